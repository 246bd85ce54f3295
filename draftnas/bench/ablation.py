"""`draftnas bench --ablation`: the chain from the stock drafter to a search's winner
(`search.ablation.ablation_chain`: + weight format, + head, + depth/width/selection, + per-layer formats),
every link measured in one interleaved run of draftnas's static loop, each at its own γ, so the table says
what each transform buys on this host. The links are the study's own trials, exported into drafters/
(an export already there is reused); the stock drafter runs by name. The table also goes into the winner
folder's README.md, under its own heading (replaced by a later run)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from draftnas.bench.arms import MAIN, reference_label
from draftnas.bench.records import BenchResult
from draftnas.bench.request_records import BenchRequest
from draftnas.core.errors import InvalidInputError
from draftnas.core.intervals import with_interval
from draftnas.core.options import option_error
from draftnas.core.prompts import load_prompts
from draftnas.core.records import Progress, Record

HEADING = "## Ablation: where the speed comes from (measured)"


@dataclass(frozen=True)
class AblationLink(Record):
    """One link of the chain as measured: what it adds, the drafter (a name or folder), its study trial,
    its bench arm, and its figures there (medians over prompts with 95% intervals)."""

    adds: str
    drafter: str
    trial: int | None
    arm: str
    gamma: int | None
    weights: str | None
    tokens_per_s: float
    tokens_per_s_interval: tuple[float, ...]
    speedup: float | None
    speedup_interval: tuple[float, ...]
    tokens_per_step: float | None
    predicted_tokens_per_s: float | None  # the study's figure for that trial (None: the stock by name)
    p_min: float = 0.0  # its confidence stop (the chain's last link, where the winner has one)


def _study_of(folder: Path) -> tuple[str, int]:
    from draftnas.export.folder import exported_record

    source = str((exported_record(folder) or {}).get("source", ""))
    found = re.fullmatch(r"study (\S+) trial (\d+)", source)
    if found is None:
        raise option_error("ablation", "needs a drafter a search exported (its draftnas.json names the study "
                                       f"and trial); {folder} does not")
    return found.group(1), int(found.group(2))


def run_ablation(request: BenchRequest, progress: Progress | None = None,
                 export_progress: Progress | None = None) -> BenchResult:
    """The chain of `request.draft` (a search's export) benched in one run; the result's `ablation` holds the
    links in chain order and notes on the links left out. Writes the table into the folder's README.md.
    `request` comes checked (`bench_from_request`)."""
    from draftnas.bench.run import run_bench
    from draftnas.export.request import export_best
    from draftnas.search.ablation import ablation_chain, fixed_prediction
    from draftnas.search.results import load_results

    folder = Path(request.draft).expanduser()
    study, number = _study_of(folder)
    result = load_results(study, None)
    winner = next((r for r in result.ranked if r.number == number), None)
    if winner is None:
        raise InvalidInputError(f"study {study} ranks no completed trial {number}")
    links, notes = ablation_chain(result, winner)
    specs: list[str] = []
    for link in links[:-1]:
        if link is links[0]:  # the stock drafter, as users load it (at the γ its hand-made trial priced best)
            specs.append(result.info.base)
        else:
            exported = export_best(result, Path("drafters"), trial=link.trial, progress=export_progress)
            specs.append(exported.folder)
    # each link before the stop at its best fixed γ: priced once, run and checked at it
    fixed = {i: fixed_prediction(result, link.trial) for i, link in enumerate(links)
             if link.trial is not None and not link.stop}
    policies = {i: (f.primary().gamma, 0.0) for i, f in fixed.items() if 0 < i < len(specs)}
    options = replace(request.options, engine="static", hf_assisted=False,
                      reference_gamma=request.options.reference_gamma or (
                          fixed[0].primary().gamma if 0 in fixed else None))
    bench = run_bench(request.target, str(folder), load_prompts(request.prompts), options, references=specs,
                      progress=progress, policies=policies)
    arms = [reference_label(i) for i in range(len(specs))] + [MAIN]
    measured = []
    for i, (link, arm, spec) in enumerate(zip(links, arms, [*specs, str(folder)], strict=True)):
        a = bench.arm(arm)
        measured.append(AblationLink(
            adds=link.adds, drafter=spec, trial=link.trial.number if link.trial else None, arm=arm,
            gamma=a.gamma, p_min=a.p_min, weights=a.draft_weights, tokens_per_s=a.tokens_per_s,
            tokens_per_s_interval=a.tokens_per_s_interval, speedup=a.speedup,
            speedup_interval=a.speedup_interval, tokens_per_step=a.tokens_per_step,
            predicted_tokens_per_s=fixed[i].tokens_per_s if i in fixed else
            link.trial.throughput.tokens_per_s if link.trial else None))
    out = replace(bench, ablation={"study": study, "links": [m.to_dict() for m in measured], "notes": notes})
    write_card_section(folder, table_lines(out), bench, ablation_command(request))
    return out


def ablation_command(request: BenchRequest) -> str:
    """The `draftnas bench --ablation` command line `request` stands for (what the card quotes)."""
    o = request.options
    return (f"draftnas bench --target {request.target} --draft {request.draft} --ablation --gamma {o.gamma} "
            f"--dtype {o.dtype} --prompts {request.prompts}"
            + (f" --per-domain {o.per_domain}" if o.per_domain else "")
            + (f" --rounds {o.rounds}" if o.rounds != 3 else "")
            + (f" --max-new-tokens {o.max_new_tokens}" if o.max_new_tokens != 64 else ""))


def links_of(result: BenchResult) -> list[AblationLink]:
    return [AblationLink.from_dict(d) for d in (result.ablation or {}).get("links", [])]


def table_lines(result: BenchResult) -> list[str]:
    """The chain as a Markdown table: each link's tokens/s and speedup over the target alone (medians,
    95% intervals), tokens per step, γ, and its tokens/s over the link before it, paired per prompt and
    round (a median of ratios with its interval and verdict, not a ratio of medians)."""
    from draftnas.bench.stats import compare_arms

    target = result.arm("target")
    lines = [f"Target alone: {target.tokens_per_s:.2f} tokens/s "
             f"[{target.tokens_per_s_interval[0]:.2f}, {target.tokens_per_s_interval[1]:.2f}] "
             "(draftnas's static loop, the same run).", "",
             "| link | drafter | γ <stop | weights | tokens/s [95%] | × target [95%] | tokens/step "
             "| × link before, paired [95%] |",
             "|---|---|---|---|---|---|---|---|"]
    before = None
    for link in links_of(result):
        lo, hi = link.tokens_per_s_interval
        speed = "-" if link.speedup is None else (f"{link.speedup:.3f} [{link.speedup_interval[0]:.3f}, "
                                                  f"{link.speedup_interval[1]:.3f}]")
        step = "-" if link.tokens_per_step is None else f"{link.tokens_per_step:.2f}"
        over = "-"
        if before is not None:
            c = compare_arms(result.prompts, link.arm, before)
            over = f"{with_interval(c.ratio, c.interval)}, {c.verdict}"
        trial = f" (trial {link.trial})" if link.trial is not None else ""
        drafting = f"{link.gamma} <{link.p_min:g}" if link.p_min else f"{link.gamma}"
        lines.append(f"| {link.adds} | {Path(link.drafter).name}{trial} | {drafting} | {link.weights} | "
                     f"{link.tokens_per_s:.2f} [{lo:.2f}, {hi:.2f}] | {speed} | {step} | {over} |")
        before = link.arm
    return lines + [f"\nNot in the chain: {note}" for note in (result.ablation or {}).get("notes", [])]


def write_card_section(folder: Path, table: list[str], bench: BenchResult, command: str) -> None:
    """Put the table into the folder's README.md under `HEADING`, replacing an earlier one."""
    card = folder / "README.md"
    text = card.read_text() if card.exists() else ""
    text = text.split(HEADING)[0].rstrip() + "\n\n" if HEADING in text else text.rstrip() + "\n\n"
    host = f"{bench.host}, {bench.threads} threads, load average before {bench.load_average_before}"
    section = [HEADING, "", f"`{command}` on {host}; {bench.n_prompts} prompts x {bench.max_new_tokens} "
               f"tokens, {bench.rounds} interleaved rounds, {bench.dtype}.", "", *table, ""]
    card.write_text(text + "\n".join(section))
