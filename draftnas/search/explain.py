"""What a search says beside its ranking, as text the caller prints: the summary lines (trials,
storage, the best, why nothing pays, what was assumed) and the next commands to run with the winner
(export it, bench it, use it from transformers or llama.cpp)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from draftnas.core.engine_kinds import LLAMA_CPP, VLLM
from draftnas.search.hand_made import bar_line
from draftnas.search.healing import healing_lines

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.core.registry import Architecture
    from draftnas.search.records import BatchEconomics, CandidateChoice, RankedTrial, SearchResult
    from draftnas.search.space import SearchSpace


def summary_lines(result: SearchResult) -> list[str]:
    c = result.counts
    lines = [
        f"trials: {c.get('COMPLETE', 0)} complete, {c.get('PRUNED', 0)} pruned "
        f"({result.pruned_by_upper_bound} by the upper bound, {result.pruned_infeasible} infeasible), "
        f"{c.get('FAIL', 0)} failed, {c.get('RUNNING', 0)} running; this process told "
        f"{len(result.told_here)} in {result.wall_s:.1f} s",
        f"storage: {result.storage}  (study {result.study_name})",
    ]
    if result.info.placement is not None:
        lines.append(f"placement: {result.info.placement.summary()}")
    if result.pruned_by_upper_bound:
        what = "healing + acceptance estimates" if not result.info.acceptance_assumed else "evaluations"
        lines.append(f"upper-bound pruning saved {result.pruned_by_upper_bound} {what} "
                     "(acceptance 1 at their latency could not beat the best trial)")
    if result.reused:
        lines.append(f"{result.reused} trial(s) re-proposed an evaluated drafter and reused its evaluation")
    if result.best is not None:
        b = result.best
        lines.append(f"best: trial {b.number} {b.candidate.name}: {b.throughput.tokens_per_s:,.1f} tokens/s, "
                     f"{b.throughput.speedup:.3f}x plain decoding "
                     f"({b.throughput.baseline_tokens_per_s:,.1f} tokens/s)")
        bar = bar_line(result)
        if bar is not None:
            lines.append(bar)
        if b.economics is not None:
            lines.append(break_even_line(b.economics, f"trial {b.number}"))
        lines += healing_lines(result)
        lines += [f"WARNING: the best sits on an edge of the space: {edge}; the optimum may lie beyond it "
                  "(widen the space there and search again)"
                  for edge in space_edges(result.info.space, b.candidate.choice, b.primary.gamma,
                                          result.info.base_arch)]
    # (a llama.cpp search prints its verdict instead: the engine's step costs and break-even acceptance)
    if result.best is not None and result.best.throughput.speedup < 1.0 and result.verdict is None:
        lines.append(_no_winner(result))
    if result.info.acceptance_model:
        lines.append(f"NOTE: {result.info.note}. Transferring a model fitted on other families to this one "
                     "is an assumption; the break-even α column says what each drafter needs.")
    elif result.info.acceptance_assumed:
        lines.append(f"NOTE: {result.info.note}; ranking reflects latency only.")
    if result.profile_note:
        lines.append(result.profile_note if result.profile_note.startswith("calibrated")
                     else f"NOTE: {result.profile_note}.")
    return lines


def break_even_line(e: BatchEconomics, name: str) -> str:
    """One line: the largest swept batch at which `name` still pays (predicted), and what priced it."""
    paying = [b for b, s in zip(e.sweep_batches, e.sweep_speedup, strict=True) if s > 1.0
              and (e.crossover_batch is None or b < e.crossover_batch)]
    if e.timed_batches:
        top = max(e.timed_batches)
        how = f"batches timed here up to {top}" + (", larger ones priced from it"
                                                   if e.sweep_batches[-1] > top else "")
    else:
        how = ("priced from batch-1 timings by the profile's growth with the batch, which can be wrong "
               "by orders of magnitude: `--batch B` times batches up to B")
    if not paying:
        return f"break-even batch: {name} does not pay even at batch 1 ({how})"
    stop = (f"stops at batch {e.crossover_batch}" if e.crossover_batch is not None
            else f"pays at every batch swept, to {e.sweep_batches[-1]}")
    loop = (f"; in draftnas's batched loop, where a batch steps until its slowest sequence has its "
            f"{e.lockstep_tokens} tokens" if e.lockstep_tokens else "")
    return f"break-even batch: {name} pays up to batch {paying[-1]} (predicted; {stop}; {how}{loop})"


def space_edges(space: SearchSpace, choice: CandidateChoice, gamma: int, base: Architecture) -> list[str]:
    """Each dimension of `space` whose offered values end at `choice`'s (or at `gamma`) where the space
    could go on: depth at its min (above 1) or max (below the base's layers), the smallest reduced head,
    the largest reduced head below the full vocabulary, an MLP ratio at the lowest offered, γ at its max."""
    out = []
    depths = space.depth.values()
    if len(depths) > 1 and choice.depth == depths[0] > 1:
        out.append(f"depth {choice.depth} is the least offered")
    if len(depths) > 1 and choice.depth == depths[-1] < base.num_hidden_layers:
        out.append(f"depth {choice.depth} is the most offered (the base has {base.num_hidden_layers})")
    reduced = sorted(v for v in space.vocab_sizes if v > 0)
    if len(space.vocab_sizes) > 1 and reduced and choice.vocab_size == reduced[0]:
        out.append(f"head {choice.vocab_size:,} rows is the smallest offered")
    elif len(space.vocab_sizes) > 1 and reduced and choice.vocab_size == reduced[-1]:
        out.append(f"head {choice.vocab_size:,} rows is the largest reduced head offered, below the full "
                   f"{base.vocab_size:,}")
    ratios = sorted(space.width.mlp_ratios)
    if len(ratios) > 1 and choice.mlp_ratio == ratios[0]:
        out.append(f"MLP ratio {choice.mlp_ratio} is the lowest offered")
    if space.gamma.max > space.gamma.min and gamma == space.gamma.max:
        out.append(f"γ {gamma} is the most considered")
    return out


def _no_winner(result: SearchResult) -> str:
    """Why nothing beats plain decoding here: the acceptance-1 ceiling, from the step latencies."""
    from draftnas.search.results import acceptance_ceiling

    ceiling = acceptance_ceiling(result)
    assert ceiling is not None
    r, bound = ceiling
    e = bound.primary()
    why = (f"even accepting every drafted token, the best of them ({r.candidate.name}) would reach "
           f"{bound.speedup:.2f}x: at gamma {e.gamma}, {e.gamma} draft step(s) of {e.draft_ms:.1f} ms and a "
           f"verify of {e.gamma + 1} tokens at {e.verify_ms:.1f} ms, against {e.target_ms:.1f} ms per "
           "target token")
    if bound.speedup <= 1.0:
        return f"NOTE: no candidate beats plain decoding: {why}; no acceptance makes these drafters pay here."
    if result.info.acceptance_assumed:
        return (f"NOTE: no candidate beats plain decoding at the acceptance given: {why}, so it is "
                "acceptance that falls short; the break-even α column says how much each drafter needs.")
    steps = result.info.space.heal.steps
    healed = f" after the search's {steps}-step healing" if steps else ""
    return (f"NOTE: no candidate beats plain decoding at the acceptance measured{healed}: {why}, so it is "
            "acceptance that falls short; export heals longer and prices the drafter again (--export), "
            "or trace more of your workload, or search another base.")


def exportable(result: SearchResult) -> bool:
    """Whether the best trial is a drafter with weights (not a latency-only shape)."""
    b = result.best
    return b is not None and b.candidate.plan is not None and not result.info.acceptance_assumed


def next_commands(result: SearchResult, exported: tuple[str, int, float] | None = None,
                  target_gguf: str | None = None, hand_made: str | None = None) -> list[str]:
    """What to run next with the best drafter: export it (unless `exported`: its folder and gamma),
    bench it (beside the first reference with weights, at its own best gamma, and the hand-made best
    exported into the folder `hand_made`, at its own; in the dtype the search chose, on `target_gguf`
    when llama.cpp timed another file of the target), use it from transformers or llama.cpp."""
    from draftnas.models.sources import has_weights

    b = result.best
    if b is None:
        return []
    if not exportable(result):
        return ["next: this was a latency-only search (no weights to prune); search with the base's weights "
                "(--base) to get a drafter you can export"]
    folder, gamma, p_min = exported or (f"drafters/{b.candidate.name}", b.primary.gamma, b.primary.p_min)
    w = result.info.space.workload  # bench on the workload's prompt set, as the acceptance was measured
    reduced = b.candidate.head_vocab_size is not None
    load = f"AutoModelForCausalLM.from_pretrained('{folder}'{', trust_remote_code=True' if reduced else ''})"
    export = [] if exported is not None else [
        f"  draftnas export --study {result.study_name} --storage {result.storage} --trial {b.number} "
        f"--out {folder}"]
    ref = next((r for r in result.references if r.reference and has_weights(r.reference)), None)
    reference = ref.reference if ref is not None else None
    ref_gamma = ref.primary.gamma if ref is not None else gamma  # the reference at its own best gamma
    if result.info.engine == LLAMA_CPP:
        use = _llama_cpp_use(result, folder, gamma, target_gguf)
    elif result.info.engine == VLLM:
        use = _vllm_use(result, folder, gamma)
    else:
        weights = b.candidate.choice.weights
        use = [f"  in transformers: target.generate(..., assistant_model={load})"
               + ("  # loaded plainly it runs dense, at the γ and stop its generation_config sets for that"
                  if weights != "dense" else ""),
               "  on CPU, route both models' small products first (a multi-token verify can cost far more "
               "than a decode with the default kernel): from draftnas.models import route_linears; "
               "route_linears(target); route_linears(drafter"
               + (f", weights={weights!r}) and pass num_assistant_tokens={gamma}"
                  + (f", assistant_confidence_threshold={p_min:g}" if p_min else "")
                  + f" to generate  # its {weights} kernels' own settings" if weights != "dense" else ")")]
    return [
        "next:",
        *export,
        f"  draftnas bench --target {result.info.target} --draft {folder} --gamma {gamma}"
        + (f" --p-min {p_min:g}" if p_min else "")
        + (f" --engine {result.info.engine}" if result.info.engine else "")
        + (f" --target-gguf {target_gguf}" if target_gguf else "")
        + (f" --dtype {result.info.dtype}" if result.info.dtype != "fp32" else "")
        + (f" --device {result.info.device}" if result.info.device != "cpu" else "")
        + (f" --reference {reference}" if reference else "")
        + (f" --reference-gamma {ref_gamma}" if ref_gamma != gamma else "")
        + (f" --reference-p-min {ref.primary.p_min:g}" if ref is not None and ref.primary.p_min else "")
        + (f" --reference {hand_made}" if hand_made else "")
        + (f" --prompts {w.prompt_set} --per-domain 3" if w.prompt_set != "all" else "")
        + (f" --predictions {result.predictions_file}"  # vLLM's bench prices from the stored calibration
           if result.predictions_file and result.info.engine != VLLM else ""),
        *use,
    ]


def _llama_cpp_use(result: SearchResult, folder: str, gamma: int, target_gguf: str | None) -> list[str]:
    """How to serve the winner with llama.cpp's own server, draft length as searched."""
    from draftnas.models.gguf_file import gguf_of

    b = result.best
    assert b is not None
    drafter = f"{folder}/{result.info.base}-{b.candidate.name}.gguf"  # export.gguf.gguf_path
    target = target_gguf or gguf_of(result.info.target)
    return [f"  in llama.cpp: llama-server -m {target} -md {drafter} --spec-type "
            f"draft-simple --spec-draft-n-max {gamma} --spec-draft-p-min 0"]


def _vllm_use(result: SearchResult, folder: str, gamma: int) -> list[str]:
    """How to serve the winner with vLLM: its `--speculative-config` (the export's full-head copy where its
    head is reduced) and, where the search priced batches, γ per batch range up to the break-even."""
    from draftnas.models.sources import ensure_local_folder
    from draftnas.search.vllm import batch_schedule, config_line, speculative_config

    b = result.best
    assert b is not None
    e = b.economics
    batched = max(result.info.space.workload.batch_sizes) > 1
    schedule = (batch_schedule(e.sweep_batches, e.sweep_gamma, e.sweep_speedup)
                if e is not None and e.sweep_gamma and batched else [])
    config = speculative_config(folder, gamma, schedule)
    target = str(ensure_local_folder(result.info.target)[1])
    out = [f"  in vLLM: vllm serve {target} --dtype float32 {config_line(config)}"]
    if schedule:
        sweep = zip(e.sweep_batches, e.sweep_gamma, e.sweep_speedup, strict=True) if e is not None else ()
        past = next((batch for batch, g, s in sweep if s <= 1.0 or g < 1), None)
        if past is not None:
            out.append(f"  (from batch {past} no γ is predicted to pay; vLLM cannot stop drafting within a "
                       "server, so where most steps run there, serve without the drafter)")
        out.append("  (served in vLLM 0.32's CPU build on a Zen 4, each group of requests prefilled in one "
                   "step, a schedule so closed ran level with the best fixed γ at one, two, four and eight "
                   "sequences, 0.98x to 1.04x paired over 4 runs, each range holding 1: "
                   "docs/hosts/amd-epyc-zen4-vllm-schedules.md; bench yours, `draftnas bench --engine vllm "
                   "--batch-size ... --gamma-schedule`)")
    if e is not None and e.sweep_gamma and not schedule:
        out.append("  (no batch schedule: no γ is predicted to pay at batch 1)" if batched else
                   "  (with --batch B the search also prints γ per batch-size range)")
    return out


def alpha_next_command(step: str, out: str) -> str:
    """What to run after `draftnas alpha measure` (fit the pairs written to `out`) or `alpha fit` (search
    a target without weights with the model written to `out`)."""
    if step == "measure":
        return f"next: draftnas alpha fit {out} --out alpha-model.json"
    return f"next: draftnas search --target llama-65b --acceptance-prior {out}"


def standing_lines(ranked: Sequence[RankedTrial], finished: int, total: int, first: bool,
                   top: int = 3) -> list[str]:
    """The ranking while the search runs (the best `top` so far by predicted tokens/s), which the final
    table refines: `first` after the hand-made trials, else after `finished` of `total` trials."""
    if not ranked:
        return []
    said = ("first ranking, from the hand-made trials (the search goes on and refines it)" if first
            else f"ranking after {finished} of {total} trials")
    rows = [f"  {i}. trial {r.number}{' (hand-made)' if r.hand_made else ''} {r.candidate.name}: "
            f"{r.throughput.tokens_per_s:.1f} tokens/s, {r.throughput.speedup:.2f}x predicted"
            for i, r in enumerate(ranked[:top], 1)]
    return [f"{said}:", *rows]
