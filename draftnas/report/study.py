"""`draftnas report`: a study's ranking as Markdown with PNG plots, rebuilt from storage alone.

Plots (matplotlib, Agg backend): the Pareto front of draft latency vs acceptance,
speedup vs gamma for the best candidates, and draft latency vs depth. The storage
is Optuna's, so the same study also opens in optuna-dashboard.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from draftnas.report.fmt import fmt_opt
from draftnas.report.records import ReportFiles, ReportRequest
from draftnas.search.records import RankedTrial, SearchResult
from draftnas.search.results import load_results
from draftnas.search.scoring import estimate_at

log = logging.getLogger(__name__)


def write_report(study_name: str, storage: str | None, out_dir: str | Path, *, run_dir: str | Path = "runs",
                 top: int = 20) -> ReportFiles:
    """Write `<out_dir>/report.md` and its PNG plots for one study (`report_from_request` takes the
    command's request)."""
    result = load_results(study_name, storage, run_dir)
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    plots = _plots(result, out)
    md = out / "report.md"
    md.write_text(render_markdown(result, [p.name for p in plots], top))
    log.info("wrote %s and %d plots", md, len(plots))
    return ReportFiles(study_name=study_name, markdown=str(md), plots=tuple(str(p) for p in plots),
                       n_ranked=len(result.ranked), acceptance_assumed=result.info.acceptance_assumed)


def render_markdown(result: SearchResult, plot_names: list[str], top: int = 20) -> str:
    info = result.info
    c = result.counts
    lines = [f"# draftnas search: `{result.study_name}`", ""]
    if info.acceptance_assumed:
        lines += [f"> **Acceptance is ASSUMED, not measured**: every candidate is scored with the "
                  f"acceptance prior {info.acceptance_prior:g} per token (`--acceptance-prior`). The "
                  "ranking reflects draft latency only; measure acceptance on target traces before "
                  "trusting it.", ""]
    lines += [
        f"- target: `{info.target}` ({info.target_arch.num_hidden_layers} layers x "
        f"{info.target_arch.hidden_size})",
        f"- base: `{info.base}`; search space `{info.space.name}` ({info.space.size()} points)",
        f"- latency profile: {info.profile}",
        f"- acceptance: {info.note}",
        f"- workload: batch sizes {_batches(info.space.workload)}, temperature "
        f"{info.space.workload.temperature:g}, context {info.space.workload.context_tokens} tokens",
        f"- trials: {c.get('COMPLETE', 0)} complete, {c.get('PRUNED', 0)} pruned "
        f"({result.pruned_by_upper_bound} by the throughput upper bound, {result.pruned_infeasible} "
        f"infeasible), {c.get('FAIL', 0)} failed",
        f"- storage: `{result.storage}` (also readable with `optuna-dashboard`)",
        "",
    ]
    if result.best is not None:
        b = result.best
        lines += [f"**Best:** trial {b.number}, `{b.candidate.name}` ({b.candidate.shape_label()}): "
                  f"{b.throughput.tokens_per_s:,.1f} tokens/s predicted, {b.throughput.speedup:.3f}x "
                  f"plain decoding ({b.throughput.baseline_tokens_per_s:,.1f} tokens/s).", ""]
        if b.throughput.speedup < 1.0:
            lines += ["No candidate beats plain decoding: measured acceptance is below break-even at "
                      "this healing budget (the ranking shows which drafters come closest).", ""]
    lines += ["## Ranking", "", _table(result.ranked[:top], info.acceptance_assumed), ""]
    if result.pareto:
        lines += ["## Pareto front (draft latency vs acceptance)", "",
                  "Trials: " + ", ".join(str(n) for n in result.pareto), ""]
    for name in plot_names:
        lines += [f"![{name}]({name})", ""]
    return "\n".join(lines)


def _batches(workload: Any) -> str:
    return ", ".join(f"{b} ({w:.0%})" for b, w in zip(workload.batch_sizes, workload.batch_weights,
                                                        strict=True))


def _table(ranked: tuple[RankedTrial, ...], assumed: bool) -> str:
    acc = "assumed α" if assumed else "top-1"
    head = ["#", "trial", "candidate", "layers x width", "params (M)", "draft ms", "verify ms", acc,
            "tokens/step", "best γ <stop", "tokens/s", "speedup", "break-even α b1 / bN", "stops paying at b"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(ranked, start=1):
        p = r.primary
        params_m = r.candidate.parameters / 1e6
        e = r.economics
        even = ("" if e is None else
                f"{fmt_opt(e.break_even_alpha_batch1)} / {fmt_opt(e.break_even_alpha_largest)}")
        stops = ("" if e is None else str(e.crossover_batch) if e.crossover_batch
                 else f"> {e.sweep_batches[-1]}")
        cells = [str(i), str(r.number), f"`{r.candidate.name}`", r.candidate.shape_label(),
                 f"{params_m:.1f}", f"{p.draft_ms:.3f}", f"{p.verify_ms:.3f}",
                 f"{r.acceptance.acceptance_rate:.3f}", f"{p.tokens_per_step:.2f}", p.drafting,
                 f"{r.throughput.tokens_per_s:,.1f}", f"{r.throughput.speedup:.3f}x", even, stops]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _plots(result: SearchResult, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not result.ranked:
        return []
    paths = []
    draws = [("pareto.png", _pareto), ("speedup_vs_gamma.png", _speedup_vs_gamma),
             ("latency_vs_depth.png", _latency_vs_depth)]
    if any(r.economics is not None for r in result.ranked):
        draws.append(("speedup_vs_batch.png", _speedup_vs_batch))
    for name, draw in draws:
        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
        draw(ax, result)
        if result.info.acceptance_assumed:
            fig.text(0.99, 0.01, "acceptance ASSUMED, not measured", ha="right", va="bottom",
                     fontsize=8, color="darkred")
        fig.tight_layout()
        fig.savefig(out / name)
        plt.close(fig)
        paths.append(out / name)
    return paths


def _pareto(ax: Any, result: SearchResult) -> None:
    ranked = result.ranked
    ax.scatter([r.primary.draft_ms for r in ranked], [r.acceptance.acceptance_rate for r in ranked],
               s=14, alpha=0.5, label="completed trials")
    by_number = {r.number: r for r in ranked}
    front = [by_number[n] for n in result.pareto if n in by_number]
    ax.plot([r.primary.draft_ms for r in front], [r.acceptance.acceptance_rate for r in front],
            "o-", color="crimson", label="Pareto front")
    ax.set_xlabel(f"draft latency (ms, batch {ranked[0].primary.batch_size})")
    ax.set_ylabel("acceptance (assumed α)" if result.info.acceptance_assumed else "top-1 agreement")
    ax.set_title(f"{result.study_name}: draft latency vs acceptance")
    ax.legend()


def _speedup_vs_gamma(ax: Any, result: SearchResult) -> None:
    gmax = result.info.space.gamma.max
    for r in result.ranked[:5]:
        i = r.latency.batch_sizes.index(r.primary.batch_size)
        gammas = [g for g in range(gmax + 1) if r.acceptance.tokens_per_step is None
                  or r.acceptance.tokens_at(g) is not None]
        stop = r.primary.p_min  # the winner's confidence stop at every gamma
        points = [(g, e.speedup) for g in gammas
                  if (e := estimate_at(r.latency, r.acceptance, i, g, stop if g else 0.0,
                                       result.info.space.workload.new_tokens)) is not None]
        ax.plot([g for g, _ in points], [v for _, v in points], marker="o",
                label=f"#{r.number} {r.candidate.name}" + (f" (stop below p {stop:g})" if stop else ""))
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("γ (draft tokens per step)")
    ax.set_ylabel("predicted speedup over plain decoding")
    ax.set_title(f"speedup vs γ (top 5, batch {result.ranked[0].primary.batch_size})")
    ax.legend(fontsize=7)


def _speedup_vs_batch(ax: Any, result: SearchResult, top: int = 5) -> None:
    """Predicted speedup (best gamma >= 1 at each drafter's alpha) against batch size, crossovers marked."""
    rows = [r for r in result.ranked[:top] if r.economics is not None]
    rows += [r for r in result.references if r.economics is not None]
    for r in rows:
        e = r.economics
        assert e is not None
        label = f"{'ref ' if r.reference else f'#{r.number} '}{r.candidate.name} (α {e.alpha:.2f})"
        line, = ax.plot(e.sweep_batches, e.sweep_speedup, marker="o", ms=3, ls="--" if r.reference else "-",
                        label=label)
        if e.crossover_batch is not None:
            y = e.sweep_speedup[e.sweep_batches.index(e.crossover_batch)]
            ax.plot([e.crossover_batch], [y], marker="x", ms=10, mew=2, color=line.get_color())
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("predicted speedup over plain decoding")
    ax.set_title("speedup vs batch (x: first batch where it stops paying)")
    ax.legend(fontsize=6)


def save_batch_plot(result: SearchResult, path: str | Path) -> Path:
    """The speedup-vs-batch plot of the top drafters and the space's references, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=110)
    _speedup_vs_batch(ax, result)
    if result.info.acceptance_assumed:
        fig.text(0.99, 0.01, "acceptance " + ("from a fitted model" if result.info.acceptance_model
                                              else "ASSUMED") + ", not measured",
                 ha="right", va="bottom", fontsize=8, color="darkred")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _latency_vs_depth(ax: Any, result: SearchResult) -> None:
    ranked = result.ranked
    widths = sorted({r.candidate.arch.hidden_size for r in ranked})
    for w in widths:
        pts = sorted((r.candidate.arch.num_hidden_layers, r.primary.draft_ms) for r in ranked
                     if r.candidate.arch.hidden_size == w)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=16, label=f"hidden {w}")
    ax.set_xlabel("drafter layers")
    ax.set_ylabel(f"draft latency (ms, batch {ranked[0].primary.batch_size})")
    ax.set_title("draft latency vs depth (all widths tried)")
    ax.legend(fontsize=7)


def report_from_request(request: ReportRequest) -> ReportFiles:
    """`draftnas report`: the request's study written as Markdown and PNG plots."""
    return write_report(request.study, request.storage, request.out, run_dir=request.run_dir, top=request.top)
