"""Measuring (drafter -> acceptance) pairs on an embedded family, for `draftnas.search.alpha`'s model.

`measure_pairs` cuts a designed set of drafters (`design`) from an embedded base, heals each
with a stated budget (or not), and estimates its acceptance on held-out traces of the base as
its own target (`evaluate.WeightsEvaluator`), per domain. One JSONL row per drafter is appended
as it is measured, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from draftnas.acceptance.records import TraceOptions
from draftnas.acceptance.tracing import build_traces
from draftnas.core.errors import InfeasibleCandidateError, InvalidInputError
from draftnas.core.options import option_error
from draftnas.core.prompts import load_prompts
from draftnas.core.registry import Architecture, resolve_architecture
from draftnas.models.sources import has_weights
from draftnas.search.alpha import PAIRS_SCHEMA, AlphaPair, drafter_features, read_pairs
from draftnas.search.candidate import build_candidate
from draftnas.search.evaluate import WeightsEvaluator
from draftnas.search.records import Candidate, CandidateChoice
from draftnas.search.requests import AlphaMeasureRequest
from draftnas.search.resolve import fingerprint_text
from draftnas.search.space import SearchSpace
from draftnas.search.spaces import default_space_for

log = logging.getLogger(__name__)
DOMAIN_SETS = "chat,code,math,translation"


def design(space: SearchSpace, base: Architecture, base_spec: str, n: int, seed: int = 0,
           heal_steps: Sequence[int] | None = None) -> list[tuple[Candidate, int]]:
    """`n` (candidate, heal steps) points of the space, spread over its depths: the grid of every
    knob value and heal budget (default: none and the space's), shuffled per depth with `seed`,
    taken round-robin."""
    w = space.width
    heal_steps = sorted(set(heal_steps) if heal_steps else {0, space.heal.steps})
    if any(h < 0 for h in heal_steps):
        raise InvalidInputError(f"heal steps must be >= 0, got {', '.join(map(str, heal_steps))}")
    by_depth: dict[int, list[tuple[Candidate, int]]] = {}
    for depth in space.depth.values():
        points = []
        # one layer: every selection of a first-layer-heavy rule is the same
        selections = space.layer_selection[:1] if depth == 1 else space.layer_selection
        for sel, q, kv, mlp, vocab in itertools.product(selections, w.query_head_ratios, w.kv_head_ratios,
                                                         w.mlp_ratios, space.vocab_sizes):
            choice = CandidateChoice(depth=depth, layer_selection=sel, kv_head_ratio=kv, query_head_ratio=q,
                                     mlp_ratio=mlp, vocab_size=vocab)
            try:
                cand = build_candidate(space, base, base_spec, choice, target=base)
            except InfeasibleCandidateError:
                continue
            points += [(cand, h) for h in heal_steps]
        random.Random(f"{seed}-{depth}").shuffle(points)
        by_depth[depth] = points
    out: list[tuple[Candidate, int]] = []
    while len(out) < n and any(by_depth.values()):
        for depth in sorted(by_depth):
            if by_depth[depth] and len(out) < n:
                out.append(by_depth[depth].pop())
    return out


def pair_key(base: str, choice: CandidateChoice, heal_steps: int) -> str:
    """One drafter of the design: its base, its knobs and its heal budget."""
    return f"{base}|{json.dumps(choice.to_dict(), sort_keys=True)}|h{heal_steps}"


def measure_pairs(base: str, out: str | Path, *, n: int = 24, seed: int = 0, per_domain: int = 9,
                  space: SearchSpace | None = None, heal_steps: Sequence[int] | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  trace_progress: Callable[[int, int], None] | None = None) -> list[AlphaPair]:
    """Measure `n` designed drafters cut from embedded `base` (as its own target) into `out` (JSONL).

    Traces of the base over `per_domain` prompts of each shipped domain are built once beside
    `out`; every 3rd is held out for acceptance, the rest teach the healing. Rows already in
    `out` (same drafter, same heal budget) are kept and not measured again.
    """

    if n < 1:
        raise option_error("pairs", f"must be >= 1, got {n}")
    if not has_weights(base):
        raise InvalidInputError(f"measuring acceptance needs weights; {base!r} has none here (use an "
                                "embedded model such as smollm2-135m or gemma-3-270m, or a folder)")
    space = space or default_space_for(base)
    if space.latency_only:
        raise InvalidInputError(f"search space {space.name!r} prunes the hidden size; no drafter of it "
                                "can be built from weights")
    base_arch = resolve_architecture(base)
    out = Path(out).expanduser()
    if out.exists() and not out.is_file():
        raise option_error("out", f"{out} is not a file")
    done = {pair_key(p.base, p.choice, p.heal_steps): p for p in read_pairs(out)} if out.is_file() else {}
    points = design(space, base_arch, base, n, seed, heal_steps)
    prompts = load_prompts(DOMAIN_SETS, per_domain=per_domain)
    t = space.traces
    key = fingerprint_text([base, DOMAIN_SETS, per_domain, t.max_new_tokens, space.workload.temperature])
    traces_path = out.with_name(f"{out.stem}-traces-{key}.safetensors")
    if not traces_path.is_file():
        traces_path.parent.mkdir(parents=True, exist_ok=True)
        options = TraceOptions(max_new_tokens=t.max_new_tokens, temperatures=(space.workload.temperature,),
                               batch_size=min(len(prompts), 16))
        build_traces(base, list(prompts), options, traces_path, prompt_set=DOMAIN_SETS,
                     progress=trace_progress)
    evaluator = WeightsEvaluator(base, base_arch, traces_path, space, seed=seed)
    pairs = []
    for i, (candidate, budget) in enumerate(points):
        if progress is not None:
            progress(i, len(points))
        key_i = pair_key(base, candidate.choice, budget)
        if key_i in done:
            pairs.append(done[key_i])
            continue
        evaluation = evaluator.evaluate(candidate, heal=replace(space.heal, steps=budget, max_seconds=None))
        reading, built = evaluation.acceptance, evaluation.candidate
        assert reading.estimate is not None
        steps = reading.heal.steps if reading.heal is not None else 0
        pair = AlphaPair(
            schema=PAIRS_SCHEMA, family=base, base=base, candidate=built.name, choice=built.choice,
            layers=built.plan.layers if built.plan is not None else (), heal_steps=budget,
            features=drafter_features(built, base_arch, steps), alpha=reading.acceptance_rate,
            per_domain={d: v.acceptance_rate for d, v in reading.estimate.per_domain.items()},
            n_positions=reading.estimate.n_positions, tokens_per_step=dict(reading.tokens_per_step or {}),
            traces=traces_path.name, evaluate_s=reading.evaluate_s)
        with out.open("a") as f:  # one whole line per pair: a killed run keeps what it measured
            f.write(json.dumps(pair.to_dict()) + "\n")
        pairs.append(pair)
        log.info("%s heal %d: alpha %.3f", built.name, budget, pair.alpha)
    if progress is not None:
        progress(len(points), len(points))
    return pairs


def pairs_from_request(request: AlphaMeasureRequest, *, progress: Callable[[int, int], None] | None = None,
                       trace_progress: Callable[[int, int], None] | None = None) -> list[AlphaPair]:
    """`draftnas alpha measure`: the request's design of drafters measured into its file."""
    from draftnas.search.spaces import load_search_space

    return measure_pairs(request.base, request.out, n=request.pairs, seed=request.seed,
                         per_domain=request.per_domain,
                         space=load_search_space(request.space) if request.space else None,
                         heal_steps=request.heal_steps, progress=progress, trace_progress=trace_progress)
