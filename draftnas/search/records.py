"""What the search stage hands on: candidates, what a trial stores (latency, acceptance, throughput,
batch economics), the study's identity and settings, and a search's result. No torch."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from draftnas.acceptance.records import AcceptanceEstimate, PolicySteps
from draftnas.core.options import option
from draftnas.core.placement import Placement
from draftnas.core.records import Record
from draftnas.core.registry import Architecture
from draftnas.core.throughput import RequestTerms, ThroughputEstimate
from draftnas.drafter.heal.heal_records import HealResult
from draftnas.drafter.records import PruningPlan
from draftnas.drafter.training.distill_records import TrainedPrice
from draftnas.search.space import SearchSpace


@dataclass(frozen=True)
class CandidateChoice(Record):
    """The knobs one trial chose (Optuna parameter names)."""

    depth: int
    layer_selection: str = "first"
    kv_head_ratio: float = 1.0
    query_head_ratio: float = 1.0
    mlp_ratio: float = 1.0
    hidden_ratio: float = 1.0
    vocab_size: int = 0  # rows of a reduced draft head (draftnas.drafter.vocab); 0 = the full vocabulary
    weights: str = "dense"  # how its linear layers run: "dense", "int8", "int4", per group (models.records)

    @classmethod
    def from_params(cls, params: dict[str, Any], space: SearchSpace) -> CandidateChoice:
        """From an Optuna trial's params; knobs with a single allowed value are not params."""
        w = space.width
        return cls(
            depth=int(params.get("depth", space.depth.min)),
            layer_selection=str(params.get("layer_selection", space.layer_selection[0])),
            kv_head_ratio=float(params.get("kv_head_ratio", w.kv_head_ratios[0])),
            query_head_ratio=float(params.get("query_head_ratio", w.query_head_ratios[0])),
            mlp_ratio=float(params.get("mlp_ratio", w.mlp_ratios[0])),
            hidden_ratio=float(params.get("hidden_ratio", w.hidden_ratios[0])),
            vocab_size=int(params.get("vocab_size", space.vocab_sizes[0])),
            weights=str(params.get("weights", space.weights[0])),
        )


@dataclass(frozen=True)
class Candidate(Record):
    """A drafter proposed by the search: its shape, the knobs, and (once planned) its plan.

    `plan`: before the drafter is built it is the shape-only plan (layer indices for
    first/even, widths, no kept indices or head ids); after, the measured plan the drafter was
    built from. None when the shape cannot be a plan (a pruned hidden size, latency-only).
    """

    name: str
    base: str
    arch: Architecture
    choice: CandidateChoice
    plan: PruningPlan | None = None

    @property
    def key(self) -> str:
        """Identity for de-duplication: same key, same drafter (the shape and layer picking)."""
        a = self.arch
        key = (f"{a.num_hidden_layers}|{self.choice.layer_selection}|{a.hidden_size}|"
               f"{a.num_attention_heads}|{a.num_key_value_heads}|{a.intermediate_size}")
        key += f"|v{self.choice.vocab_size}" if self.choice.vocab_size else ""
        return key + ("" if self.choice.weights == "dense" else f"|{self.choice.weights}")

    @property
    def built_key(self) -> str:
        """Identity of the drafter actually built: the kept layers once the plan knows them (block
        influence and first-k that both keep layer 0 are one drafter), else `key`."""
        if self.plan is None:
            return self.key
        layers = self.plan.layers
        a = self.arch
        return (f"layers={','.join(map(str, layers))}|{a.hidden_size}|{a.num_attention_heads}|"
                f"{a.num_key_value_heads}|{a.intermediate_size}|v{self.choice.vocab_size}|{self.choice.weights}")

    @property
    def parameters(self) -> int:
        """All parameters, the reduced draft head (untied, `head_vocab_size` rows) counted as such."""
        return self.arch.parameters_with_head(self.head_vocab_size)

    @property
    def head_vocab_size(self) -> int | None:
        """Rows of the drafter's LM head: a reduced draft vocabulary, or None for the full one."""
        n = self.choice.vocab_size
        return n if n and n < self.arch.vocab_size else None

    def shape_label(self) -> str:
        """`layers x width`, e.g. `4 x 576 (q9/kv3, mlp 1536)`."""
        a = self.arch
        return (f"{a.num_hidden_layers} x {a.hidden_size} (q{a.num_attention_heads}/"
                f"kv{a.num_key_value_heads}, mlp {a.intermediate_size})")

    def with_plan(self, plan: PruningPlan, arch: Architecture | None = None) -> Candidate:
        return replace(self, plan=plan, arch=arch or self.arch)


ASSUMED_NOTE = "acceptance is ASSUMED ({alpha:g} per token, --acceptance-prior), not measured"


class LatencyPredictor(Protocol):
    """What the search needs from `draftnas.latency.model.LatencyModel`."""

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float: ...


@dataclass(frozen=True)
class TargetLatency(Record):
    """The target's latencies per workload batch size, shared by every candidate: decode, verify of
    g + 1 tokens (g = 0..gamma max) and the prefill of one request's prompt (empty: not modelled)."""

    decode_ms: tuple[float, ...]
    verify_ms: tuple[tuple[float, ...], ...]
    prefill_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class LatencyReading(Record):
    """Latencies (ms) one candidate is ranked with, per workload batch size.

    `verify_ms[i][g]` is the target over g + 1 new tokens at `batch_sizes[i]`, g = 0..gamma max.
    """

    profile: str
    batch_sizes: tuple[int, ...]
    context_tokens: int
    draft_ms: tuple[float, ...]
    target_ms: tuple[float, ...]
    verify_ms: tuple[tuple[float, ...], ...]
    # where memory caps the batch (`placement.Placement`): speculation runs at spec_batch_sizes[i]
    # (draft_ms and verify_ms priced there), plain decoding at plain_batch_sizes[i] (target_ms);
    # empty: both at batch_sizes
    spec_batch_sizes: tuple[int, ...] = ()
    plain_batch_sizes: tuple[int, ...] = ()
    max_batch: int | None = None  # largest batch the target and this drafter fit together (None: unmodelled)
    # a request's prompt prefilled (workload.prompt_tokens > 0): by the target alone at the plain
    # batch, and by the target and the drafter at the speculation batch
    target_prefill_ms: tuple[float, ...] = ()
    spec_prefill_ms: tuple[float, ...] = ()

    def spec_batch(self, index: int) -> int:
        return self.spec_batch_sizes[index] if self.spec_batch_sizes else self.batch_sizes[index]

    def plain_batch(self, index: int) -> int:
        return self.plain_batch_sizes[index] if self.plain_batch_sizes else self.batch_sizes[index]


@dataclass(frozen=True)
class AcceptanceReading(Record):
    """How well the target accepts a candidate's drafts: measured on traces, or assumed.

    Assumed: `acceptance_rate` is the user's prior alpha (i.i.d. per token).
    Measured: `tokens_per_step[str(gamma)]` from `estimate_acceptance`, `acceptance_rate`
    its mean per-position acceptance (greedy: top-1 agreement); `estimate` and `heal` hold
    the full records.
    """

    kind: str  # "measured" | "assumed" | "fitted" (an alpha(drafter) model, `draftnas.search.alpha`)
    acceptance_rate: float
    tokens_per_step: dict[str, float] | None = None
    estimate: AcceptanceEstimate | None = None
    heal: HealResult | None = None
    evaluate_s: float = 0.0

    @property
    def assumed(self) -> bool:
        """Not measured on this drafter: a constant prior or a fitted model's prediction."""
        return self.kind != "measured"

    def tokens_at(self, gamma: int) -> float | None:
        """Measured E[tokens per step] at gamma (1.0 at gamma 0), None when assumed."""
        if self.tokens_per_step is None:
            return None
        return 1.0 if gamma == 0 else self.tokens_per_step.get(str(gamma))

    def policy_at(self, gamma: int, p_min: float = 0.0) -> PolicySteps | None:
        """The estimate's walk at (gamma, p_min) with its per-prompt figures, where it made one."""
        return self.estimate.policy(gamma, p_min) if self.estimate is not None and gamma > 0 else None


@dataclass(frozen=True)
class WorkloadPrediction(Record):
    """Predicted throughput of the workload: best gamma per batch size, weighted harmonic mean.

    tokens/s = 1 / sum_b(w_b / tokens_per_s_b), w_b the share of tokens decoded at batch b.
    """

    per_batch: tuple[ThroughputEstimate, ...]
    batch_weights: tuple[float, ...]
    tokens_per_s: float
    baseline_tokens_per_s: float
    speedup: float
    acceptance_assumed: bool
    # at batch 1: the median over prompts of each prompt's whole-request tokens/s and its speedup over
    # plain decoding (`search.scoring`), where the acceptance has per-prompt walks; the fields above are
    # the pooled figures
    median_tokens_per_s: float | None = None
    median_speedup: float | None = None
    # at batch 1: the latencies that priced those whole requests, to price another set of prompts alike
    request: RequestTerms | None = None

    def primary(self) -> ThroughputEstimate:
        """The estimate at the workload's largest-share batch size (the first of equal shares)."""
        weights = self.batch_weights
        return self.per_batch[max(range(len(weights)), key=lambda j: (weights[j], -j))]


@dataclass(frozen=True)
class BatchEconomics(Record):
    """Where a drafter pays off, whatever its acceptance turns out to be.

    break_even_alpha_*: the per-token acceptance at which its best gamma >= 1 exactly matches
    plain decoding, at batch 1 and at the workload's largest batch (None: even acceptance 1 does
    not pay). crossover_batch: the first swept batch at which, at its predicted acceptance,
    speculation no longer beats plain decoding (None: it pays at every swept batch).
    """

    alpha: float
    largest_batch: int
    break_even_alpha_batch1: float | None
    break_even_alpha_largest: float | None
    crossover_batch: int | None
    sweep_batches: tuple[int, ...]
    sweep_speedup: tuple[float, ...]
    # the batches above 1 whose steps were timed on this machine (`search --batch`); a swept batch past
    # the largest is priced from it, and with none every batch is priced from batch 1 by the profile
    timed_batches: tuple[int, ...] = ()
    # a batch priced as draftnas's batched loop runs it: in lockstep until each sequence has this many new
    # tokens (`core.lockstep`; 0: stored before it was priced)
    lockstep_tokens: int = 0
    sweep_gamma: tuple[int, ...] = ()  # the best γ at each swept batch (empty: stored before it was kept)


@dataclass(frozen=True)
class RankedTrial(Record):
    """One completed trial, rebuilt from storage."""

    number: int
    candidate: Candidate
    latency: LatencyReading
    acceptance: AcceptanceReading
    throughput: WorkloadPrediction
    reused_from: int | None = None
    economics: BatchEconomics | None = None
    reference: str | None = None  # a published drafter priced beside the trials (number -1), not a trial
    hand_made: str | None = None  # a trial pricing the stock drafter under one transform ("int8, head 32768")
    healed: dict[str, Any] | None = None  # a trial healing another within the budget (`search.healing`)
    dense_latency: LatencyReading | None = None  # a quantized drafter's, run dense (loaded plainly)

    @property
    def primary(self) -> ThroughputEstimate:
        """The estimate at the workload's largest-share batch size."""
        return self.throughput.primary()


@dataclass(frozen=True)
class StudyInfo(Record):
    """What a study was created for (stored as the study's user attribute "draftnas")."""

    schema: int
    target: str
    base: str
    space: SearchSpace
    objectives: str  # "throughput" | "latency,acceptance"
    acceptance_assumed: bool
    acceptance_prior: float | None
    profile: str
    target_arch: Architecture
    base_arch: Architecture
    acceptance_model: str | None = None  # the alpha(drafter) model's label (FITTED ON ...) and file hash
    placement: Placement | None = None
    engine: str | None = None  # the loop engine a calibrated CPU search priced ("hf" | "static")
    traces: str | None = None  # the target traces acceptance was measured on (absolute path)
    dtype: str = "fp32"  # the weights' dtype everything was timed and estimated in
    references: tuple[str, ...] = ()  # drafters a user would otherwise pick, priced beside the trials
    device: str = "cpu"  # where drafters were built, healed and scored (and a calibration timed)
    quant_dtype: str | None = None  # quantized drafters' activation dtype where it is not `dtype`

    def fingerprint(self) -> dict[str, Any]:
        space = {k: v for k, v in self.space.to_dict().items() if k not in ("source", "description")}
        return {"target": self.target, "base": self.base, "space": space, "objectives": self.objectives,
                "acceptance_prior": self.acceptance_prior, "profile": self.profile,
                "acceptance_model": self.acceptance_model,
                "placement": self.placement.to_dict() if self.placement else None,
                **({"engine": self.engine} if self.engine else {}),
                **({"dtype": self.dtype} if self.dtype != "fp32" else {}),
                **({"quant_dtype": self.quant_dtype} if self.quant_dtype else {})}

    @property
    def note(self) -> str:
        if self.acceptance_model:
            return f"acceptance from a model {self.acceptance_model}, not measured on these drafters"
        if self.acceptance_assumed:
            return ASSUMED_NOTE.format(alpha=self.acceptance_prior or 0.0)
        return "acceptance measured on target traces"


SAMPLERS: tuple[str, ...] = ("tpe", "nsga2", "random")


@dataclass(frozen=True)
class StudySettings(Record):
    """How a study runs: what `draftnas search` was asked and what the loop runs with alike."""

    n_trials: int = option(20, flag="--trials", short="-n", low=1,
                           help="Finished trials the study should hold.")
    timeout_s: float | None = option(None, flag="--timeout", low=0, low_open=True,
                                     help="Stop asking new trials after this many seconds.")
    storage: str | None = option(None, help="Optuna storage: sqlite:///F, postgresql://..., journal:F "
                                             "(default: runs/<study>/study.db).")
    study_name: str | None = option(None, flag="--study",
                                    help="Study name (default from the space and target).")
    sampler: str = option("tpe", choices=SAMPLERS, help="tpe, nsga2 (latency vs acceptance Pareto front) "
                                                        "or random.")  # stored lower-case
    seed: int | None = option(0, help="Sampler seed (also the healing and trace subsampling seed).")
    run_dir: str = option("runs", help="Folder for studies' outputs.")
    heal_budget_s: float | None = option(
        None, flag="--heal-budget", scale=60.0, low=0.0, low_open=True,
        help="Minutes to heal with after the trials: the best-ranked drafters with a depth or width cut, "
             "best first, each distilled on the target's traces with only the layers next to its cuts "
             "training, then scored again and ranked as a trial of its own while the minutes last. The study "
             "records minutes spent against agreement gained (default: no healing beyond the space's own).")
    heal_with: str = option(
        "cut", choices=("cut", "lowrank"),
        help="How --heal-budget heals: cut (the layers next to a cut train) or lowrank (a rank-8 update on "
             "every linear layer of the stack, merged into the weights after: the healed drafter keeps its "
             "shape, so its latency is the unhealed one's).")

    def __post_init__(self) -> None:
        object.__setattr__(self, "sampler", self.sampler.lower())


@dataclass(frozen=True)
class SearchResult(Record):
    """A study's state after this process's run: the ranking and what happened."""

    study_name: str
    storage: str
    run_dir: str
    info: StudyInfo
    sampler: str
    n_trials: int
    ranked: tuple[RankedTrial, ...]
    pareto: tuple[int, ...]
    counts: dict[str, int]
    pruned_by_upper_bound: int
    pruned_infeasible: int
    reused: int
    told_here: tuple[int, ...]
    interrupted: bool
    wall_s: float
    baseline_tokens_per_s: float
    interrupted_trial: int | None = None  # the trial in flight at Ctrl-C (told FAIL), if any
    profile_note: str | None = None  # calibration summary, or: the profile was not measured here
    references: tuple[RankedTrial, ...] = ()  # the space's published drafters, priced the same way
    predictions_file: str | None = None  # predictions.json beside the study (`draftnas bench --predictions`)
    verdict: dict[str, Any] | None = None  # llama.cpp: can any drafter pay there (`search.llama_cpp.Verdict`)
    trained: tuple[TrainedPrice, ...] = ()  # trained shapes at the budget (`search.trained`), with --curves

    @property
    def best(self) -> RankedTrial | None:
        return self.ranked[0] if self.ranked else None
