"""Healing within a budget (`draftnas search --heal-budget MINUTES`).

The trials score drafters as cut (a space may heal each a little). A drafter with a depth or width cut can
win back agreement by distillation, at minutes a drafter. With a budget, after the trials the search takes
the best-ranked drafters with a cut, best first, and heals each on the target's traces with only the layers
next to its cuts training (`PruningPlan.cut_neighbours`), or with `--heal-with lowrank` a low-rank update
over the whole stack (`drafter.adapters`, merged after: the drafter keeps its shape and its latency), for
as long as the minutes last; each healed
drafter is scored again and ranked as a trial of its own. The study records what each cost against what it
gained: minutes, top-1 agreement and predicted tokens/s before and after.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from draftnas.core.registry import Architecture
from draftnas.search.records import RankedTrial, SearchResult
from draftnas.search.space import HealBudget

HEAL_STEPS = 100  # optimizer steps a drafter gets beyond the space's own healing (the budget may stop it)
MIN_SECONDS = 30.0  # a drafter is not started with less of the budget left


def has_cut(r: RankedTrial, base: Architecture) -> bool:
    """Whether the trial's drafter drops layers or width of its base (what healing can win back)."""
    c = r.candidate.choice
    return c.depth < base.num_hidden_layers or min(c.kv_head_ratio, c.query_head_ratio, c.mlp_ratio,
                                                   c.hidden_ratio) < 1.0


def budget_heal(space_heal: HealBudget, seconds: float, train: str = "cut") -> HealBudget:
    """The space's healing settings with `HEAL_STEPS` steps more than the trials got (a drafter is healed
    from its base again, so fewer would only repeat the trial), stopped after `seconds`; `train`: "cut"
    (the layers next to a cut only) or "lowrank" (a low-rank update over the stack, merged after)."""
    return replace(space_heal, steps=space_heal.steps + HEAL_STEPS, train=train, max_seconds=seconds)


def heal_within_budget(ranked: Sequence[RankedTrial], base: Architecture, space_heal: HealBudget,
                       budget_s: float, heal_one: Callable[[RankedTrial, HealBudget], None],
                       clock: Callable[[], float] = time.monotonic, train: str = "cut") -> int:
    """Heal the ranked drafters with a cut, best first, while `budget_s` lasts (`heal_one` heals, scores and
    records one); one healed before (a resumed study) is not healed again. Returns how many were healed."""
    done = {int(r.healed["from"]) for r in ranked if r.healed}
    spent, healed = 0.0, 0
    for r in ranked:
        if r.healed or r.number in done or not has_cut(r, base):
            continue
        left = budget_s - spent
        if left < MIN_SECONDS:
            break
        started = clock()
        heal_one(r, budget_heal(space_heal, left, train))
        spent += clock() - started
        healed += 1
    return healed


def healing_lines(result: SearchResult) -> list[str]:
    """What healing within the budget cost and gained, drafter by drafter."""
    healed = sorted((r for r in result.ranked if r.healed), key=lambda r: r.number)
    if not healed:
        return []
    minutes = sum(float(r.healed["minutes"]) for r in healed if r.healed)
    how = {"lowrank": "a low-rank update over each stack, merged after"}.get(
        str(healed[0].healed.get("train") if healed[0].healed else ""), "the layers next to each cut")
    lines = [f"healed within the budget: {len(healed)} drafter(s) in {minutes:.1f} min ({how} trained on the "
             "target's traces; minutes spent against agreement gained):"]
    for r in healed:
        h = r.healed or {}
        lines.append(f"  trial {r.number} (healed trial {h['from']}) {r.candidate.name}: "
                     f"{h['minutes']:.1f} min, top-1 {h['top1_before']:.3f} -> {h['top1_after']:.3f}, "
                     f"predicted {h['tokens_per_s_before']:.2f} -> {r.throughput.tokens_per_s:.2f} tokens/s")
    return lines
