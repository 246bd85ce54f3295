"""Evaluators: how a candidate gets its acceptance — assumed (a prior), or measured by
building the drafter from the base's real weights (`build.build_drafter`) and replaying it
on held-out target traces.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from draftnas.acceptance.estimate import BodyMemo, estimate_acceptance
from draftnas.acceptance.traces import load_traces, split_traces
from draftnas.core.errors import InfeasibleCandidateError
from draftnas.core.registry import Architecture
from draftnas.drafter.build import build_drafter, heal_options, plan_drafter
from draftnas.drafter.heal.heal_data import data_from_traces
from draftnas.drafter.loading import load_drafter
from draftnas.drafter.prune.stats import StatsMemo
from draftnas.drafter.records import PlanOptions
from draftnas.models.records import TORCH_DTYPES, quantized
from draftnas.models.sources import load_model
from draftnas.search.alpha import AlphaModel, drafter_features
from draftnas.search.records import AcceptanceReading, Candidate
from draftnas.search.scoring import assumed_acceptance, measured_acceptance
from draftnas.search.space import HealBudget, SearchSpace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    """What evaluating a candidate yields: the candidate (with its real plan) and its acceptance."""

    candidate: Candidate
    acceptance: AcceptanceReading


class Evaluator(Protocol):
    """Turns a candidate into an acceptance reading. `measured` = it really runs a drafter; `builds` = it
    builds each drafter from the base's weights, so the stock drafter's hand-made variants are priced too
    (`search.hand_made`) and `heal` (a budget's healing instead of the space's) heals the drafter."""

    measured: bool
    builds: bool

    def evaluate(self, candidate: Candidate, heal: HealBudget | None = None) -> Evaluation: ...


class PriorEvaluator:
    """Latency-only search: every candidate gets the acceptance the user assumed."""

    measured = False
    builds = False

    def __init__(self, acceptance_rate: float) -> None:
        self.reading = assumed_acceptance(acceptance_rate)

    def evaluate(self, candidate: Candidate, heal: HealBudget | None = None) -> Evaluation:
        """The assumed acceptance (nothing is built, so there is nothing to `heal`)."""
        return Evaluation(candidate=candidate, acceptance=self.reading)


class ModelEvaluator:
    """Acceptance from an alpha(drafter) model fitted on measured pairs (`draftnas.search.alpha`): each
    candidate's features relative to the base, at `heal_steps` of healing. With an anchor
    (reference candidate, alpha), the model's level is shifted in logit so the reference gets that
    alpha: the model then supplies only how acceptance differs between drafters."""

    measured = False
    builds = False

    def __init__(self, model: AlphaModel, base_arch: Architecture, heal_steps: int, domain: str | None = None,
                 anchor: tuple[Candidate, float] | None = None) -> None:
        self.model, self.base_arch, self.heal_steps, self.domain = model, base_arch, heal_steps, domain
        self.shift = 0.0
        if anchor is not None:
            reference, alpha = anchor
            features = drafter_features(reference, base_arch, heal_steps)
            self.shift = math.log(alpha / (1 - alpha)) - model.log_odds(features, domain)

    def evaluate(self, candidate: Candidate, heal: HealBudget | None = None) -> Evaluation:
        """The model's alpha for `candidate` at its fitted `heal_steps` (nothing is built, so `heal` changes
        nothing); a drafter unlike every measured pair (a feature outside the fitted range) is refused as
        infeasible rather than extrapolated."""
        features = drafter_features(candidate, self.base_arch, self.heal_steps)
        outside = self.model.outside(features)
        if outside:
            raise InfeasibleCandidateError("the acceptance model was not fitted on drafters like this: "
                                           + "; ".join(outside))
        alpha = self.model.predict(features, self.domain, self.shift)
        return Evaluation(candidate=candidate,
                          acceptance=AcceptanceReading(kind="fitted", acceptance_rate=alpha))


class WeightsEvaluator:
    """Measured acceptance: prune the base's real weights, heal briefly, estimate on traces.

    The base is loaded once per process. Traces are split: every 3rd record is held out
    for the acceptance estimate, the rest teach the healing (so a drafter is never scored
    on the sequences it was distilled on). Importance (block influence, activations) is
    measured on a small calibration sample: the search re-plans for every trial.
    """

    measured = True
    builds = True
    calibration_sequences = 4
    calibration_seq_len = 96

    def __init__(self, base: str, base_arch: Architecture, traces_path: Path, space: SearchSpace,
                 seed: int = 0, dtype: str = "fp32", device: str = "cpu",
                 quant_dtype: str | None = None, heals: bool = False) -> None:
        self.base, self.dtype, self.device = base, dtype, device
        self.heals = heals or space.heal.steps > 0  # some evaluation heals (the trials', or within a budget)
        self.quant_dtype = quant_dtype or dtype  # quantized drafters' activations (bf16 beside fp32 targets)
        self.base_arch = base_arch
        self.traces_path = traces_path
        self.space = space
        self.seed = seed
        self._loaded: Any = None
        self._heal_traces: Any = None
        self._eval_traces: Any = None
        self._heal_data: Any = None
        self._body = BodyMemo()  # the last unhealed body scored on the held-out records
        self._stats = StatsMemo()  # the base's block influence (and activations), measured once

    def _setup(self) -> None:
        if self._loaded is not None:
            return

        torch.manual_seed(self.seed)
        # healing trains in fp32 (the drafter is cast to the run's dtype before it is estimated)
        dtype = "fp32" if self.heals else self.dtype
        self._loaded = load_model(self.base, dtype=TORCH_DTYPES[dtype], device=self.device)
        self._loaded.model.eval()
        traces = load_traces(self.traces_path).select(temperature=self.space.workload.temperature)
        self._eval_traces, self._heal_traces = split_traces(traces)

    def evaluate(self, candidate: Candidate, heal: HealBudget | None = None) -> Evaluation:
        """Plan, heal (with `heal`, default the space's budget) and estimate one candidate."""

        self._setup()
        started = time.perf_counter()
        a, choice, h = candidate.arch, candidate.choice, heal or self.space.heal
        plan = plan_drafter(self._loaded, PlanOptions(
            num_layers=a.num_hidden_layers, layer_selection=choice.layer_selection,
            num_attention_heads=a.num_attention_heads, num_key_value_heads=a.num_key_value_heads,
            intermediate_size=a.intermediate_size, base=self.base,
            calibration_sequences=self.calibration_sequences, calibration_seq_len=self.calibration_seq_len),
            head_rows=candidate.head_vocab_size or 0, vocab_traces=self._heal_traces,
            source=str(self.traces_path), memo=self._stats)
        options = heal_options(steps=h.steps, batch_size=h.batch_size, lr=h.learning_rate, seq_len=h.seq_len,
                               seed=self.seed, n_records=len(self._heal_traces.records),
                               max_seconds=h.max_seconds, device=self.device)
        if options is not None and h.train == "cut":  # only the layers next to a cut train
            options = replace(options, only_layers=plan.cut_neighbours())
        if options is not None and h.train == "lowrank":  # a low-rank update over the stack, merged after
            options = replace(options, train="lowrank")
        if options is not None and self._heal_data is None:  # the same data for every trial
            self._heal_data = data_from_traces(self._heal_traces, options)
        built = build_drafter(plan, self._loaded, heal=options, teacher=self._heal_traces,
                              data=self._heal_data, held=self._eval_traces, max_gamma=self.space.gamma.max,
                              p_mins=self.space.gamma.p_min, temperature=self.space.workload.temperature,
                              dtype=self.quant_dtype if quantized(choice.weights) else self.dtype,
                              weights=choice.weights, body=self._body)
        estimate = built.estimate
        assert estimate is not None
        reading = measured_acceptance(estimate, built.heal, round(time.perf_counter() - started, 3))
        arch = plan.architecture(self.base_arch).with_shape(name=candidate.arch.name)
        return Evaluation(candidate=candidate.with_plan(plan, arch), acceptance=reading)

    def evaluate_reference(self, candidate: Candidate) -> Evaluation:
        """A drafter with weights of its own, as a user runs it (no pruning, no healing): its
        acceptance on the same held-out trace records the trials are scored on."""
        self._setup()
        started = time.perf_counter()
        loaded = load_drafter(candidate.name, dtype=TORCH_DTYPES[self.dtype], device=self.device)
        estimate = estimate_acceptance(loaded.model, self._eval_traces, max_gamma=self.space.gamma.max,
                                       temperature=self.space.workload.temperature,
                                       p_mins=self.space.gamma.p_min)
        del loaded
        seconds = round(time.perf_counter() - started, 3)
        return Evaluation(candidate=candidate, acceptance=measured_acceptance(estimate, None, seconds))
