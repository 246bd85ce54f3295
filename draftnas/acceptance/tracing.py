"""Building traces: the target decodes the prompt set (batched, resumable by shard) and its
top-k next-token probabilities are kept at every continuation position.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache

from draftnas.acceptance.records import TraceMetadata, TraceOptions, TraceRecordInfo, TraceRequest
from draftnas.acceptance.traces import TraceRecord, load_traces, make_metadata, save_traces
from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import require_device
from draftnas.core.prompts import Prompt, encode_prompt, load_prompts
from draftnas.core.records import Progress
from draftnas.models.hf_head import CACHE_ARG
from draftnas.models.records import TORCH_DTYPES
from draftnas.models.sources import load_model

if TYPE_CHECKING:
    from draftnas.models.sources import LoadedModel


log = logging.getLogger(__name__)


@dataclass
class _Decoded:
    continuation: list[int]
    topk_ids: torch.Tensor  # [C, K]
    topk_probs: torch.Tensor  # [C, K]
    leftover: torch.Tensor  # [C]
    ended_with_eos: bool


def _next_token_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Distribution a token is drawn from: softmax(logits / T); greedy records keep T = 1."""

    scale = temperature if temperature > 0 else 1.0
    return torch.softmax(logits.float() / scale, dim=-1)


def decode_batch(
    model: Any,
    prompts_ids: Sequence[Sequence[int]],
    *,
    temperature: float,
    max_new_tokens: int,
    top_k: int,
    eos_ids: Sequence[int],
    generators: Sequence[torch.Generator] | None = None,
) -> list[_Decoded]:
    """Decode a batch of prompts with a KV cache (left padded), keeping top-k probabilities.

    Greedy when temperature is 0, else ancestral sampling from softmax(logits / T),
    each row with its own generator so a prompt's sample does not depend on its batch (drawn on
    the host, so a seed gives the same sample on any device). Decodes on the model's device; the
    results are on the host.
    """

    device = next(model.parameters()).device
    batch = len(prompts_ids)
    width = max(len(p) for p in prompts_ids)
    input_ids = torch.zeros(batch, width, dtype=torch.long)
    attention = torch.zeros(batch, width, dtype=torch.long)
    for row, prompt in enumerate(prompts_ids):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention[row, width - len(prompt):] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    eos = torch.tensor(list(eos_ids) or [-1], device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    top_ids: list[torch.Tensor] = []
    top_probs: list[torch.Tensor] = []
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    with torch.inference_mode():
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                    **{CACHE_ARG: cache}, use_cache=True, logits_to_keep=1)
        for _ in range(max_new_tokens):
            probs = _next_token_probs(out.logits[:, -1, :], temperature)  # [B, V]
            if temperature > 0:
                gens = list(generators) if generators else [None] * batch
                host = probs.cpu()
                nxt = torch.cat([torch.multinomial(host[r], 1, generator=gens[r])
                                 for r in range(batch)]).to(device)
            else:
                nxt = probs.argmax(-1)
            vals, ids = probs.topk(top_k, dim=-1)
            tokens.append(nxt)
            top_ids.append(ids)
            top_probs.append(vals)
            lengths += (~done).long()
            done = done | torch.isin(nxt, eos)
            if bool(done.all()):
                break
            attention = torch.cat([attention, torch.ones(batch, 1, dtype=torch.long, device=device)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(input_ids=nxt[:, None], attention_mask=attention, position_ids=positions,
                        **{CACHE_ARG: cache}, use_cache=True)
    all_tokens = torch.stack(tokens, 1).cpu()  # [B, T]
    all_ids, all_probs = torch.stack(top_ids, 1).cpu(), torch.stack(top_probs, 1).cpu()  # [B, T, K]
    lengths = lengths.cpu()
    results = []
    for row in range(batch):
        n = int(lengths[row])
        probs_row = all_probs[row, :n]
        cont = all_tokens[row, :n].tolist()
        results.append(_Decoded(
            continuation=cont, topk_ids=all_ids[row, :n], topk_probs=probs_row,
            leftover=(1.0 - probs_row.sum(-1)).clamp(min=0.0),
            ended_with_eos=bool(cont) and cont[-1] in set(eos_ids),
        ))
    return results


def teacher_forced_topk(
    model: Any, prompt_ids: Sequence[int], continuation: Sequence[int], *, temperature: float, top_k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k target probabilities at each continuation position from one forward pass.

    Returns (topk_ids [C, K], topk_probs [C, K], leftover [C]). Used to make traces from
    continuations produced elsewhere (e.g. the plain-decoding runs of `draftnas bench`).
    """

    ids = torch.tensor([list(prompt_ids) + list(continuation)], device=next(model.parameters()).device)
    n = len(continuation)
    with torch.inference_mode():
        logits = model(input_ids=ids, logits_to_keep=n + 1).logits[0, :n].float().cpu()  # [C, V], on the host
    probs = _next_token_probs(logits, temperature)
    vals, top = probs.topk(top_k, dim=-1)
    return top, vals, (1.0 - vals.sum(-1)).clamp(min=0.0)


def _record(prompt: Prompt, temperature: float, prompt_ids: Sequence[int], decoded: _Decoded) -> TraceRecord:
    info = TraceRecordInfo(
        prompt_id=prompt.id, domain=prompt.domain, language=prompt.language,
        temperature=float(temperature), prompt_len=len(prompt_ids),
        continuation_len=len(decoded.continuation), ended_with_eos=decoded.ended_with_eos,
    )
    return TraceRecord(
        info=info,
        prompt_ids=torch.tensor(list(prompt_ids), dtype=torch.long),
        continuation_ids=torch.tensor(decoded.continuation, dtype=torch.long),
        topk_ids=decoded.topk_ids.long(), topk_probs=decoded.topk_probs.float(),
        leftover=decoded.leftover.float(),
    )


def record_from_continuation(model: Any, prompt: Prompt, prompt_ids: Sequence[int],
                             continuation: Sequence[int], *, temperature: float, top_k: int,
                             eos_ids: Sequence[int]) -> TraceRecord:
    """A trace record for a continuation the target produced elsewhere (one teacher-forced pass)."""
    top, vals, left = teacher_forced_topk(model, prompt_ids, continuation, temperature=temperature,
                                          top_k=top_k)
    cont = list(continuation)
    decoded = _Decoded(cont, top, vals, left, ended_with_eos=bool(cont) and cont[-1] in set(eos_ids))
    return _record(prompt, temperature, prompt_ids, decoded)


def _manifest(metadata: TraceMetadata, options: TraceOptions) -> dict[str, Any]:
    """What must match for a partial run to be resumed."""
    keep = ("target", "model_type", "num_hidden_layers", "vocab_size", "tokenizer_fingerprint",
            "prompt_set_hash", "temperatures", "seed", "top_k", "max_new_tokens", "dtype")
    data = metadata.to_dict()
    return {**{k: data[k] for k in keep}, "shard_size": options.shard_size,
            "batch_size": options.batch_size}


def _open_partial(partial: Path, manifest: dict[str, Any]) -> None:
    mpath = partial / "manifest.json"
    if mpath.is_file():
        try:
            same = json.loads(mpath.read_text()) == manifest
        except ValueError:
            same = False
        if same:
            return
        log.warning("discarding %s: it was built with other settings", partial)
        shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    mpath.write_text(json.dumps(manifest, indent=1))


def _generator(seed: int, prompt_index: int, temperature: float) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}|{prompt_index}|{temperature:.6f}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _decode_shard(loaded: LoadedModel, prompts: Sequence[Prompt], encoded: Sequence[list[int]],
                  jobs: Sequence[tuple[int, float]], options: TraceOptions,
                  eos_ids: Sequence[int], on_done: Callable[[int], None]) -> list[TraceRecord]:
    records: list[TraceRecord] = []
    for start in range(0, len(jobs), options.batch_size):
        group = jobs[start:start + options.batch_size]
        by_temp: dict[float, list[int]] = {}
        for prompt_index, temp in group:
            by_temp.setdefault(temp, []).append(prompt_index)
        for temp, indices in by_temp.items():
            decoded = decode_batch(
                loaded.model, [encoded[i] for i in indices], temperature=temp,
                max_new_tokens=options.max_new_tokens, top_k=options.top_k, eos_ids=eos_ids,
                generators=[_generator(options.seed, i, temp) for i in indices],
            )
            records.extend(_record(prompts[i], temp, encoded[i], d)
                           for i, d in zip(indices, decoded, strict=True))
            on_done(len(indices))
    return records


def build_traces(
    target: str | LoadedModel,
    prompts: Sequence[Prompt],
    options: TraceOptions,
    out: str | Path,
    *,
    prompt_set: str = "custom",
    progress: Progress | None = None,
) -> Path:
    """Run the target over every prompt at every temperature and write the traces to `out`.

    Finished shards are kept in ``<out>.partial/`` so an interrupted run resumes; the
    final file is written atomically and the partial folder removed. `progress(done, total)`
    is called after each batch (records, i.e. prompts x temperatures).
    """

    options.validate()
    if not prompts:
        raise InvalidInputError("no prompts to trace")
    started = time.perf_counter()
    require_device(options.device)
    loaded = (load_model(target, dtype=TORCH_DTYPES[options.dtype], device=options.device)
              if isinstance(target, str) else target)
    metadata = make_metadata(loaded, prompts, options, prompt_set)
    out = Path(out)
    partial = out.with_name(out.name + ".partial")
    _open_partial(partial, _manifest(metadata, options))
    encoded = [encode_prompt(loaded.tokenizer, p.text) for p in prompts]
    eos_ids = metadata.eos_token_ids
    jobs = [(i, float(t)) for t in options.temperatures for i in range(len(prompts))]
    shards = [jobs[s:s + options.shard_size] for s in range(0, len(jobs), options.shard_size)]
    done = 0
    for index, shard_jobs in enumerate(shards):
        if (partial / f"shard-{index:05d}.safetensors").is_file():
            done += len(shard_jobs)
    if done:
        log.info("resuming %s: %d of %d records already traced", out, done, len(jobs))
    if progress:
        progress(done, len(jobs))

    def on_done(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, len(jobs))

    for index, shard_jobs in enumerate(shards):
        shard_path = partial / f"shard-{index:05d}.safetensors"
        if shard_path.is_file():
            continue
        records = _decode_shard(loaded, prompts, encoded, shard_jobs, options, eos_ids, on_done)
        save_traces(metadata, records, shard_path)
    records = [r for i in range(len(shards))
               for r in load_traces(partial / f"shard-{i:05d}.safetensors").records]
    metadata = replace(metadata, n_records=len(records),
                       n_tokens=sum(r.info.continuation_len for r in records),
                       wall_s=round(time.perf_counter() - started, 3))
    save_traces(metadata, records, out)
    shutil.rmtree(partial, ignore_errors=True)
    log.info("wrote %d trace records (%d tokens) to %s", len(records), metadata.n_tokens, out)
    return out


def trace_from_request(request: TraceRequest, *, progress: Progress | None = None) -> Path:
    """`draftnas trace`: the request's prompts traced into its file (resumable); the file's path."""
    prompts = load_prompts(request.prompts, per_domain=request.per_domain)
    return build_traces(request.target, prompts, request.options, request.out, prompt_set=request.prompts,
                        progress=progress)
