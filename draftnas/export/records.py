"""What the export stage is asked and hands on: the folder's provenance (`ExportInfo`), the
export and heal requests, and their results. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftnas.acceptance.records import AcceptanceEstimate
from draftnas.core.machine import DEVICES
from draftnas.core.options import check_options, option, option_group
from draftnas.core.records import Record
from draftnas.drafter.heal.heal_records import HealOptions, HealResult
from draftnas.drafter.records import PruningPlan
from draftnas.models.records import llama_cpp_option, weights_suffix
from draftnas.search.records import RankedTrial, WorkloadPrediction

DEFAULT_GAMMA = 4
MIN_GAMMA, MAX_GAMMA = 1, 32  # the range `draftnas bench` accepts
#: `draftnas export`'s healing unless --heal-steps says otherwise: 400 steps toward the target's
#: top-64 kept while its data was made (no target forward per step), on the workload's prompts and 128
#: more the target writes itself. On the 2-core AMD EPYC host this took SmolLM2-135M's 1-layer drafter
#: to held-out top-1 0.252 in about 1 min of training, where 80 steps toward the live target on the
#: workload's prompts alone reached 0.196 in 1.5 min (README, "Healing at export").
DEFAULT_EXPORT_HEAL_STEPS = 400
EXPORT_WRITTEN_PROMPTS = 128
EXPORT_TEACHER_TOPK = 64
SCHEMA_VERSION = 1
EXPORT_FORMATS = ("hf", "gguf")


@dataclass(frozen=True)
class ExportInfo(Record):
    """What the exported folder records about where the drafter came from.

    base: the spec pruned; target: the model it drafts for; gamma: draft tokens per
    step the card and generation_config recommend. trial: the search's records for this
    drafter (candidate, latency, acceptance, throughput), as stored in its Optuna trial, and
    profile the latency profile they were priced with; measured: figures measured at export
    (e.g. top-1 after healing). acceptance / prediction: when the plan came from a study that
    measured acceptance, this folder's drafter (healed as exported) estimated on the trace records
    the search scored acceptance on (kept out of the export's healing data; any record whose
    prompt it trained on anyway is left out), and the trial's latency priced at that acceptance
    (best gamma included): the search's own figure, for the drafter as exported.
    """

    base: str
    target: str
    plan: PruningPlan | None = None
    trial: RankedTrial | None = None
    profile: str | None = None
    heal: HealResult | None = None
    measured: dict[str, Any] | None = None
    source: str = ""
    seed: int = 0
    gamma: int = 4
    p_min: float = 0.0  # the confidence stop it drafts with: a step stops after a draft below it
    acceptance: AcceptanceEstimate | None = None  # this folder's drafter on the study's scored traces
    prediction: WorkloadPrediction | None = None  # the trial's latency at that acceptance
    dtype: str | None = None  # the activations' (and stored weights') dtype it drafts in
    # `prompt_key`s of every prompt the study's traces hold (acceptance was scored and the reduced
    # head's rows chosen on them): a bench leaves them out, as it leaves out those healed on
    searched_prompts: tuple[str, ...] = ()
    # how the drafter's linear layers run: "dense" (the folder's dtype), "int8", "int4" or per layer group
    # (weight-only, CPU; the folder holds the dense weights, quantized when loaded:
    # draftnas.models.linears.route_linears(weights=...))
    weights: str = "dense"
    # a quantized drafter's settings where it runs dense (loaded plainly: transformers' `assistant_model=`,
    # which reads them from generation_config), priced with its dense latency; None for a dense drafter
    plain_gamma: int | None = None
    plain_p_min: float = 0.0


@dataclass(frozen=True)
class ExportRequest(Record):
    """What `draftnas export` was asked: a study trial or a plan file, and where to write."""

    out_dir: str = option(flag="--out", short="-o", help="Folder to write (refused when not empty).")
    study: str | None = option(None, help="Optuna study name (with its storage).")
    storage: str | None = option(None, help="Optuna storage: sqlite:///F, postgresql://..., journal:F "
                                             "(default: runs/<study>/study.db).")
    trial: int | None = option(None, low=0, help="Trial number (default: the best).")
    plan_file: str | None = option(None, flag="--plan", help="Pruning plan JSON instead of a study.")
    base: str | None = option(None, help="Base model (default: the plan's).")
    target: str | None = option(None, help="Target it drafts for (default: the base).")
    traces: str | None = option(
        None, help="Traces to heal toward (no target needed); also where a reduced-vocabulary trial's draft "
                   "vocabulary comes from (default: the study folder's traces).")
    heal_steps: int | None = option(
        None, low=0,
        help="Distillation steps toward the target before export; 0 exports the pruned weights unhealed. "
             "Default: 400 (toward the target's top-64, on the workload's prompts and 128 more the target "
             "writes itself), or 0 when the study's search space heals none. If healing lowers held-out "
             "top-1 agreement, the unhealed weights are exported.")
    heal: HealOptions | None = None  # the healing's options (None: the workload's)
    gamma: int | None = option(
        None, low=MIN_GAMMA, high=MAX_GAMMA,
        help="Draft tokens per step for generation_config (default: the best for the drafter as exported "
             "when the study measured acceptance, else the searched best, else 4).")
    force: bool = option(False, help="Replace a non-empty output folder.")
    full_head: bool = option(
        True, flag="--full-head/--no-full-head",
        help="A reduced-head drafter also gets a plain full-vocabulary copy in full-head/: the folder vLLM "
             "and plain transformers load with no remote code (vLLM refuses custom code; as large as the "
             "base). On by default, so an export loads in vLLM and plain transformers too.")
    format: str = option(
        "hf", choices=EXPORT_FORMATS,
        help="hf: the Hugging Face folder alone. gguf: also <out>/<name>-<quant>.gguf, a file llama.cpp "
             "loads as the target's drafter (the target's tokenizer, full vocabulary; a trial searched for "
             "llama.cpp gets one in its searched type without asking).")
    quant: str | None = option(
        None, help="The GGUF's ggml type with the gguf format: Q8_0, Q4_0, F16, BF16 or F32 are written "
                   "directly; other llama.cpp types (Q4_K_M, Q6_K, ...) through llama-quantize. Default: the "
                   "type the trial was searched in, else Q8_0.")
    llama_cpp: str | None = llama_cpp_option("quantize the GGUF to a type draftnas does not write")
    push_to_hub: str | None = option(None, help="Upload to this hub repo (online).")
    seed: int = option(0, help="Seed of healing.")
    device: str | None = option(None, choices=DEVICES,
                                help="Where healing trains (default: the study's device, else cpu). The "
                                     "folder is written from the host.")

    @property
    def gguf(self) -> str | None:
        """The GGUF's type ("default": the searched one, else Q8_0), None for no GGUF asked."""
        return (self.quant or "default") if self.format == "gguf" else None

    def validate(self) -> ExportRequest:
        """Every out-of-range field at once, as one error (nothing is written)."""
        extra = [("quant", "is the GGUF's type: set {format} gguf with it")] if (
            self.quant is not None and self.format != "gguf") else []
        if self.plan_file is None and self.study is None:
            extra.append(("study", "or {plan_file} must name the drafter to export"))
        elif self.plan_file is not None and self.study is not None:
            extra.append(("study", "and {plan_file} exclude each other: give one"))
        return check_options(self, extra)


@dataclass(frozen=True)
class ExportResult(Record):
    out_dir: str
    plan: PruningPlan
    parameters: int
    heal: HealResult | None = None
    hub_url: str | None = None
    source: str = ""
    name: str = ""  # the drafter's name (search table, card, draftnas.json)
    gamma: int = DEFAULT_GAMMA
    p_min: float = 0.0
    acceptance: AcceptanceEstimate | None = None
    prediction: WorkloadPrediction | None = None
    searched_tokens_per_step: float | None = None  # the search's reading at `gamma`, for comparison
    gguf: str | None = None  # the GGUF file written for llama.cpp, if one was


@dataclass(frozen=True)
class HealRequest(Record):
    """What `draftnas heal` was asked: a drafter (plan + base, or a folder) and a teacher."""

    plan_file: str | None = option(None, flag="--plan", help="Pruning plan JSON (or a draftnas.json).")
    base: str | None = option(None, help="Base model the plan prunes (default: the plan's).")
    drafter: str | None = option(None, help="An exported drafter folder (instead of a plan).")
    target: str | None = option(None, help="Live teacher (default: the base).")
    traces: str | None = option(None, help="Distill toward these traces' top-k (no target forward).")
    options: HealOptions = option_group(HealOptions)
    checkpoint_dir: str | None = option(None, flag="--checkpoint",
                                        help="Folder for resumable state (rerun to resume).")
    out_dir: str | None = option(None, flag="--out", help="Export the healed drafter to this folder.")
    force: bool = option(False, help="Replace a non-empty output folder.")

    def validate(self) -> HealRequest:
        extra = []
        if self.plan_file is None and self.drafter is None:
            extra.append(("plan_file", "or {drafter} must name the drafter to heal"))
        elif self.plan_file is not None and self.drafter is not None:
            extra.append(("plan_file", "and {drafter} exclude each other: give one"))
        return check_options(self, extra)


def drafter_name(info: ExportInfo) -> str:
    """The drafter's name: its base and `PruningPlan.label` (with the reduced head's rows), the
    name the search's table gives the same drafter."""
    label = info.plan.label() if info.plan else "drafter"
    return f"{info.base}-{label}{weights_suffix(info.weights)}"


@dataclass(frozen=True)
class BestExport(Record):
    """A search's best trial as exported (`draftnas search --export`): its folder, gamma and the
    folder's record; `result` is None when the folder already held that trial (kept as it was)."""

    folder: str
    gamma: int
    record: dict[str, Any]
    result: ExportResult | None = None
    p_min: float = 0.0
