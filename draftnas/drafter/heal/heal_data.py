"""Healing data: self-distillation sequences, the target's own continuations of the prompt
set (and of prompts it writes itself), or trace records; cached beside a checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from draftnas.acceptance.records import held_out
from draftnas.acceptance.traces import eos_token_ids
from draftnas.acceptance.tracing import decode_batch
from draftnas.core.errors import InvalidInputError, TraceError
from draftnas.core.prompts import encode_prompt, load_prompts, user_turn_opening, uses_chat_template
from draftnas.core.records import Progress
from draftnas.drafter.heal.heal_records import HealOptions

log = logging.getLogger(__name__)


DATA_FILE = "heal-data.pt"


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


def data_from_traces(traces: Any, options: HealOptions) -> HealData:
    """Held-out split of trace records (`traces.held_out` every `heldout_every`-th) into HealSequences."""

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
    return [torch.Generator().manual_seed(seed * 100_003 + start + j) for j in range(n)]


def load_or_make_data(teacher: Any, tokenizer: Any, options: HealOptions, folder: Path | None,
                       data: HealData | None, data_progress: Progress | None) -> HealData:

    if data is not None:
        return data
    if is_traces(teacher):
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


def is_traces(teacher: Any) -> bool:
    return hasattr(teacher, "records") and hasattr(teacher, "metadata")


def pad_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attr, None) if tokenizer is not None else None
        if value is not None:
            return int(value)
    return 0
