"""`draftnas e2e`'s results as text: its table, per-domain and decomposition tables, and the
plain sentences on what the figures say.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from draftnas.report.fmt import fmt_opt

if TYPE_CHECKING:
    from draftnas.bench.fidelity_records import DrafterRow, Measured
    from draftnas.e2e.records import E2EResult


#: the spec-sheet GPU profile e2e prices each drafter with beside the CPU it measured on
E2E_GPU_PROFILE = "h100-sxm"


def _best_measured(row: DrafterRow) -> Measured | None:
    return max(row.measured.values(), key=lambda m: m.speedup, default=None)


def honest_notes(result: E2EResult) -> list[str]:
    """Plain sentences on what was measured: who won, whether speculation paid, what a GPU implies."""
    notes = []
    scored = [(r, m) for r in result.rows if r.same_as is None and (m := _best_measured(r)) is not None]
    if not scored:
        return ["no drafter was benched"]
    top, top_m = max(scored, key=lambda rm: rm[1].speedup)
    winner = result.row("winner")
    verdict = "has" if top.role == "winner" else f"does NOT have (the {top.role} baseline does)"
    notes.append(f"the draftnas winner {winner.name} {verdict} the highest measured speedup: "
                 f"{top.name} {top_m.speedup:.3f}x at gamma {top_m.gamma}.")
    others = [(r, m) for r, m in scored if r is not top]
    if others:
        best_other = max(m.speedup_spread[1] for _, m in others)
        runner = max(m.speedup for _, m in others)
        apart = "apart" if top_m.speedup_spread[0] > best_other else "overlapping"
        notes.append(f"margin over the next drafter: {top_m.speedup / runner - 1:+.1%} (medians); repeats "
                     f"{apart}: the top's slowest {top_m.speedup_spread[0]:.3f}x vs the others' fastest "
                     f"{best_other:.3f}x.")
    if top_m.speedup < 1.0:
        notes.append(f"on this CPU speculative decoding does NOT beat the target alone for this target: best "
                     f"{top_m.tokens_per_s:.1f} tokens/s vs {top_m.target_tokens_per_s:.1f} tokens/s alone "
                     f"({top_m.speedup:.3f}x); acceptance after this healing budget is below break-even.")
    else:
        lo, hi = top_m.speedup_spread
        same = {True: "identical to", False: "NOT identical to", None: "not compared with"}[top_m.lossless]
        verdict = ("beats the target alone on this machine" if lo > 1.0 else
                   "only breaks even with the target alone on this machine (its repeats straddle 1x)")
        notes.append(f"speculative decoding with {top.name} {verdict}: "
                     f"{top_m.tokens_per_s:.1f} tokens/s vs {top_m.target_tokens_per_s:.1f} tokens/s alone "
                     f"({top_m.speedup:.3f}x, {lo:.3f}-{hi:.3f} over {top_m.repeats} repeats); greedy output "
                     f"{same} the target's.")
    notes += _edge_notes(result, winner)
    notes += _tuned_notes(result, winner)
    gpu = [(r, r.gpu_predicted_speedup) for r, _ in scored if r.gpu_predicted_speedup is not None]
    if gpu:
        r, s = max(gpu, key=lambda x: x[1] or 0.0)
        notes.append(f"with the measured acceptance, the {E2E_GPU_PROFILE} spec-sheet profile predicts "
                     f"{s:.2f}x for {r.name} on {result.options.target} (a roofline from the data sheet, "
                     "NOT MEASURED on a GPU).")
    f = result.fidelity
    notes.append(f"prediction fidelity over {f.n_drafters} drafters: MAPE {f.mape_best_gamma:.1f}% at the "
                 f"best gamma, {f.mape_fixed_gamma:.1f}% at the fixed gamma; Spearman "
                 f"{fmt_opt(f.spearman_best_gamma)} / {fmt_opt(f.spearman_fixed_gamma)}.")
    if f.worst_terms:
        terms = sorted(set(f.worst_terms.values()), key=list(f.worst_terms.values()).count, reverse=True)
        notes.append(f"off by more than 10%: {', '.join(f.worst_terms)}; largest term: {', '.join(terms)} "
                     "(see the decomposition table).")
    close = [r.name for r, m in scored if r is not top and m.speedup >= 0.98 * top_m.speedup]
    if close:
        notes.append(f"{', '.join(close)} measured within 2% of the top: a tie within noise here.")
    return notes


def _edge_notes(result: E2EResult, winner: DrafterRow) -> list[str]:
    """Where the winner's speedup over each baseline comes from: its draft step or its acceptance."""
    w = _best_measured(winner)
    if w is None or winner.terms is None:
        return []
    notes = []
    for row in result.rows:
        b = _best_measured(row)
        if row.role == "winner" or row.same_as or b is None or row.terms is None:
            continue
        notes.append(f"winner vs {row.role} {row.name}: {w.speedup:.3f}x vs {b.speedup:.3f}x; draft step "
                     f"{winner.terms.draft_ms:.1f} vs {row.terms.draft_ms:.1f} ms, tokens/step "
                     f"{w.tokens_per_step:.2f} (γ {w.gamma}) vs {b.tokens_per_step:.2f} (γ {b.gamma}).")
    return notes


def _tuned_notes(result: E2EResult, winner: DrafterRow) -> list[str]:
    """Does the drafter healed on one domain accept more there than the all-domain winner?"""
    t, d = result.tuned, result.options.tuned_domain
    if t is None or d is None:
        return []

    def top1(row: DrafterRow) -> dict[str, float]:
        return {k: v["top1"] for k, v in row.estimate_per_domain.items() if "top1" in v}

    tt, wt = top1(t), top1(winner)
    if d not in tt or d not in wt:
        return [f"the {d}-only drafter has no held-out {d} traces to score"]
    ranked = ", ".join(f"{k} {v:.3f}" for k, v in sorted(tt.items(), key=lambda kv: -kv[1]))
    others = [k for k in tt if k != d and k in wt]
    o_t = statistics.fmean(tt[k] for k in others) if others else float("nan")
    o_w = statistics.fmean(wt[k] for k in others) if others else float("nan")
    rival = max(others, key=lambda k: tt[k], default=None)
    where = (f"more on {d} than on any other domain" if rival is None or tt[d] > tt[rival] else
             f"NOT most on {d} ({rival} is as high or higher)")
    notes = [f"healed on {d} only ({t.role}, same plan and head size as the winner), the drafter accepts "
             f"{where}; top-1 on held-out traces: {ranked}.",
             f"against the winner healed on all four domains: {d} top-1 {tt[d]:.3f} vs {wt[d]:.3f} "
             f"({tt[d] - wt[d]:+.3f}); the other domains {o_t:.3f} vs {o_w:.3f} (mean, {o_t - o_w:+.3f})."]
    g = str(result.options.budget.fixed_gamma)
    tm, wm = t.measured_per_domain.get(d), winner.measured_per_domain.get(d)
    if g in t.measured and tm and wm:
        notes.append(f"benched at γ {g}: tokens/step on the {d} bench prompts {tm['tokens_per_step']:.2f} "
                     f"vs the winner's {wm['tokens_per_step']:.2f}; over all bench prompts "
                     f"{t.measured[g].speedup:.3f}x vs {winner.measured[g].speedup:.3f}x.")
    return notes


E2E_COLUMNS = ("drafter", "role", "layers x width", "params", "draft ms (pred / meas)", "tok/step meas (est)",
               "γ", "tok/s meas", "speedup meas", "tok/s pred", "speedup pred", "error")


def e2e_table(result: E2EResult) -> list[tuple[str, ...]]:
    """The results table's rows (cells as text, `E2E_COLUMNS`): the target alone, then every drafter
    at each benched gamma. Markdown and the terminal render these same cells."""
    b = result.options.budget
    depth = result.search.info.target_arch.num_hidden_layers
    rows: list[tuple[str, ...]] = [("target alone", "target", f"{depth} layers", "-", "-", "1", "0",
             f"{result.target_tokens_per_s:.1f}", "1.000x", f"{result.target_predicted_tokens_per_s:.1f}",
             "1.000x", "-")]
    for r in result.rows:
        for g in sorted(r.measured, key=int):
            meas, pred = r.measured[g], r.predicted[g]
            tag = "fixed" if int(g) == b.fixed_gamma else "best"
            if int(g) == b.fixed_gamma and int(g) == r.predicted_best_gamma:
                tag = "fixed=best"
            draft_meas = f"{r.terms.draft_ms:.1f}" if r.terms else "-"
            err = 100.0 * (pred.speedup - meas.speedup) / meas.speedup
            same = f" (= {r.same_as})" if r.same_as else ""
            rows.append((f"{r.name}{same}", r.role, r.shape, f"{r.parameters / 1e6:.1f}M",
                         f"{pred.draft_ms:.1f} / {draft_meas}",
                         f"{meas.tokens_per_step:.2f} ({pred.tokens_per_step:.2f})", f"{g} ({tag})",
                         f"{meas.tokens_per_s:.1f}", f"{meas.speedup:.3f}x", f"{pred.tokens_per_s:.1f}",
                         f"{pred.speedup:.3f}x", f"{err:+.1f}%"))
    return rows


def results_markdown(result: E2EResult) -> str:
    """The results table, the winner's per-domain acceptance, the decomposition and the notes."""
    b, m = result.options.budget, result.machine
    lines = [f"## draftnas e2e: {result.options.target} ({b.name} budget, seed {result.options.seed})", "",
             f"Machine: {m.cpu_model}, {m.logical_cores} logical cores, {m.torch_threads} torch threads; "
             f"load average {m.load_average_before} before, {m.load_average_after} after. "
             f"Profile: {result.profile}. Greedy, batch 1, {result.n_bench_prompts} bench prompts x "
             f"{b.bench_new_tokens} new tokens (not traced), median of {b.repeats} repeat(s); heal "
             f"{b.heal_steps} steps on {result.n_trace_prompts} traced prompts for every drafter. "
             f"Wall {result.wall_s / 60:.1f} min.", ""]
    lines += ["| " + " | ".join(E2E_COLUMNS) + " |", "|" + "---|" * len(E2E_COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in e2e_table(result)]
    lines += ["", *_domain_lines(result), "", *_decomposition_lines(result), "",
              "### What the figures say", ""]
    lines += [f"- {n}" for n in result.notes]
    return "\n".join(lines) + "\n"


def _domain_lines(result: E2EResult) -> list[str]:
    w = result.row("winner")
    g = result.options.budget.fixed_gamma
    lines = [f"### Per-domain acceptance of the winner {w.name} (γ = {g})", "",
             "| domain | top-1 (held-out traces) | tok/step est | tok/step measured (bench) "
             "| accept rate measured |",
             "|---|---|---|---|---|"]
    for d in sorted(set(w.estimate_per_domain) | set(w.measured_per_domain)):
        e, mm = w.estimate_per_domain.get(d, {}), w.measured_per_domain.get(d, {})
        lines.append(f"| {d} | {fmt_opt(e.get('top1'), '.3f')} | {fmt_opt(e.get('tokens_per_step'))} | "
                     f"{fmt_opt(mm.get('tokens_per_step'))} | "
                     f"{fmt_opt(mm.get('acceptance_rate'), '.3f')} |")
    t, dom = result.tuned, result.options.tuned_domain
    if t is None:
        return lines
    lines += ["", f"### The winner's plan healed on {dom} only ({t.role}: {t.name}, γ = {g})", "",
              f"Same layers, widths and head size as the winner and the same heal budget, on the {dom} "
              f"traces of the heal split only; scored on the same held-out traces (all domains) and benched "
              f"on the same prompts.", "",
              "| domain | top-1 all domains | top-1 " + f"{dom} only | tok/step measured all domains | "
              f"tok/step measured {dom} only |", "|---|---|---|---|---|"]
    for d in sorted(set(w.estimate_per_domain) | set(t.estimate_per_domain)):
        we, te = w.estimate_per_domain.get(d, {}), t.estimate_per_domain.get(d, {})
        wm, tm = w.measured_per_domain.get(d, {}), t.measured_per_domain.get(d, {})
        lines.append(f"| {d} | {fmt_opt(we.get('top1'), '.3f')} | {fmt_opt(te.get('top1'), '.3f')} | "
                     f"{fmt_opt(wm.get('tokens_per_step'))} | {fmt_opt(tm.get('tokens_per_step'))} |")
    m = t.measured.get(str(g))
    if m is not None:
        lines += ["", f"Over all bench prompts at γ = {g}: {m.speedup:.3f}x measured "
                      f"({m.speedup_spread[0]:.3f}-{m.speedup_spread[1]:.3f}), "
                      f"{t.predicted[str(g)].speedup:.3f}x predicted."]
    return lines


def _decomposition_lines(result: E2EResult) -> list[str]:
    lines = ["### Where the predicted speedup goes wrong (each term measured alone)", "",
             "| drafter | γ | predicted | + meas. acceptance | + meas. draft ms | + meas. verify ms | "
             "+ meas. target ms | measured | loop overhead ms/step | generate overhead ms/token | largest |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.rows:
        if r.same_as:
            continue
        for g, d in sorted(r.decomposition.items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {r.name} | {g} | {d.predicted:.3f} | {d.with_acceptance:.3f} | "
                         f"{d.with_draft:.3f} | {d.with_verify:.3f} | {d.with_target:.3f} | "
                         f"{d.measured:.3f} | "
                         f"{d.loop_overhead_ms_per_step:.1f} | {d.target_overhead_ms_per_token:.1f} | "
                         f"{d.worst_term} |")
    return lines
