"""Curves of acceptance against training tokens: tokens per step = a + b ln T, fitted per drafter shape
on the held-out readings of its training run: a cut's pretrain phase (a finetune's readings measure another
recipe), a head's whole run (the second seed's Figure 4 puts speedup linear in log training tokens). Each
curve is checked at the largest budget it was not fitted on: the fit made without that reading predicts it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from draftnas.core.errors import InvalidInputError
from draftnas.drafter.head.folder import WEIGHTS, read_shape
from draftnas.drafter.head.records import RESULT_FILE, HeadTrainResult
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


def fit_curve(result: DistillTrainResult | HeadTrainResult, *, min_tokens: int, source: str = ""
              ) -> TrainingCurve:
    """The curve of one training run's readings at budgets >= `min_tokens`, with its check: a cut's
    pretrain readings (`distill train`) or a head's (`distill head`)."""
    untrained = next((r for r in result.readings if r.tokens == 0), None)
    if untrained is None:
        raise InvalidInputError(f"{source or result.out}: the run has no untrained reading")
    phase = "train" if isinstance(result, HeadTrainResult) else "pretrain"
    points = tuple(CurvePoint(r.tokens, r.tokens_per_step, r.top1_agreement)
                   for r in result.readings if r.tokens >= min_tokens and r.phase == phase)
    if len({p.tokens for p in points}) < 3:
        where = source or result.out
        raise InvalidInputError(f"{where}: {len(points)} readings at >= {min_tokens:,} tokens; a "
                                "checked curve needs 3 at least (more --readings, a larger budget)")
    a, b = fit_log_line([(p.tokens, p.tokens_per_step) for p in points])
    last = max(points, key=lambda p: p.tokens)
    a0, b0 = fit_log_line([(p.tokens, p.tokens_per_step) for p in points if p.tokens < last.tokens])
    check = CurveCheck(tokens=last.tokens, predicted=a0 + b0 * math.log(last.tokens),
                       measured=last.tokens_per_step)
    common = dict(label=result.label, gamma=result.gamma, points=points, intercept=a, slope=b,
                  fitted_from=min_tokens, untrained=untrained.tokens_per_step, check=check, source=source,
                  host=result.host, command=result.command)
    if isinstance(result, HeadTrainResult):
        shape = result.shape or read_shape(result.head)
        return TrainingCurve(base=result.target, layers=shape.layers, head_rows=shape.draft_vocab,
                             family="head", ffn=shape.ffn, unroll=result.unroll,
                             delta_sha256=_head_sha256(result.head),
                             **common)  # type: ignore[arg-type]
    finetuned = tuple(CurvePoint(r.tokens, r.tokens_per_step, r.top1_agreement)
                      for r in result.readings if r.phase == "finetune")
    return TrainingCurve(base=result.base, layers=result.layers, head_rows=result.head_rows,
                         finetuned=finetuned, delta_sha256=result.delta_sha256, **common)  # type: ignore[arg-type]


def _head_sha256(folder: str) -> str:
    """The head's weights' hash where its folder is here (a rerun of its command reproduces them), else ""."""
    import hashlib

    weights = Path(folder) / WEIGHTS
    return hashlib.sha256(weights.read_bytes()).hexdigest() if weights.is_file() else ""


def read_train_result(folder: str | Path) -> DistillTrainResult:
    """A cut's training folder's result (`train.json`)."""
    result = _read_result(Path(folder) / "train.json", DistillTrainResult, "`draftnas distill train`")
    assert isinstance(result, DistillTrainResult)
    return result


def read_curve_run(folder: str | Path) -> DistillTrainResult | HeadTrainResult:
    """A training folder's result, a cut's (`train.json`) or a head's (`head.json` of `distill head`)."""
    if (Path(folder) / RESULT_FILE).is_file() and not (Path(folder) / "train.json").is_file():
        return _read_result(Path(folder) / RESULT_FILE, HeadTrainResult, "`draftnas distill head`")
    if not (Path(folder) / "train.json").is_file():
        raise InvalidInputError(f"{folder}: no train.json or {RESULT_FILE} here (a folder of `draftnas "
                                "distill train` or `distill head` holds one)")
    return read_train_result(folder)


def _read_result(path: Path, kind: type[DistillTrainResult] | type[HeadTrainResult], made_by: str
                 ) -> DistillTrainResult | HeadTrainResult:
    if not path.is_file():
        raise InvalidInputError(f"{path}: missing (a folder of {made_by} holds it)")
    try:
        return kind.from_dict(json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as exc:
        raise InvalidInputError(f"{path}: not a training result ({exc})") from None


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
        result = read_curve_run(folder)
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
