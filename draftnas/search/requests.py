"""What the search stage is asked, as records whose fields declare their options (help, bounds,
allowed values): `SearchRequest` (`draftnas search`), `AlphaMeasureRequest` and `AlphaFitRequest`
(`draftnas alpha`). The command line builds its flags from them (`draftnas.cli.flags`); a Python
caller builds them directly. `validate()` says every problem at once as an `OptionError`. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from draftnas.core.engine_kinds import ENGINE_KINDS, LLAMA_CPP, engines_for
from draftnas.core.machine import DEVICES
from draftnas.core.options import check_options, option, option_group
from draftnas.core.records import Record
from draftnas.models.records import llama_cpp_option, target_gguf_option
from draftnas.search.records import StudySettings
from draftnas.search.space import SearchSpace

DTYPES = ("fp32", "fp16", "bf16", "fp8")


def _prior(text: str | float) -> float | str:
    """--acceptance-prior: a number (an assumed acceptance) or a model file's path."""
    try:
        return float(text)
    except ValueError:
        return str(text)


@dataclass(frozen=True)
class SearchRequest(Record):
    """What `draftnas search` was asked, before anything is resolved."""

    target: str = option(help="Target model: registry name, embedded name, folder or .gguf.", short="-t")
    base: str | None = option(None, help="Base to prune drafters from (weights; default: the space's base).")
    base_shape: str | None = option(
        None, help="Registry name giving the base's shape for a latency-only search (no weights); with no "
                   "shipped space for the target, the default depth/width space is built from the two "
                   "registry shapes.")
    space: str | SearchSpace | None = option(
        None, cli_type=str, help="Search space YAML or shipped name (default: the shipped space for the "
                                 "target, else one built from the registry with base_shape).")
    profile: str | None = option(
        None, help="Latency profile JSON or shipped name (default: the space's; 'cpu' is the shipped profile "
                   "measured on this CPU when there is one, else a roofline prior named as such).")
    traces: str | None = option(None, help="Target traces (draftnas trace); default: built once into the run "
                                           "folder when the target has weights.")
    study: StudySettings = option_group(StudySettings)
    acceptance_prior: float | str | None = option(
        None, parse=_prior, cli_type=str,
        help="Do not measure acceptance: a number assumes that per-token acceptance for every drafter "
             "(ASSUMED); a model file from `draftnas alpha fit` predicts it per drafter (FITTED ON ...).")
    acceptance_anchor: float | None = option(
        None, low=0.0, high=1.0, low_open=True,
        help="With an acceptance model: shift its level so the space's first reference drafter gets this "
             "acceptance; the model then only says how drafters differ.")
    gpus: int | None = option(
        None, low=1, help="GPUs the target is sharded over (tensor parallelism; GPU profiles). Default: the "
                          "smallest number that holds it at the workload's largest batch.")
    draft_tp: str = option("1", choices=("1", "same"),
                           help="Drafter on 1 GPU, or 'same': sharded like the target (the two vLLM allows).")
    dtype: str | None = option(
        None, choices=DTYPES,
        help="Weights' dtype. Default: on a calibrated CPU search the faster of fp32 and (where the CPU has "
             "native bf16) bf16, on a calibrated GPU search of bf16 and fp16, timed on the target first; "
             "else the profile's (spec-sheet profiles are re-derived).")
    references: tuple[str, ...] = option(
        (), flag="--reference", short="-r",
        help="A drafter a user would otherwise pick (an embedded name, a folder or a registry shape), priced "
             "and ranked beside the trials as 'ref'; repeatable, added to the space's references.")
    memory_margin: float = option(0.1, low=0.0, high=1.0, high_open=True,
                                  help="Share of each GPU's memory kept free (vLLM's 1 - "
                                       "gpu_memory_utilization).")
    device: str = option(
        "cpu", choices=DEVICES,
        help="Where the target's traces are written, drafters built, healed and scored, the calibration "
             "timed (a measured profile of this device is calibrated) and the printed bench runs.")
    calibrate: bool = option(
        True, flag="--calibrate/--no-calibrate",
        help="Before ranking, time the target's decode and verify steps, drafter-sized stacks, the space's "
             "reduced heads and a few short decoding runs on the device, and correct a measured profile "
             "of that device with them.")
    engine: str = option(
        "static", choices=engines_for("search"),
        help="The speculative loop the calibration times and the printed bench runs: static (draftnas's "
             "decoder over caches allocated once), hf (transformers models over a growing cache), "
             "llama.cpp (GGUF drafters timed, ranked and exported for llama.cpp's own tools; the target must "
             "be a GGUF, the default space is the target's -llama-cpp one, and the search says when no "
             "drafter can pay there) or vllm (steps timed inside vLLM, `draftnas engines --install vllm`; "
             "dense full-width drafters ranked by vLLM's costs, the default space is the target's -vllm one, "
             "and the search prints vLLM's --speculative-config, with --batch a γ per batch range).")
    llama_cpp: str | None = llama_cpp_option("time and rank with the llama.cpp engine")
    target_gguf: str | None = target_gguf_option("time and bench")
    calibration: str | None = option(
        None, help="A stored calibration of this host (a JSON the search wrote under ~/.cache/draftnas/"
                   "calibrations/) to use instead of timing; one from another CPU, thread count or torch "
                   "version is refused. Default: the stored one when its target decode and verify still "
                   "re-time within 10%, else a new calibration, stored for the next run.")
    batch: int | None = option(
        None, low=1,
        help="Rank for a server decoding this many sequences at once: the workload's batch sizes become this "
             "one, and the calibration also times the target's decode and verify and the drafters' bases at "
             "batch 2, 4, ... up to it (stored beside the calibration). Default: the space's batch sizes.")
    threads: int | None = option(None, low=1, help="torch's CPU threads for the whole search (default: "
                                                   "torch's own); part of the stored calibration's key.")
    curves: str | None = option(
        None, help="Training curves of this target's drafter shapes (`draftnas distill curve`): each shape "
                   "is "
                   "priced at --train-tokens with acceptance from its curve, beside the ranking, with the "
                   "budget it needs to beat the hand-made best (else the search's best trial). Default: the "
                   "curves draftnas ships for an embedded target, if any.")
    train_tokens: int | None = option(
        None, low=1, help="The training budget (tokens) trained shapes are priced at (with --curves; "
                          "default: "
                          "the largest budget each curve measured).")
    export: bool = option(
        False, help="Then export the best drafter to drafters/<name> as `draftnas export` does (healed by "
                    "default), price it again as exported, and print how to bench and use it. A folder "
                    "that already holds that trial is kept.")

    @property
    def assumed_acceptance(self) -> float | None:
        """The acceptance assumed for every drafter (a number given as the prior), else None."""
        return self.acceptance_prior if isinstance(self.acceptance_prior, float) else None

    @property
    def acceptance_model(self) -> str | None:
        """The alpha(drafter) model file given as the prior, else None."""
        return self.acceptance_prior if isinstance(self.acceptance_prior, str) else None

    def validate(self) -> SearchRequest:
        extra = []
        if self.assumed_acceptance is not None and not 0.0 <= self.assumed_acceptance <= 1.0:
            extra.append(("acceptance_prior",
                          f"must be in [0, 1] or a model file, got {self.assumed_acceptance:g}"))
        model = self.acceptance_model
        if model is not None and not Path(model).expanduser().is_file():
            extra.append(("acceptance_prior", f"{model!r} is neither a number in [0, 1] nor a model file "
                                              "(`draftnas alpha fit` writes one)"))
        if self.acceptance_anchor is not None and model is None:
            extra.append(("acceptance_anchor", "needs an acceptance model ({acceptance_prior} MODEL.json)"))
        kind = ENGINE_KINDS.get(self.engine)
        if self.target_gguf is not None and kind is not None and kind.drafter_file != "gguf":
            extra.append(("target_gguf", f"is a GGUF file: set {{engine}} {LLAMA_CPP} with it"))
        if kind is not None and kind.limits(self.device, 0.0):
            extra.append(("engine", f"{self.engine} {kind.limits(self.device, 0.0)} ({{device}})"))
        return check_options(self, extra)


@dataclass(frozen=True)
class AlphaMeasureRequest(Record):
    """What `draftnas alpha measure` was asked: drafters cut from an embedded base, measured against it."""

    base: str = option(help="Embedded model (or folder) to cut drafters from; it is also their target.")
    out: str = option(help="JSONL file of pairs (appended; a re-run resumes).", short="-o")
    pairs: int = option(24, low=1, help="Drafters to measure, spread over the space's depths.")
    space: str | None = option(None, help="Search space whose knobs and heal budget are sampled (default: "
                                          "the base's shipped one).")
    heal_steps: tuple[int, ...] | None = option(
        None, low=0, cli_type=str, parse=lambda t: _ints(t),
        help="Comma-separated heal budgets sampled (default: 0 and the space's), e.g. 0,30,150.")
    per_domain: int = option(9, low=1, help="Prompts per domain traced (a third held out).")
    seed: int = option(0, help="Seed of the design and of healing.")


def _ints(text: str | tuple[int, ...]) -> tuple[int, ...]:
    from draftnas.core.options import parse_ints

    return text if isinstance(text, tuple) else parse_ints(text)


@dataclass(frozen=True)
class AlphaFitRequest(Record):
    """What `draftnas alpha fit` was asked: pair files in, a model file out."""

    pairs: tuple[str, ...] = option(argument=True, nonempty=True,
                                    help="Pair files from `draftnas alpha measure`.")
    out: str = option(help="Model file to write (JSON).", short="-o")
    ridge: float = option(1.0, low=0.0, help="L2 penalty on the standardized weights.")

    def validate(self) -> AlphaFitRequest:
        out = Path(self.out)
        extra = [("out", f"{self.out} is not a file")] if out.exists() and not out.is_file() else []
        return check_options(self, extra)
