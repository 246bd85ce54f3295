"""Building a drafter: the one way a plan becomes a model.

`plan_drafter` measures importance on the base's weights (`prune.plan_pruning`) and, for a
reduced draft head, chooses its rows from the target's traces; the kept ids go into the
plan, so the plan alone (with the base) replays the drafter. `build_drafter` applies a plan
(`prune.apply_plan`: layers, widths, head), heals it toward a teacher
(`distill.heal`), and estimates its acceptance on held-out traces
(`acceptance.estimate_acceptance`). The search's evaluator, `draftnas export`, `draftnas
heal` and e2e all build drafters here; `heal_options` is the one place a budget becomes
`HealOptions`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from draftnas.acceptance.estimate import BodyMemo, estimate_acceptance
from draftnas.acceptance.traces import Traces as TracesClass
from draftnas.core.errors import InvalidInputError
from draftnas.core.records import Progress
from draftnas.drafter.heal.heal import heal as run_heal
from draftnas.drafter.heal.heal_data import HealData
from draftnas.drafter.heal.heal_records import HealOptions, HealReading, HealResult, prompt_key
from draftnas.drafter.prune.plan import plan_pruning
from draftnas.drafter.prune.stats import StatsMemo
from draftnas.drafter.prune.surgery import apply_plan
from draftnas.drafter.records import BuiltDrafter, PlanOptions, PruningPlan
from draftnas.drafter.vocab import subset_from_traces
from draftnas.models.ggml_quants import round_model
from draftnas.models.linears import route_linears
from draftnas.models.records import GGUF_WEIGHTS, TORCH_DTYPES, quantized

if TYPE_CHECKING:
    from draftnas.acceptance.traces import Traces
    from draftnas.models.sources import LoadedModel


log = logging.getLogger(__name__)


def heal_options(*, steps: int, batch_size: int, lr: float, seq_len: int, seed: int, n_records: int,
                 max_seconds: float | None = None, gamma: int = 4, device: str = "cpu") -> HealOptions | None:
    """A search or e2e healing budget as `HealOptions` (None for 0 steps: no healing).

    Trace teachers are small (a few dozen records): healing's own held-out readings take every
    `min(4, n_records)`-th record (at least every 2nd) so some records are left to train on."""
    if steps <= 0:
        return None
    return HealOptions(steps=steps, batch_size=batch_size, lr=lr, eval_every=0, max_seq_len=seq_len,
                       max_seconds=max_seconds, seed=seed, heldout_every=max(2, min(4, n_records)),
                       gamma=gamma, device=device)


def plan_drafter(base: LoadedModel, options: PlanOptions, *, head_rows: int = 0,
                 vocab_traces: Traces | None = None, source: str = "", memo: StatsMemo | None = None
                 ) -> PruningPlan:
    """The plan for `options` measured on `base`, with a reduced head of `head_rows` rows (the
    target's most frequent tokens in `vocab_traces`, plus special tokens) when `head_rows` > 0.
    `memo`: the base's importance statistics kept across plans (`StatsMemo`)."""

    plan = plan_pruning(base.model, options, tokenizer=base.tokenizer, memo=memo)
    return choose_head(plan, head_rows, vocab_traces, base.tokenizer, source=source)


def choose_head(plan: PruningPlan, head_rows: int, traces: Traces | None, tokenizer: Any = None, *,
                source: str = "") -> PruningPlan:
    """`plan` with a reduced draft head of `head_rows` rows: the target's most frequent tokens in
    `traces` plus special tokens (`vocab.subset_from_traces`); the base's head for 0 rows."""
    if not head_rows:
        return replace(plan, vocab=None)
    if traces is None:
        raise InvalidInputError(f"a {head_rows}-row draft head is chosen from the target's traces; "
                                "none were given")

    return replace(plan, vocab=subset_from_traces(traces, head_rows, tokenizer, source=source))


def build_drafter(plan: PruningPlan, base: LoadedModel, *, heal: HealOptions | None = None,
                  teacher: Any = None, data: HealData | None = None, held: Traces | None = None,
                  max_gamma: int = 8, temperature: float = 0.0, p_mins: Sequence[float] = (0.0,),
                  checkpoint_dir: str | Path | None = None,
                  progress: Progress | None = None, data_progress: Progress | None = None,
                  on_reading: Callable[[HealReading], None] | None = None,
                  dtype: str | None = None, weights: str = "dense", body: BodyMemo | None = None
                  ) -> BuiltDrafter:
    """apply the plan to `base` -> heal toward `teacher` (traces or a live model; skipped when
    `heal` is None) -> cast to `dtype` (the dtype it will draft in; None keeps the base's) ->
    estimate acceptance on `held` traces (skipped when None), with its linear layers multiplied in
    int8/int4 as `weights` says ("int8", "int4", per layer group: how it will draft; the model returned
    keeps its dense weights), or
    with its matrices rounded in place as a GGUF of that type stores them (`weights` Q8_0, Q4_0).

    `data`: heal data already built from the same teacher (the search reuses it across trials).
    Deterministic for a given plan, base, teacher and options: the plan carries every index,
    the reduced head's ids included. `body`: the hidden states of the last unhealed drafter estimated
    on these `held` records: reused where this drafter differs from it only in its head (`body_key`: the
    stock drafter under each head size makes one pass), else replaced by this one's; unused when healed.
    """

    drafter = apply_plan(base.model, plan)
    result = None
    if heal is not None:
        if teacher is None:
            raise InvalidInputError("healing needs a teacher: the target's traces or the target model")

        result = run_heal(drafter, teacher, heal, tokenizer=base.tokenizer, data=data,
                          checkpoint_dir=checkpoint_dir, progress=progress, data_progress=data_progress,
                          on_reading=on_reading)
    drafter.eval()
    if dtype is not None:
        drafter.to(getattr(torch, TORCH_DTYPES[dtype]))
    estimate = None
    if held is not None and result is not None:
        held = unseen_records(held, result)
    if weights in GGUF_WEIGHTS:  # a GGUF drafter: its matrices as the file stores them
        round_model(drafter, weights)
    if held is not None and held.records:
        routing = route_linears(drafter, attach=False, own_weights=False, weights=weights) \
            if quantized(weights) else contextlib.nullcontext()
        with routing:
            if body is not None and heal is None and body.key != (key := body_key(plan, weights, dtype)):
                body.key, body.hidden = key, {}
            estimate = estimate_acceptance(drafter, held, max_gamma=max_gamma, temperature=temperature,
                                           p_mins=p_mins, body=body if heal is None else None)
    parameters = sum(p.numel() for p in {id(p): p for p in drafter.parameters()}.values())
    return BuiltDrafter(plan=plan, heal=result, estimate=estimate, parameters=parameters, model=drafter)


def body_key(plan: PruningPlan, weights: str, dtype: str | None) -> str:
    """What decides an unhealed drafter's hidden states: its plan without the head, its weights and dtype
    (a per-layer format is named whole, head included: a conservative key)."""
    return json.dumps([replace(plan, vocab=None).to_dict(), weights, dtype], sort_keys=True)


def unseen_records(traces: Traces, heal: HealResult) -> Traces:
    """`traces` without the records whose prompt `heal` trained on: a drafter is never scored on the
    text it was distilled on, whichever teacher's data that text came from."""

    trained = set(heal.trained_prompts)
    kept = [r for r in traces.records if prompt_key(r.prompt_ids.tolist()) not in trained]
    if len(kept) < len(traces.records):
        log.info("acceptance estimate: %d of %d trace records left out (healing trained on their prompts)",
                 len(traces.records) - len(kept), len(traces.records))
    return TracesClass(metadata=traces.metadata, records=kept)
