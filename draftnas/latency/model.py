"""Latency profiles and the per-device latency model. Pure python + numpy; no torch.

A `LatencyProfile` is what `draftnas profile` writes: raw timings of decoder
shapes on one device (or, for `kind="spec-sheet"`, none: coefficients derived
from a data sheet), plus the coefficients of a roofline-shaped model fitted to
them and that model's error on shapes held out of the fit.

The model (all times in ms; b = bytes per weight, T = batch_size * new_tokens
tokens in the forward pass, C = context_tokens, L layers, P parameters of one
layer, N rows of the LM head, h hidden size, r the ridge point in FLOPs/byte):

    T_ms = call + layer * L + token * T + layer_token * L * T
         + gemm_mb    * L * max(P*b, 2*P*T / r) / 1e6        (weights read / matmul FLOPs, roofline)
         + gemm_gflop * L * 2*P*T / 1e9                       (compute not hidden by the roofline)
         + kv_mb      * L * max(KV bytes read, attention FLOPs / r) / 1e6
         + head_mb    * max(N*h*b, 2*N*h*T / r) / 1e6         (final norm + LM head of N rows)
         + head_gflop * 2*N*h*T / 1e9
         + gemm_tile_gflop * L * 2*P*min(T, m) / 1e9 + head_tile_gflop * 2*N*h*min(T, m) / 1e9
         + [T > 16] * (gemm_over_mb * L * P*b + head_over_mb * N*h*b) / 1e6

This is the roofline of Williams et al. (2009), "Roofline: an insightful visual
performance model", with max(bytes / bandwidth, FLOPs / peak) per operator; with
the spec-sheet coefficients (gemm_mb = kv_mb = head_mb = 1e9 / bandwidth,
r = peak / bandwidth, overhead terms from a stated per-kernel cost) it is exactly
that roofline plus launch overhead. The two "tile" terms model skinny matrix
products: a GEMM of T < m rows runs its microkernel tiles (m rows high) partly
empty, so its first rows cost more per FLOP than the rest (on this 2-core CPU,
m = 8 cut the held-out error of the previous form roughly in half). The two "over"
terms price the change of kernel at 16 rows: draftnas's static decoder on CPU multiplies
products of up to `MAX_WEIGHT_ONCE_ROWS` rows in the form that timed fastest (weight-once
on the AMD EPYC host) and larger ones with `F.linear`, whose blocking there reads the weights
at a different cost (on that host they cut the held-out error of a static-mode profile from
6.4% to 4.2%; profiles fitted before them read them as 0). For a measured
device the coefficients are fitted by non-negative least squares on relative error
(each row divided by its measured time), and `r` and `m` by a grid search on the
training shapes only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np

from draftnas.core.errors import InvalidInputError, ProfileError
from draftnas.core.placement import dtype_bytes
from draftnas.core.registry import Architecture
from draftnas.latency.records import FitResult, LatencyProfile, Measurement
from draftnas.models.records import MAX_WEIGHT_ONCE_ROWS

log = logging.getLogger(__name__)
#: Coefficient names, in feature-column order (see the module docstring).
MODEL_TERMS: tuple[str, ...] = (
    "call", "layer", "token", "layer_token", "gemm_mb", "gemm_gflop",
    "kv_mb", "head_mb", "head_gflop", "gemm_tile_gflop", "head_tile_gflop",
    "gemm_over_mb", "head_over_mb",
)
#: Terms added after profiles were first shipped: a profile without them reads them as 0.
LATER_TERMS: tuple[str, ...] = ("gemm_over_mb", "head_over_mb")
#: Extra column only head-only micro-benchmarks have (their own call overhead); never predicted.
HEAD_CALL = "head_call"
FIT_TERMS: tuple[str, ...] = (*MODEL_TERMS, HEAD_CALL)
RIDGE = "ridge_flops_per_byte"
RIDGE_GRID: tuple[float, ...] = tuple(float(x) for x in np.geomspace(0.25, 2048.0, 40))
TILE = "tile_rows"
TILE_GRID: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
HYPERPARAMETERS = (RIDGE, TILE)
#: Coefficients every profile must have (LATER_TERMS may be missing: read as 0).
REQUIRED_COEFFICIENTS: tuple[str, ...] = tuple(t for t in (*MODEL_TERMS, *HYPERPARAMETERS)
                                               if t not in LATER_TERMS)


def _terms(arch: Architecture, batch_size: int, new_tokens: int, context_tokens: int,
           head_rows: int, dtype_bytes: int, ridge: float, tile: float) -> tuple[float, ...]:
    """Feature values in MODEL_TERMS order (units: 1, layers, tokens, MB, GFLOP)."""
    layers = arch.num_hidden_layers
    tokens = batch_size * new_tokens
    skinny = min(tokens, tile)
    layer_params = arch.layer_parameters()
    gemm_flops = 2.0 * layer_params * tokens
    kv_bytes = 2.0 * batch_size * (context_tokens + new_tokens) * arch.kv_dim * dtype_bytes
    # QK^T and AV: 2 matmuls of [new, ctx+new] x head_dim per query head, 2 FLOPs per MAC
    attn_flops = 4.0 * tokens * (context_tokens + new_tokens) * arch.q_dim
    head_mb, head_gflop, head_skinny, head_over = _head_parts(arch.hidden_size, head_rows, tokens,
                                                             dtype_bytes, ridge, tile)
    return (
        1.0,
        float(layers),
        float(tokens),
        float(layers * tokens),
        layers * max(layer_params * dtype_bytes, gemm_flops / ridge) / 1e6,
        layers * gemm_flops / 1e9,
        layers * max(kv_bytes, attn_flops / ridge) / 1e6,
        head_mb,
        head_gflop,
        layers * 2.0 * layer_params * skinny / 1e9,
        head_skinny,
        _past_weight_once(tokens) * layers * layer_params * dtype_bytes / 1e6,
        head_over,
    )


def _past_weight_once(tokens: int) -> float:
    """1.0 when a product of `tokens` rows is past the small-batch forms (the "over" terms), else 0."""
    return 1.0 if tokens > MAX_WEIGHT_ONCE_ROWS else 0.0


def _head_parts(hidden_size: int, head_rows: int, tokens: int, dtype_bytes: int,
                ridge: float, tile: float) -> tuple[float, float, float, float]:
    """The LM head's terms: head_mb, head_gflop, head_tile_gflop, head_over_mb."""
    head_params = float(head_rows * hidden_size)
    head_flops = 2.0 * head_params * tokens
    return (max(head_params * dtype_bytes, head_flops / ridge) / 1e6, head_flops / 1e9,
            2.0 * head_params * min(tokens, tile) / 1e9,
            _past_weight_once(tokens) * head_params * dtype_bytes / 1e6)


def _head_terms(hidden_size: int, head_rows: int, tokens: int, dtype_bytes: int,
                ridge: float, tile: float) -> tuple[float, ...]:
    """Feature values of the LM head alone, in MODEL_TERMS order (the stack's terms 0)."""
    head_mb, head_gflop, head_skinny, head_over = _head_parts(hidden_size, head_rows, tokens,
                                                             dtype_bytes, ridge, tile)
    zeros = (0.0,) * MODEL_TERMS.index("head_mb")
    return (*zeros, head_mb, head_gflop, 0.0, head_skinny, 0.0, head_over)


def feature_row(m: Measurement, shapes: dict[str, Architecture], dtype_bytes: int,
                ridge: float, tile: float) -> list[float]:
    """Feature values of one measurement in FIT_TERMS order."""
    arch = shapes.get(m.shape)
    if arch is None:
        raise InvalidInputError(f"measurement names shape {m.shape!r} that the profile does not list")
    if m.kind == "head":
        return [*_head_terms(arch.hidden_size, m.head_rows, m.batch_size * m.new_tokens,
                             dtype_bytes, ridge, tile), 1.0]
    return [*_terms(arch, m.batch_size, m.new_tokens, m.context_tokens, m.head_rows,
                    dtype_bytes, ridge, tile), 0.0]


def _nnls_relative(rows: np.ndarray, times_ms: np.ndarray) -> np.ndarray:
    """argmin_{c >= 0} sum_i ((rows_i . c - t_i) / t_i)^2, with column scaling for conditioning."""
    from scipy.optimize import nnls

    weighted = rows / times_ms[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(weighted / scale, np.ones(len(times_ms)), maxiter=5000)
    return np.asarray(coef / scale)


def _mape(rows: np.ndarray, coef: np.ndarray, times_ms: np.ndarray) -> float:
    return float(np.mean(np.abs(rows @ coef - times_ms) / times_ms) * 100.0)


def _design(measurements: Sequence[Measurement], shapes: dict[str, Architecture], dtype_bytes: int,
            ridge: float, tile: float) -> tuple[np.ndarray, np.ndarray]:
    rows = np.array([feature_row(m, shapes, dtype_bytes, ridge, tile) for m in measurements],
                    dtype=float)
    return rows, np.array([m.median_ms for m in measurements], dtype=float)


def fit_latency_model(measurements: Sequence[Measurement], shapes: Iterable[Architecture],
                      dtype: str, ridge_grid: Sequence[float] = RIDGE_GRID,
                      tile_grid: Sequence[int] = TILE_GRID) -> FitResult:
    """Fit the coefficients on split=="train" rows; report MAPE (%) on split=="heldout" rows.

    The ridge point r and tile height m are chosen on the training rows only, so held-out
    shapes never influence the fit. Held-out error is over "model" rows (whole passes).
    """
    by_name = {a.name: a for a in shapes}
    nbytes = dtype_bytes(dtype)
    train = [m for m in measurements if m.split == "train"]
    heldout = [m for m in measurements if m.split == "heldout" and m.kind == "model"]
    if len(train) < len(FIT_TERMS):
        raise InvalidInputError(
            f"need at least {len(FIT_TERMS)} training measurements to fit, got {len(train)}")
    best: tuple[float, float, int, np.ndarray] | None = None
    for tile in tile_grid:
        for ridge in ridge_grid:
            rows, times = _design(train, by_name, nbytes, ridge, tile)
            coef = _nnls_relative(rows, times)
            err = _mape(rows, coef, times)
            if best is None or err < best[0] - 1e-9:
                best = (err, ridge, tile, coef)
    assert best is not None
    train_err, ridge, tile, coef = best
    coefficients = {name: float(c) for name, c in zip(FIT_TERMS, coef, strict=True)}
    coefficients[RIDGE] = float(ridge)
    coefficients[TILE] = float(tile)
    heldout_err = None
    if heldout:
        rows, times = _design(heldout, by_name, nbytes, ridge, tile)
        heldout_err = _mape(rows, coef, times)
    return FitResult(coefficients=coefficients, train_mape=train_err, heldout_mape=heldout_err,
                     n_train=len(train), n_heldout=len(heldout))


class LatencyModel:
    """Predicts one forward pass's latency (ms) for any decoder shape on one device.

    Pure python arithmetic (tens of thousands of predictions per second), so a search
    can ask it for every candidate and every gamma.
    """

    def __init__(self, coefficients: dict[str, float], dtype: str, *, name: str = "") -> None:
        missing = [t for t in REQUIRED_COEFFICIENTS if t not in coefficients]
        if missing:
            raise ProfileError(f"latency model {name or '?'}: coefficients miss {', '.join(missing)}")
        self.name = name
        self.dtype = dtype
        self._dtype_bytes = dtype_bytes(dtype)
        self._ridge = float(coefficients[RIDGE])
        self._tile = float(coefficients[TILE])
        self._coef = tuple(float(coefficients.get(t, 0.0)) for t in MODEL_TERMS)

    @classmethod
    def from_profile(cls, profile: LatencyProfile) -> LatencyModel:
        return cls(profile.coefficients, profile.dtype, name=profile.device_name)

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float:
        """Latency (ms) of one forward over `new_tokens` tokens per sequence at `batch_size`.

        new_tokens=1 is a draft step, gamma+1 a verification; `context_tokens` is the KV
        cache length before the step; `head_vocab_size` is the number of LM-head rows
        (a reduced draft vocabulary), None for the full `arch.vocab_size`.
        """
        if batch_size < 1 or new_tokens < 1 or context_tokens < 0:
            raise InvalidInputError(
                f"batch_size and new_tokens must be >= 1 and context_tokens >= 0, got "
                f"{batch_size}, {new_tokens}, {context_tokens}")
        rows = arch.vocab_size if head_vocab_size is None else head_vocab_size
        if rows < 1:
            raise InvalidInputError(f"head_vocab_size must be >= 1, got {rows}")
        terms = _terms(arch, batch_size, new_tokens, context_tokens, rows, self._dtype_bytes,
                       self._ridge, self._tile)
        c = self._coef
        return (c[0] * terms[0] + c[1] * terms[1] + c[2] * terms[2] + c[3] * terms[3]
                + c[4] * terms[4] + c[5] * terms[5] + c[6] * terms[6] + c[7] * terms[7]
                + c[8] * terms[8] + c[9] * terms[9] + c[10] * terms[10] + c[11] * terms[11]
                + c[12] * terms[12])

    def breakdown_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                     context_tokens: int = 128, head_vocab_size: int | None = None) -> dict[str, float]:
        """The prediction split by term (ms), e.g. to see how much is per-layer overhead."""
        rows = arch.vocab_size if head_vocab_size is None else head_vocab_size
        terms = _terms(arch, batch_size, new_tokens, context_tokens, rows, self._dtype_bytes,
                       self._ridge, self._tile)
        return {name: c * t for name, c, t in zip(MODEL_TERMS, self._coef, terms, strict=True)}


def heldout_errors(profile: LatencyProfile) -> dict[str, float]:
    """Mean absolute percentage error of the profile's model on each held-out shape."""
    model = LatencyModel.from_profile(profile)
    shapes = {a.name: a for a in profile.shapes}
    errors: dict[str, list[float]] = {}
    for m in profile.measurements:
        if m.split != "heldout" or m.kind != "model" or m.shape not in shapes:
            continue
        predicted = model.predict_ms(shapes[m.shape], batch_size=m.batch_size, new_tokens=m.new_tokens,
                                     context_tokens=m.context_tokens, head_vocab_size=m.head_rows)
        errors.setdefault(m.shape, []).append(abs(predicted - m.median_ms) / m.median_ms * 100.0)
    return {name: float(np.mean(errs)) for name, errs in errors.items()}
