"""What `draftnas search` prints: the ranking as a table (the search stage writes the rest,
`draftnas.search.explain`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from draftnas.cli.app import fmt_params
from draftnas.core.engine_kinds import VLLM

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.drafter.training.distill_records import TrainedPrice
    from draftnas.search.records import RankedTrial, SearchResult


def ranked_table(result: SearchResult, top: int = 15) -> Table:
    """The ranking as a rich table (best first); says when acceptance is assumed."""
    info = result.info
    assumed = info.acceptance_assumed
    title = (f"study {result.study_name}: drafters for {info.target} from {info.base}, "
             f"ranked by predicted tokens/s on {info.profile}")
    if (result.profile_note or "").startswith("calibrated"):
        title += ", calibrated on this machine"
    if info.acceptance_model:
        title += f"\n[bold yellow]ACCEPTANCE {info.acceptance_model}, NOT MEASURED[/]"
    elif assumed:
        title += f"\n[bold yellow]ACCEPTANCE ASSUMED ({info.acceptance_prior:g} per token), NOT MEASURED[/]"
    table = Table(title=title, header_style="bold", title_justify="left")
    acc_col = ("fitted α / tok/step" if info.acceptance_model else "assumed α / tok/step" if assumed
               else "top-1 / tok/step")
    rows = rows_with_references(result, top)
    name_width = max((len(r.candidate.name) for r in rows), default=9)
    for col in ("#", "trial", "candidate", "layers x width", "params", "draft / verify ms",
                acc_col, "best γ <stop", "tokens/s", "speedup", "break-even α b1 / bN", "stops paying at b"):
        # the name is never cut ("L1bi-h6kv2-m0.5-v4…" was): its column keeps its width, the
        # others wrap at their spaces when the terminal is narrow
        if col == "candidate":
            table.add_column(col, no_wrap=True, min_width=name_width)
        else:
            table.add_column(col, justify="left" if col == "layers x width" else "right", overflow="fold")
    rank = 0
    for r in rows:
        rank += r.reference is None
        table.add_row(*_row(rank, r))
    batches = result.ranked[0].latency.batch_sizes if result.ranked else ()
    caption = []
    if len(batches) > 1:
        caption.append(f"ms and γ at the workload's main batch size; tokens/s and speedup over batch "
                       f"sizes {', '.join(map(str, batches))} (weighted)")
    w = info.space.workload
    if w.prompt_tokens:
        caption.append(f"tokens/s and speedup of whole requests: a {w.prompt_tokens}-token prompt prefilled, "
                       f"{w.new_tokens} tokens generated")
    if result.references:
        caption.append("ref: a published drafter (the space's references), priced the same way")
    if any(r.hand_made for r in rows):
        caption.append("hand: a trial pricing the stock drafter under one global weight format and head size "
                       "(what a user can make without a search; the best of them is the bar)")
    caption.append("break-even α: the acceptance at which speculation ties plain decoding, at batch 1 and "
                   "the largest; stops paying: the first batch where it no longer wins at its α")
    table.caption = "\n".join(caption)
    return table


def rows_with_references(result: SearchResult, top: int) -> list[RankedTrial]:
    """The top trials and the space's published drafters, by predicted tokens/s."""
    rows = [*result.ranked[:top], *result.references]
    return sorted(rows, key=lambda r: -r.throughput.tokens_per_s)


def _alpha(value: float | None) -> str:
    return "none ≤ 1" if value is None else f"{value:.2f}"


def _row(rank: int, r: RankedTrial) -> list[str]:
    p = r.primary
    acc = f"{r.acceptance.acceptance_rate:.3f} / {p.tokens_per_step:.2f}"
    trial = f"{r.number}" + (f" (=#{r.reused_from})" if r.reused_from is not None else "") \
        + (" hand" if r.hand_made else "")
    e = r.economics
    even = "" if e is None else f"{_alpha(e.break_even_alpha_batch1)} / {_alpha(e.break_even_alpha_largest)}"
    stops = "" if e is None else (f"{e.crossover_batch}" if e.crossover_batch is not None
                                  else f"> {e.sweep_batches[-1]}")
    return ["ref" if r.reference else str(rank), "—" if r.reference else trial, r.candidate.name,
            r.candidate.shape_label(), fmt_params(r.candidate.parameters),
            f"{p.draft_ms:.3f} / {p.verify_ms:.3f}", acc, p.drafting, f"{r.throughput.tokens_per_s:,.1f}",
            f"{r.throughput.speedup:.3f}x", even, stops]


def _tokens(p: TrainedPrice) -> str:
    """The budget a shape needs to beat the bar, as far as its curve says: nothing where the slope's
    interval spans 0, marked where it lies past the last reading."""
    from draftnas.search.trained import MAX_BUDGET

    if not p.measurable_slope:
        low, high = p.slope_interval or (float("nan"), float("nan"))
        return f"no measurable slope ({low:+.4f} to {high:+.4f} per e-fold)"
    value = p.tokens_to_beat_bar
    if value is None:
        return f"not within {MAX_BUDGET:.0e} by the fit (extrapolated)"
    if value == 0:
        return "0 (already)"
    return f"{value:.2g}" + (" (extrapolated)" if value > p.measured_to_tokens else "")


def trained_table(result: SearchResult) -> Table:
    """Trained shapes at their budget: acceptance from each shape's curve (`draftnas distill curve`),
    latency from the trials' model, and the budget each needs to beat the hand-made best."""
    table = Table(title="trained shapes (acceptance read off each shape's training curve, NOT MEASURED at "
                        "budgets past its last reading)", header_style="bold", title_justify="left")
    for col in ("shape", "base", "budget tokens", "draft ms", "tok/step (curve γ)", "α", "best γ", "tokens/s",
                "speedup", "tokens to beat the bar", "curve measured to", "fit check"):
        table.add_column(col, justify="left" if col in ("shape", "base") else "right", overflow="fold")
    for p in result.trained:
        table.add_row(p.label, p.base if p.family != "head" else f"{p.base}'s hidden states",
                      f"{p.budget_tokens:,}" + (" (extrapolated)" if p.extrapolated else ""),
                      f"{p.draft_ms:.3f}", f"{p.tokens_per_step:.2f} (γ {p.curve_gamma})",
                      f"{p.acceptance_rate:.3f}",
                      str(p.best_gamma), f"{p.tokens_per_s:,.1f}", f"{p.speedup:.3f}x",
                      _tokens(p),
                      f"{p.measured_to_tokens:,}",
                      "-" if p.check_error is None else f"{p.check_error:+.1%} of the gain over 1")
    bar = result.trained[0].bar_tokens_per_s if result.trained else None
    caption = [f"the bar: the hand-made best (else the search's best trial) at {bar:,.1f} tokens/s"
               if bar is not None else "no hand-made best or trial to beat"]
    hosts = sorted({p.curve_host.split(", load")[0] for p in result.trained if p.curve_host})
    where = (f" (trained on {'; '.join(hosts)}: greedy acceptance does not depend on the host)"
             if hosts else "")
    caption.append("acceptance from training runs' held-out readings" + where + "; latency priced here; "
                   "`draftnas distill train` makes a shape's drafter (docs/training.md)")
    from draftnas.search.trained import ASSUMED_GPU_FLOPS

    for p in result.trained:
        if p.plan and p.tokens_to_beat_bar:
            hours = p.tokens_to_beat_bar * p.flops_per_token / ASSUMED_GPU_FLOPS / 3600
            past = ", extrapolated" if p.tokens_to_beat_bar > p.measured_to_tokens else ""
            caption.append(f"GPU plan for {p.label} to the budget its curve says beats the bar "
                           f"({p.tokens_to_beat_bar:.2g} tokens{past}): {p.plan}; about {hours:.2g} "
                           f"GPU-hours from FLOPs ({p.flops_per_token / 1e9:.1f} GFLOP a token at an assumed "
                           f"{ASSUMED_GPU_FLOPS / 1e12:.0f} TFLOP/s of fp32 on an H100, not measured; making "
                           "data decodes, which runs below its FLOPs: a lower bound)")
    if any(p.family == "head" for p in result.trained):
        caption.append(("a head is priced from a head of its shape timed as vLLM's eagle3 drafter in this "
                        "host's calibration" if result.info.engine == VLLM else
                        "a head is priced as one layer at the target's width of equal weights (its fc and "
                        "wider qkv folded into the FFN), its draft vocabulary as its rows")
                       + "; `draftnas distill head` trains one (docs/heads.md)")
    table.caption = "\n".join(caption)
    return table
