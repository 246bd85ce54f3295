"""Training a head on the target's hidden states (`draftnas distill head`), to a token budget.

Data: a self-distillation set (`draftnas distill data`): its sequences packed into rows (`training.packing`),
the target's top-k kept with each taught token. Each step the target reads the rows once (no gradient) and
hands over its residual stream at the head's layers (`--features store`: it reads each sequence alone once
before training, kept in fp16, and each step gathers its rows from there); the head learns KL(target top-k +
leftover || head) of the token two ahead of each row (`heal.losses.kl_to_topk`, its draft vocabulary's share
of the top-k), over `unroll` draft steps, each reading the step before's output as inference does
(`Eagle3Head.unrolled`), weighted 0.8^j (EAGLE-3's training-time test). The learning rate is constant after a
linear warm-up, so readings along the run are points of one curve.

Readings: exact greedy acceptance on the target's greedy continuations of the data's held-out prompts, at
log-spaced budgets: the unrolled steps over a continuation are the drafts the head makes there wherever
the drafts before them were accepted, so top-1 and tokens per step at γ are what the speculative loop gets
on those continuations. Checkpoints (atomic) resume to the same weights; other options or data are refused.
The guard: where the last reading's tokens per step is below the untrained head's, the untrained head is
kept. The head folder (`RUN/head`) is what vLLM serves and `head:RUN/head` names.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import host_line, require_device
from draftnas.core.options import OptionError, option_flags
from draftnas.core.records import Progress
from draftnas.drafter.head.build import draft_vocabulary, new_head, target_hidden
from draftnas.drafter.head.folder import write_head
from draftnas.drafter.head.model import Eagle3Head
from draftnas.drafter.head.records import HEAD_DIR, RESULT_FILE, HeadTrainRequest, HeadTrainResult
from draftnas.drafter.head.shape import HeadShape, head_shape
from draftnas.drafter.heal.heal_data import HealSequence
from draftnas.drafter.heal.losses import kl_to_topk, topk_in_rows
from draftnas.drafter.training.distill_records import DataManifest, TrainReading
from draftnas.drafter.training.distill_store import iter_sequences, read_manifest
from draftnas.drafter.training.packing import Stream, build_stream, epoch_index
from draftnas.drafter.training.ranks import Ranks, start_ranks, stop_ranks
from draftnas.drafter.training.train import (
    load_checkpoint,
    reading_budgets,
    reproduce_command,
    save_checkpoint,
)
from draftnas.drafter.training.train_setup import heldout_sequences

log = logging.getLogger(__name__)
STATE_FILE = "head-state.pt"
#: weight of draft step j's loss: later steps count less (EAGLE-3)
STEP_DECAY = 0.8


@dataclass
class _State:
    tokens: int = 0
    micro: int = 0
    train_s: float = 0.0
    features_s: float = 0.0
    readings: list[TrainReading] = field(default_factory=list)


@dataclass
class Heldout:
    """One held-out continuation: its ids [T], where the answer starts, and the target's residual stream at
    the head's layers over it, [A, T, H]."""

    ids: torch.Tensor
    prompt_len: int
    hidden: torch.Tensor


def check_head_request(request: HeadTrainRequest, manifest: DataManifest, config: dict[str, Any]
                       ) -> HeadShape:
    """The head's shape for the data's target; every mistake in the request's fields at once, named by
    flag on the command line (a layer outside the target, a draft vocabulary larger than its vocabulary)."""
    try:
        return head_shape(config, manifest.target, layers=request.layers or None,
                          draft_vocab=request.draft_vocab, ffn=request.ffn or None)
    except OptionError as e:
        raise OptionError(e.problems, option_flags(request)) from None


def head_drafts(head: Eagle3Head, embeddings: torch.Tensor, ids: torch.Tensor, hidden: torch.Tensor,
                steps: int) -> list[torch.Tensor]:
    """Over a sequence `ids` [T] with the target's residual stream `hidden` [A, T, H]: for each draft step j
    < `steps`, the target id the head drafts at each row [T - 1] (row b + j: the j-th draft after base b,
    wherever the drafts before it were the sequence's own tokens)."""
    table = head.draft_ids()
    head.eval()
    with torch.inference_mode():
        outs = head.unrolled(embeddings[ids[1:]][None], head.fuse(hidden)[:-1][None], steps)
        return [table[head.logits(o[0]).argmax(-1)] for o in outs]


def head_walk(drafts: list[torch.Tensor], ids: torch.Tensor, prompt_len: int, gamma: int
              ) -> list[tuple[int, int]]:
    """(accepted, drafted) per greedy step over the target's own continuation `ids[prompt_len:]`, `drafts`
    being `head_drafts`' (at least `gamma` steps), as draftnas's loop takes them. The prefill emits the
    first answer token; each step then drafts γ after the last token (fewer where the sequence ends first)
    and emits its accepted drafts and one. (vLLM's steps, which draft γ to the end: `bench.vllm_replay`.)"""
    t, steps = len(ids), []
    end = t - prompt_len
    b, emitted = prompt_len - 1, 1  # base: the last row read with the target's features
    while emitted < end:
        limit = min(gamma, t - b - 3)
        a = 0
        while a < limit and b + a + 2 < t and int(drafts[a][b + a]) == int(ids[b + a + 2]):
            a += 1
        steps.append((a, limit))
        emitted, b = emitted + a + 1, b + a + 1
    return steps


def exact_acceptance(head: Eagle3Head, embeddings: torch.Tensor, held: list[Heldout], gamma: int
                     ) -> tuple[float, float]:
    """(top-1, tokens per step at `gamma`) of greedy speculative decoding with `head` over the held-out
    continuations (the first answer token is the prefill's; each step emits its accepted drafts and one)."""
    hits = seen = emitted = steps = 0
    for h in held:
        drafts = head_drafts(head, embeddings, h.ids, h.hidden, gamma)
        first = drafts[0][h.prompt_len - 1:len(h.ids) - 2] == h.ids[h.prompt_len + 1:]
        hits, seen = hits + int(first.sum()), seen + int(first.numel())
        walk = head_walk(drafts, h.ids, h.prompt_len, gamma)
        emitted, steps = emitted + sum(a + 1 for a, _ in walk), steps + len(walk)
    return hits / max(seen, 1), emitted / max(steps, 1)


class HeadTrainer:
    """One run: the head, its optimizer, the target that hands it hidden states, and what resumes."""

    def __init__(self, request: HeadTrainRequest, head: Eagle3Head, target: Any, held: list[Heldout],
                 folder: Path, key: str, progress: Progress | None, ranks: Ranks = Ranks()) -> None:
        self.request, self.head, self.target, self.held = request, head, target, held
        self.folder, self.key, self.ranks = folder, key, ranks
        self.progress = progress if ranks.main else None
        self.embeddings = target.get_input_embeddings().weight.detach()
        self.device = self.embeddings.device
        self.params = [p for p in head.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=request.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.state = _State()
        self.budgets = reading_budgets(request.tokens, request.readings)
        self.rows = (head.draft_ids().new_full((head.shape.target.vocab_size,), -1))
        self.rows[head.draft_ids()] = torch.arange(head.shape.draft_vocab)
        self._last_save = time.perf_counter()
        self._losses: list[float] = []
        self.store: torch.Tensor | None = None  # `--features store`: [N, A, H] fp16 by stream position

    def read(self, phase: str) -> None:
        top1, tps = exact_acceptance(self.head, self.embeddings, self.held, self.request.gamma)
        loss = sum(self._losses) / len(self._losses) if self._losses else None
        self._losses = []
        self.state.readings.append(TrainReading(tokens=self.state.tokens, phase=phase,
                                                train_s=round(self.state.train_s, 3), loss=loss,
                                                top1_agreement=top1, tokens_per_step=tps))
        log.info("head at %d tokens: top-1 %.4f, tokens/step %.3f", self.state.tokens, top1, tps)

    def store_features(self, stream: Stream) -> None:
        """`--features store`: the target's residual stream at the head's layers over each sequence of
        `stream` alone, once, fp16 [N, A, H] by stream position (its time is training time). Across
        processes each computes every N-th sequence and the store is summed over them."""
        started = time.perf_counter()
        shape = self.head.shape
        store = torch.zeros(len(stream.ids), len(shape.layers), shape.hidden_size, dtype=torch.float16)
        log.info("storing the target's hidden states over %d tokens (%.0f MB in fp16)", len(stream.ids),
                 store.numel() * 2 / 1e6)
        for i, (start, n) in enumerate(stream.sequences):
            if i % self.ranks.world != self.ranks.rank:
                continue
            ids = stream.ids[start:start + n].long()[None].to(self.device)
            store[start:start + n] = target_hidden(self.target, ids, shape.layers)[0].transpose(0, 1).to(
                "cpu", torch.float16)
        self.store = self.ranks.sum_(store)
        spent = time.perf_counter() - started
        self.state.features_s += spent
        self.state.train_s += spent

    def loss(self, index: torch.Tensor, teach: torch.Tensor, stream: Stream, limit: int
             ) -> tuple[torch.Tensor, int]:
        """The loss of the rows at stream positions `index` over their first `limit` taught positions, and
        how many it taught."""
        ids = stream.ids[index].long().to(self.device)
        if self.store is not None:
            rows = self.store[index].to(self.device).float()  # [B, T, A, H]
        else:
            started = time.perf_counter()
            rows = target_hidden(self.target, ids, self.head.shape.layers).transpose(1, 2).clone()
            self.state.features_s += time.perf_counter() - started
        b, t, a, h = rows.shape
        features = self.head.fc(rows.reshape(b, t, a * h))[:, :-1]
        outs = self.head.unrolled(self.embeddings[ids[:, 1:]], features, self.request.unroll)
        taught = teach[:, 1:]  # row p predicts token p + 2: the top-k row of position p + 1
        where = (taught >= 0).nonzero()[:limit]
        total, weights = torch.zeros((), device=self.device), 0.0
        for j, normed in enumerate(outs):
            at = where[where[:, 1] >= j]
            if not len(at):
                continue
            k = taught[at[:, 0], at[:, 1]]
            probs = stream.topk_probs[k].float().to(self.device)
            teacher = topk_in_rows(self.rows, stream.topk_ids[k].long().to(self.device), probs,
                                   (1.0 - probs.sum(-1)).clamp(min=0.0))
            on = at.to(self.device)
            logits = self.head.logits(normed[on[:, 0], on[:, 1]]).float()
            total = total + STEP_DECAY ** j * kl_to_topk(logits, *teacher)
            weights += STEP_DECAY ** j
        return total / max(weights, 1e-9), len(where)

    def train(self, stream: Stream) -> bool:
        """Train to the budget; False where the call was told to stop first. Across processes a step's rows
        are `batch_rows` per process, each process taking its own."""
        req, ranks = self.request, self.ranks
        step_rows = req.batch_rows * ranks.world
        per_epoch = max(1, ((len(stream.ids) - 1) // req.seq_len) // step_rows)
        if req.features == "store" and self.store is None and self.state.tokens < req.tokens:
            self.store_features(stream)
        epoch, rows = -1, None
        while self.state.tokens < req.tokens:
            if req.stop_after_tokens is not None and self.state.tokens >= req.stop_after_tokens:
                return False
            started = time.perf_counter()
            if self.state.micro // per_epoch != epoch:
                epoch = self.state.micro // per_epoch
                rows = epoch_index(stream, req.seq_len, req.seed, epoch)
            assert rows is not None
            i = (self.state.micro % per_epoch) * step_rows + ranks.rank * req.batch_rows
            self.head.train()
            for group in self.optimizer.param_groups:
                warm = req.warmup_tokens
                group["lr"] = req.lr * (min(1.0, (self.state.tokens + 1) / warm) if warm else 1.0)
            loss, n = self.loss(rows[0][i:i + req.batch_rows], rows[1][i:i + req.batch_rows], stream,
                                ranks.share(req.tokens - self.state.tokens))
            loss.backward()
            ranks.average_gradients(self.params)
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.state.micro += 1
            self.state.tokens += ranks.total(n)
            self.state.train_s += time.perf_counter() - started
            self._losses.append(float(loss.detach()))
            self._after_step()
        return True

    def _after_step(self) -> None:
        done = max((r.tokens for r in self.state.readings), default=-1)
        if any(done < b <= self.state.tokens for b in self.budgets):
            self.read("train")
        if self.progress:
            self.progress(self.state.tokens, self.request.tokens)
        due = time.perf_counter() - self._last_save >= self.request.checkpoint_minutes * 60.0
        if due and self.ranks.main:
            self.save()

    def save(self) -> None:
        """The run's state written to its checkpoint (by rank 0 alone: every process holds the same)."""
        if not self.ranks.main:
            return
        s = self.state
        payload = {"key": self.key, "tokens": s.tokens, "micro": s.micro, "train_s": s.train_s,
                   "features_s": s.features_s, "readings": [r.to_dict() for r in s.readings],
                   "head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}
        save_checkpoint(self.folder / STATE_FILE, payload)
        self._last_save = time.perf_counter()

    def load(self) -> bool:
        saved = load_checkpoint(self.folder / STATE_FILE, self.key)
        if saved is None:
            return False
        self.head.load_state_dict(saved["head"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.state = _State(saved["tokens"], saved["micro"], saved["train_s"], saved["features_s"],
                            [TrainReading.from_dict(r) for r in saved["readings"]])
        return True


def _key(request: HeadTrainRequest, shape: HeadShape, manifest: DataManifest, world: int = 1) -> str:
    """What a checkpoint must match to resume: the options that shape training, the head, the data and, for
    a run across processes, their count (a step's rows depend on it)."""
    opts = request.to_dict()
    for volatile in ("checkpoint_minutes", "stop_after_tokens", "out", "data", "readings", "tokens",
                     "heldout_prompts", "device"):
        opts.pop(volatile, None)
    parts: list[Any] = [opts, shape.to_dict(), [s.sha256 for s in manifest.shards]]
    payload = json.dumps(parts + ([world] if world > 1 else []), sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _command(request: HeadTrainRequest, world: int = 1) -> str:
    """The command that reproduces the run (under torchrun where it ran across processes)."""
    command = reproduce_command("head", request)
    if world == 1:
        return command
    return command.replace("draftnas ", f"torchrun --nproc_per_node {world} -m draftnas ", 1)


def trained_prompts(manifest: DataManifest, tokenizer: Any) -> list[str]:
    """Keys of the shipped prompts a data set's answers and written prompts come from (all but its held-out
    ones): a bench of the head leaves them out."""
    from draftnas.core.prompts import DOMAINS, encode_prompt, load_prompts
    from draftnas.drafter.heal.heal_records import prompt_key
    from draftnas.drafter.training.distill_data import split_prompts

    train, _ = split_prompts(load_prompts(",".join(DOMAINS)), manifest.heldout_every)
    return sorted({prompt_key(encode_prompt(tokenizer, p.text)) for p in train})


def heldout(request: HeadTrainRequest, target: Any, tokenizer: Any, layers: tuple[int, ...], folder: Path
            ) -> list[Heldout]:
    """The held-out continuations (`train_setup.heldout_sequences`, cached in the run's folder) with the
    target's residual stream at `layers` over each."""
    seqs: list[HealSequence] = heldout_sequences(request.data, "", request.heldout_prompts, target, tokenizer,
                                                 folder)
    out = []
    device = target.get_input_embeddings().weight.device
    for s in seqs:
        ids = torch.tensor(s.input_ids, device=device)
        out.append(Heldout(ids, s.prompt_len, target_hidden(target, ids[None], layers)[0].clone()))
    return out


def train_head(request: HeadTrainRequest, *, progress: Progress | None = None) -> HeadTrainResult:
    """Make (or resume) a head for the data's target, train it to the budget, guard, write its folder (in one
    process, or in each of the processes torchrun started: `drafter.training.ranks`)."""
    request.validate()
    require_device(request.device)
    ranks = start_ranks(request.device)  # one process, or torchrun's several
    try:
        return _train_head(request, ranks, progress)
    finally:
        stop_ranks(ranks)


def _train_head(request: HeadTrainRequest, ranks: Ranks, progress: Progress | None) -> HeadTrainResult:
    from draftnas.drafter.vocab import special_token_ids
    from draftnas.models.sources import ensure_local_folder, load_model

    manifest = read_manifest(request.data)
    if manifest is None:
        raise InvalidInputError(f"{request.data}: no data set here (make one with `draftnas distill data`)")
    config = json.loads((ensure_local_folder(manifest.target)[1] / "config.json").read_text())
    shape = check_head_request(request, manifest, config)  # before any weights load or anything is written
    loaded = load_model(manifest.target, device=request.device)
    target = loaded.model.float().eval().requires_grad_(False)
    folder = Path(request.out)
    folder.mkdir(parents=True, exist_ok=True)
    seqs = list(iter_sequences(request.data, manifest))
    draft_ids = draft_vocabulary(shape, [s.ids[s.prompt_len:] for s in seqs],
                                 required=special_token_ids(loaded.tokenizer), fallback=[s.ids for s in seqs])
    head = new_head(target, shape, draft_ids, seed=request.seed)
    untrained = {k: v.clone() for k, v in head.state_dict().items()}
    if not ranks.main:  # rank 0 makes the held-out set and caches it; the others read the cache
        ranks.barrier()
    held = heldout(request, target, loaded.tokenizer, shape.layers, folder)
    if ranks.main:
        ranks.barrier()
    trainer = HeadTrainer(request, head, target, held, folder, _key(request, shape, manifest, ranks.world),
                          progress, ranks)
    resumed = trainer.state.tokens if trainer.load() else 0
    if not trainer.state.readings:
        trainer.read("untrained")
    finished = trainer.train(build_stream(seqs))
    if finished and trainer.state.readings[-1].tokens != trainer.state.tokens:
        trainer.read("train")
    trainer.save()
    readings = trainer.state.readings
    kept = "trained" if finished else "interrupted"
    if finished and readings[-1].tokens_per_step < readings[0].tokens_per_step:
        kept = "untrained (the guard: training lowered held-out tokens per step)"
        head.load_state_dict(untrained)
    extra = {"data": str(request.data), "command": _command(request, ranks.world),
             "trained_prompts": trained_prompts(manifest, loaded.tokenizer)}
    tokens = trainer.state.tokens if kept == "trained" else 0
    written = write_head(head, folder / HEAD_DIR, trained_tokens=tokens, extra=extra) if ranks.main \
        else folder / HEAD_DIR
    result = HeadTrainResult(
        out=str(folder), head=str(written), target=manifest.target, label=shape.label(),
        parameters=shape.parameters(), trained_tokens=trainer.state.tokens, budget_tokens=request.tokens,
        train_s=round(trainer.state.train_s, 3), features_s=round(trainer.state.features_s, 3),
        readings=tuple(readings), kept=kept, command=_command(request, ranks.world),
        resumed_from_tokens=resumed,
        gamma=request.gamma, host=host_line(), shape=shape, unroll=request.unroll)
    if ranks.main:
        (folder / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=1))
    return result
