"""Curves of acceptance against training tokens: tokens per step = a + b ln T, fitted per drafter shape
on the held-out readings of its training run's pretrain phase (a finetune's readings measure another
recipe) (the second seed's Figure 4 puts speedup linear in log
training tokens). Each curve is checked at the largest budget it was not fitted on: the fit made
without that reading predicts it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.training.distill_records import (
    CurveCheck,
    CurvePoint,
    CurveSet,
    DistillCurveRequest,
    DistillTrainResult,
    TrainingCurve,
)


def fit_log_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b ln x over (x, y) points, x > 0; two distinct x at
    least."""
    xs = [math.log(x) for x, _ in points]
    ys = [y for _, y in points]
    if len(set(xs)) < 2:
        raise InvalidInputError("a curve needs readings at two budgets at least")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def fit_curve(result: DistillTrainResult, *, min_tokens: int, source: str = "") -> TrainingCurve:
    """The curve of one training run's readings at budgets >= `min_tokens`, with its check."""
    untrained = next((r for r in result.readings if r.tokens == 0), None)
    if untrained is None:
        raise InvalidInputError(f"{source or result.out}: the run has no untrained reading")
    points = tuple(CurvePoint(r.tokens, r.tokens_per_step, r.top1_agreement)
                   for r in result.readings if r.tokens >= min_tokens and r.phase == "pretrain")
    if len({p.tokens for p in points}) < 3:
        where = source or result.out
        raise InvalidInputError(f"{where}: {len(points)} readings at >= {min_tokens:,} tokens; a "
                                "checked curve needs 3 at least (more --readings, a larger budget)")
    a, b = fit_log_line([(p.tokens, p.tokens_per_step) for p in points])
    last = max(points, key=lambda p: p.tokens)
    a0, b0 = fit_log_line([(p.tokens, p.tokens_per_step) for p in points if p.tokens < last.tokens])
    check = CurveCheck(tokens=last.tokens, predicted=a0 + b0 * math.log(last.tokens),
                       measured=last.tokens_per_step)
    finetuned = tuple(CurvePoint(r.tokens, r.tokens_per_step, r.top1_agreement)
                      for r in result.readings if r.phase == "finetune")
    return TrainingCurve(label=result.label, base=result.base, layers=result.layers,
                         head_rows=result.head_rows,
                         gamma=result.gamma, points=points, intercept=a, slope=b, fitted_from=min_tokens,
                         untrained=untrained.tokens_per_step, check=check, source=source, finetuned=finetuned,
                         host=result.host, command=result.command, delta_sha256=result.delta_sha256)


def read_train_result(folder: str | Path) -> DistillTrainResult:
    """A training folder's result (`train.json`)."""
    path = Path(folder) / "train.json"
    if not path.is_file():
        raise InvalidInputError(f"{path}: missing (a folder of `draftnas distill train` holds it)")
    try:
        data = json.loads(path.read_text())
        result = DistillTrainResult.from_dict(data)
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
        raise InvalidInputError(f"{path}: not a training result ({exc})") from None
    return result


def load_curves(path: str | Path) -> CurveSet:
    """A curves file (`draftnas distill curve --out`); one line naming the file when it is not one."""
    p = Path(path)
    try:
        return CurveSet.from_dict(json.loads(p.read_text()))
    except FileNotFoundError:
        raise InvalidInputError(f"{p}: no such curves file") from None
    except (json.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError) as exc:
        raise InvalidInputError(f"{p}: not a curves file ({exc})") from None


def shipped_curves(target_name: str) -> CurveSet | None:
    """The curves measured for an embedded target and shipped with draftnas (data/curves/<name>.json)."""
    from importlib import resources

    path = resources.files("draftnas") / "data" / "curves" / f"{target_name}.json"
    return load_curves(str(path)) if path.is_file() else None


def curves_from_request(request: DistillCurveRequest) -> CurveSet:
    """Fit each run's curve, write them (and a plot beside them) to `request.out`."""
    request.validate()
    curves = []
    targets = set()
    for folder in request.runs:
        result = read_train_result(folder)
        targets.add(result.target)
        curves.append(fit_curve(result, min_tokens=request.min_tokens, source=str(folder)))
    if len(targets) > 1:
        names = ", ".join(sorted(targets))
        raise InvalidInputError(f"the runs train drafters of different targets ({names}); "
                                "one curves file holds one target's")
    out = Path(request.out)
    plot = out.with_suffix(".png")
    draw_curves(curves, plot)
    result_set = CurveSet(target=targets.pop(), curves=tuple(curves), plot=str(plot))
    out.write_text(json.dumps(result_set.to_dict(), indent=1) + "\n")
    return result_set


def draw_curves(curves: Sequence[TrainingCurve], path: Path) -> None:
    """Tokens per step against training tokens (log axis), measured points and each fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in curves:
        xs = [p.tokens for p in c.points]
        line = ax.plot(xs, [p.tokens_per_step for p in c.points], "o", label=f"{c.label} (measured)")[0]
        lo, hi = min(xs), max(xs) * 10
        grid = [lo * (hi / lo) ** (i / 50) for i in range(51)]
        ax.plot(grid, [c.predict(x) for x in grid], "-", color=line.get_color(), alpha=0.6,
                label=f"fit {c.intercept:.2f} + {c.slope:.3f} ln T")
        ax.axhline(c.untrained, color=line.get_color(), linestyle=":", alpha=0.5)
        if c.finetuned:
            ax.plot([p.tokens for p in c.finetuned], [p.tokens_per_step for p in c.finetuned], "*",
                    markersize=11,
                    color=line.get_color(), label=f"{c.label} after the finetune")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens (trained positions)")
    ax.set_ylabel(f"held-out tokens per step (greedy, gamma {curves[0].gamma if curves else 4})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
