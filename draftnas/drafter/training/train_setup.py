"""What a training run is set up from (`drafter.train`): the request checked against its data and base, the
run's plan (cut, reduced head) kept in its folder, the held-out continuations its readings score, and the
finetune's data set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftnas.acceptance.traces import eos_token_ids, tokenizer_fingerprint
from draftnas.acceptance.tracing import decode_batch
from draftnas.core.errors import InvalidInputError
from draftnas.core.options import OptionError, option_error, option_flags
from draftnas.core.prompts import encode_prompt, load_prompts
from draftnas.drafter.heal.heal_data import HealSequence
from draftnas.drafter.records import PlanOptions, PruningPlan
from draftnas.drafter.training.distill_records import HELDOUT_PROMPTS, DataManifest, DistillTrainRequest
from draftnas.drafter.training.distill_store import iter_sequences, read_manifest
from draftnas.drafter.training.trained import PLAN_FILE

HELDOUT_NEW_TOKENS = 96


def check_request(request: DistillTrainRequest, manifest: DataManifest, base: Any, tokenizer: Any) -> None:
    """Every mistake at once, before any training: data of another tokenizer, a shape the base lacks."""
    problems = []  # (the request's field, what is wrong with it): the CLI names each field's flag
    if tokenizer_fingerprint(tokenizer) != manifest.tokenizer_fingerprint:
        problems.append(("data", f"{request.data} was made with {manifest.target}'s tokenizer, which differs "
                                 f"from {request.base or manifest.target}'s"))
    n = int(base.config.num_hidden_layers)
    wide = [i for i in request.layers if i >= n]
    if wide:
        problems.append(("layers", f"{','.join(map(str, wide))}: the base has layers 0..{n - 1}"))
    vocab = int(base.get_input_embeddings().weight.shape[0])
    if request.head_rows > vocab:
        problems.append(("head_rows", f"{request.head_rows}: wider than the base's {vocab}-row head"))
    if request.finetune_domain and not manifest.positions(domain=request.finetune_domain):
        have = sorted({d for s in manifest.shards for d in s.domains})
        problems.append(("finetune_domain", f"{request.finetune_domain}: the data has {', '.join(have)}"))
    if problems:
        raise OptionError(problems, option_flags(request))


def heldout_sequences(data: str, domain: str, count: int, target: Any, tokenizer: Any, folder: Path
                      ) -> list[HealSequence]:
    """The target's greedy continuations of the first `count` of the data's held-out prompts (of `domain`
    where given), cached in the training folder: top-1 agreement on them is greedy acceptance per token."""
    cached = folder / "heldout.pt"
    if cached.is_file():
        return [HealSequence(**s) for s in torch.load(cached, weights_only=False)]
    prompts = [p for p in load_prompts(str(Path(data) / HELDOUT_PROMPTS)) if not domain or p.domain == domain]
    prompts = prompts[:count]
    encoded = [encode_prompt(tokenizer, p.text) for p in prompts]
    out: list[HealSequence] = []
    eos = eos_token_ids(target, tokenizer)
    for start in range(0, len(encoded), 8):
        chunk = encoded[start:start + 8]
        for ids, d in zip(chunk, decode_batch(target, chunk, temperature=0.0,
                                              max_new_tokens=HELDOUT_NEW_TOKENS,
                                              top_k=1, eos_ids=eos), strict=True):
            if d.continuation:
                out.append(HealSequence(list(ids) + d.continuation, len(ids), d.continuation))
    torch.save([vars(s) for s in out], cached)
    return out


def head_subset(request: DistillTrainRequest, manifest: DataManifest, tokenizer: Any) -> Any:
    """The reduced head's ids: special tokens, then the tokens the target wrote most often in the finetune
    domain (the text the drafter will serve), then in the rest of the set."""
    from draftnas.drafter.vocab import select_subset, special_token_ids

    if not request.head_rows or request.head_rows >= manifest.vocab_size:
        return None
    ranked: list[list[int]] = []
    rest: list[list[int]] = []
    for s in iter_sequences(request.data, manifest, check=False):
        (ranked if s.domain == request.finetune_domain else rest).append(s.ids[s.prompt_len:])
    return select_subset(ranked or rest, request.head_rows, manifest.vocab_size,
                         required=special_token_ids(tokenizer), fallback_sequences=rest if ranked else (),
                         source=f"distill data {request.data}",
                         tokenizer_fingerprint=manifest.tokenizer_fingerprint)


def make_plan(request: DistillTrainRequest, manifest: DataManifest, loaded: Any) -> PruningPlan:
    from dataclasses import replace

    from draftnas.drafter.prune.plan import plan_pruning

    plan = plan_pruning(loaded.model, PlanOptions(layers=tuple(sorted(request.layers)),
                                                  base=request.base or manifest.target))
    return replace(plan, vocab=head_subset(request, manifest, loaded.tokenizer))


def run_plan(request: DistillTrainRequest, manifest: DataManifest, loaded: Any, folder: Path) -> PruningPlan:
    """The run's plan: the one its folder holds (a resumed run keeps its head even where the data grew),
    else made now and kept there. A request for another shape than the folder's is refused."""
    path = folder / PLAN_FILE
    if not path.is_file():
        plan = make_plan(request, manifest, loaded)
        plan.save(path)
        return plan
    plan = PruningPlan.from_json(path.read_text())
    rows = plan.vocab.size if plan.vocab is not None else 0
    if tuple(plan.layers) != tuple(sorted(request.layers)) or rows != (request.head_rows if request.head_rows
                                                                         < manifest.vocab_size else 0):
        kept = ",".join(map(str, plan.layers))
        raise option_error("out", f"{folder} trains layers {kept} with a {rows}-row head: resume with the "
                                  "same {layers} and {head_rows}, or give another folder")
    return plan


def finetune_manifest(request: DistillTrainRequest, manifest: DataManifest) -> DataManifest | None:
    """The finetune's data set (its own folder, or DATA), checked to be of the same tokenizer and to hold
    the domain."""
    if not request.finetune_data:
        return manifest
    other = read_manifest(request.finetune_data)
    if other is None:
        raise option_error("finetune_data", f"{request.finetune_data}: no data set here")
    if other.tokenizer_fingerprint != manifest.tokenizer_fingerprint:
        raise InvalidInputError(f"{request.finetune_data} was made with {other.target}'s tokenizer, "
                                f"{request.data} with {manifest.target}'s")
    if request.finetune_tokens and not other.positions(domain=request.finetune_domain):
        raise InvalidInputError(f"{request.finetune_data} holds no {request.finetune_domain} data")
    return other
