"""What `draftnas bench` is asked and measures, and the records of e2e's analysis (pure).
"""


from __future__ import annotations

from dataclasses import dataclass

from draftnas.core.errors import InvalidInputError
from draftnas.core.records import Record
from draftnas.models.records import ENGINES, TORCH_DTYPES

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class BenchOptions(Record):
    """`engine` None: "static" on CUDA (captured steps), "hf" on CPU."""

    gamma: int = 4
    temperature: float = 0.0
    max_new_tokens: int = 64
    seed: int = 0
    hf_assisted: bool = True
    # also run transformers with both models' linear layers routed (draftnas.models.linears; CPU only)
    hf_routed: bool = True
    estimate: bool = True
    top_k: int = 20
    device: str = "cpu"
    dtype: str = "fp32"
    engine: str | None = None
    # at most this many prompts per domain (evenly spaced), chosen after leaving out the prompts
    # the drafter was healed on (None: every prompt given that it was not healed on)
    per_domain: int | None = None

    def resolved_engine(self) -> str:
        return self.engine or ("static" if self.device == "cuda" else "hf")

    def validate(self) -> None:
        problems = []
        if self.device not in DEVICES:
            problems.append(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.dtype not in TORCH_DTYPES:
            problems.append(f"dtype must be one of {', '.join(TORCH_DTYPES)}, got {self.dtype!r}")
        if self.engine is not None and self.engine not in ENGINES:
            problems.append(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not 1 <= self.gamma <= 32:
            problems.append(f"gamma must be in [1, 32], got {self.gamma}")
        if not 0.0 <= self.temperature <= 10.0:
            problems.append(f"temperature must be in [0, 10], got {self.temperature:g}")
        if not 1 <= self.max_new_tokens <= 8192:
            problems.append(f"max_new_tokens must be in [1, 8192], got {self.max_new_tokens}")
        if self.per_domain is not None and self.per_domain < 1:
            problems.append(f"per_domain must be >= 1, got {self.per_domain}")
        if problems:
            raise InvalidInputError("; ".join(problems))


@dataclass(frozen=True)
class BenchPrompt(Record):
    """One prompt's runs. Times in seconds (prefill included); tokens are new tokens."""

    prompt_id: str
    domain: str
    prompt_tokens: int
    new_tokens: int
    target_s: float
    draftnas_s: float
    draftnas_tokens: int
    steps: int
    accepted: int
    drafted: int
    lossless: bool | None
    hf_assisted_s: float | None = None
    hf_assisted_tokens: int | None = None
    hf_steps: int | None = None
    hf_lossless: bool | None = None
    draft_s: float | None = None  # time inside the drafter in draftnas's loop
    hf_target_s: float | None = None  # transformers generate of the target alone (engine "static")
    first_divergence: int | None = None  # index of the first token the loop's output departs at
    divergence_margin: float | None = None  # target's top-1 minus top-2 logit there (own greedy run)
    # transformers with route_linears on both models: the target alone, then assisted generation
    hf_routed_target_s: float | None = None
    hf_routed_target_tokens: int | None = None
    hf_routed_s: float | None = None
    hf_routed_tokens: int | None = None
    hf_routed_steps: int | None = None
    hf_routed_lossless: bool | None = None  # equal to the routed target's own greedy output


@dataclass(frozen=True)
class BenchResult(Record):
    """Measured tokens/s of the three decoders and tokens per step, beside the estimate.

    tokens_per_step = new tokens / target verification passes of draftnas's loop;
    mean_accepted_per_step = accepted drafts / steps; lossless = greedy output equal to
    the target's on every prompt (None when sampling).
    """

    target: str
    draft: str
    gamma: int
    temperature: float
    max_new_tokens: int
    n_prompts: int
    device: str
    dtype: str
    threads: int
    target_tokens_per_s: float
    draftnas_tokens_per_s: float
    draftnas_speedup: float
    tokens_per_step: float
    mean_accepted_per_step: float
    draft_acceptance_rate: float
    lossless: bool | None
    hf_assisted_tokens_per_s: float | None = None
    hf_assisted_speedup: float | None = None
    hf_tokens_per_step: float | None = None
    hf_lossless: bool | None = None
    predicted_tokens_per_step: float | None = None
    predicted_ci_low: float | None = None
    predicted_ci_high: float | None = None
    predicted_acceptance_rate: float | None = None
    estimator_s: float | None = None
    prompts: tuple[BenchPrompt, ...] = ()
    versions: dict[str, str] | None = None
    wall_s: float = 0.0
    draft_ms_per_token: float | None = None  # drafter time per drafted token in draftnas's loop
    draft_vocab_size: int | None = None  # rows of a reduced draft head (draft_vocab.json), None = full
    engine: str = "hf"
    exact_match_rate: float | None = None  # greedy: share of prompts whose output equals the target's
    divergence_margins: tuple[float, ...] = ()  # target's top-1 minus top-2 logit at each divergence
    hf_target_tokens_per_s: float | None = None  # transformers generate of the target alone
    left_out: tuple[str, ...] = ()  # ids of prompts not benched: the drafter was healed on them
    # transformers with route_linears on both models (draftnas.models.linears)
    hf_routed_target_tokens_per_s: float | None = None
    hf_routed_tokens_per_s: float | None = None
    hf_routed_speedup: float | None = None  # against the routed target alone
    hf_routed_tokens_per_step: float | None = None
    hf_routed_lossless: bool | None = None
    # seconds the CPU product choosers spent timing inside the timed runs (0 unless a shape was
    # met there first: the bench times every step size and short prompt length beforehand)
    choice_timing_s: float = 0.0
    host: str = ""  # CPU model (machine.cpu_model_name), and load averages before the run
    load_average_before: str = ""


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
