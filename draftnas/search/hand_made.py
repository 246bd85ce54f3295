"""The drafters a user can make by hand, as the bar a search has to clear.

Quantizing the stock drafter and trimming its head needs no search: a user who reads the README can
do both. So a search whose space holds the stock drafter (its base at full depth and full width) first
prices that drafter under each single global weight format the space offers (dense, int8, int4) and
each head size it offers. They run as ordinary trials with those params given (first, so the sampler
learns from them and the exporter can export any of them by number), marked "hand-made"; the best of
them is the "hand-made best" the summary sets the winner against. Each is ranked at its own best γ, as
every trial is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from draftnas.models.records import WEIGHT_FORMATS
from draftnas.search.records import CandidateChoice

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    from optuna.trial import FrozenTrial

    from draftnas.core.registry import Architecture
    from draftnas.search.records import RankedTrial, SearchResult
    from draftnas.search.space import SearchSpace

ATTR = "hand_made"  # the trial's user attribute: the hand-made transform it prices ("int8, head 32768")


def hand_made_params(space: SearchSpace, base: Architecture) -> list[tuple[dict[str, Any], str]]:
    """The trial params (and a label) of the stock drafter (`CandidateChoice` at the base's depth, its
    other knobs at their stock defaults) under each global format × head size the space offers; none where
    the space cannot build the stock drafter (depth short of the base's, no full width, or latency-only
    shapes with no weights to quantize). The trial keeps the params its space searches."""
    w = space.width
    full_width = all(1.0 in ratios for ratios in (w.kv_head_ratios, w.query_head_ratios, w.mlp_ratios,
                                                  w.hidden_ratios))
    depth = base.num_hidden_layers
    if space.latency_only or not full_width or depth not in space.depth.values():
        return []
    out = []
    for weights in (f for f in space.weights if f in WEIGHT_FORMATS):
        for rows in space.vocab_sizes:
            choice = CandidateChoice(depth=depth, layer_selection=space.layer_selection[0], vocab_size=rows,
                                     weights=weights)
            out.append((choice.to_dict(), f"{weights}, " + (f"head {rows}" if rows else "full head")))
    return out


def next_hand_made(trials: Sequence[FrozenTrial], space: SearchSpace, base: Architecture
                   ) -> tuple[dict[str, Any], dict[str, str]] | None:
    """The params and user attributes of the first hand-made drafter no trial of the study has run or
    is running (a failed one runs again); None once every one has."""
    from optuna.trial import TrialState

    done = {t.user_attrs.get(ATTR) for t in trials if t.state != TrialState.FAIL}
    return next(((params, {ATTR: label}) for params, label in hand_made_params(space, base)
                 if label not in done), None)


def hand_made_best(result: SearchResult) -> RankedTrial | None:
    """The best-ranked hand-made drafter of the study (None when it priced none)."""
    return next((r for r in result.ranked if r.hand_made), None)


def bar_line(result: SearchResult) -> str | None:
    """What the winner adds over the hand-made best, predicted; or that the search confirms it."""
    hand, best = hand_made_best(result), result.best
    if hand is None or best is None:
        return None
    what = (f"hand-made best: trial {hand.number} {hand.candidate.name} (the stock drafter, "
            f"{hand.hand_made}), {hand.throughput.tokens_per_s:,.1f} tokens/s at γ {hand.primary.gamma}")
    if best.number == hand.number or best.throughput.tokens_per_s <= hand.throughput.tokens_per_s:
        return f"{what}: the search confirms the hand-made best here (predicted; bench it to measure)"
    ratio = best.throughput.tokens_per_s / hand.throughput.tokens_per_s
    return f"{what}: the best is {ratio:.3f}x it (predicted; bench both to measure)"
