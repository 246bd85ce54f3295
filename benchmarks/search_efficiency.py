"""How fast do TPE, NSGA-II and random search find the best drafter of an enumerable space?

    python benchmarks/search_efficiency.py [--space llama-65b-from-llama-7b] [--profile h100-sxm]
        [--trials 200] [--seeds 3] [--prior shaped|constant]

The space is scored on latency (a shipped profile) plus an acceptance prior, so every
point can be enumerated: the exhaustive optimum is the reference. For each sampler and
seed a `draftnas search` study (journal file in a temporary folder) runs `--trials`
trials; the table gives the best predicted tokens/s found so far as a share of the
optimum after 10, 25, 50, 100 and 200 trials (mean over seeds), and the trial at which
the optimum was first found.

Priors: `constant` is the CLI's --acceptance-prior 0.7 (the ranking is then by latency
alone); `shaped` is a SYNTHETIC prior for benchmarking only — acceptance rising with the
drafter's share of the base's non-embedding parameters,
alpha = 0.5 + 0.25 * share ** 0.3 (0.59 for one full-width LLaMA-7B layer, 0.75 for all 32) —
so the optimum is an interior depth/width trade-off.
It is not a claim about any real drafter.

Also printed: trials per second of latency-only scoring (candidate + latency + best gamma
per batch size, no storage) and of the whole ask/tell loop with journal-file storage.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import tempfile
import time
from typing import Any

CHECKPOINTS = (10, 25, 50, 100, 200)


class ShapedPrior:
    """Synthetic acceptance prior rising with the drafter's size (benchmark only)."""

    measured = False

    def __init__(self, base: Any) -> None:
        self.base_params = base.non_embedding_parameters()

    def alpha(self, arch: Any) -> float:
        share = arch.non_embedding_parameters() / self.base_params
        return min(0.95, 0.5 + 0.25 * share ** 0.3)

    def evaluate(self, candidate: Any) -> Any:
        from draftnas.search.evaluate import Evaluation
        from draftnas.search.scoring import assumed_acceptance

        return Evaluation(candidate, assumed_acceptance(self.alpha(candidate.arch)))


def enumerate_space(space: Any, base: Any, target: Any, predictor: Any, profile: str,
                    evaluator: Any) -> tuple[float, str, int, float]:
    """Exhaustive optimum: (tokens/s, candidate name, points scored, points per second)."""
    from draftnas.core.errors import InfeasibleCandidateError
    from draftnas.search.candidate import build_candidate
    from draftnas.search.records import CandidateChoice
    from draftnas.search.scoring import predict_workload, read_latency, target_latency

    w = space.width
    tl = target_latency(predictor, target, space.workload, space.gamma)
    best, name, n = 0.0, "", 0
    started = time.perf_counter()
    for depth, sel, kv, q, mlp, hid in itertools.product(
            space.depth.values(), space.layer_selection, w.kv_head_ratios, w.query_head_ratios,
            w.mlp_ratios, w.hidden_ratios):
        choice = CandidateChoice(depth, sel, kv, q, mlp, hid)
        try:
            cand = build_candidate(space, base, space.base, choice, target=target)
        except InfeasibleCandidateError:
            continue
        latency = read_latency(predictor, profile, cand.arch, space.workload, tl)
        acceptance = evaluator.evaluate(cand).acceptance
        tps = predict_workload(latency, acceptance, space.workload, space.gamma).tokens_per_s
        n += 1
        if tps > best:
            best, name = tps, cand.name
    elapsed = time.perf_counter() - started
    return best, name, n, n / elapsed


def best_so_far(result_trials: list[Any]) -> list[float]:
    """Running best tokens/s over trials in number order (pruned/failed trials repeat the best)."""
    out, best = [], 0.0
    for t in sorted(result_trials, key=lambda t: t.number):
        tp = t.user_attrs.get("throughput") if t.state.name == "COMPLETE" else None
        if tp:
            best = max(best, tp["tokens_per_s"])
        out.append(best)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", default="llama-65b-from-llama-7b")
    parser.add_argument("--profile", default=None, help="profile name or JSON (default: the space's)")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--prior", choices=("shaped", "constant"), default="shaped")
    parser.add_argument("--samplers", default="tpe,nsga2,random")
    args = parser.parse_args()

    import optuna

    from draftnas.core.registry import get_architecture
    from draftnas.search.evaluate import PriorEvaluator
    from draftnas.search.loop import SearchOptions, run_search
    from draftnas.search.pricing import resolve_profile
    from draftnas.search.records import StudySettings
    from draftnas.search.spaces import load_search_space
    from draftnas.search.storage import load_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_search_space(args.space)
    base, target = get_architecture(space.base), get_architecture(space.target)
    predictor, profile = resolve_profile(args.profile, space)
    evaluator: Any = ShapedPrior(base) if args.prior == "shaped" else PriorEvaluator(0.7)
    optimum, opt_name, n_points, points_per_s = enumerate_space(space, base, target, predictor, profile,
                                                                evaluator)
    print(f"space {space.name}: {space.size()} points ({n_points} feasible), profile {profile}, "
          f"prior {args.prior}")
    print(f"exhaustive optimum: {opt_name} at {optimum:,.2f} tokens/s")
    print(f"latency-only scoring: {points_per_s:,.0f} candidates/s "
          f"(candidate + latency + best gamma at {len(space.workload.batch_sizes)} batch sizes)\n")

    checkpoints = [c for c in CHECKPOINTS if c <= args.trials]
    header = ["sampler"] + [f"@{c}" for c in checkpoints] + ["optimum found at (trials)", "trials/s"]
    rows = []
    tmp = tempfile.mkdtemp(prefix="draftnas-search-efficiency-")
    for sampler in args.samplers.split(","):
        curves, found, speeds = [], [], []
        for seed in range(args.seeds):
            name, storage = f"{sampler}-{seed}", f"journal:{tmp}/{sampler}-{seed}.log"
            started = time.perf_counter()
            result = run_search(SearchOptions(
                target=target.name, target_arch=target, base=space.base, base_arch=base, space=space,
                profile=profile, acceptance_prior=0.7,
                study=StudySettings(n_trials=args.trials, storage=storage, study_name=name, sampler=sampler,
                                    seed=seed)), predictor, evaluator)
            speeds.append(len(result.told_here) / (time.perf_counter() - started))
            curve = best_so_far(load_study(name, storage).get_trials(deepcopy=False))
            curves.append(curve)
            hit = next((i + 1 for i, v in enumerate(curve) if v >= optimum * (1 - 1e-9)), None)
            found.append(hit)
        cells = [sampler]
        for c in checkpoints:
            cells.append(f"{statistics.mean(cur[min(c, len(cur)) - 1] / optimum for cur in curves):.4f}")
        hits = [f"{h}" if h else f">{args.trials}" for h in found]
        cells += [", ".join(hits), f"{statistics.mean(speeds):.1f}"]
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"best found / exhaustive optimum (mean of {args.seeds} seeds); trials/s of the whole "
          "ask/tell loop on journal-file storage")
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
