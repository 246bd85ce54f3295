"""Records: the frozen dataclasses that cross stage boundaries, and the one shared by all stages.

A record holds primitives, tuples, dicts and other records only, and round-trips
through `to_dict` / `from_dict` (JSON-safe), which is how records are stored in
Optuna trials, profiles and `draftnas.json`. Importing this module imports no torch.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

R = TypeVar("R", bound="Record")
#: a long job's progress callback: progress(done, total)
Progress = Callable[[int, int], None]
#: field metadata of a record field that lives in memory only (a model, a tensor): `to_dict`
#: leaves it out and `from_dict` leaves it at its default
TRANSIENT = {"draftnas_transient": True}


def _encode(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    return value


def _decode(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            return _decode(arg, value)
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp.from_dict(value)
    if origin is tuple:
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        return tuple(_decode(item_tp, v) for v in value)
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp) or (Any, Any)
        # JSON keys are strings: a dict[int, ...] gets its int keys back
        return {(int(k) if key_tp is int else k): _decode(val_tp, v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class Record:
    """Frozen dataclass with JSON round-trip."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not f.metadata.get("draftnas_transient")}

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)
                 if f.init and not f.metadata.get("draftnas_transient")}
        kwargs = {k: _decode(hints[k], v) for k, v in data.items() if k in names}
        return cls(**kwargs)


@dataclass(frozen=True)
class CpuIdentity(Record):
    """What decides a CPU's kernels: vendor, family and model numbers, and the instruction sets that
    matter for matrix products. Hosts that `/proc/cpuinfo` names alike ("AMD EPYC" on Zen 2, Zen 4 and
    Zen 5) differ here. None: not known (a profile measured before draftnas recorded it)."""

    vendor: str | None = None
    family: int | None = None
    model: int | None = None
    isa: tuple[str, ...] | None = None  # of avx2, avx512f, avx512_bf16, amx_tile, amx_bf16; None: unknown
    name: str = ""

    def label(self) -> str:
        parts = [self.name or self.vendor or "unknown CPU"]
        if self.family is not None:
            parts.append(f"family {self.family} model {self.model}")
        if self.isa is not None:
            parts.append("+".join(self.isa) if self.isa else "no AVX2")
        return ", ".join(parts)

    def same_kernels(self, other: CpuIdentity) -> bool:
        """Whether `other` runs the same kernels: same vendor, instruction sets, family and model, each
        recorded on both sides. An identity that does not record them (a profile measured before draftnas
        recorded CPUs) matches no CPU: "AMD EPYC" names Zen 2 to Zen 5 alike."""
        known = (self.vendor, other.vendor, self.family, other.family, self.model, other.model)
        if any(v is None or v == "" for v in known) or self.isa is None or other.isa is None:
            return False
        return ((self.vendor, self.family, self.model, set(self.isa))
                == (other.vendor, other.family, other.model, set(other.isa)))


@dataclass(frozen=True)
class MachineInfo(Record):
    cpu_model: str
    logical_cores: int
    torch_threads: int
    platform: str
    load_average_before: str
    load_average_after: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    cpu: CpuIdentity | None = None


def write_folder_atomically(out: str | Path, write: Callable[[Path], None]) -> Path:
    """`write` fills a temporary folder beside `out`, which is then renamed into place (an existing `out` is
    moved aside first and removed after): a failure leaves nothing half-written. Returns `out`."""
    import shutil
    import tempfile
    import time

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{time.time_ns()}")
            out.rename(old)
        tmp.rename(out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_json_file(path: str | Path, data: Any, indent: int | None = 1) -> Path:
    """`data` as JSON at `path`, written whole to a temporary file beside it and renamed over it (a
    reader never sees half a file; a crash leaves the old one), readable by all like a plain write."""
    import json
    import os
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=indent, default=str)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path
