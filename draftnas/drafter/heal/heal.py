"""Healing: knowledge distillation of a pruned drafter toward its target.

Two teachers:

- a live target model: KL(target || drafter) over the full vocabulary at every
  position that predicts a target-generated token (one target forward per step);
- `Traces` (draftnas.acceptance.traces): KL to the stored top-k probabilities plus the
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
from typing import Any

import torch

from draftnas.acceptance.traces import check_compatible
from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import require_device
from draftnas.core.options import option_error
from draftnas.core.records import Progress
from draftnas.drafter.heal.adapters import attach_low_rank, is_adapter, merge_low_rank
from draftnas.drafter.heal.heal_data import HealData, is_traces, load_or_make_data, pad_id
from draftnas.drafter.heal.heal_records import HealOptions, HealReading, HealResult, prompt_key
from draftnas.drafter.heal.losses import (
    collate,
    head_subset,
    kl_to_logits,
    kl_to_topk,
    measure_agreement,
    selected_logits,
    topk_to_head,
)

log = logging.getLogger(__name__)
STATE_FILE = "heal-state.pt"


def trainable_parameters(drafter: Any, train: str, only_layers: Sequence[int] = ()) -> list[tuple[str, Any]]:
    """(name, parameter) pairs healing updates; everything else gets requires_grad False. `only_layers`:
    of the decoder layers, only these positions train (with "layers")."""
    named = list(drafter.named_parameters())
    if train == "all":
        chosen = {n for n, _ in named}
    elif train == "lowrank":  # the adapters `attach_low_rank` put on (and the final norm)
        chosen = {n for n, _ in named if is_adapter(n) or (".layers." not in n and "norm" in n)}
    else:
        frozen_ids = {id(drafter.get_input_embeddings().weight)}
        head = drafter.get_output_embeddings()
        if head is not None and head_subset(drafter) is None:  # a reduced head is untied: it trains
            frozen_ids.add(id(head.weight))
        keys = tuple(f".layers.{i}." for i in only_layers)

        def trains(name: str) -> bool:  # a decoder layer's weight (of `only_layers`), or the final norm
            if ".layers." in name:
                return not keys or any(k in name for k in keys)
            return "norm" in name

        chosen = {n for n, p in named if id(p) not in frozen_ids and trains(n)}
        if head is not None and head_subset(drafter) is not None:
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
    for volatile in ("eval_every", "checkpoint_every", "max_seconds", "device"):
        opts.pop(volatile)
    if options.train != "lowrank":  # the rank changes nothing else: earlier runs keep their key
        opts.pop("rank")
    payload = json.dumps([opts, drafter.config.to_dict(), data.fingerprint()], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _save_state(folder: Path, key: str, params: list[tuple[str, Any]], optimizer: Any,
                scheduler: Any, run: _RunState) -> None:

    state = {"key": key, "step": run.step, "train_s": run.train_s, "trained_tokens": run.trained_tokens,
             "readings": [r.to_dict() for r in run.readings],
             "params": {n: p.detach().clone() for n, p in params},
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    tmp = folder / (STATE_FILE + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, folder / STATE_FILE)


def _load_state(folder: Path, key: str, params: list[tuple[str, Any]], optimizer: Any,
                scheduler: Any) -> _RunState | None:

    path = folder / STATE_FILE
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=False, map_location=params[0][1].device if params else "cpu")
    if state.get("key") != key:
        raise option_error("checkpoint", f"{path} belongs to another drafter, data or options: give a fresh "
                                         "folder (or delete it) to start over")
    with torch.no_grad():
        for name, param in params:
            param.copy_(state["params"][name])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return _RunState(state["step"], state["train_s"], state["trained_tokens"],
                     [HealReading.from_dict(r) for r in state["readings"]])


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

    options = options or HealOptions()
    options.validate()
    require_device(options.device)
    drafter.to(options.device)
    folder = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    live = not is_traces(teacher)
    if live and teacher is not None:
        teacher.to(options.device)
    if not live and getattr(teacher, "metadata", None) is not None:
        _check_traces_vocab(drafter, teacher)
    data = load_or_make_data(teacher, tokenizer, options, folder, data, data_progress)
    pad = pad_id(tokenizer)
    if options.train == "lowrank":
        attach_low_rank(drafter, options.rank, options.only_layers, options.seed)
    params = trainable_parameters(drafter, options.train, options.only_layers)
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
    try:
        _train(drafter, teacher if forward else None, data, options, params, optimizer, scheduler, run,
               folder, key, pad, progress, on_reading)
    finally:  # a low-rank update folded into its weight: the drafter's shape is unchanged
        merge_low_rank(drafter)
    return _result(drafter, data, options, params, run, resumed,
                   "traces" if not live else "live" if forward else f"target top-{options.teacher_topk}")


def _check_traces_vocab(drafter: Any, traces: Any) -> None:
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
        batch = collate(seqs, pad, with_topk=target is None).to(options.device)
        logits = selected_logits(drafter, batch)
        if target is not None:
            with torch.no_grad():
                target_logits = selected_logits(target, batch)
            subset = head_subset(drafter)
            if subset is not None:  # a reduced head: KL to the target renormalized over the subset
                target_logits = target_logits[:, subset.to(target_logits.device)]
            loss = kl_to_logits(logits, target_logits)
        else:
            loss = kl_to_topk(logits, *topk_to_head(drafter, batch))
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
