"""Candidates: one drafter the search proposes — the knobs chosen, and the shape they give.

A `CandidateChoice` is the point in the search space (depth, layer selection,
width ratios). `build_candidate` turns it into a `Candidate`: the drafter's
`Architecture` (HF config names) derived from the base's, plus — where widths
can be expressed as a `PruningPlan` — the plan's shape (layers picked by
"first"/"even" are known without weights; block influence is measured later by
`plan_pruning`). No torch here: the search scores thousands of these per second.
"""

from __future__ import annotations

from pathlib import Path

from draftnas.core.errors import InfeasibleCandidateError
from draftnas.core.registry import Architecture, resolve_architecture
from draftnas.drafter.prune.importance import layer_selection
from draftnas.drafter.records import VOCAB_FILE, PruningPlan, drafter_label, load_vocab_subset
from draftnas.models.records import weights_suffix
from draftnas.search.records import Candidate, CandidateChoice
from draftnas.search.space import SearchSpace


def kept_count(ratio: float, total: int) -> int:
    """Heads (or groups) a width ratio keeps of `total`: at least one, at most all."""
    return max(1, min(total, round(ratio * total)))


def _rounded(ratio: float, total: int, multiple: int) -> int:
    if ratio >= 1.0:
        return total
    return max(multiple, min(total, round(ratio * total / multiple) * multiple))


def drafter_shape(base: Architecture, choice: CandidateChoice, channel_multiple: int = 8) -> Architecture:
    """The drafter's shape: `choice.depth` layers, widths from the ratios (see `WidthChoices`)."""
    group = base.num_attention_heads // max(base.num_key_value_heads, 1)
    kv = kept_count(choice.kv_head_ratio, base.num_key_value_heads)
    q_per_group = kept_count(choice.query_head_ratio, group)
    hidden = _rounded(choice.hidden_ratio, base.hidden_size, base.head_dim)
    intermediate = _rounded(choice.mlp_ratio, base.intermediate_size, channel_multiple)
    return base.with_shape(
        name=f"{base.name}:{_label(choice, kv * q_per_group, kv, intermediate)}",
        num_hidden_layers=choice.depth,
        hidden_size=hidden,
        num_attention_heads=kv * q_per_group,
        num_key_value_heads=kv,
        intermediate_size=intermediate,
    )


def _label(choice: CandidateChoice, heads: int, kv: int, intermediate_size: int) -> str:
    label = drafter_label(choice.depth, choice.layer_selection, heads, kv, intermediate_size,
                          choice.vocab_size, choice.hidden_ratio)
    return label + weights_suffix(choice.weights)


def shape_plan(base: Architecture, base_spec: str, choice: CandidateChoice,
               arch: Architecture) -> PruningPlan | None:
    """The shape-only `PruningPlan` for this choice, or None if no plan can express it."""
    if arch.hidden_size != base.hidden_size:
        return None
    n, k = base.num_hidden_layers, choice.depth
    selection = layer_selection(choice.layer_selection)
    # block influence is measured on the weights when the drafter is built (plan_pruning)
    layers = tuple(range(k)) if selection.needs_block_influence else selection(k, n)
    return PruningPlan(base=base_spec, base_num_layers=n, layers=layers,
                       layer_selection=choice.layer_selection, num_attention_heads=arch.num_attention_heads,
                       num_key_value_heads=arch.num_key_value_heads,
                       intermediate_size=arch.intermediate_size)


def build_candidate(space: SearchSpace, base: Architecture, base_spec: str, choice: CandidateChoice,
                    target: Architecture | None = None) -> Candidate:
    """A candidate for `choice`; raises `InfeasibleCandidateError` with the reason if unusable."""
    problems = []
    if not 1 <= choice.depth <= base.num_hidden_layers:
        problems.append(f"depth {choice.depth} outside 1..{base.num_hidden_layers} layers of {base.name}")
    if choice.vocab_size and not 1 <= choice.vocab_size <= base.vocab_size:
        problems.append(f"draft vocabulary {choice.vocab_size} outside 1..{base.vocab_size}")
    if choice.layer_selection not in space.layer_selection:
        problems.append(f"layer selection {choice.layer_selection!r} not in the space "
                        f"({', '.join(space.layer_selection)})")
    if problems:
        raise InfeasibleCandidateError("; ".join(problems))
    arch = drafter_shape(base, choice, space.width.channel_multiple)
    problems = arch.problems()
    # a reduced draft head costs far less than its parameter count says (the full input embedding is
    # a lookup): the search's latency bound judges those instead
    if target is not None and not choice.vocab_size and arch.count_parameters() >= target.count_parameters():
        problems.append(f"drafter has {arch.count_parameters():,} parameters, not fewer than the "
                        f"target's {target.count_parameters():,}")
    if problems:
        raise InfeasibleCandidateError("; ".join(problems))
    return Candidate(name=arch.name.split(":", 1)[-1], base=base_spec, arch=arch, choice=choice,
                     plan=shape_plan(base, base_spec, choice, arch))


def reference_candidate(name: str, base: str, base_arch: Architecture) -> Candidate:
    """A drafter a user would otherwise pick (a registry shape, an embedded model or a folder), as a
    candidate beside the trials (no plan: it is used as it is)."""
    arch = resolve_architecture(name)
    return Candidate(name=name, base=base, arch=arch, plan=None,
                     choice=CandidateChoice(depth=arch.num_hidden_layers, vocab_size=_head_rows(name)))


def _head_rows(name: str) -> int:
    """Rows of the reduced head a drafter folder draftnas wrote keeps (its draft_vocab.json); 0 otherwise."""
    folder = Path(name).expanduser()
    if not (folder / VOCAB_FILE).is_file():
        return 0
    return load_vocab_subset(folder).size
