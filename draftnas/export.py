"""Export: a drafter as a Hugging Face folder that serving engines load.

The folder holds `config.json` (written by transformers from the model, whose config
`apply_plan` set from the tensor shapes), `model.safetensors`, the tokenizer files,
`generation_config.json` (assisted-generation settings for the drafter), a model card
`README.md` and `draftnas.json` (candidate, plan, profile, estimates, seed, versions).

It is written into a temporary folder next to the destination and renamed into place
at the end, so a crash never leaves a half-written drafter; a non-empty destination is
refused unless `force`.

Size: the folder writer, the model card (shape, plan, figures, use, reduced-vocabulary sections) and
the export/heal requests; the card sections read the same ExportInfo.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from draftnas.acceptance import AcceptanceEstimate
from draftnas.distill import HealOptions, HealReading, HealResult
from draftnas.errors import ExportError, InvalidInputError
from draftnas.provenance import package_versions
from draftnas.prune import PruningPlan, load_plan
from draftnas.record import Record
from draftnas.scoring import RankedTrial, WorkloadPrediction, measured_acceptance, predict_workload
from draftnas.study import StudyInfo
from draftnas.vocab import HEAD_MODULE

log = logging.getLogger(__name__)

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
Progress = Callable[[int, int], None]


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


def check_destination(out_dir: str | Path, force: bool) -> Path:
    """The destination, refused (ExportError) when it is a file or a non-empty folder without force."""
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"{out} is not empty; pass --force to replace it, or choose another --out")
    return out


def export_drafter(model: Any, tokenizer: Any, out_dir: str | Path, info: ExportInfo,
                   force: bool = False) -> Path:
    """Write `model` + `tokenizer` as a loadable HF folder at `out_dir` (atomically). Returns it."""
    out = check_destination(out_dir, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_folder(model, tokenizer, tmp, info)
        _replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("exported drafter to %s", out)
    return out


def _replace(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`; an existing `out` is moved aside first and removed after."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{time.time_ns()}")
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


HEAD_MODULE_FILE = f"{HEAD_MODULE}.py"  # draftnas/hf_head.py, copied into reduced-head folders
FULL_HEAD_DIR = "full-head"


def _write_folder(model: Any, tokenizer: Any, folder: Path, info: ExportInfo) -> None:
    from draftnas.registry import Architecture
    from draftnas.vocab import model_subset

    _set_generation_config(model, info.gamma)
    subset = model_subset(model)
    full_parameters = None
    if subset is not None:  # the reduced head as it is, and a plain full-head variant beside it
        _save_reduced_head(model, subset, folder)
        full_parameters = _save_full_head(model, subset, tokenizer, folder / FULL_HEAD_DIR)
        subset.save(folder)
    else:
        model.save_pretrained(folder, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    arch = Architecture.from_hf_config(model.config, name=drafter_name(info))
    parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    meta = {
        "schema_version": SCHEMA_VERSION,
        "created_unix_s": int(time.time()),
        "architecture": arch.to_dict(),
        "parameters": parameters,
        **info.to_dict(),
        "versions": package_versions(("draftnas", "torch", "transformers", "optuna", "safetensors")),
    }
    if full_parameters is not None:
        meta["full_head_parameters"] = full_parameters
    (folder / "draftnas.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    (folder / "README.md").write_text(model_card(info, arch.to_dict(), parameters, subset, full_parameters))


def reduced_head_class(model_or_config: Any) -> Any:
    """The draftnas.hf_head class for a LLaMA or Gemma-3 drafter (by its transformers class or
    config); an ExportError for other families."""
    from draftnas import hf_head

    config = getattr(model_or_config, "config", model_or_config)
    base = {"llama": "LlamaForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}.get(config.model_type)
    if base is None:
        raise ExportError(f"a reduced draft head is exported for LLaMA and Gemma-3 drafters, "
                          f"not {config.model_type!r}")
    return getattr(hf_head, hf_head.CLASS_BY_BASE[base])


def _save_reduced_head(model: Any, subset: Any, folder: Path) -> None:
    """`model` (head already reduced) as a draftnas.hf_head class: N-row head, the kept ids as the
    `draft_vocab_ids` buffer, `auto_map` naming the shipped copy of draftnas/hf_head.py."""
    import copy

    import torch

    from draftnas import hf_head

    cls = reduced_head_class(model)
    config = copy.deepcopy(model.config)
    config.draft_vocab_size = subset.size
    config.tie_word_embeddings = False
    config.auto_map = {"AutoModelForCausalLM": f"{HEAD_MODULE}.{cls.__name__}"}
    weight = model.get_output_embeddings().weight
    with torch.device("meta"):
        reduced = cls(config)
    state = {**model.state_dict(), "draft_vocab_ids": subset.head_to_full().to(weight.device)}
    reduced.load_state_dict(state, strict=True, assign=True)
    reduced.generation_config = model.generation_config
    reduced.save_pretrained(folder, safe_serialization=True)
    shutil.copyfile(hf_head.__file__, folder / HEAD_MODULE_FILE)


def _save_full_head(model: Any, subset: Any, tokenizer: Any, folder: Path) -> int:
    """A plain transformers folder with the head expanded to the whole vocabulary (kept rows from
    the reduced head, the others from the input embedding); returns its parameter count."""
    from draftnas.vocab import expand_head

    reduced = model.get_output_embeddings()
    expand_head(model, subset)
    try:
        model.save_pretrained(folder, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    finally:
        model.set_output_embeddings(reduced)


def _set_generation_config(model: Any, gamma: int) -> None:
    """Assisted-generation settings read from the drafter's generation_config by transformers:
    a constant `gamma` draft tokens per step and no confidence cut-off, which is what the
    search's estimates assume."""
    gen = getattr(model, "generation_config", None)
    if gen is None:
        return
    gen.num_assistant_tokens = int(gamma)
    gen.num_assistant_tokens_schedule = "constant"
    gen.assistant_confidence_threshold = 0.0


def drafter_name(info: ExportInfo) -> str:
    """The drafter's name: its base and `PruningPlan.label` (with the reduced head's rows), the
    name the search's table gives the same drafter."""
    label = info.plan.label() if info.plan else "drafter"
    return f"{info.base}-{label}"


# --------------------------------------------------------------------------- model card


def model_card(info: ExportInfo, arch: dict[str, Any], parameters: int, subset: Any = None,
               full_parameters: int | None = None) -> str:
    """README.md with YAML metadata (base_model, tags, target) and the plan and figures."""
    name = drafter_name(info)
    front = [
        "---",
        "library_name: transformers",
        f"base_model: {_yaml_str(info.base)}",
        "tags:",
        "- speculative-decoding",
        "- draft-model",
        "- draftnas",
        "- pruned",
        f"target_model: {_yaml_str(info.target)}",
        "pipeline_tag: text-generation",
        "---",
        "",
    ]
    body = [
        f"# {name}",
        "",
        f"A draft model for speculative decoding of **{info.target}**, cut from **{info.base}** by "
        "draftnas (a search for the fastest drafter: latency first, then acceptance).",
        "",
        "## Shape",
        "",
        "| field | value |",
        "|---|---|",
        *[f"| {k} | {arch[k]} |" for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                           "num_key_value_heads", "head_dim", "intermediate_size",
                                           "vocab_size")],
        f"| parameters | {parameters:,} ("
        + (f"with its {subset.size:,}-row LM head" if subset is not None else "LM head included") + ") |",
        "",
        *_plan_section(info.plan),
        *_figures_section(info),
        *_usage_section(info, reduced=subset is not None),
        *_vocab_section(subset, info, parameters, full_parameters),
    ]
    return "\n".join(front + body) + "\n"


def _yaml_str(value: str) -> str:
    return json.dumps(value)


def _plan_section(plan: PruningPlan | None) -> list[str]:
    if plan is None:
        return []
    return [
        "## Pruning plan",
        "",
        f"- base layers kept ({plan.layer_selection}): {list(plan.layers)} of {plan.base_num_layers}",
        f"- query heads {plan.num_attention_heads}, KV heads {plan.num_key_value_heads}, "
        f"MLP channels {plan.intermediate_size} (importance: {plan.importance})",
        "- the full plan (kept head, KV-group and channel indices per layer) is in `draftnas.json`; "
        "`draftnas export --plan draftnas.json --base BASE` replays the pruning bit-identically "
        "(healing, when recorded below, is then redone).",
        "",
    ]


def _trained_on(h: HealResult) -> str:
    """What the drafter was healed on, in words."""
    if h.teacher == "traces":
        return f"{h.n_train_sequences} trace records"
    text = f"{h.n_train_sequences} of the target's continuations of prompt set {h.options.prompts}"
    if h.n_written_sequences:
        text += (f" ({h.n_written_sequences} of them of prompts the target wrote itself, opening like "
                 "the set's training prompts)")
    return text


def _figures_section(info: ExportInfo) -> list[str]:
    lines = ["## Figures", ""]
    if info.heal is not None:
        h = info.heal
        lines += [
            f"Healing: {h.steps} steps of distillation toward the target ({h.teacher} teacher), "
            f"{h.train_s / 60:.1f} min on the export machine, on {_trained_on(h)}.",
            "",
            "| measured on held-out prompts | before healing | after healing |",
            "|---|---|---|",
            f"| top-1 agreement with the target | {h.top1_before:.3f} | {h.top1_after:.3f} |",
            f"| greedy tokens per step (gamma={h.gamma}) | {h.tokens_per_step_before:.3f} | "
            f"{h.tokens_per_step_after:.3f} |",
            "",
        ]
        if not h.kept:
            lines += ["Healing lowered held-out agreement, so this folder holds the **unhealed** weights "
                      "(the 'before healing' column).", ""]
    if info.prediction is not None and info.acceptance is not None:
        searched = searched_tokens(info.trial, info.gamma)
        lines += [*rescored_lines(info.prediction, info.acceptance, searched), ""]
    predicted = None
    if info.trial is not None:
        t = info.trial
        predicted = {"latency": t.latency.to_dict(), "acceptance": t.acceptance.to_dict(),
                     "throughput": t.throughput.to_dict()}
    for title, data in (("Measured", info.measured), ("Predicted by the search", predicted)):
        if data:
            rows = _scalar_rows(data)
            lines += [f"{title} (every record in full: `draftnas.json`):", "", "| figure | value |",
                      "|---|---|", *[f"| {key} | {value} |" for key, value in rows[:CARD_ROWS]]]
            if len(rows) > CARD_ROWS:
                lines.append(f"| … | {len(rows) - CARD_ROWS} more in `draftnas.json` |")
            lines.append("")
    if len(lines) == 2:
        lines += ["No figures were recorded for this export.", ""]
    return lines


CARD_ROWS = 24


def rescored_lines(prediction: WorkloadPrediction, acceptance: AcceptanceEstimate,
                   searched: float | None) -> list[str]:
    """What the search predicts for the drafter as exported, in plain words (card and CLI);
    `searched`: the tokens per step the search scored at that gamma."""
    p = prediction.primary()
    tokens = acceptance.tokens_per_step.get(str(p.gamma))
    verdict = ("faster than" if prediction.speedup >= 1.005 else "slower than" if prediction.speedup <= 0.995
               else "level with")
    line = (f"Predicted for this drafter as exported: {prediction.tokens_per_s:.1f} tokens/s, "
            f"{prediction.speedup:.3f}x the target alone ({prediction.baseline_tokens_per_s:.1f}), so "
            f"{verdict} plain decoding, at gamma {p.gamma}")
    if tokens is not None:
        line += (f" with {tokens:.3f} tokens per step, measured on {acceptance.n_positions} positions of "
                 f"{acceptance.n_prompts} trace records its healing never trained on")
    if searched is not None:
        line += f" (the search scored {searched:.3f} after its own, shorter healing)"
    return [line + ". Latency as the search priced it on its machine."]


def _scalar_rows(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, value) for every number, string and boolean in nested dicts; lists of records
    by index ("per_batch.0.gamma"). Floats to 4 significant digits."""
    if isinstance(data, dict):
        return [row for k, v in data.items() for row in _scalar_rows(v, f"{prefix}{k}.")]
    if isinstance(data, list | tuple):
        if all(not isinstance(v, dict | list | tuple) for v in data):
            return [(prefix.rstrip("."), ", ".join(_fmt_value(v) for v in data))] if data else []
        return [row for i, v in enumerate(data) for row in _scalar_rows(v, f"{prefix}{i}.")]
    return [(prefix.rstrip("."), _fmt_value(data))]


def _fmt_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value).replace("|", "/")


def _model_ref(spec: str) -> str:
    """A hub id as is; a local or embedded name as a placeholder path the reader fills in."""
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return repr(spec)
    return repr(f"path/to/{Path(spec).name or spec}")


def _usage_section(info: ExportInfo, reduced: bool = False) -> list[str]:
    g = info.gamma
    target = _model_ref(info.target)
    load = ("AutoModelForCausalLM.from_pretrained(\"path/to/this/folder\", trust_remote_code=True)"
            if reduced else "AutoModelForCausalLM.from_pretrained(\"path/to/this/folder\")")
    vllm_folder = f"path/to/this/folder/{FULL_HEAD_DIR}" if reduced else "path/to/this/folder"
    return [
        "## Use",
        "",
        "transformers (assisted generation; greedy output is identical to the target's own):",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"target = AutoModelForCausalLM.from_pretrained({target})",
        f"drafter = {load}",
        f"tokenizer = AutoTokenizer.from_pretrained({target})",
        "inputs = tokenizer(\"Hello\", return_tensors=\"pt\")",
        "out = target.generate(**inputs, assistant_model=drafter, do_sample=False, max_new_tokens=64)",
        "```",
        "",
        f"`generation_config.json` sets `num_assistant_tokens={g}` with a constant schedule: the γ priced "
        "best for draftnas's loop. transformers' assisted generation does more work per step outside the "
        "two models (about 3 ms on a 2-core CPU host), which can favour a smaller γ there; "
        "`draftnas bench --gamma N` measures both at any γ.",
        "",
        "On CPU, a host's default kernel can make the target's multi-token verify cost far more than a "
        "one-token decode, which undoes speculative decoding. With draftnas installed, route both models' "
        "linear layers through the product that times fastest on your host (outputs unchanged; products of "
        "more than 16 rows keep the default kernel; no effect on CUDA). Each step size is timed once, on "
        f"its second use; `.prepare(range(1, {g + 2}))` on a routing does it up front (3-5 s a size for "
        "Gemma-3-270M on a 2-core AMD EPYC host):",
        "",
        "```python",
        "from draftnas.linears import route_linears",
        "route_linears(target); route_linears(drafter)",
        "```",
        "",
        "`draftnas bench` measures assisted generation both ways (\"HF assisted generate\" and \"HF "
        "assisted, linears routed\").",
        "",
        "vLLM (not tested by draftnas):",
        "",
        "```python",
        "from vllm import LLM",
        f"llm = LLM(model={target}, speculative_config={{\"model\": \"{vllm_folder}\", "
        f"\"num_speculative_tokens\": {g}}})",
        "```",
        "",
        "Drafter and target must share one tokenizer (this drafter keeps the base's vocabulary).",
        "",
    ]


def _vocab_section(subset: Any, info: ExportInfo, parameters: int = 0,
                   full_parameters: int | None = None) -> list[str]:
    """How the reduced draft vocabulary is stored and which runtimes can use it."""
    if subset is None:
        return []
    full = f"{full_parameters:,}" if full_parameters else "more"
    measured = info.measured or {}
    cost = ""
    if "draft_ms_reduced_head" in measured and "draft_ms_full_head" in measured:
        cost = (f" Measured on the export machine: {measured['draft_ms_full_head']:.1f} ms per drafted "
                f"token with the full head against {measured['draft_ms_reduced_head']:.1f} ms with the "
                f"reduced head.")
    coverage = f"{subset.coverage:.3f}" if subset.coverage is not None else "unknown"
    return [
        "## Reduced draft vocabulary",
        "",
        f"This drafter's LM head covers **{subset.size:,} of the {subset.vocab_size:,} "
        "token ids** "
        f"(the most frequent tokens of the target's own outputs on the workload, plus special tokens; "
        f"coverage of those outputs: {coverage}). "
        f"The kept ids are in `draft_vocab.json` (fingerprint `{subset.fingerprint}`).",
        "",
        "- **draftnas** (`draftnas bench`, `draftnas.speculative.speculative_generate`) reads "
        "`draft_vocab.json` and slices the LM head to those rows: that small head is where the speed "
        "comes from. Verification by the target is unchanged, so greedy output stays identical to the "
        "target's own.",
        f"- **transformers, this folder** ({parameters:,} parameters): `model.safetensors` holds the "
        f"{subset.size:,}-row head and the kept ids. `{HEAD_MODULE_FILE}` (named in `config.json`'s "
        "`auto_map`) "
        "multiplies by those rows only and returns logits over the whole vocabulary, -inf outside the "
        "kept ids, so `assistant_model=` stays lossless and pays for the small head. When assisted "
        "generation decodes greedily, the class also answers its per-step call for candidates with a "
        "short greedy loop of its own instead of transformers' full `generate` (same tokens; "
        "`drafter.fast_assistant = False` turns it off). Load it with "
        "`trust_remote_code=True`; that file imports only torch and transformers.",
        f"- **`{FULL_HEAD_DIR}/`** ({full} parameters): the same drafter with a plain "
        "full-vocabulary, untied LM head (kept rows = the reduced head, the other rows = the input "
        "embedding). It loads anywhere with no remote code and stays lossless, but every drafted token "
        "pays for the full head." + cost,
        "- **vLLM / SGLang**: vLLM's draft-model method needs the draft and target vocabulary sizes to be "
        "equal, and neither engine reads `draft_vocab.json` for a plain draft model (their reduced "
        f"vocabularies are for EAGLE-family heads). Serve `{FULL_HEAD_DIR}/` there as an ordinary draft "
        "model; draftnas has not tested it in either engine.",
        "",
    ]


# --------------------------------------------------------------------------- hub


def push_to_hub(folder: str | Path, repo: str, *, private: bool = False) -> str:
    """Upload an exported folder to the hub; ExportError (one line) when the machine is offline."""
    from draftnas.sources import hub_reachable

    if not hub_reachable():
        raise ExportError(f"cannot push to {repo}: the model hub is unreachable from this machine "
                          f"(offline or HF_HUB_OFFLINE set); the drafter is saved at {folder}, upload it "
                          f"later with: huggingface-cli upload {repo} {folder}")
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(repo, private=private, exist_ok=True)
        api.upload_folder(repo_id=repo, folder_path=str(folder), commit_message="draftnas export")
    except Exception as exc:  # noqa: BLE001 - hub errors vary (auth, network); one line for the CLI
        raise ExportError(f"push to {repo} failed: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    return f"https://huggingface.co/{repo}"


# --------------------------------------------------------------------------- from a study or a plan file


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
    heal_steps: int | None = 0  # None: the stated default (`default_heal_steps`)
    heal: HealOptions | None = None
    gamma: int | None = None
    force: bool = False
    push_to_hub: str | None = None
    seed: int = 0

    def validate(self) -> ExportRequest:
        """Every out-of-range field at once, as one InvalidInputError (nothing is written)."""
        problems = []
        if self.gamma is not None and not MIN_GAMMA <= self.gamma <= MAX_GAMMA:
            problems.append(f"gamma must be in [{MIN_GAMMA}, {MAX_GAMMA}], got {self.gamma}")
        if self.heal_steps is not None and self.heal_steps < 0:
            problems.append(f"heal steps must be >= 0, got {self.heal_steps}")
        if problems:
            raise InvalidInputError("; ".join(problems))
        return self


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


@dataclass(frozen=True)
class _Source:
    """Where an export's plan came from: a study trial (with what the study was made for) or a file."""

    plan: PruningPlan
    label: str
    trial: RankedTrial | None = None
    info: StudyInfo | None = None


def _resolve_plan(request: ExportRequest) -> _Source:
    if (request.study is None) == (request.plan_file is None):
        raise ExportError("pass either --study NAME --storage URL [--trial N] or --plan FILE --base BASE")
    if request.plan_file is not None:
        return _Source(plan=load_plan(request.plan_file), label=f"plan {request.plan_file}")
    from draftnas.study import load_trial

    study = str(request.study)
    storage = request.storage
    if not storage:  # `draftnas search`'s default: runs/<study>/study.db
        default = Path("runs") / study / "study.db"
        if not default.is_file():
            raise ExportError(
                f"--study {request.study} without --storage looks for {default}, which does not "
                "exist; pass --storage URL (sqlite:///F, postgresql://..., journal:F)")
        storage = f"sqlite:///{default.resolve()}"
    info, trial = load_trial(study, storage, request.trial)
    plan = trial.candidate.plan
    if plan is None:
        raise ExportError(f"trial {trial.number} of study {request.study!r} holds no pruning plan "
                          "(latency-only candidates cannot be exported)")
    if trial.candidate.head_vocab_size and plan.vocab is None:
        raise ExportError(f"trial {trial.number} was stored by a draftnas whose plans did not carry the "
                          "reduced head's token ids; re-run `draftnas search` to export it")
    return _Source(plan=plan, label=study_source(study, trial.number), trial=trial, info=info)


def _gamma(request: ExportRequest, trial: RankedTrial | None, prediction: WorkloadPrediction | None) -> int:
    """--gamma, else the best gamma at the workload's main batch size for the drafter as exported
    (`prediction`), else the search's, else 4; never 0 (a folder is for speculating).

    (This once looked for top-level keys the stored prediction does not have, so every
    exported drafter said gamma 4 whatever the search found.)
    """
    if request.gamma is not None:
        return request.gamma
    for source in (prediction, trial.throughput if trial is not None else None):
        if source is not None and source.primary().gamma >= MIN_GAMMA:
            return source.primary().gamma
    return DEFAULT_GAMMA


def study_source(study: str, trial: int) -> str:
    """How an export from a study trial names its source (ExportInfo.source, draftnas.json)."""
    return f"study {study} trial {trial}"


def exported_record(folder: str | Path) -> dict[str, Any] | None:
    """A draftnas folder's `draftnas.json` (None when the folder holds none or it is unreadable)."""
    path = Path(folder) / "draftnas.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def searched_tokens(trial: RankedTrial | None, gamma: int) -> float | None:
    """The tokens per step the search scored for this trial at `gamma` (None: none measured)."""
    return trial.acceptance.tokens_at(gamma) if trial is not None else None


def study_traces(info: StudyInfo | None) -> Any:
    """The trace records a study scored acceptance on (its held-out split, at the workload's
    temperature), or None: an assumed-acceptance study, a study stored before draftnas recorded
    its traces, or a moved file."""
    if info is None or info.acceptance_assumed or not info.traces:
        return None
    if not Path(info.traces).is_file():
        log.warning("the study's traces %s are gone; the export is not re-scored", info.traces)
        return None
    from draftnas.traces import load_traces, split_traces

    scored, _ = split_traces(load_traces(info.traces).select(temperature=info.space.workload.temperature))
    return scored


def rescore(trial: RankedTrial, info: StudyInfo, estimate: AcceptanceEstimate) -> WorkloadPrediction:
    """The trial's latency (as the search priced it) at the exported drafter's measured acceptance."""
    reading = measured_acceptance(estimate)
    return predict_workload(trial.latency, reading, info.space.workload, info.space.gamma)


def workload_heal_options(info: StudyInfo | None, scored: Any = None) -> HealOptions:
    """Healing data for an export: the target's continuations of the study's workload prompt set
    (self-distillation on the text the drafter will serve; up to 40 prompts per domain), or of the
    default mixed set (10 per domain) for a plan file or a workload of every set; never the
    prompts of `scored`, the traces its acceptance will be estimated on. Training also gets
    EXPORT_WRITTEN_PROMPTS prompts the target writes itself, opening like the training prompts, and
    the teacher is the target's top-EXPORT_TEACHER_TOPK kept while the data is made. The learning
    rate is the study space's (`heal.learning_rate`), the one its trials were healed with."""
    exclude = tuple(r.info.prompt_id for r in scored.records) if scored is not None else ()
    options = HealOptions(exclude_prompts=exclude, written_prompts=EXPORT_WRITTEN_PROMPTS,
                          teacher_topk=EXPORT_TEACHER_TOPK)
    if info is None:
        return options
    options = replace(options, lr=info.space.heal.learning_rate)
    if info.space.workload.prompt_set == "all":
        return options
    return replace(options, prompts=info.space.workload.prompt_set, prompts_per_domain=40)


def default_heal_steps(source_space: Any) -> tuple[int, str]:
    """Heal steps when --heal-steps is not given, with why: none when the study's space heals none
    (its authors found short healing lowers that family's acceptance: the shipped Gemma-3 space),
    else DEFAULT_EXPORT_HEAL_STEPS."""
    if source_space is not None and source_space.heal.steps == 0:
        return 0, f"the search space {source_space.name} heals no drafter (heal.steps: 0)"
    return DEFAULT_EXPORT_HEAL_STEPS, "the stated default"


def export_from_request(request: ExportRequest, *, progress: Progress | None = None,
                        data_progress: Progress | None = None) -> ExportResult:
    """Resolve the plan, build the drafter from the base (healed unless 0 steps), export, push
    (optional)."""
    from draftnas.build import build_drafter
    from draftnas.sources import load_model

    request.validate()
    check_destination(request.out_dir, request.force)  # fail before minutes of work
    source = _resolve_plan(request)
    plan, trial = source.plan, source.trial
    base = request.base or plan.base
    if not base:
        raise ExportError("the plan names no base model; pass --base")
    target = request.target or (source.info.target if source.info else None) or base
    loaded = load_model(base)
    steps = request.heal_steps
    if steps is None:
        steps, why = default_heal_steps(source.info.space if source.info else None)
        log.info("healing %d steps: %s (--heal-steps N to choose)", steps, why)
    held = study_traces(source.info) if trial is not None else None
    options = None
    if steps > 0:
        options = replace(request.heal or workload_heal_options(source.info, held), steps=steps,
                          seed=request.seed)
    checkpoint = Path(request.out_dir + ".heal-checkpoint")
    scoring: dict[str, Any] = {}
    if held is not None and source.info is not None:
        scoring = {"held": held, "max_gamma": max(source.info.space.gamma.max, 1),
                   "temperature": source.info.space.workload.temperature}
    built = build_drafter(plan, loaded, heal=options,
                          teacher=_teacher(request.traces, target, base, loaded) if options else None,
                          checkpoint_dir=checkpoint, progress=progress, data_progress=data_progress,
                          **scoring)
    heal_result = built.heal
    if heal_result is not None and heal_result.top1_after < heal_result.top1_before:
        # healing made it worse on held-out text: export the pruned weights, and say so in the card
        log.warning("healing lowered held-out top-1 agreement (%.3f -> %.3f): exporting the unhealed "
                    "drafter", heal_result.top1_before, heal_result.top1_after)
        built = build_drafter(plan, loaded, **scoring)
        heal_result = replace(heal_result, kept=False)
    prediction = None
    if built.estimate is not None and trial is not None and source.info is not None:
        prediction = rescore(trial, source.info, built.estimate)
    measured = None
    if heal_result is not None:
        measured = ({"top1_agreement_after_healing": heal_result.top1_after} if heal_result.kept
                    else {"top1_agreement": heal_result.top1_before})
    info = ExportInfo(
        base=base, target=target, plan=plan, trial=trial,
        profile=source.info.profile if source.info else None,
        heal=heal_result, source=source.label, seed=request.seed, gamma=_gamma(request, trial, prediction),
        measured=measured, acceptance=built.estimate, prediction=prediction,
    )
    out = export_drafter(built.model, loaded.tokenizer, request.out_dir, info, force=request.force)
    if heal_result is not None:
        shutil.rmtree(checkpoint, ignore_errors=True)
    hub_url = push_to_hub(out, request.push_to_hub) if request.push_to_hub else None
    return ExportResult(out_dir=str(out), plan=plan, parameters=built.parameters, heal=heal_result,
                        hub_url=hub_url, source=source.label, name=drafter_name(info), gamma=info.gamma,
                        acceptance=built.estimate, prediction=prediction,
                        searched_tokens_per_step=searched_tokens(trial, info.gamma))


def _teacher(traces: str | None, target: str, base: str, loaded: Any) -> Any:
    """Traces when given, else the live target (the already `loaded` base when they are the same)."""
    if traces:
        from draftnas.traces import load_traces

        return load_traces(traces).select(temperature=0.0)
    if loaded is not None and target in (base, loaded.source.spec):
        return loaded.model
    from draftnas.sources import load_model

    return load_model(target).model


# --------------------------------------------------------------------------- draftnas heal


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


def heal_from_request(request: HealRequest, *, progress: Progress | None = None,
                      on_reading: Callable[[HealReading], None] | None = None,
                      data_progress: Progress | None = None) -> HealResult:
    """Build (from a plan) or load (a folder) the drafter, heal it toward the teacher, and with
    `out_dir` export it."""
    from draftnas.sources import load_model

    if (request.plan_file is None) == (request.drafter is None):
        raise InvalidInputError("pass either --plan FILE [--base BASE] or --drafter FOLDER")
    if request.out_dir:
        check_destination(request.out_dir, request.force)
    if request.plan_file is not None:
        from draftnas.build import build_drafter

        plan_file = load_plan(request.plan_file)
        plan: PruningPlan | None = plan_file
        base = request.base or plan_file.base
        if not base:
            raise InvalidInputError("the plan names no base model; pass --base")
        loaded = load_model(base)
        target = request.target or base
        built = build_drafter(plan_file, loaded, heal=request.options,
                              teacher=_teacher(request.traces, target, base, loaded),
                              checkpoint_dir=request.checkpoint_dir, progress=progress,
                              data_progress=data_progress, on_reading=on_reading)
        model, tokenizer, result = built.model, loaded.tokenizer, built.heal
    else:
        from draftnas.distill import heal

        drafter = str(request.drafter)
        folder = load_model(drafter)
        meta_path = Path(drafter) / "draftnas.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        plan = PruningPlan.from_data(meta["plan"]) if meta.get("plan") else None
        base = str(meta.get("base") or drafter)
        target = request.target or str(meta.get("target") or base)
        teacher = _teacher(request.traces, target, base, None)
        model, tokenizer = folder.model, folder.tokenizer
        result = heal(model, teacher, request.options, tokenizer=tokenizer,
                      checkpoint_dir=request.checkpoint_dir, progress=progress, on_reading=on_reading,
                      data_progress=data_progress)
    assert result is not None
    if request.out_dir:
        info = ExportInfo(base=base, target=target, plan=plan, heal=result, seed=request.options.seed,
                          gamma=request.options.gamma, source="draftnas heal",
                          measured={"top1_agreement_after_healing": result.top1_after})
        export_drafter(model, tokenizer, request.out_dir, info, force=request.force)
    return result


__all__ = [
    "ExportInfo", "ExportRequest", "ExportResult", "HealRequest", "check_destination", "export_drafter",
    "export_from_request", "heal_from_request", "model_card", "push_to_hub",
]
