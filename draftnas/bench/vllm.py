"""`bench --engine vllm`: the target alone, the drafter benched, each reference and lookup (`--lookup`) in
vLLM, every prompt no drafter was searched or healed on, greedy, one request at a time, in fp32.

Each arm is one vLLM engine (a process in vLLM's own environment, `models.vllm_engine`), its
`speculative_config` written by the arm's drafter family (`drafter.families`): `draft_model` for a model
drafter at the bench's γ, `ngram` for lookup. vLLM holds one engine per process and this host cannot hold
every arm's weights at once, so the rounds are interleaved by process: each round starts every arm's
engine again, in an order that rotates, and runs every prompt through it (the engine's load is left out).
A speculative arm's output is compared with the target alone's in the same round.

Beside vLLM's accepted drafts per position (its own counters) stands draftnas's replay of the same
requests over the target alone's outputs: lookup by vLLM's n-gram rule (`drafter.lookup`), a model drafter
by one teacher-forced pass (exact for greedy), each step drafting γ after the prefill, as vLLM does.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from draftnas.bench.arms import MAIN, reference_label
from draftnas.bench.records import ArmResult, ArmRun, BenchPrompt, BenchResult
from draftnas.bench.request_records import BenchOptions
from draftnas.bench.run import unseen_prompts
from draftnas.bench.stats import compare_arms, drafting_figures, first_divergence, interval_of, tokens_per_s
from draftnas.bench.vllm_replay import release_models, replayed
from draftnas.core.engine_kinds import VLLM
from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import cpu_count, cpu_identity, load_average
from draftnas.core.options import option_error
from draftnas.core.prompts import Prompt, check_context
from draftnas.core.records import Progress
from draftnas.drafter.families import DrafterSpec, family, parse_drafter
from draftnas.drafter.head.folder import head_for_target
from draftnas.drafter.head.shape import TargetKey, target_key
from draftnas.models.records import FULL_HEAD_DIR
from draftnas.models.sources import auto_class_name, ensure_local_folder, release_freed_memory
from draftnas.models.vllm_engine import Vllm, find_vllm, run_vllm
from draftnas.search.vllm import parse_schedule, schedule_gamma, scheduled_config

log = logging.getLogger(__name__)
TARGET, LOOKUP, SCHEDULE = "target", "lookup", "schedule"
KV_CACHE_GB_MAX = 8  # of the host's memory for vLLM's KV cache, beside the target and drafter weights


@dataclass(frozen=True)
class VllmArm:
    """One arm: its name, the drafter it runs (None: the target alone), the folder vLLM loads that drafter
    from, and the `speculative_config` its family writes."""

    name: str
    drafter: DrafterSpec | None = None
    folder: str = ""
    config: dict[str, Any] | None = None

    @property
    def gamma(self) -> int:
        """The most it drafts a step (a schedule's largest γ)."""
        return int((self.config or {}).get("num_speculative_tokens", 0))

    @property
    def kind(self) -> str:
        """How its steps are priced: "target" (no drafter), "lookup", "head" or "model"."""
        if self.drafter is None:
            return "target"
        if self.drafter.lookup is not None:
            return "lookup"
        return "head" if self.drafter.family == "head" else "model"

    @property
    def schedule(self) -> tuple[tuple[int, int, int], ...]:
        """Its batch-size schedule of γ (vLLM's num_speculative_tokens_per_batch_size), if it has one."""
        rows = (self.config or {}).get("num_speculative_tokens_per_batch_size") or ()
        return tuple((int(a), int(b), int(g)) for a, b, g in rows)

    def gamma_at(self, batch: int) -> int:
        """The γ vLLM drafts at `batch` running sequences."""
        return schedule_gamma(self.schedule, batch) if self.schedule else self.gamma

    def at_gamma(self, gamma: int) -> VllmArm:
        """The same arm at a fixed γ (what its schedule drafts at some batch)."""
        config = {k: v for k, v in (self.config or {}).items()
                  if k != "num_speculative_tokens_per_batch_size"}
        return replace(self, config=config | {"num_speculative_tokens": gamma})

    def label(self) -> str:
        """Its drafter as a table names it: the spec, and its γ where it drafts by a schedule or at a γ of its
        own."""
        if self.drafter is None:
            return ""
        if self.schedule:
            ranges = ",".join(f"{a}-{b}:{g}" for a, b, g in self.schedule)
            return f"{self.drafter.text}, γ by batch {ranges}"
        text = self.drafter.text
        return text if self.drafter.lookup is not None else f"{text} at γ {self.gamma}"


def vllm_folder(spec: DrafterSpec, target_vocab: int) -> str:
    """The folder vLLM loads a model drafter from: the drafter's own where it is an architecture vLLM knows,
    its plain full-head copy where its reduced head is custom code (`export --full-head`); one line where
    neither runs there, or where its vocabulary is not the target's."""
    folder = ensure_local_folder(spec.model)[1]
    if auto_class_name(folder):
        plain = folder / FULL_HEAD_DIR
        if not (plain / "config.json").is_file():
            raise option_error("draft", f"{spec.model}: its reduced head is custom code, which vLLM refuses; "
                                        f"export it with --full-head (a plain copy in {FULL_HEAD_DIR}/)")
        folder = plain
    vocab = int(json.loads((folder / "config.json").read_text()).get("vocab_size", 0))
    if vocab != target_vocab:
        raise option_error("draft", f"{spec.model}: its vocabulary ({vocab} rows) is not the target's "
                                    f"({target_vocab}); vLLM's draft_model needs the target's tokenizer")
    return str(folder)


def head_folder(spec: DrafterSpec, target: TargetKey) -> str:
    """The folder vLLM serves a head from (`eagle3`): the spec's own, checked against the target (one line
    where it was made for another or is no head)."""
    head_for_target(spec.model, target)
    return str(Path(spec.model).resolve())


def vllm_arms(draft: str, references: Sequence[str], options: BenchOptions, target: dict[str, Any],
              target_name: str = "the target") -> list[VllmArm]:
    """The target alone, the drafter benched, each reference and `--lookup`'s settings, each with its
    family's vLLM config (model drafters at --gamma, a reference at --reference-gamma); one line for a
    drafter whose family vLLM does not run."""
    named = [(MAIN, draft, options.gamma)]
    named += [(reference_label(i), ref, options.reference_gamma or options.gamma)
              for i, ref in enumerate(references)]
    named += [(LOOKUP, options.lookup, 0)] if options.lookup else []
    arms = [VllmArm(TARGET)]
    for name, text, gamma in named:
        spec = parse_drafter(text)
        if VLLM not in family(spec.family).engines:
            raise InvalidInputError(f"{text}: a {spec.family} drafter does not run in vLLM (vLLM runs one "
                                    "proposer per request)")
        folder = (head_folder(spec, target_key(target, target_name)) if spec.family == "head"
                  else vllm_folder(spec, int(target["vocab_size"])) if spec.model else "")
        arms.append(VllmArm(name, spec, folder, spec.settings(VLLM, gamma, draft_folder=folder)))
    if options.gamma_schedule:
        main, schedule = arms[1], parse_schedule(options.gamma_schedule)
        assert main.drafter is not None
        config = scheduled_config(main.drafter, 0, schedule, draft_folder=main.folder)
        arms.append(VllmArm(SCHEDULE, main.drafter, main.folder, config))
    return arms


@dataclass(frozen=True)
class VllmPlan:
    """What a vLLM bench runs: its arms, the prompts no drafter was searched or healed on (and their ids),
    those left out, and the driver's job without its speculative_config."""

    arms: list[VllmArm]
    prompts: list[Prompt]
    encoded: list[list[int]]
    left_out: tuple[str, ...]
    job: dict[str, Any]


def plan_vllm_bench(target: str, draft: str, prompts: Sequence[Prompt], options: BenchOptions,
                    references: Sequence[str], batches: Sequence[int] = (1,)) -> VllmPlan:
    """The arms and prompts of a vLLM bench, checked before any engine starts: the drafters vLLM can load,
    the context the longest prompt needs, and (`batches`) the KV cache B sequences of it need."""
    target_folder = ensure_local_folder(target)[1]
    release_freed_memory()  # a conversion of the target: its pages go back before vLLM allocates
    config = json.loads((target_folder / "config.json").read_text())
    arms = vllm_arms(draft, references, options, config, target)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_folder))
    models = [Path(a.drafter.model) for a in arms if a.drafter is not None and a.drafter.model]
    folders: list[Path | None] = [m for m in models if m.is_dir()]
    kept, encoded, left_out = unseen_prompts(prompts, tokenizer, folders, options.per_domain)
    if not kept:
        raise InvalidInputError("no prompts to bench")
    limit = int(config["max_position_embeddings"])
    check_context(kept, encoded, options.max_new_tokens + max(a.gamma for a in arms) + 1, limit, VLLM)
    context = min(max(len(ids) for ids in encoded) + options.max_new_tokens + 64, limit)
    kv_gb = _kv_gb(config, context, max(batches))
    if kv_gb > KV_CACHE_GB_MAX:
        raise option_error("batch_sizes", f"a batch of {max(batches)} sequences of {context} tokens needs "
                                          f"{kv_gb:.1f} GB of vLLM's KV cache in fp32, above the "
                                          f"{KV_CACHE_GB_MAX} GB draftnas gives it here: lower "
                                          "{batch_sizes} or {max_new_tokens}", flag="--batch-size")
    job = {"model": str(target_folder), "dtype": "float32", "prompts": [list(ids) for ids in encoded],
           "max_tokens": options.max_new_tokens, "rounds": 1, "seed": options.seed, "max_model_len": context,
           "kv_cache_gb": max(1, math.ceil(kv_gb * 1.25)), "batches": list(batches)}
    return VllmPlan(arms, kept, encoded, left_out, job)


def check_settings(vllm: Vllm, plan: VllmPlan, batches: Sequence[int] = (1,)) -> None:
    """vLLM's own reading of each arm's speculative_config and of the batch, before any engine starts (one
    process, no weights loaded): one line naming the arm and vLLM's refusal, or the batch above the
    max_num_seqs vLLM serves with."""
    speculating = [a for a in plan.arms if a.config]
    job = {key: plan.job[key] for key in ("model", "dtype", "max_model_len")}
    said = run_vllm(vllm, job | {"check": [a.config for a in speculating]}, timeout_s=600)
    for arm, refusal in zip(speculating, said["checks"], strict=True):
        if refusal:
            raise InvalidInputError(f"vLLM refuses the {arm.name} arm's speculative_config "
                                    f"{json.dumps(arm.config)}: {refusal}")
    most = said.get("max_num_seqs")
    if most and max(batches) > int(most):
        raise option_error("batch_sizes", f"{max(batches)} is above the {most} sequences vLLM {vllm.version} "
                                          "serves at once here (its max_num_seqs)", flag="--batch-size")


def _kv_gb(config: dict[str, Any], context: int, batch: int) -> float:
    """GB of fp32 keys and values `batch` sequences of `context` tokens hold (each drafter's are smaller)."""
    heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    return 2 * int(config["num_hidden_layers"]) * heads * head_dim * 4 * context * batch / 1e9


def _runs(arm: VllmArm, out: dict[str, Any]) -> list[tuple[ArmRun, list[int], list[int]]]:
    """Each request of one arm's process: its run, its tokens and vLLM's accepted drafts per position."""
    found = []
    for request in out["rounds"][0]:
        c = request["counters"]
        tokens = [int(t) for t in request["tokens"][0]]
        run = ArmRun(arm=arm.name, seconds=float(request["seconds"]), new_tokens=len(tokens),
                     steps=len(tokens) - int(c["num_accepted_tokens"]) if arm.config else len(tokens),
                     accepted=int(c["num_accepted_tokens"]), drafted=int(c["num_draft_tokens"]))
        found.append((run, tokens, [int(a) for a in c["accepted_per_pos"]] + [int(c["num_drafts"])]))
    return found


def run_vllm_bench(target: str, draft: str, prompts: Sequence[Prompt], options: BenchOptions, *,
                   references: Sequence[str] = (), progress: Progress | None = None,
                   vllm: Vllm | None = None) -> BenchResult:
    """Bench `draft` (each of `references`, and `options.lookup`) against `target` alone in vLLM: every
    prompt no drafter was healed or searched on, `options.rounds` rounds, each arm's engine started once a
    round in a rotating order."""
    started, load_before = time.perf_counter(), load_average()
    plan = plan_vllm_bench(target, draft, prompts, options, references)
    vllm = vllm or find_vllm()
    check_settings(vllm, plan)
    arms, kept, encoded, job = plan.arms, plan.prompts, plan.encoded, plan.job
    rows: list[BenchPrompt] = []
    per_pos: dict[str, list[int]] = {a.name: [] for a in arms}
    # the target alone's first run also decodes each prompt past the budget, untimed: a step near the end
    # drafts past it in vLLM, and the replay needs the tokens those drafts meet there
    extended: list[list[int]] = []
    for r in range(options.rounds):
        done = {}
        for a in arms[r % len(arms):] + arms[:r % len(arms)]:
            log.info("vLLM round %d: %s %s", r + 1, a.name,
                     json.dumps(a.config) if a.config else "(no drafter)")
            extend = max(x.gamma for x in arms) + 1 if a.config is None and not extended else 0
            out = run_vllm(vllm, job | {"speculative_config": a.config, "extend": extend})
            extended = extended or out.get("extended") or []
            done[a.name] = _runs(a, out)
            if progress:
                progress(r * len(arms) + len(done), options.rounds * len(arms))
        rows += _rows(arms, kept, encoded, done, r)
        for a in arms:
            per_pos[a.name] = _summed(per_pos[a.name], [pos for _, _, pos in done[a.name]])
    budget = options.max_new_tokens
    replays = {a.name: replayed(a, encoded, extended, budget, job["model"]) for a in arms}
    release_models()
    results = tuple(_arm_result(a, rows, per_pos[a.name], replays[a.name][0]) for a in arms)
    result = BenchResult(
        target=target, drafters={a.name: a.drafter.text for a in arms if a.drafter is not None},
        gamma=options.gamma, temperature=0.0, max_new_tokens=options.max_new_tokens, n_prompts=len(kept),
        device=vllm.device, dtype="float32", threads=cpu_count(), engine=VLLM, arms=results,
        prompts=tuple(rows), versions={"vllm": vllm.version}, left_out=plan.left_out,
        host=cpu_identity().label(), load_average_before=load_before, rounds=options.rounds,
        comparisons=tuple(compare_arms(rows, MAIN, a.name) for a in arms[2:]),
        wall_s=round(time.perf_counter() - started, 2))
    return _predicted(result, arms, {k: v[1] for k, v in replays.items()}, vllm, job["model"])


def _predicted(result: BenchResult, arms: Sequence[VllmArm], steps: dict[str, list[list[tuple[int, int]]]],
               vllm: Vllm, target_folder: str) -> BenchResult:
    """`result` with each arm's prediction from this host's stored vLLM calibration of the target and
    draftnas's replay (`bench.vllm_predicted`), and the line naming it; as it is where none is stored."""
    from draftnas.bench.vllm_predicted import predicted_checks, priced_arms, stored_calibration
    from draftnas.core.registry import resolve_architecture

    found = stored_calibration(Path(target_folder), vllm.version, result.threads)
    if found is None:
        return replace(result, predicted_from="no vLLM calibration of this target here to predict from "
                                              "(`draftnas search --engine vllm` times one)")
    calibration, path = found
    kinds = {a.name: a.kind for a in arms}
    model, drafters = priced_arms(calibration, resolve_architecture(target_folder),
                                  {a.name: (a.kind, a.folder) for a in arms})
    checks = predicted_checks(result, model, kinds, drafters, steps)
    said = f"this host's vLLM calibration {path} (timed {calibration.timed_at}) and draftnas's replay"
    return replace(result, predictions=checks, predicted_from=said)


def _rows(arms: Sequence[VllmArm], kept: Sequence[Prompt], encoded: Sequence[Sequence[int]],
          done: dict[str, list[tuple[ArmRun, list[int], list[int]]]], round_: int) -> list[BenchPrompt]:
    rows = []
    for i, (prompt, ids) in enumerate(zip(kept, encoded, strict=True)):
        plain = done[TARGET][i][1]
        runs = tuple(replace(run, lossless=tokens == plain, first_divergence=first_divergence(tokens, plain))
                     if a.config else run for a in arms for run, tokens, _ in [done[a.name][i]])
        rows.append(BenchPrompt(prompt_id=prompt.id, domain=prompt.domain, prompt_tokens=len(ids), runs=runs,
                                round=round_))
    return rows


def _summed(total: list[int], counts: Sequence[Sequence[int]]) -> list[int]:
    """Accepted drafts per position and the drafts (last), summed over requests."""
    for c in counts:
        total = [a + b for a, b in zip(total or [0] * len(c), c, strict=True)]
    return total


def _rates(counts: Sequence[int]) -> tuple[float, ...]:
    """Accepted per position over the steps that drafted (the last count)."""
    return tuple(a / counts[-1] for a in counts[:-1]) if counts and counts[-1] else ()


def _arm_result(arm: VllmArm, rows: Sequence[BenchPrompt], counts: Sequence[int], replayed: Sequence[int]
                ) -> ArmResult:
    runs = [p.run(arm.name) for p in rows]
    tps, (low, high) = interval_of(rows, lambda p: tokens_per_s(p.run(arm.name)))
    tokens = sum(r.new_tokens for r in runs)
    result = ArmResult(name=arm.name, engine=VLLM, tokens_per_s=tps, tokens_per_s_interval=(low, high),
                       pooled_tokens_per_s=tokens / sum(r.seconds for r in runs))
    if arm.config is None or arm.drafter is None:
        return result
    return replace(
        result, **drafting_figures(runs, compare_arms(rows, arm.name, TARGET)), drafter=arm.drafter.text,
        baseline=TARGET, gamma=arm.gamma, accepted_per_position=_rates(counts),
        predicted_accepted_per_position=_rates(replayed))


def position_lines(result: BenchResult) -> list[str]:
    """Per speculative arm: vLLM's accepted drafts per position beside draftnas's replay of the same
    requests, and their largest difference (relative to the replay)."""
    lines = []
    for a in result.arms:
        measured, replayed = a.accepted_per_position, a.predicted_accepted_per_position
        if not measured:
            continue
        line = f"{a.name}: accepted per draft position in vLLM {' / '.join(f'{x:.3f}' for x in measured)}"
        if len(replayed) == len(measured):
            worst = max(abs(m - r) / r if r else abs(m - r) for m, r in zip(measured, replayed, strict=True))
            line += (f"; draftnas's replay on the same requests {' / '.join(f'{x:.3f}' for x in replayed)} "
                     f"(largest difference {worst:.1%})")
        lines.append(line)
    return lines
