"""Acceptance as a function of the drafter, for targets whose weights are not here.

A search for LLaMA-65B cannot measure acceptance: neither the target nor a pruned LLaMA-7B
is on the machine. A constant prior makes the cheapest drafter win by construction. This
module fits a small model alpha(drafter) on measured (drafter -> alpha) pairs instead:

- `draftnas.search.pairs.measure_pairs` (torch) measures the pairs: a designed set of drafters cut
  from an embedded base, healed, their acceptance estimated on held-out traces per domain.
- `fit_alpha_model` (pure): ridge regression of logit(alpha) on features relative to the
  base (`FEATURES`), with its leave-one-out error and, given several families, the error on
  a family left out entirely (what transferring the model to another family costs).
- `AlphaModel.predict`: alpha for any candidate's features; features outside the fitted range
  are reported, not silently trusted.

Applying a model fitted on SmolLM2-135M and Gemma-3-270M to drafters cut from LLaMA-7B for
LLaMA-65B is an ASSUMPTION (different families, base != target, and far more distillation in
the paper's drafters than the pairs' healing); every output that uses one says FITTED ON.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftnas.core.errors import InvalidInputError
from draftnas.core.records import Record
from draftnas.core.registry import Architecture
from draftnas.search.records import Candidate, CandidateChoice
from draftnas.search.requests import AlphaFitRequest

log = logging.getLogger(__name__)
MODEL_SCHEMA = "draftnas-alpha-model"
MODEL_VERSION = 1
PAIRS_SCHEMA = "draftnas-alpha-pairs/1"
#: inputs of the model, each relative to the base the drafter is cut from
FEATURES: tuple[str, ...] = ("depth_fraction", "mean_position", "query_head_ratio", "kv_head_ratio",
                             "mlp_ratio", "log_head_fraction", "log1p_heal_steps")
ALL = "all"
RIDGE = 1.0
ALPHA_FLOOR = 1e-3  # logit(0) is -inf: measured alphas are clipped into [floor, 1 - floor]


@dataclass(frozen=True)
class DrafterFeatures(Record):
    """A drafter described relative to its base, the way the model reads it.

    `hidden_ratio` is kept for the record but is not a model input: a pruned hidden size cannot
    be healed from real weights here, so no pair ever measures its effect.
    """

    depth_fraction: float
    mean_position: float  # mean kept-layer index / (base layers - 1); 0 = the first layers
    query_head_ratio: float
    kv_head_ratio: float
    mlp_ratio: float
    log_head_fraction: float  # ln(head rows / vocabulary); 0 = the full head
    log1p_heal_steps: float
    hidden_ratio: float = 1.0

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, f) for f in FEATURES], dtype=float)


def drafter_features(candidate: Candidate, base: Architecture, heal_steps: int) -> DrafterFeatures:
    """Features of `candidate` cut from `base`; kept layers from its plan (first-k without one)."""
    a, n = candidate.arch, base.num_hidden_layers
    layers = candidate.plan.layers if candidate.plan is not None else tuple(range(a.num_hidden_layers))
    rows = candidate.head_vocab_size or a.vocab_size
    return DrafterFeatures(
        depth_fraction=a.num_hidden_layers / n,
        mean_position=float(np.mean(layers)) / (n - 1) if n > 1 else 0.0,
        query_head_ratio=a.num_attention_heads / base.num_attention_heads,
        kv_head_ratio=a.num_key_value_heads / base.num_key_value_heads,
        mlp_ratio=a.intermediate_size / base.intermediate_size,
        log_head_fraction=math.log(rows / a.vocab_size),
        log1p_heal_steps=math.log1p(max(0, heal_steps)),
        hidden_ratio=a.hidden_size / base.hidden_size,
    )


@dataclass(frozen=True)
class AlphaPair(Record):
    """One measured drafter: what it is (relative to its base) and the acceptance it got."""

    schema: str
    family: str
    base: str
    candidate: str
    choice: CandidateChoice
    layers: tuple[int, ...]
    heal_steps: int
    features: DrafterFeatures
    alpha: float  # mean per-position acceptance on the held-out traces (greedy: top-1 agreement)
    per_domain: dict[str, float]
    n_positions: int
    tokens_per_step: dict[str, float]
    traces: str
    evaluate_s: float


@dataclass(frozen=True)
class HeldOutError(Record):
    """The model's error on pairs it was not fitted on (absolute error in alpha)."""

    method: str
    n: int
    mean_abs_error: float
    max_abs_error: float
    by_family_left_out: dict[str, float]  # family -> MAE when fitted on the other families only


@dataclass(frozen=True)
class AlphaModel(Record):
    """logit(alpha) = intercept + w . standardized(features), per domain ("all": every domain)."""

    schema: str
    version: int
    features: tuple[str, ...]
    means: tuple[float, ...]
    scales: tuple[float, ...]  # 0 = a feature constant in the pairs (not used)
    weights: dict[str, tuple[float, ...]]  # domain -> (intercept, w_1..w_n)
    ranges: dict[str, tuple[float, float]]
    ridge: float
    families: tuple[str, ...]
    n_pairs: int
    heldout: HeldOutError
    sources: tuple[str, ...] = ()
    created: str = ""

    def log_odds(self, features: DrafterFeatures, domain: str | None = None) -> float:
        """logit(alpha) for a drafter; the domain's fit when the model has one, else all domains'."""
        w = np.array(self.weights.get(domain or ALL, self.weights[ALL]))
        return float(w[0] + _standardize(features.vector(), self.means, self.scales) @ w[1:])

    def predict(self, features: DrafterFeatures, domain: str | None = None, shift: float = 0.0) -> float:
        """alpha for a drafter, its log-odds moved by `shift` (an anchor's level)."""
        return float(sigmoid(self.log_odds(features, domain) + shift))

    def outside(self, features: DrafterFeatures, tolerance: float = 0.1) -> list[str]:
        """Inputs outside the fitted range by more than `tolerance` of its width (the model was not
        fitted on drafters like this; its prediction there would be an extrapolation)."""
        out = []
        for name in self.features:
            lo, hi = self.ranges[name]
            v = getattr(features, name)
            slack = tolerance * (hi - lo) + 1e-9
            if not lo - slack <= v <= hi + slack:
                out.append(f"{name} {v:.3g} (fitted {lo:.3g}..{hi:.3g})")
        if not math.isclose(features.hidden_ratio, 1.0):
            out.append(f"hidden_ratio {features.hidden_ratio:.3g} (no pair prunes the hidden size; "
                       "its effect is not modelled)")
        return out

    def label(self) -> str:
        h = self.heldout
        return (f"FITTED ON {', '.join(self.families)} ({self.n_pairs} measured pairs; held-out mean "
                f"abs error {h.mean_abs_error:.3f} in alpha, {h.method})")


def sigmoid(x: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-x))


def _logit(alpha: np.ndarray) -> np.ndarray:
    a = np.clip(alpha, ALPHA_FLOOR, 1 - ALPHA_FLOOR)
    return np.log(a / (1 - a))


def _standardize(x: np.ndarray, means: Sequence[float] | np.ndarray,
                 scales: Sequence[float] | np.ndarray) -> np.ndarray:
    s = np.array(scales, dtype=float)
    return np.where(s > 0, (x - np.array(means)) / np.where(s > 0, s, 1.0), 0.0)


def _ridge(x: np.ndarray, y: np.ndarray, ridge: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(means, scales, [intercept, w...]) of ridge regression on standardized x (intercept free)."""
    means = x.mean(axis=0)
    scales = x.std(axis=0)
    scales = np.where(scales > 1e-12, scales, 0.0)
    z = _standardize(x, means, scales)
    design = np.hstack([np.ones((len(z), 1)), z])
    penalty = ridge * np.eye(design.shape[1])
    penalty[0, 0] = 0.0
    coef = np.linalg.solve(design.T @ design + penalty, design.T @ y)
    return means, scales, coef


def _predict_raw(x: np.ndarray, means: np.ndarray, scales: np.ndarray, coef: np.ndarray) -> np.ndarray:
    return np.asarray(sigmoid(coef[0] + _standardize(x, means, scales) @ coef[1:]))


def fit_alpha_model(pairs: Sequence[AlphaPair], *, ridge: float = RIDGE,
                    sources: Sequence[str] = ()) -> AlphaModel:
    """Fit the model (all domains, and each domain measured on every pair) with its held-out error."""
    if len(pairs) < 4:
        raise InvalidInputError(f"fitting an acceptance model needs at least 4 measured pairs, "
                                f"got {len(pairs)}")
    if ridge < 0:
        raise InvalidInputError(f"ridge must be >= 0, got {ridge:g}")
    x = np.stack([p.features.vector() for p in pairs])
    alpha = np.array([p.alpha for p in pairs])
    means, scales, coef = _ridge(x, _logit(alpha), ridge)
    weights = {ALL: tuple(float(c) for c in coef)}
    domains = set.intersection(*(set(p.per_domain) for p in pairs))
    for domain in sorted(domains):
        d_alpha = np.array([p.per_domain[domain] for p in pairs])
        _, _, d_coef = _ridge(x, _logit(d_alpha), ridge)
        weights[domain] = tuple(float(c) for c in d_coef)
    errors = []
    for i in range(len(pairs)):  # leave one out
        keep = np.arange(len(pairs)) != i
        m, s, c = _ridge(x[keep], _logit(alpha[keep]), ridge)
        errors.append(abs(float(_predict_raw(x[i:i + 1], m, s, c)[0]) - alpha[i]))
    families = tuple(sorted({p.family for p in pairs}))
    by_family = {}
    if len(families) > 1:
        for fam in families:
            held = np.array([p.family == fam for p in pairs])
            m, s, c = _ridge(x[~held], _logit(alpha[~held]), ridge)
            by_family[fam] = float(np.mean(np.abs(_predict_raw(x[held], m, s, c) - alpha[held])))
    heldout = HeldOutError(method="leave-one-out", n=len(pairs), mean_abs_error=float(np.mean(errors)),
                           max_abs_error=float(np.max(errors)), by_family_left_out=by_family)
    ranges = {name: (float(x[:, j].min()), float(x[:, j].max())) for j, name in enumerate(FEATURES)}
    return AlphaModel(schema=MODEL_SCHEMA, version=MODEL_VERSION, features=FEATURES,
                      means=tuple(float(v) for v in means), scales=tuple(float(v) for v in scales),
                      weights=weights, ranges=ranges, ridge=ridge, families=families, n_pairs=len(pairs),
                      heldout=heldout, sources=tuple(sources),
                      created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def read_pairs(path: str | Path) -> list[AlphaPair]:
    """Pairs from a JSONL file `draftnas alpha measure` wrote (one clear line on a wrong file)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InvalidInputError(f"pairs file {path} does not exist")
    pairs = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
        if not isinstance(data, dict) or data.get("schema") != PAIRS_SCHEMA:
            raise InvalidInputError(f"{path}:{lineno}: not a {PAIRS_SCHEMA} row (write pairs with "
                                    "`draftnas alpha measure`)")
        try:
            pairs.append(AlphaPair.from_dict(data))
        except (TypeError, KeyError, ValueError) as exc:
            raise InvalidInputError(f"{path}:{lineno}: malformed pair ({exc})") from None
    return pairs


def save_alpha_model(model: AlphaModel, path: str | Path) -> Path:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(model.to_dict(), indent=1) + "\n")
    tmp.replace(path)
    return path


def load_alpha_model(path: str | Path) -> AlphaModel:
    """A model file `draftnas alpha fit` wrote; any other file is refused in one line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InvalidInputError(f"acceptance model {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"acceptance model {path} is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != MODEL_SCHEMA:
        raise InvalidInputError(f"{path} is not a draftnas acceptance model (schema "
                                f"{data.get('schema') if isinstance(data, dict) else None!r}, expected "
                                f"{MODEL_SCHEMA!r}; fit one with `draftnas alpha fit`)")
    if data.get("version") != MODEL_VERSION:
        raise InvalidInputError(f"acceptance model {path} has version {data.get('version')!r}; this "
                                f"draftnas reads version {MODEL_VERSION}")
    try:
        model = AlphaModel.from_dict(data)
    except (TypeError, KeyError, ValueError) as exc:
        raise InvalidInputError(f"acceptance model {path} is malformed ({exc})") from None
    n = len(model.features) + 1
    if (tuple(model.features) != FEATURES or ALL not in model.weights
            or any(len(w) != n for w in model.weights.values())
            or len(model.means) != n - 1 or len(model.scales) != n - 1
            or set(model.ranges) != set(FEATURES)):
        raise InvalidInputError(f"acceptance model {path} does not have this draftnas's features "
                                f"({', '.join(FEATURES)}) and one weight per feature plus an intercept")
    return model


def fit_from_request(request: AlphaFitRequest) -> AlphaModel:
    """`draftnas alpha fit`: the request's pair files fitted, the model written to its file."""
    rows = [p for path in request.pairs for p in read_pairs(path)]
    model = fit_alpha_model(rows, ridge=request.ridge, sources=[Path(path).name for path in request.pairs])
    save_alpha_model(model, request.out)
    return model
