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

Size: the profile records, the fitted latency model (its terms, fit and held-out error), the spec-
sheet roofline and host calibration all price the same Condition shapes.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftnas.errors import InvalidInputError, ProfileError
from draftnas.placement import DTYPE_BYTES, Hardware, Interconnect, dtype_bytes
from draftnas.record import Record
from draftnas.registry import Architecture

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
KINDS = ("measured", "spec-sheet")

#: Products of up to this many rows take the small-batch forms of `decoder.MatmulChooser` on CPU;
#: above it, F.linear (whose blocking already reads each weight about once).
MAX_WEIGHT_ONCE_ROWS = 16
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


@dataclass(frozen=True)
class Measurement(Record):
    """One timed configuration: median and quartiles of `repeats` timed calls, in ms.

    kind "model": a full forward of `shape` (embedding, layers, final norm, LM head of
    `head_rows` = vocab rows) over `new_tokens` new tokens per sequence with a KV cache
    of `context_tokens`. kind "head": final norm + LM head of `head_rows` rows only, on
    [batch_size, new_tokens, hidden] activations. `split` is "train", "heldout" or
    "extrapolation" (timings used only to check the k-layer extrapolation).
    """

    kind: str
    shape: str
    batch_size: int
    new_tokens: int
    context_tokens: int
    head_rows: int
    median_ms: float
    q1_ms: float
    q3_ms: float
    repeats: int
    split: str = "train"


@dataclass(frozen=True)
class SkippedConfig(Record):
    """A configuration the profiler did not time because its memory peak would not fit.

    `needed_bytes`: weights + KV cache as allocated + held outputs + the largest transient
    of one forward; `budget_bytes`: the memory the run allowed itself on this device.
    """

    kind: str
    shape: str
    batch_size: int
    new_tokens: int
    context_tokens: int
    needed_bytes: int
    budget_bytes: int
    reason: str


@dataclass(frozen=True)
class ExtrapolationPoint(Record):
    batch_size: int
    new_tokens: int
    context_tokens: int
    full_ms: float
    extrapolated_ms: float
    error_pct: float  # (extrapolated - full) / full * 100


@dataclass(frozen=True)
class ExtrapolationCheck(Record):
    """Error of "time k layers, extrapolate fixed + L * per-layer" on a model that fits.

    Two stacks of `timed_layers` (k1 < k2) layers give per_layer = (t2 - t1) / (k2 - k1)
    and fixed = t1 - k1 * per_layer; the estimate for L layers is fixed + L * per_layer.
    """

    shape: str
    full_layers: int
    timed_layers: tuple[int, ...]
    points: tuple[ExtrapolationPoint, ...]
    mean_abs_error_pct: float
    max_abs_error_pct: float


@dataclass(frozen=True)
class TargetTiming(Record):
    """A target's full-depth step latencies, extrapolated from stacks of its first k layers timed
    on the profile's device (`draftnas profile --target T --layers k1,k2`).

    `arch` is the shape that was timed: the target itself, or one tensor-parallel rank's share
    of it (`gpus` > 1). `ms["BxN"]` is batch B reading N new tokens (N = 1 decode, gamma + 1
    verify) after `context_tokens`. `check`: the method's error on a stack that fits.
    """

    target: str
    arch: Architecture
    gpus: int
    timed_layers: tuple[int, ...]
    context_tokens: int
    batch_sizes: tuple[int, ...]
    new_tokens: tuple[int, ...]
    ms: dict[str, float]
    check: ExtrapolationCheck | None = None
    device_name: str = ""
    mode: str = "eager"
    wall_s: float = 0.0

    def matches(self, arch: Architecture, head_rows: int) -> bool:
        """Whether a prediction for `arch` with `head_rows` LM-head rows is this timed shape."""
        a, t = arch, self.arch
        return (head_rows == t.vocab_size and a.num_hidden_layers == t.num_hidden_layers
                and a.hidden_size == t.hidden_size and a.intermediate_size == t.intermediate_size
                and a.num_attention_heads == t.num_attention_heads
                and a.num_key_value_heads == t.num_key_value_heads and a.head_dim == t.head_dim)


@dataclass(frozen=True)
class LatencyProfile(Record):
    """A device's latency profile (schema-versioned JSON under `profiles/`)."""

    schema_version: int
    kind: str  # "measured" | "spec-sheet"
    device: str  # "cpu" | "cuda"
    device_name: str
    dtype: str  # fp32 | fp16 | bf16
    versions: dict[str, str]
    measurements: tuple[Measurement, ...]
    coefficients: dict[str, float]
    heldout_mape: float | None
    train_mape: float | None = None
    mode: str = "eager"  # "eager" (transformers) | "static" | "cuda-graph" (draftnas.decoder)
    threads: int | None = None
    shapes: tuple[Architecture, ...] = ()
    heldout_shapes: tuple[str, ...] = ()
    extrapolation: ExtrapolationCheck | None = None
    created: str = ""
    wall_s: float | None = None
    command: str = ""
    notes: str = ""
    spec: dict[str, float] = field(default_factory=dict)
    series: dict[str, tuple[str, ...]] = field(default_factory=dict)  # "depth"/"width" -> shape names
    skipped: tuple[SkippedConfig, ...] = ()
    hardware: Hardware | None = None  # GPU memory, dtypes and interconnect (placement, parallelism)
    targets: dict[str, TargetTiming] = field(default_factory=dict)  # "name" or "name/tpN" -> timing


# --------------------------------------------------------------------------- features


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


# --------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class FitResult(Record):
    """Coefficients (ms per feature unit, plus the ridge point) and their errors in %."""

    coefficients: dict[str, float]
    train_mape: float
    heldout_mape: float | None
    n_train: int
    n_heldout: int


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


# --------------------------------------------------------------------------- prediction


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


# --------------------------------------------------------------------------- files

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "schema_version": int, "kind": str, "device": str, "device_name": str, "dtype": str,
    "versions": dict, "measurements": list, "coefficients": dict,
    "heldout_mape": (int, float, type(None)),
}
_MEASUREMENT_FIELDS = ("kind", "shape", "batch_size", "new_tokens", "context_tokens", "head_rows",
                       "median_ms", "q1_ms", "q3_ms", "repeats")


def _schema_problems(data: Any) -> list[str]:
    """Every schema problem of a decoded profile, as short phrases."""
    if not isinstance(data, dict):
        return [f"top level is a {type(data).__name__}, expected an object"]
    problems = []
    if "schema_version" in data and data["schema_version"] != SCHEMA_VERSION:
        return [f"schema_version {data['schema_version']!r} is not supported (expected {SCHEMA_VERSION})"]
    for key, tp in _REQUIRED.items():
        if key not in data:
            problems.append(f"missing field {key!r}")
        elif not isinstance(data[key], tp) or isinstance(data[key], bool) and tp is int:
            problems.append(f"field {key!r} has the wrong type ({type(data[key]).__name__})")
    if problems:
        return problems
    if data["kind"] not in KINDS:
        problems.append(f"kind {data['kind']!r} is not one of {', '.join(KINDS)}")
    if data["dtype"] not in DTYPE_BYTES:
        problems.append(f"dtype {data['dtype']!r} is not one of {', '.join(DTYPE_BYTES)}")
    coefs = data["coefficients"]
    missing = [t for t in REQUIRED_COEFFICIENTS if t not in coefs]
    if missing:
        problems.append(f"coefficients miss {', '.join(missing)}")
    bad = [k for k, v in coefs.items() if not isinstance(v, int | float) or not math.isfinite(v) or v < 0]
    if bad:
        problems.append(f"coefficients {', '.join(bad)} are not finite non-negative numbers")
    for i, m in enumerate(data["measurements"]):
        lacking = [f for f in _MEASUREMENT_FIELDS if not isinstance(m, dict) or f not in m]
        if lacking:
            problems.append(f"measurements[{i}] misses {', '.join(lacking)}")
            break
    if data["kind"] == "measured" and not data["measurements"]:
        problems.append("a measured profile has no measurements")
    return problems


def load_profile(path: str | os.PathLike[str]) -> LatencyProfile:
    """Read and schema-check a profile; any problem is one `ProfileError` line naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ProfileError(f"latency profile {path} not found") from None
    except OSError as exc:
        raise ProfileError(f"latency profile {path} cannot be read: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            f"latency profile {path} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    problems = _schema_problems(data)
    if problems:
        raise ProfileError(f"latency profile {path}: " + "; ".join(problems))
    try:
        return LatencyProfile.from_dict(data)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ProfileError(f"latency profile {path}: malformed ({exc})") from None


def save_profile(profile: LatencyProfile, path: str | os.PathLike[str]) -> Path:
    """Write a profile as indented JSON (creating parent folders); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=1) + "\n")
    return path


def profiles_dir() -> Path:
    """Shipped profiles: $DRAFTNAS_PROFILES, else `profiles/` next to the package."""
    if env := os.environ.get("DRAFTNAS_PROFILES"):
        return Path(env)
    return Path(__file__).resolve().parent.parent / "profiles"


#: Names accepted by `default_profile`, mapped to the shipped file.
SHIPPED_PROFILES: dict[str, str] = {
    "cpu": "cpu-2core-fp32.json",  # Intel Xeon, 2 threads, transformers' eager forward
    "cpu-amd-static": "cpu-amd-2core-fp32-static.json",  # AMD EPYC (Zen 2), 2 threads, draftnas's decoder
    "a100-80gb": "a100-80gb-spec.json",
    "h100-sxm": "h100-sxm-spec.json",
    "rtx-3090": "rtx-3090-spec.json",
}


def default_profile(device: str = "cpu") -> LatencyProfile:
    """The shipped profile for `device` ("cpu", or a spec-sheet GPU: a100-80gb, h100-sxm, rtx-3090)."""
    key = device.lower()
    if key not in SHIPPED_PROFILES:
        raise ProfileError(
            f"no shipped latency profile for {device!r}; shipped: {', '.join(SHIPPED_PROFILES)} "
            "(or measure one with `draftnas profile`)")
    return load_profile(profiles_dir() / SHIPPED_PROFILES[key])


# --------------------------------------------------------------------------- spec sheets


@dataclass(frozen=True)
class SpecSheet(Record):
    """A GPU's data-sheet figures and the overheads assumed on top of them."""

    name: str
    memory_bandwidth_gb_s: float
    peak_tflops: float  # dense fp16/bf16 tensor-core, fp32 accumulate
    kernel_overhead_us: float = 4.0
    kernels_per_layer: int = 12
    call_overhead_us: float = 50.0
    source: str = ""
    hardware: Hardware | None = None


#: Small-message all-reduce latency, ASSUMED (not from a data sheet): NCCL's small all-reduces
#: within one NVSwitch node take on the order of 10 us; PCIe more.
_NVLINK_LATENCY_US = 10.0
H100_SXM_NODE = Hardware(
    name="NVIDIA H100-SXM5-80GB", memory_gb=80.0, dtypes=("fp32", "fp16", "bf16", "fp8"), max_gpus=8,
    interconnect=Interconnect(
        name="NVLink 4 / NVSwitch (HGX H100, 8 GPUs)", bus_bandwidth_gb_s=370.0,
        latency_us=_NVLINK_LATENCY_US,
        source="NCCL all-reduce bus bandwidth with the ring algorithm, 370 GB/s (NVLink line rate 450 GB/s "
               "less ~20% protocol overhead; NVLink SHARP reaches ~480 GB/s busbw, ~275 GB/s algbw, on "
               "8 GPUs): NCCL maintainer, github.com/NVIDIA/nccl-tests/issues/212; small-message latency "
               "10 us ASSUMED"),
    source="NVIDIA H100 datasheet: 80 GB HBM3; FP8 tensor cores")
A100_SXM_NODE = Hardware(
    name="NVIDIA A100-SXM4-80GB", memory_gb=80.0, dtypes=("fp32", "fp16", "bf16"), max_gpus=8,
    interconnect=Interconnect(
        name="NVLink 3 / NVSwitch (HGX A100, 8 GPUs)", bus_bandwidth_gb_s=200.0,
        latency_us=_NVLINK_LATENCY_US,
        source="nccl-tests all_reduce_perf busbw measured by users on 8 x A100-SXM4-80GB: ~200 GB/s "
               "(github.com/NVIDIA/nccl-tests/issues/149) and 208 GB/s (issues/178); small-message latency "
               "10 us ASSUMED"),
    source="NVIDIA A100 datasheet: 80 GB HBM2e; no FP8")
RTX_3090_NODE = Hardware(
    name="NVIDIA GeForce RTX 3090", memory_gb=24.0, dtypes=("fp32", "fp16", "bf16"), max_gpus=4,
    interconnect=Interconnect(
        name="PCIe 4.0 x16", bus_bandwidth_gb_s=20.0, latency_us=25.0,
        source="ASSUMED: PCIe 4.0 x16 carries 32 GB/s per direction; NCCL all-reduce busbw taken as 20 GB/s "
               "and 25 us per small all-reduce, not measured"),
    source="NVIDIA GeForce RTX 3090 specifications: 24 GB GDDR6X")

SPEC_SHEETS: dict[str, SpecSheet] = {
    "a100-80gb": SpecSheet("NVIDIA A100-SXM4-80GB", 2039.0, 312.0,
                           source="NVIDIA A100 datasheet: HBM2e 2,039 GB/s; FP16/BF16 tensor "
                                  "312 TFLOPS dense", hardware=A100_SXM_NODE),
    "h100-sxm": SpecSheet("NVIDIA H100-SXM5-80GB", 3350.0, 989.0,
                          source="NVIDIA H100 datasheet: HBM3 3.35 TB/s; FP16/BF16 tensor "
                                 "989 TFLOPS dense", hardware=H100_SXM_NODE),
    "rtx-3090": SpecSheet("NVIDIA GeForce RTX 3090", 936.0, 71.0,
                          source="NVIDIA Ampere GA102 whitepaper: GDDR6X 936 GB/s; FP16 tensor with "
                                 "FP32 accumulate 71 TFLOPS dense", hardware=RTX_3090_NODE),
}


def spec_sheet_profile(key: str, dtype: str = "fp16") -> LatencyProfile:
    """A `kind="spec-sheet"` profile: roofline from data-sheet figures, NOT measured. fp8 weights
    halve the bytes read; their FLOPs are priced at the fp16 peak (conservative)."""
    sheet = SPEC_SHEETS[key]
    if sheet.hardware is not None and dtype not in sheet.hardware.dtypes:
        raise InvalidInputError(f"{sheet.name} does not run {dtype} "
                                f"(it runs {', '.join(sheet.hardware.dtypes)})")
    ms_per_mb = 1e6 / (sheet.memory_bandwidth_gb_s * 1e9) * 1e3
    coefficients = {t: 0.0 for t in FIT_TERMS}
    coefficients.update(
        call=sheet.call_overhead_us / 1e3,
        layer=sheet.kernel_overhead_us * sheet.kernels_per_layer / 1e3,
        gemm_mb=ms_per_mb, kv_mb=ms_per_mb, head_mb=ms_per_mb,
    )
    coefficients[RIDGE] = sheet.peak_tflops * 1e12 / (sheet.memory_bandwidth_gb_s * 1e9)
    coefficients[TILE] = 1.0  # no skinny-GEMM penalty assumed (tile terms are 0)
    notes = (
        f"SPEC-SHEET ROOFLINE, NOT MEASURED. {sheet.source}. Each operator costs "
        "max(bytes / bandwidth, FLOPs / peak) at 100% of the data-sheet figures, plus an assumed "
        f"{sheet.kernel_overhead_us:g} us per kernel x {sheet.kernels_per_layer} kernels per layer and "
        f"{sheet.call_overhead_us:g} us per forward call (CUDA-graph replay; eager PyTorch adds "
        "Python launch overhead not modelled here). Real latencies are higher; use it to rank "
        "shapes, and measure with `draftnas profile --device cuda` for absolute figures."
    )
    return LatencyProfile(
        schema_version=SCHEMA_VERSION, kind="spec-sheet", device="cuda", device_name=sheet.name,
        dtype=dtype, versions={}, measurements=(), coefficients=coefficients, heldout_mape=None,
        mode="cuda-graph", notes=notes, command=f"draftnas.latency.spec_sheet_profile({key!r})", spec={
            "memory_bandwidth_gb_s": sheet.memory_bandwidth_gb_s, "peak_tflops": sheet.peak_tflops,
            "kernel_overhead_us": sheet.kernel_overhead_us,
            "kernels_per_layer": float(sheet.kernels_per_layer),
            "call_overhead_us": sheet.call_overhead_us},
        hardware=sheet.hardware,
    )


# --------------------------------------------------------------------------- measured targets


class TargetTimedModel:
    """A latency model that answers a timed target's shape (`TargetTiming`) with its extrapolated
    full-depth latencies: exact at the timed (batch, new tokens) at the timed context; another
    batch, count or context scales the model's prediction by measured / predicted at the nearest
    timed point. Every other shape: the model itself. `predict_ms` has `LatencyModel`'s signature.
    """

    def __init__(self, model: Any, timings: Iterable[TargetTiming]) -> None:
        self.model, self.timings = model, tuple(timings)

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float:
        rows = head_vocab_size or arch.vocab_size
        timing = next((t for t in self.timings if t.matches(arch, rows)), None)
        if timing is not None:
            key = f"{batch_size}x{new_tokens}"
            if key in timing.ms and context_tokens == timing.context_tokens:
                return timing.ms[key]
            b = min(timing.batch_sizes, key=lambda x: abs(x - batch_size))
            n = min(timing.new_tokens, key=lambda x: abs(x - new_tokens))
            said = self.model.predict_ms(arch, batch_size=b, new_tokens=n,
                                         context_tokens=timing.context_tokens,
                                         head_vocab_size=head_vocab_size)
            ratio = timing.ms[f"{b}x{n}"] / said if said > 0 else 1.0
            return ratio * self.model.predict_ms(arch, batch_size=batch_size, new_tokens=new_tokens,
                                                 context_tokens=context_tokens,
                                                 head_vocab_size=head_vocab_size)
        return float(self.model.predict_ms(arch, batch_size=batch_size, new_tokens=new_tokens,
                                           context_tokens=context_tokens, head_vocab_size=head_vocab_size))


# --------------------------------------------------------------------------- host calibration


@dataclass(frozen=True)
class HostCalibration(Record):
    """Steps of one target shape timed on the machine a search runs on (batch 1, one context).

    `target_ms[n]`: the whole target reading n new tokens (n = 1 decode, n = gamma + 1 verify);
    `prefix_ms[k]`: its first k layers (embedding, k layers, final norm, LM head) decoding one
    token, for a few small k: drafter-sized stacks of the same kernels.
    """

    target: str
    device_name: str
    threads: int
    context_tokens: int
    target_ms: dict[int, float]
    prefix_ms: dict[int, float]
    mode: str = "eager"
    wall_s: float = 0.0
    # per-call work outside the forward, from real decoding runs: transformers' generate per
    # token (the target alone), draftnas's loop per drafted token and per verify step
    generate_overhead_ms: float = 0.0
    draft_overhead_ms: float = 0.0
    verify_overhead_ms: float = 0.0
    prefill_ms: dict[int, float] = field(default_factory=dict)  # prompt tokens -> the target's prefill
    # head rows -> decode time the target's full depth saves with that reduced head (measured)
    head_saving_ms: dict[int, float] = field(default_factory=dict)
    # head rows -> the same saving for its first layer alone (a 1-layer drafter's stack)
    head_saving_prefix_ms: dict[int, float] = field(default_factory=dict)


class CalibratedModel:
    """A latency model corrected by what this machine measured (`HostCalibration`).

    - The target itself at batch 1 and the calibrated context: the measured time of that many
      new tokens (interpolated between measured counts, exact at them).
    - Anything else: the model's prediction times measured / predicted for the target's own
      stack at the same depth, from a straight line through the measured prefixes and the full
      target (depth is what the correction follows: per-layer and per-call costs are what
      differ most between hosts). Other batch sizes and contexts scale the same way.
    - A reduced draft head at one new token (batch 1): the full-head prediction so corrected,
      less the time the smaller head saved when measured (linear in the row count between
      measured sizes): under the target's full depth (`head_saving_ms`) and under its first
      layer (`head_saving_prefix_ms`), linear in depth between the two. The profile's head
      term came from another engine's kernels; on the AMD EPYC host the static engine's head
      product over 262,144 rows runs 1.6x faster than F.linear's. And the saving depends on
      depth: SmolLM2-135M's 4,096-row head saved 2.7 ms under 30 layers but 4.2 ms under one,
      where the small stack's weights partly stay in cache between steps.
    - Plus the measured work outside the forward: one new token of the target is plain
      decoding (`generate_overhead_ms`), more are a verify step of the loop
      (`verify_overhead_ms`), one new token of anything else is a draft step
      (`draft_overhead_ms`).

    `predict_ms` has `LatencyModel`'s signature, so the search uses it unchanged.
    """

    def __init__(self, model: Any, calibration: HostCalibration, target: Architecture) -> None:
        if not calibration.target_ms or not calibration.prefix_ms:
            raise ProfileError("a host calibration needs target and prefix timings")
        self.model, self.calibration, self.target = model, calibration, target
        ctx = calibration.context_tokens
        points = [(k, ms, model.predict_ms(target.with_shape(num_hidden_layers=k), context_tokens=ctx))
                  for k, ms in sorted(calibration.prefix_ms.items())]
        if 1 in calibration.target_ms:
            points.append((target.num_hidden_layers, calibration.target_ms[1],
                           model.predict_ms(target, context_tokens=ctx)))
        ks = np.array([p[0] for p in points], dtype=float)
        measured = np.array([p[1] for p in points])
        predicted = np.array([p[2] for p in points])
        # ratio(k) = (a + b k) / (a' + b' k): lines through measured and predicted times by depth
        self._measured_line = np.polyfit(ks, measured, 1) if len(ks) > 1 else np.array([0.0, measured[0]])
        self._predicted_line = np.polyfit(ks, predicted, 1) if len(ks) > 1 else np.array([0.0, predicted[0]])

    def ratio(self, layers: int) -> float:
        """Measured over predicted time of the target's stack cut to `layers` layers."""
        measured = float(np.polyval(self._measured_line, layers))
        predicted = float(np.polyval(self._predicted_line, layers))
        return measured / predicted if predicted > 0 and measured > 0 else 1.0

    def _target_ms(self, new_tokens: int) -> float | None:
        counts, ms = zip(*sorted(self.calibration.target_ms.items()), strict=True)
        if not counts[0] <= new_tokens <= counts[-1]:
            return None
        return float(np.interp(new_tokens, counts, ms))  # exact at measured counts, linear between

    def predict_ms(self, arch: Architecture, *, batch_size: int = 1, new_tokens: int = 1,
                   context_tokens: int = 128, head_vocab_size: int | None = None) -> float:
        same = (arch.with_shape(name="") == self.target.with_shape(name="") and head_vocab_size in
                (None, self.target.vocab_size))
        c = self.calibration
        if same and batch_size == 1 and context_tokens == 0 and new_tokens in c.prefill_ms:
            return c.prefill_ms[new_tokens]
        overhead = (c.generate_overhead_ms if new_tokens == 1 else c.verify_overhead_ms) if same \
            else (c.draft_overhead_ms if new_tokens == 1 else c.verify_overhead_ms)
        if same and batch_size == 1 and context_tokens == c.context_tokens:
            measured = self._target_ms(new_tokens)
            if measured is not None:
                return measured + overhead
        rows = arch.vocab_size if head_vocab_size is None else head_vocab_size
        saving = self.head_saving_ms(rows, arch.num_hidden_layers) if batch_size == 1 and new_tokens == 1 \
            else None
        if saving is not None:
            full = (self.model.predict_ms(arch, context_tokens=context_tokens)
                    * self.ratio(arch.num_hidden_layers))
            return max(full - saving, 0.05 * full) + overhead
        predicted = self.model.predict_ms(arch, batch_size=batch_size, new_tokens=new_tokens,
                                          context_tokens=context_tokens, head_vocab_size=head_vocab_size)
        return predicted * self.ratio(arch.num_hidden_layers) + overhead

    def head_saving_ms(self, rows: int, layers: int | None = None) -> float | None:
        """Decode time a `rows`-row head saves against the full one under `layers` layers (default:
        the target's depth), from the measured sizes (None when none was measured or `rows` is the
        full vocabulary): linear in depth between the first-layer and the full-depth savings."""
        c = self.calibration
        vocab, full = self.target.vocab_size, self.target.num_hidden_layers
        if not c.head_saving_ms or rows >= vocab:
            return None

        def at(measured: dict[int, float]) -> float:
            sizes, saved = zip(*sorted({**measured, vocab: 0.0}.items()), strict=True)
            return float(np.interp(rows, sizes, saved))  # below the smallest size measured: its saving

        deep = at(c.head_saving_ms)
        if not c.head_saving_prefix_ms or layers is None or full <= 1:
            return deep
        return float(np.interp(layers, [1, full], [at(c.head_saving_prefix_ms), deep]))

    def summary(self) -> str:
        """One line: what was measured here against what the profile said."""
        c = self.calibration
        said = self.model.predict_ms(self.target, context_tokens=c.context_tokens)
        verify = max(c.target_ms)
        said_verify = self.model.predict_ms(self.target, new_tokens=verify, context_tokens=c.context_tokens)
        k = min(c.prefix_ms)
        said_k = self.model.predict_ms(self.target.with_shape(num_hidden_layers=k),
                                       context_tokens=c.context_tokens)
        return (f"calibrated on this machine ({c.device_name}, {c.threads} threads, {c.wall_s:.0f} s): "
                f"target decode {c.target_ms.get(1, float('nan')):.1f} ms (profile: {said:.1f}), verify of "
                f"{verify} tokens {c.target_ms[verify]:.1f} ms (profile: {said_verify:.1f}), its first {k} "
                f"layer(s) {c.prefix_ms[k]:.1f} ms (profile: {said_k:.1f}); outside the forward: "
                f"{c.generate_overhead_ms:.1f} ms per generated token, {c.draft_overhead_ms:.1f} per drafted "
                f"token, {c.verify_overhead_ms:.1f} per verify step")
