"""Healing: knowledge distillation of a pruned drafter toward its target.

Two teachers:

- a live target model: KL(target || drafter) over the full vocabulary at every
  position that predicts a target-generated token (one target forward per step);
- `Traces` (draftnas.traces): KL to the stored top-k probabilities plus the
  leftover mass as one extra bucket. No target forward, so a step costs about
  half as much.

A live target with `teacher_topk` keeps its top-k while it makes the data and is
then taught from those, like traces: no target forward per step.

The training text is self-distillation data: the target's own continuations of
the prompt set (pretrain-and-finetune on target outputs is what makes a drafter
accepted, per the second seed paper), and optionally of prompts the target
writes itself (`written_prompts`). Live mode generates them once (cached in
the checkpoint folder); trace mode uses the traces' continuations.

Only the kept decoder layers and the final norm train by default (embedding and
LM head are tied and frozen). AdamW, linear warm-up then cosine decay. Periodic
readings of top-1 agreement with the target on held-out prompts (teacher-forced
over the target's greedy continuation: for greedy decoding this is exactly the
drafter's per-token acceptance). A checkpoint (trainable weights, optimizer,
scheduler, step, readings) is written atomically so an interrupted run resumes.

Size: healing is one training loop with its data, losses, readings and resumable checkpoints; the
parts share the batch layout and the run state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftnas.errors import InvalidInputError, TraceError
from draftnas.record import Record

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
STATE_FILE = "heal-state.pt"
DATA_FILE = "heal-data.pt"


@dataclass(frozen=True)
class HealOptions(Record):
    """How to heal. `steps` optimizer steps of `batch_size` sequences (prompt + continuation).

    lr: peak AdamW learning rate after `warmup_steps` (default: 10% of steps), cosine to 0.
    train: "layers" (kept decoder layers + final norm; embedding/LM head frozen) or "all".
    eval_every: steps between held-out readings (0: only before and after).
    heldout_every: every n-th prompt (or trace record) is held out for the readings.
    prompts / prompts_per_domain / max_new_tokens / data_temperature: self-distillation data in
    live mode (the target's continuations; generating them is most of a short run's cost).
    exclude_prompts: ids of prompts kept out of the live data altogether (e.g. the ones an
    acceptance estimate will be made on).
    written_prompts: in live mode, this many more user turns the target writes itself (each opening
    with the first words of a training prompt of the set), answered like the set's prompts and
    added to the training sequences only (chat models; other targets write none).
    teacher_topk: in live mode, keep the target's top-k probabilities at every continuation position
    while generating the data and train on them (the trace teacher's loss) instead of running the
    target at every step; 0 runs it at every step (full-vocabulary KL).
    max_seconds: stop early after this much training wall time (the search's budget).
    checkpoint_every: steps between checkpoints when a checkpoint folder is given.
    """

    steps: int = 150
    batch_size: int = 4
    lr: float = 2e-3
    weight_decay: float = 0.0
    warmup_steps: int | None = None
    train: str = "layers"
    eval_every: int = 25
    heldout_every: int = 5
    prompts: str = "all"
    prompts_per_domain: int | None = 10
    exclude_prompts: tuple[str, ...] = ()
    max_new_tokens: int = 96
    data_temperature: float = 0.0
    written_prompts: int = 0
    teacher_topk: int = 0
    max_seq_len: int = 384
    gamma: int = 4
    seed: int = 0
    max_seconds: float | None = None
    checkpoint_every: int = 25

    def validate(self) -> None:
        problems = []
        for name, low in (("steps", 1), ("batch_size", 1), ("heldout_every", 2), ("written_prompts", 0),
                          ("teacher_topk", 0), ("max_new_tokens", 1), ("max_seq_len", 8), ("gamma", 1),
                          ("checkpoint_every", 1), ("eval_every", 0)):
            if getattr(self, name) < low:
                problems.append(f"{name} must be >= {low}, got {getattr(self, name)}")
        if not 0 < self.lr <= 1:
            problems.append(f"lr must be in (0, 1], got {self.lr:g}")
        if self.train not in ("layers", "all"):
            problems.append(f"train must be one of layers, all, got {self.train!r}")
        if self.warmup_steps is not None and not 0 <= self.warmup_steps <= self.steps:
            problems.append(f"warmup_steps must be in [0, steps={self.steps}], got {self.warmup_steps}")
        if not 0 <= self.data_temperature <= 10:
            problems.append(f"data_temperature must be in [0, 10], got {self.data_temperature:g}")
        if problems:
            raise InvalidInputError("invalid heal options: " + "; ".join(problems))


@dataclass(frozen=True)
class HealReading(Record):
    """A held-out reading: top-1 agreement and greedy tokens per step at `gamma`."""

    step: int
    train_s: float
    loss: float | None
    top1_agreement: float
    tokens_per_step: float


@dataclass(frozen=True)
class HealResult(Record):
    """What a healing run did and how much acceptance it bought."""

    teacher: str  # "live" | "target top-k" (live data, cached teacher) | "traces"
    steps: int
    resumed_from_step: int
    train_s: float
    data_s: float
    top1_before: float
    top1_after: float
    tokens_per_step_before: float
    tokens_per_step_after: float
    gamma: int
    top1_rise_per_minute: float
    n_train_sequences: int
    n_heldout_sequences: int
    n_heldout_positions: int
    trained_tokens: int
    trainable_parameters: int
    readings: tuple[HealReading, ...] = ()
    options: HealOptions = field(default_factory=HealOptions)
    kept: bool = True  # False: healing lowered held-out top-1, so the export kept the unhealed weights
    trained_prompts: tuple[str, ...] = ()  # `prompt_key` of every prompt the drafter was trained on
    n_written_sequences: int = 0  # of n_train_sequences, those whose prompt the target wrote itself


def prompt_key(prompt_ids: Sequence[int]) -> str:
    """A prompt's identity by its token ids (sha256, 12 hex digits): what healing records of the
    prompts it trained on, so an acceptance estimate can leave them out wherever its text came from."""
    return hashlib.sha256(json.dumps([int(i) for i in prompt_ids]).encode()).hexdigest()[:12]


@dataclass
class HealSequence:
    """One training/held-out sequence: prompt ids then the target's continuation.

    `top1` [C]: the target's most likely token at each continuation position (for
    greedy data, the continuation itself). Trace data adds `topk_ids` / `topk_probs`
    [C, K] and `leftover` [C].
    """

    input_ids: list[int]
    prompt_len: int
    top1: list[int]
    topk_ids: Any = None
    topk_probs: Any = None
    leftover: Any = None

    @property
    def continuation_len(self) -> int:
        return len(self.input_ids) - self.prompt_len


@dataclass
class HealData:
    """Training and held-out sequences (reusable across heal calls, e.g. by the search)."""

    train: list[HealSequence]
    heldout: list[HealSequence]
    source: str  # "live" | "traces"
    build_s: float = 0.0
    n_written: int = 0  # training sequences whose prompt the target wrote itself (at the end of train)

    def fingerprint(self) -> str:
        payload = json.dumps([[s.input_ids, s.prompt_len] for s in self.train + self.heldout])
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- data


def data_from_traces(traces: Any, options: HealOptions) -> HealData:
    """Held-out split of trace records (`traces.held_out` every `heldout_every`-th) into HealSequences."""
    from draftnas.traces import held_out

    train: list[HealSequence] = []
    heldout: list[HealSequence] = []
    for i, rec in enumerate(traces.records):
        if rec.info.continuation_len < 1:
            continue
        seq = HealSequence(
            input_ids=rec.input_ids.tolist(), prompt_len=int(rec.info.prompt_len),
            top1=rec.topk_ids[:, 0].tolist(), topk_ids=rec.topk_ids, topk_probs=rec.topk_probs,
            leftover=rec.leftover,
        )
        (heldout if held_out(i, options.heldout_every) else train).append(_truncate(seq, options.max_seq_len))
    if not train or not heldout:
        raise TraceError(f"traces hold {len(traces.records)} usable records; healing needs at least "
                         f"{options.heldout_every + 1} (one held out every {options.heldout_every})")
    return HealData(train=train, heldout=heldout, source="traces")


def _truncate(seq: HealSequence, max_len: int) -> HealSequence:
    if len(seq.input_ids) <= max_len or seq.prompt_len >= max_len:
        return seq
    c = max_len - seq.prompt_len
    cut = (lambda t: None if t is None else t[:c])  # noqa: E731
    return HealSequence(seq.input_ids[:max_len], seq.prompt_len, seq.top1[:c], cut(seq.topk_ids),
                        cut(seq.topk_probs), cut(seq.leftover))


def generate_heal_data(target: Any, tokenizer: Any, options: HealOptions,
                       progress: Progress | None = None) -> HealData:
    """Self-distillation data: the target's continuations of the prompt set (live mode), and of
    `options.written_prompts` user turns the target writes itself (training only).

    Greedy by default (`data_temperature` 0), so a held-out continuation is the target's
    own greedy output and top-1 agreement on it equals greedy acceptance per token. The held-out
    sequences are always prompts of the set, never written ones.
    """
    from draftnas.prompts import encode_prompt, load_prompts, uses_chat_template
    from draftnas.traces import held_out

    started = time.perf_counter()
    prompts = load_prompts(options.prompts, per_domain=options.prompts_per_domain)
    excluded = set(options.exclude_prompts)
    prompts = tuple(p for p in prompts if p.id not in excluded)
    written = options.written_prompts
    if written and not uses_chat_template(tokenizer):
        log.info("the target has no chat template, so it writes no prompts of its own")
        written = 0
    total = len(prompts) + 2 * written  # a written prompt is generated, then answered
    report = (lambda done: progress(done, total)) if progress else None  # noqa: E731
    answered = _answer(target, tokenizer, [encode_prompt(tokenizer, p.text) for p in prompts], options,
                       seed_offset=0, report=report, done=0)
    train: list[HealSequence] = []
    heldout: list[HealSequence] = []
    for i, seq in enumerate(answered):
        if seq is not None:
            (heldout if held_out(i, options.heldout_every) else train).append(seq)
    n_written = 0
    if written:
        openings = [p.text for i, p in enumerate(prompts) if not held_out(i, options.heldout_every)]
        texts = written_prompts(target, tokenizer, openings, written, seed=options.seed, report=report,
                                done=len(prompts))
        answers = _answer(target, tokenizer, [encode_prompt(tokenizer, t) for t in texts], options,
                          seed_offset=len(prompts), report=report, done=len(prompts) + written)
        kept = [seq for seq in answers if seq is not None]
        train += kept
        n_written = len(kept)
        if progress:
            progress(total, total)
    if not train or not heldout:
        raise InvalidInputError(f"prompt set {options.prompts!r} gave too few continuations to heal on")
    return HealData(train, heldout, "live", build_s=time.perf_counter() - started, n_written=n_written)


#: How the target writes prompts of its own: each user turn opens with the first words of a prompt
#: of the set, and the target goes on sampling at temperature 1 until it closes the turn.
WRITTEN_OPENING_WORDS = 3
WRITTEN_MAX_TOKENS = 64
#: Sequences decoded together while making data: on the 2-core AMD EPYC host, 32 rows make 1.3x the
#: tokens per second of 16 (170 against 128 tok/s, SmolLM2-135M, 48 new tokens, 2 threads).
DATA_BATCH = 32


def written_prompts(target: Any, tokenizer: Any, openings: Sequence[str], n: int, *, seed: int = 0,
                    report: Callable[[int], None] | None = None, done: int = 0) -> list[str]:
    """`n` user messages written by the target itself (chat models only): message i opens with the
    first WRITTEN_OPENING_WORDS words of `openings[i % len(openings)]` and the target completes it,
    sampled at temperature 1 from its own distribution, so the data follows the workload's kind of
    request without reusing any text of it. Messages the target does not close within
    WRITTEN_MAX_TOKENS tokens, and repeats, are dropped (so fewer than `n` may come back)."""
    from draftnas.prompts import user_turn_opening

    if not openings:
        raise InvalidInputError("writing prompts needs at least one prompt of the set to open them")
    heads = [" ".join(openings[i % len(openings)].split()[:WRITTEN_OPENING_WORDS]) for i in range(n)]
    decoded = _decode_all(target, tokenizer, [user_turn_opening(tokenizer, h) for h in heads],
                          temperature=1.0, max_new_tokens=WRITTEN_MAX_TOKENS, top_k=1, seed=seed + 7_919,
                          offset=0, report=report, done=done)
    texts: list[str] = []
    seen: set[str] = set()
    for head, d in zip(heads, decoded, strict=True):
        if not d.ended_with_eos:
            continue
        text = (head + tokenizer.decode(d.continuation[:-1], skip_special_tokens=True)).strip()
        if len(text.split()) > WRITTEN_OPENING_WORDS and text not in seen:
            seen.add(text)
            texts.append(text)
    log.info("the target wrote %d usable prompts of %d asked", len(texts), n)
    return texts


def _answer(target: Any, tokenizer: Any, encoded: Sequence[list[int]], options: HealOptions, *,
            seed_offset: int, report: Callable[[int], None] | None, done: int) -> list[HealSequence | None]:
    """The target's continuation of each encoded prompt, in order (None where it wrote nothing)."""
    decoded = _decode_all(target, tokenizer, encoded, temperature=options.data_temperature,
                          max_new_tokens=options.max_new_tokens, top_k=max(1, options.teacher_topk),
                          seed=options.seed, offset=seed_offset, report=report, done=done)
    out: list[HealSequence | None] = []
    for ids, d in zip(encoded, decoded, strict=True):
        if not d.continuation:
            out.append(None)
            continue
        seq = HealSequence(list(ids) + d.continuation, len(ids), d.topk_ids[:, 0].tolist())
        if options.teacher_topk:
            seq.topk_ids, seq.topk_probs, seq.leftover = d.topk_ids, d.topk_probs, d.leftover
        out.append(_truncate(seq, options.max_seq_len))
    return out


def _decode_all(target: Any, tokenizer: Any, encoded: Sequence[list[int]], *, temperature: float,
                max_new_tokens: int, top_k: int, seed: int, offset: int,
                report: Callable[[int], None] | None, done: int) -> list[Any]:
    """`traces.decode_batch` over `encoded`, DATA_BATCH rows at a time, row i sampled with its own
    generator (seed, offset + i); `report(done + rows decoded)` after each batch."""
    from draftnas.traces import decode_batch, eos_token_ids

    eos = eos_token_ids(target, tokenizer)
    out: list[Any] = []
    for start in range(0, len(encoded), DATA_BATCH):
        chunk = encoded[start:start + DATA_BATCH]
        out += decode_batch(target, chunk, temperature=temperature, max_new_tokens=max_new_tokens,
                            top_k=top_k, eos_ids=eos,
                            generators=_generators(seed, offset + start, len(chunk)))
        if report:
            report(done + start + len(chunk))
    return out


def _generators(seed: int, start: int, n: int) -> list[Any]:
    import torch

    return [torch.Generator().manual_seed(seed * 100_003 + start + j) for j in range(n)]


# --------------------------------------------------------------------------- batches and losses


@dataclass
class _Batch:
    input_ids: Any  # [B, T] right padded
    attention_mask: Any  # [B, T]
    positions: Any  # [N, 2] (row, position) of every prediction of a continuation token
    top1: Any  # [N]
    topk_ids: Any = None  # [N, K]
    topk_probs: Any = None  # [N, K]
    leftover: Any = None  # [N]


def _collate(seqs: Sequence[HealSequence], pad_id: int, with_topk: bool) -> _Batch:
    import torch

    width = max(len(s.input_ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    rows: list[int] = []
    cols: list[int] = []
    for r, s in enumerate(seqs):
        ids[r, :len(s.input_ids)] = torch.tensor(s.input_ids)
        mask[r, :len(s.input_ids)] = 1
        # the logits at position p predict token p + 1: continuation token t sits at prompt_len + t
        cols += range(s.prompt_len - 1, len(s.input_ids) - 1)
        rows += [r] * s.continuation_len
    batch = _Batch(ids, mask, torch.tensor([rows, cols]).T,
                   torch.tensor([t for s in seqs for t in s.top1], dtype=torch.long))
    if with_topk:
        batch.topk_ids = torch.cat([s.topk_ids for s in seqs]).long()
        batch.topk_probs = torch.cat([s.topk_probs for s in seqs]).float()
        batch.leftover = torch.cat([s.leftover for s in seqs]).float()
    return batch


def _selected_logits(model: Any, batch: _Batch) -> torch.Tensor:
    """Logits [N, V] at the batch's prediction positions only (the LM head skips prompt tokens),
    through `acceptance.head_logits` (float32, Gemma's soft-capping applied)."""
    from draftnas.acceptance import head_logits

    inner = getattr(model, "model", None)
    if inner is None or model.get_output_embeddings() is None:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return logits[batch.positions[:, 0], batch.positions[:, 1]].float()
    hidden = inner(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    return head_logits(model, hidden[batch.positions[:, 0], batch.positions[:, 1]])  # [N, V]


def _head_subset(model: Any) -> torch.Tensor | None:
    """Full ids of a reduced draft head's rows (draftnas.vocab.apply_vocab_subset), else None."""
    subset = getattr(model, "draft_vocab_subset", None)
    return None if subset is None else subset.head_to_full()


def _topk_to_head(model: Any, batch: _Batch) -> tuple[Any, ...]:
    """The batch's top-k teacher in the drafter's head rows: ids outside a reduced head's subset
    move their probability into the leftover bucket."""
    subset = getattr(model, "draft_vocab_subset", None)
    if subset is None:
        return batch.topk_ids, batch.topk_probs, batch.leftover, None
    rows = subset.full_to_head()[batch.topk_ids]  # [N, K], -1 outside
    inside = rows >= 0
    probs = batch.topk_probs * inside
    leftover = batch.leftover + (batch.topk_probs * ~inside).sum(-1)
    return rows.clamp(min=0), probs, leftover, inside


def kl_to_logits(drafter_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(softmax(target) || softmax(drafter)); inputs [N, V]."""
    import torch

    log_q = torch.log_softmax(drafter_logits, dim=-1)
    log_p = torch.log_softmax(target_logits, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def kl_to_topk(drafter_logits: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor,
               leftover: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean KL of the target's top-k + leftover bucket to the drafter's matching buckets.

    drafter_logits [N, V]; topk_ids / topk_probs [N, K]; leftover [N] (1 - sum of top-k).
    The drafter's leftover bucket is 1 - the drafter's mass on the same K ids.
    """
    import torch

    log_q = torch.log_softmax(drafter_logits, dim=-1)
    log_q_k = log_q.gather(1, topk_ids)  # [N, K]
    q_k = log_q_k.exp() if mask is None else log_q_k.exp() * mask  # mask: top-k ids the head has
    q_rest = (1.0 - q_k.sum(-1)).clamp(min=1e-8)
    p = topk_probs.clamp(min=0.0)
    eps = 1e-8
    kl_k = (p * (torch.log(p + eps) - log_q_k)).sum(-1)
    rest = leftover.clamp(min=0.0)
    kl_rest = rest * (torch.log(rest + eps) - torch.log(q_rest))
    return (kl_k + kl_rest).mean()


# --------------------------------------------------------------------------- readings


def measure_agreement(model: Any, seqs: Sequence[HealSequence], *, gamma: int = 4,
                      pad_id: int = 0, batch_size: int = 8) -> tuple[float, float, int]:
    """(top-1 agreement, greedy tokens per step at `gamma`, positions) over held-out sequences.

    Steps are `acceptance.greedy_steps`' replay of each continuation (the search's estimator)."""
    import numpy as np
    import torch

    from draftnas.acceptance import greedy_steps

    was_training = model.training
    model.eval()
    hits, total, tokens, steps = 0, 0, 0.0, 0
    with torch.no_grad():
        for start in range(0, len(seqs), batch_size):
            chunk = seqs[start:start + batch_size]
            batch = _collate(chunk, pad_id, with_topk=False)
            pred = _selected_logits(model, batch).argmax(-1)
            subset = _head_subset(model)
            if subset is not None:  # head rows -> full-vocabulary ids
                pred = subset[pred]
            agree = (pred == batch.top1).tolist()
            hits += sum(agree)
            total += len(agree)
            offset = 0
            for s in chunk:
                n = s.continuation_len
                steps += int(greedy_steps([np.asarray(agree[offset:offset + n], dtype=float)], gamma, n)[0])
                tokens += n
                offset += n
    model.train(was_training)
    return hits / max(total, 1), tokens / max(steps, 1), total


# --------------------------------------------------------------------------- training


def trainable_parameters(drafter: Any, train: str) -> list[tuple[str, Any]]:
    """(name, parameter) pairs healing updates; everything else gets requires_grad False."""
    named = list(drafter.named_parameters())
    if train == "all":
        chosen = {n for n, _ in named}
    else:
        frozen_ids = {id(drafter.get_input_embeddings().weight)}
        head = drafter.get_output_embeddings()
        if head is not None and _head_subset(drafter) is None:  # a reduced head is untied: it trains
            frozen_ids.add(id(head.weight))
        chosen = {n for n, p in named if id(p) not in frozen_ids and (".layers." in n or "norm" in n)}
        if head is not None and _head_subset(drafter) is not None:
            chosen |= {n for n, p in named if p is head.weight}
    out = []
    for name, param in named:
        param.requires_grad_(name in chosen)
        if name in chosen:
            out.append((name, param))
    return out


def _lr_lambda(options: HealOptions) -> Callable[[int], float]:
    warmup = options.warmup_steps if options.warmup_steps is not None else max(1, options.steps // 10)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, options.steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


def _batch_indices(options: HealOptions, step: int, n: int) -> list[int]:
    """Sequences of step `step`: an epoch-wise permutation seeded by (seed, epoch): resumable."""
    import torch

    out = []
    for j in range(options.batch_size):
        k = step * options.batch_size + j
        epoch, within = divmod(k, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(options.seed * 7919 + epoch))
        out.append(int(perm[within]))
    return out


@dataclass
class _RunState:
    step: int = 0
    train_s: float = 0.0
    trained_tokens: int = 0
    readings: list[HealReading] = field(default_factory=list)


def _state_key(drafter: Any, options: HealOptions, data: HealData) -> str:
    opts = options.to_dict()
    for volatile in ("eval_every", "checkpoint_every", "max_seconds"):
        opts.pop(volatile)
    payload = json.dumps([opts, drafter.config.to_dict(), data.fingerprint()], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _save_state(folder: Path, key: str, params: list[tuple[str, Any]], optimizer: Any,
                scheduler: Any, run: _RunState) -> None:
    import torch

    state = {"key": key, "step": run.step, "train_s": run.train_s, "trained_tokens": run.trained_tokens,
             "readings": [r.to_dict() for r in run.readings],
             "params": {n: p.detach().clone() for n, p in params},
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    tmp = folder / (STATE_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, folder / STATE_FILE)


def _load_state(folder: Path, key: str, params: list[tuple[str, Any]], optimizer: Any,
                scheduler: Any) -> _RunState | None:
    import torch

    path = folder / STATE_FILE
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=False)
    if state.get("key") != key:
        raise InvalidInputError(f"checkpoint {path} belongs to another drafter, data or options; "
                                "pass a fresh --checkpoint folder (or delete it) to start over")
    with torch.no_grad():
        for name, param in params:
            param.copy_(state["params"][name])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return _RunState(state["step"], state["train_s"], state["trained_tokens"],
                     [HealReading.from_dict(r) for r in state["readings"]])


def _load_or_make_data(teacher: Any, tokenizer: Any, options: HealOptions, folder: Path | None,
                       data: HealData | None, data_progress: Progress | None) -> HealData:
    import torch

    if data is not None:
        return data
    if _is_traces(teacher):
        return data_from_traces(teacher, options)
    if tokenizer is None:
        raise InvalidInputError("healing toward a live target needs its tokenizer (tokenizer=) "
                                "to encode the self-distillation prompts")
    cached = folder / DATA_FILE if folder is not None else None
    if cached is not None and cached.is_file():
        saved = torch.load(cached, weights_only=False)
        if saved.get("options") == _data_options(options):
            return HealData(**saved["data"])
    made = generate_heal_data(teacher, tokenizer, options, data_progress)
    if cached is not None:
        tmp = cached.with_name(DATA_FILE + ".tmp")
        torch.save({"options": _data_options(options), "data": made.__dict__}, tmp)
        os.replace(tmp, cached)
    return made


def _data_options(options: HealOptions) -> dict[str, Any]:
    keep = ("prompts", "prompts_per_domain", "exclude_prompts", "max_new_tokens", "data_temperature",
            "written_prompts", "teacher_topk", "heldout_every", "max_seq_len", "seed")
    return {k: getattr(options, k) for k in keep}


def _is_traces(teacher: Any) -> bool:
    return hasattr(teacher, "records") and hasattr(teacher, "metadata")


def _pad_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None) if tokenizer is not None else None
        if value is not None:
            return int(value)
    return 0


def heal(
    drafter: Any,
    teacher: Any,
    options: HealOptions | None = None,
    *,
    tokenizer: Any = None,
    data: HealData | None = None,
    checkpoint_dir: str | Path | None = None,
    progress: Progress | None = None,
    on_reading: Callable[[HealReading], None] | None = None,
    data_progress: Progress | None = None,
) -> HealResult:
    """Distill `drafter` (trained in place) toward `teacher`: a target model or loaded `Traces`.

    `progress(step, steps)` after every optimizer step; `on_reading` at each held-out
    reading. With `checkpoint_dir`, state is saved every `checkpoint_every` steps and at
    the end, and a run with the same drafter, data and options resumes from it.
    """
    import torch

    options = options or HealOptions()
    options.validate()
    folder = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    live = not _is_traces(teacher)
    if not live and getattr(teacher, "metadata", None) is not None:
        _check_traces_vocab(drafter, teacher)
    data = _load_or_make_data(teacher, tokenizer, options, folder, data, data_progress)
    pad = _pad_id(tokenizer)
    params = trainable_parameters(drafter, options.train)
    optimizer = torch.optim.AdamW([p for _, p in params], lr=options.lr,
                                  weight_decay=options.weight_decay, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(options))
    key = _state_key(drafter, options, data)
    run = (_load_state(folder, key, params, optimizer, scheduler) if folder else None) or _RunState()
    resumed = run.step
    if not run.readings:
        run.readings.append(_reading(drafter, data, options, pad, 0, 0.0, None))
        if on_reading:
            on_reading(run.readings[-1])
    forward = live and not options.teacher_topk  # run the target at every step
    if not forward and any(s.topk_ids is None for s in data.train):
        raise InvalidInputError("teacher_topk healing needs data generated with teacher_topk (it carries "
                                "the target's top-k); this data has none")
    if teacher is not None and forward:
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
    _train(drafter, teacher if forward else None, data, options, params, optimizer, scheduler, run,
           folder, key, pad, progress, on_reading)
    return _result(drafter, data, options, params, run, resumed,
                   "traces" if not live else "live" if forward else f"target top-{options.teacher_topk}")


def _check_traces_vocab(drafter: Any, traces: Any) -> None:
    from draftnas.traces import check_compatible

    check_compatible(traces, vocab_size=int(drafter.get_input_embeddings().weight.shape[0]))


def _reading(drafter: Any, data: HealData, options: HealOptions, pad: int, step: int,
             train_s: float, loss: float | None) -> HealReading:
    top1, tps, _ = measure_agreement(drafter, data.heldout, gamma=options.gamma, pad_id=pad)
    log.info("heal step %d: top-1 %.4f, tokens/step(g=%d) %.3f", step, top1, options.gamma, tps)
    return HealReading(step=step, train_s=round(train_s, 3), loss=loss, top1_agreement=top1,
                       tokens_per_step=tps)


def _train(drafter: Any, target: Any, data: HealData, options: HealOptions, params: list,
           optimizer: Any, scheduler: Any, run: _RunState, folder: Path | None, key: str, pad: int,
           progress: Progress | None, on_reading: Callable[[HealReading], None] | None) -> None:
    import torch

    drafter.train()
    losses: list[float] = []
    if progress:
        progress(run.step, options.steps)
    while run.step < options.steps:
        if options.max_seconds is not None and run.train_s >= options.max_seconds:
            log.info("heal: stopping at step %d, time budget %.0f s spent", run.step, options.max_seconds)
            break
        started = time.perf_counter()
        seqs = [data.train[i] for i in _batch_indices(options, run.step, len(data.train))]
        batch = _collate(seqs, pad, with_topk=target is None)
        logits = _selected_logits(drafter, batch)
        if target is not None:
            with torch.no_grad():
                target_logits = _selected_logits(target, batch)
            subset = _head_subset(drafter)
            if subset is not None:  # a reduced head: KL to the target renormalized over the subset
                target_logits = target_logits[:, subset]
            loss = kl_to_logits(logits, target_logits)
        else:
            loss = kl_to_topk(logits, *_topk_to_head(drafter, batch))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        optimizer.step()
        scheduler.step()
        run.step += 1
        run.train_s += time.perf_counter() - started
        run.trained_tokens += int(batch.positions.shape[0])
        losses.append(float(loss.detach()))
        _after_step(drafter, data, options, params, optimizer, scheduler, run, folder, key, pad,
                    losses, progress, on_reading)
    drafter.eval()
    if run.readings[-1].step != run.step:
        run.readings.append(_reading(drafter, data, options, pad, run.step, run.train_s,
                                     _mean(losses[-10:])))
        if on_reading:
            on_reading(run.readings[-1])
    if folder is not None:
        _save_state(folder, key, params, optimizer, scheduler, run)


def _after_step(drafter: Any, data: HealData, options: HealOptions, params: list, optimizer: Any,
                scheduler: Any, run: _RunState, folder: Path | None, key: str, pad: int,
                losses: list[float], progress: Progress | None,
                on_reading: Callable[[HealReading], None] | None) -> None:
    if options.eval_every and run.step % options.eval_every == 0 and run.step < options.steps:
        run.readings.append(_reading(drafter, data, options, pad, run.step, run.train_s,
                                     _mean(losses[-options.eval_every:])))
        if on_reading:
            on_reading(run.readings[-1])
        drafter.train()
    if folder is not None and run.step % options.checkpoint_every == 0:
        _save_state(folder, key, params, optimizer, scheduler, run)
    if progress:
        progress(run.step, options.steps)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _result(drafter: Any, data: HealData, options: HealOptions, params: list, run: _RunState,
            resumed: int, teacher: str) -> HealResult:
    before, after = run.readings[0], run.readings[-1]
    minutes = run.train_s / 60.0
    positions = sum(s.continuation_len for s in data.heldout)
    return HealResult(
        teacher=teacher, steps=run.step, resumed_from_step=resumed, train_s=round(run.train_s, 3),
        data_s=round(data.build_s, 3), top1_before=before.top1_agreement,
        top1_after=after.top1_agreement, tokens_per_step_before=before.tokens_per_step,
        tokens_per_step_after=after.tokens_per_step, gamma=options.gamma,
        top1_rise_per_minute=(after.top1_agreement - before.top1_agreement) / minutes if minutes else 0.0,
        n_train_sequences=len(data.train), n_written_sequences=data.n_written,
        n_heldout_sequences=len(data.heldout),
        n_heldout_positions=positions, trained_tokens=run.trained_tokens,
        trainable_parameters=sum(p.numel() for _, p in params),
        readings=tuple(run.readings), options=options,
        trained_prompts=tuple(sorted({prompt_key(s.input_ids[:s.prompt_len]) for s in data.train})),
    )


__all__ = [
    "HealData", "HealOptions", "HealReading", "HealResult", "HealSequence", "data_from_traces",
    "generate_heal_data", "heal", "kl_to_logits", "kl_to_topk",
    "measure_agreement", "prompt_key", "trainable_parameters",
]
