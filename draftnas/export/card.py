"""The model card (`README.md`) of an exported drafter: metadata, shape, plan, figures, use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftnas.acceptance.records import AcceptanceEstimate
from draftnas.drafter.heal.heal_records import HealResult
from draftnas.drafter.records import PruningPlan
from draftnas.export.records import ExportInfo, drafter_name
from draftnas.models.records import FULL_HEAD_DIR, HEAD_MODULE_FILE
from draftnas.search.records import RankedTrial, WorkloadPrediction


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
        searched = searched_tokens(info.trial, info.gamma, info.p_min)
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
    stop = acceptance.policy(p.gamma, p.p_min) if p.p_min else None
    tokens = stop.tokens_per_step if stop is not None else acceptance.tokens_per_step.get(str(p.gamma))
    verdict = ("faster than" if prediction.speedup >= 1.005 else "slower than" if prediction.speedup <= 0.995
               else "level with")
    line = (f"Predicted, not measured, for this drafter as exported: {prediction.tokens_per_s:.1f} "
            f"tokens/s, {prediction.speedup:.3f}x the target alone "
            f"({prediction.baseline_tokens_per_s:.1f}) in the engine the search priced (predicted {verdict} "
            f"the target alone there), at gamma {p.gamma}"
            + (f" stopping after a draft below p {p.p_min:g} ({stop.drafted_per_step:.2f} drafts a step)"
               if stop is not None else ""))
    if tokens is not None:
        line += (f" with {tokens:.3f} tokens per step, measured on {acceptance.n_positions} positions of "
                 f"{acceptance.n_prompts} trace records held out from its healing")
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


def _settings_lines(info: ExportInfo) -> list[str]:
    """What generation_config.json sets and, for a quantized drafter, the settings of each way it runs."""
    g, stop = info.gamma, (f" stopping below confidence {info.p_min:g}" if info.p_min else "")
    tail = ("transformers' assisted generation does more work per step outside the two models, which can "
            "favour a smaller γ there; `draftnas bench --gamma N` measures both at any γ.")
    if info.plain_gamma is None:
        return [f"`generation_config.json` sets `num_assistant_tokens={g}` with a constant schedule{stop}: "
                f"the γ priced best for draftnas's loop. {tail}"]
    plain = f" stopping below confidence {info.plain_p_min:g}" if info.plain_p_min else ""
    return [f"Settings differ by how the drafter runs. Loaded plainly it runs dense, and "
            f"`generation_config.json` sets what was priced best for it dense: `num_assistant_tokens="
            f"{info.plain_gamma}`{plain} (`assistant_confidence_threshold={info.plain_p_min:g}`). With its "
            f"{info.weights} kernels (`route_linears` below, as draftnas's loop runs it) it drafts faster, "
            f"and γ {g}{stop} was priced best: pass `num_assistant_tokens={g}, "
            f"assistant_confidence_threshold={info.p_min:g}` to `generate`. {tail}"]


def _usage_section(info: ExportInfo, reduced: bool = False) -> list[str]:
    g = info.gamma
    target = _model_ref(info.target)
    load = ('AutoModelForCausalLM.from_pretrained("path/to/this/folder", trust_remote_code=True)'
            if reduced else 'AutoModelForCausalLM.from_pretrained("path/to/this/folder")')
    vllm_folder = f"path/to/this/folder/{FULL_HEAD_DIR}" if reduced else "path/to/this/folder"
    quantized_arg = "" if info.weights == "dense" else f", weights={info.weights!r}"
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
        'inputs = tokenizer("Hello", return_tensors="pt")',
        "out = target.generate(**inputs, assistant_model=drafter, do_sample=False, max_new_tokens=64)",
        "```",
        "",
        *_settings_lines(info),
        "",
        "On CPU, a host's default kernel can make the target's multi-token verify cost far more than a "
        "one-token decode, which undoes speculative decoding. With draftnas installed, route both models' "
        "linear layers through the product that times fastest on your host (outputs unchanged; products of "
        "more than 16 rows keep the default kernel; no effect on CUDA). Each step size is timed once, on "
        f"its second use; `.prepare(range(1, {g + 2}))` on a routing does it up front (seconds a size):",
        "",
        "```python",
        "from draftnas.models.linears import route_linears",
        f"route_linears(target); route_linears(drafter{quantized_arg})",
        "```",
        "",
        *([
            f"This drafter was searched to run with **{info.weights} weights** (weight-only, on CPU; int8: "
            "one scale per output row, int4: a scale and zero point per 32 inputs): the folder holds its "
            f"dense weights, and `route_linears(drafter{quantized_arg})` multiplies its linear layers so "
            "(`draftnas bench` does the same in its static engine and routed arm). Loaded plainly it runs "
            "dense, at the speed of its dense weights.",
            "",
        ] if info.weights != "dense" else []),
        '`draftnas bench` measures assisted generation both ways ("HF assisted generate" and "HF '
        'assisted, linears routed").',
        "",
        "vLLM (as `draftnas bench --engine vllm -d path/to/this/folder` runs it: fp32, greedy, the drafter "
        "dense):",
        "",
        "```python",
        "from vllm import LLM",
        f'llm = LLM(model={target}, dtype="float32", speculative_config={{"method": "draft_model", '
        f'"model": "{vllm_folder}", "num_speculative_tokens": {g}}})',
        "```",
        "",
        f"γ {g} is the γ the search priced in its own engine. vLLM drafts γ tokens every step (no "
        "confidence stop) and runs the drafter's weights dense; `draftnas search --engine vllm` prices γ for "
        "vLLM itself and prints its `--speculative-config`.",
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
        "- **draftnas** (`draftnas bench`, `draftnas.models.speculative.speculative_generate`) reads "
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
        (f"- **`{FULL_HEAD_DIR}/`** ({full} parameters): the same drafter with a plain "
         "full-vocabulary, untied LM head (kept rows = the reduced head, the other rows = the input "
         "embedding). It loads anywhere with no remote code and stays lossless, but every drafted token "
         "pays for the full head." + cost) if full_parameters else
        (f"- **A full-head copy** is not in this folder (export with `--full-head` to write one into "
         f"`{FULL_HEAD_DIR}/`: the same drafter with a plain full-vocabulary LM head, for engines without "
         "remote code)." + cost),
        "- **vLLM / SGLang**: vLLM's draft-model method needs the draft and target vocabulary sizes to be "
        "equal, and neither engine reads `draft_vocab.json` for a plain draft model (their reduced "
        f"vocabularies are for EAGLE-family heads). vLLM loads the full-head copy (`{FULL_HEAD_DIR}/`) as "
        f"an ordinary draft model: `--speculative-config '{{\"method\": \"draft_model\", \"model\": "
        f"\"<this folder>/{FULL_HEAD_DIR}\", \"num_speculative_tokens\": G}}'` (`draftnas bench --engine "
        "vllm` runs it so); SGLang is not tested.",
        "",
    ]


def searched_tokens(trial: RankedTrial | None, gamma: int, p_min: float = 0.0) -> float | None:
    """The tokens per step the search scored for this trial at `gamma` and confidence stop `p_min` (None:
    none measured)."""
    if trial is None:
        return None
    stop = trial.acceptance.policy_at(gamma, p_min) if p_min else None
    return stop.tokens_per_step if stop is not None else trial.acceptance.tokens_at(gamma)
