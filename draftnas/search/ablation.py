"""Where a winner's speed comes from: the chain of drafters from the stock one to the winner, one transform
added per link, each a drafter the study priced (`draftnas bench --ablation` measures them in one run).

    stock -> + weight format -> + head -> + depth/width/selection -> + per-layer formats -> + confidence stop

Every link but the last drafts its best fixed γ every step (`fixed_prediction`); a winner that stops drafting
below a confidence (`ThroughputEstimate.p_min`) ends the chain with that stop added. A link the winner
does not take (a full head, dense weights, the stock's own shape, one format for every layer, no stop) is
left out; a link the study priced no drafter for is left out with a note saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from draftnas.models.records import WEIGHT_FORMATS, weight_roles
from draftnas.search.records import CandidateChoice, RankedTrial, SearchResult, WorkloadPrediction
from draftnas.search.scoring import predict_workload
from draftnas.search.space import GammaRange


@dataclass(frozen=True)
class ChainLink:
    """One link: what it adds, and the study's trial of that drafter (None: the stock drafter by name)."""

    adds: str
    trial: RankedTrial | None
    choice: CandidateChoice
    stop: bool = False  # drafts at the trial's confidence stop (the last link); else its best fixed γ


def fixed_prediction(result: SearchResult, trial: RankedTrial) -> WorkloadPrediction:
    """`trial` priced as the study priced it, at its best γ drafted every step (no confidence stop)."""
    g = result.info.space.gamma
    return predict_workload(trial.latency, trial.acceptance, result.info.space.workload,
                            GammaRange(g.min, g.max))


def _same(a: CandidateChoice, b: CandidateChoice, full_depth: int) -> bool:
    """The same drafter: at the base's full depth and width every layer selection keeps every layer."""
    def shape(c: CandidateChoice) -> tuple[object, ...]:
        selection = "all" if c.depth == full_depth else c.layer_selection
        return (c.depth, selection, c.kv_head_ratio, c.query_head_ratio, c.mlp_ratio, c.hidden_ratio,
                c.vocab_size, c.weights)

    return shape(a) == shape(b)


def ablation_chain(result: SearchResult, winner: RankedTrial) -> tuple[list[ChainLink], list[str]]:
    """The links from the stock drafter (the study's base at full depth and width, dense, its full head)
    to `winner`, each the study's trial of that drafter, and a note per link it priced no drafter for."""
    full = result.info.base_arch.num_hidden_layers
    w = winner.candidate.choice
    roles = weight_roles(w.weights)
    per_layer = w.weights not in WEIGHT_FORMATS
    uniform = w.weights if not per_layer else roles["mlp"].split("/")[0]  # the format most weights are in
    stock = CandidateChoice(depth=full)  # every other knob at its stock default
    steps = [("stock", stock)]
    if uniform != "dense":
        steps.append((f"+ {uniform} weights", replace(stock, weights=uniform)))
    if w.vocab_size:
        steps.append((f"+ head of {w.vocab_size:,} rows", replace(steps[-1][1], vocab_size=w.vocab_size)))
    shaped = replace(w, weights=uniform)
    if not _same(shaped, steps[-1][1], full):
        steps.append(("+ depth/width/selection", shaped))
    if per_layer:
        steps.append(("+ per-layer formats", w))
    links, notes = [], []
    for adds, choice in steps:
        trial = next((r for r in result.ranked if _same(r.candidate.choice, choice, full)), None)
        if adds == "stock":
            links.append(ChainLink(adds, trial if trial is not None and trial.hand_made else None, choice))
        elif trial is None:
            notes.append(f"'{adds}': the study priced no drafter of that shape and format ({choice.weights}, "
                         f"{choice.depth} layers, head {choice.vocab_size or 'full'}), so the chain skips it")
        else:
            links.append(ChainLink(adds, trial, choice))
    if links[-1].trial is None or not _same(links[-1].choice, w, full):
        links.append(ChainLink("the winner", winner, w))
    if winner.primary.p_min:
        links.append(ChainLink(f"+ confidence stop (below {winner.primary.p_min:g})", winner, w, stop=True))
    return links, notes
