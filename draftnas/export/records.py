"""What the export stage is asked and hands on: the folder's provenance (`ExportInfo`), the
export and heal requests, and their results. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from draftnas.acceptance.records import AcceptanceEstimate
from draftnas.core.options import check_options, option
from draftnas.core.records import Record
from draftnas.drafter.records import HealOptions, HealResult, PruningPlan
from draftnas.models.records import HEAD_MODULE, weights_suffix
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
    acceptance: AcceptanceEstimate | None = None  # this folder's drafter on the study's scored traces
    prediction: WorkloadPrediction | None = None  # the trial's latency at that acceptance
    dtype: str | None = None  # the activations' (and stored weights') dtype it drafts in
    # `prompt_key`s of every prompt the study's traces hold (acceptance was scored and the reduced
    # head's rows chosen on them): a bench leaves them out, as it leaves out those healed on
    searched_prompts: tuple[str, ...] = ()
    # how the drafter's linear layers run: "dense" (the folder's dtype) or "int8" (weight-only, CPU; the
    # folder holds the dense weights, quantized when loaded: draftnas.models.linears.route_linears(int8=True))
    weights: str = "dense"


@dataclass(frozen=True)
class ExportRequest(Record):
    """What `draftnas export` was asked: a study trial or a plan file, and where to write."""

    out_dir: str
    study: str | None = None
    storage: str | None = None
    trial: int | None = None
    plan_file: str | None = None
    base: str | None = None
    target: str | None = None
    traces: str | None = None
    heal_steps: int | None = option(0, help="Distillation steps (None: the stated default).", low=0,
                                    cli=False)
    heal: HealOptions | None = None
    gamma: int | None = option(None, help="Draft tokens per step for generation_config.", low=MIN_GAMMA,
                               high=MAX_GAMMA, cli=False)
    force: bool = False
    push_to_hub: str | None = None
    seed: int = 0
    device: str | None = None  # where healing trains (None: the study's device, else the CPU)
    full_head: bool = False  # a reduced-head drafter also gets a plain full-vocabulary copy (full-head/)
    # a GGUF file for llama.cpp beside the folder, in this ggml type (None: only when the trial was searched
    # for llama.cpp, in its type); `llama_cpp`: the build llama-quantize comes from (K-quants)
    gguf: str | None = None
    llama_cpp: str | None = None

    def validate(self) -> ExportRequest:
        """Every out-of-range field at once, as one error (nothing is written)."""
        return check_options(self)


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
    acceptance: AcceptanceEstimate | None = None
    prediction: WorkloadPrediction | None = None
    searched_tokens_per_step: float | None = None  # the search's reading at `gamma`, for comparison
    gguf: str | None = None  # the GGUF file written for llama.cpp, if one was


@dataclass(frozen=True)
class HealRequest(Record):
    """What `draftnas heal` was asked: a drafter (plan + base, or a folder) and a teacher."""

    plan_file: str | None = None
    base: str | None = None
    drafter: str | None = None
    target: str | None = None
    traces: str | None = None
    options: HealOptions = field(default_factory=HealOptions)
    checkpoint_dir: str | None = None
    out_dir: str | None = None
    force: bool = False


HEAD_MODULE_FILE = f"{HEAD_MODULE}.py"  # draftnas/hf_head.py, copied into reduced-head folders


FULL_HEAD_DIR = "full-head"


def drafter_name(info: ExportInfo) -> str:
    """The drafter's name: its base and `PruningPlan.label` (with the reduced head's rows), the
    name the search's table gives the same drafter."""
    label = info.plan.label() if info.plan else "drafter"
    return f"{info.base}-{label}{weights_suffix(info.weights)}"
