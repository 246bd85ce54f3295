"""The records of a bench's fidelity check (`bench.fidelity`, `bench.terms`): each drafter's measured
step terms, the search's prediction for it, and the decomposition of the error between them."""

from __future__ import annotations

from dataclasses import dataclass

from draftnas.core.records import Record


@dataclass(frozen=True)
class MeasuredTerms(Record):
    """Each latency of the model, measured alone (median ms over repeats) at one context length.

    verify_ms[str(g)]: the target over g + 1 new tokens; prefill_*_ms: one pass over the
    mean prompt (the analytical model ignores prefill).
    """

    context_tokens: int
    draft_ms: float
    target_ms: float
    verify_ms: dict[str, float]
    prefill_target_ms: float
    prefill_draft_ms: float
    prompt_tokens: int
    repeats: int


@dataclass(frozen=True)
class Prediction(Record):
    """The analytical model's figures for one drafter at one gamma (latencies from the profile)."""

    gamma: int
    tokens_per_step: float
    draft_ms: float
    verify_ms: float
    target_ms: float
    tokens_per_s: float
    speedup: float


@dataclass(frozen=True)
class Measured(Record):
    """Medians over repeats of the bench at one gamma."""

    gamma: int
    target_tokens_per_s: float
    tokens_per_s: float
    speedup: float
    speedup_spread: tuple[float, float]
    tokens_per_step: float
    mean_accepted_per_step: float
    bench_estimate_tokens_per_step: float | None
    lossless: bool | None
    repeats: int
    step_ms: float  # per speculative step, prefill removed
    target_token_ms: float  # per token of the target alone, prefill removed
    drafted_per_step: float


@dataclass(frozen=True)
class Decomposition(Record):
    """Predicted speedup with the model's terms replaced by measurements one at a time.

    Each `delta_*` is the change in predicted speedup that term's measurement makes;
    `overhead` is what remains (prefill, the Python loop, cache crops, generate()).
    """

    gamma: int
    predicted: float
    with_acceptance: float
    with_draft: float
    with_verify: float
    with_target: float
    measured: float
    delta_acceptance: float
    delta_draft: float
    delta_verify: float
    delta_target: float
    delta_overhead: float
    loop_overhead_ms_per_step: float
    target_overhead_ms_per_token: float
    worst_term: str


@dataclass(frozen=True)
class Fidelity(Record):
    """Predicted vs measured speedup across drafters (target alone excluded)."""

    n_drafters: int
    mape_fixed_gamma: float
    mape_best_gamma: float
    spearman_fixed_gamma: float | None
    spearman_best_gamma: float | None
    worst_terms: dict[str, str]


@dataclass(frozen=True)
class DrafterRow(Record):
    name: str
    role: str
    layers: tuple[int, ...]
    shape: str
    parameters: int
    non_embedding_parameters: int
    folder: str | None
    heal_top1_before: float | None
    heal_top1_after: float | None
    estimate_tokens_per_step: dict[str, float]
    estimate_per_domain: dict[str, dict[str, float]]
    predicted_best_gamma: int
    predicted: dict[str, Prediction]  # str(gamma) -> at fixed and best gamma
    measured: dict[str, Measured]
    terms: MeasuredTerms | None
    decomposition: dict[str, Decomposition]
    measured_per_domain: dict[str, dict[str, float]]
    gpu_predicted_speedup: float | None = None
    same_as: str | None = None
