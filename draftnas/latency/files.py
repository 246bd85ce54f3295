"""Profile files: the schema check, reading and writing, and the shipped profiles (package data).
"""

from __future__ import annotations

import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any

from draftnas.core.errors import ProfileError
from draftnas.core.placement import DTYPE_BYTES
from draftnas.latency.hardware import CPU_ROOFLINE, cpu_roofline_profile
from draftnas.latency.model import REQUIRED_COEFFICIENTS
from draftnas.latency.records import KINDS, SCHEMA_VERSION, LatencyProfile

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
    """Shipped profiles: $DRAFTNAS_PROFILES, else the package's data/profiles/ (package data, so an
    installed draftnas finds them as an editable checkout does)."""
    if env := os.environ.get("DRAFTNAS_PROFILES"):
        return Path(env)
    return Path(str(resources.files("draftnas").joinpath("data/profiles")))


#: Names accepted by `default_profile`, mapped to the shipped file.
SHIPPED_PROFILES: dict[str, str] = {
    "cpu-intel-xeon": "cpu-2core-fp32.json",  # Intel Xeon (model not recorded), 2 threads, eager forward
    "cpu-amd-static": "cpu-amd-2core-fp32-static.json",  # AMD EPYC (Zen 2), 2 threads, draftnas's decoder
    # AMD EPYC (family 26, AVX-512 with bf16), 2 threads, draftnas's decoder in bf16
    "cpu-amd-zen5-bf16-static": "cpu-amd-zen5-2core-bf16-static.json",
    "h100-bf16-eager": "h100-bf16-eager.json",  # an H100 80GB HBM3, measured, eager
    "h100-bf16-cuda-graph": "h100-bf16-cuda-graph.json",  # the same H100, measured as CUDA graphs
    "a100-80gb": "a100-80gb-spec.json",
    "h100-sxm": "h100-sxm-spec.json",
    "rtx-3090": "rtx-3090-spec.json",
}


def default_profile(name: str, dtype: str = "fp32") -> LatencyProfile:
    """The shipped profile `name` (a key of `SHIPPED_PROFILES`), or "cpu-roofline": this CPU's
    roofline prior in `dtype` (not measured; `draftnas.latency.hardware.cpu_roofline_profile`)."""
    key = name.lower()
    if key == CPU_ROOFLINE:
        return cpu_roofline_profile(dtype)
    if key not in SHIPPED_PROFILES:
        raise ProfileError(
            f"no shipped latency profile {name!r}; shipped: {', '.join(SHIPPED_PROFILES)}, or {CPU_ROOFLINE} "
            "(or measure one with `draftnas profile`)")
    return load_profile(profiles_dir() / SHIPPED_PROFILES[key])
