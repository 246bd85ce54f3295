"""A host's calibration kept between runs: stored once per host and request, reused after a drift check.

A calibration is the slow part of a search's set-up. What it measures belongs to the host (CPU
vendor, family, model and instruction sets), the thread count, the torch version and the shapes it
timed, so it is stored under the cache keyed by all of them, and a later search or bench on the same
host reuses it after re-timing the target's decode and largest verify (`drift`): when both
still read within `DRIFT_TOLERANCE` of the stored figures the stored calibration stands, otherwise
the host has changed (another load, another spell) and it is timed again.

`--calibration FILE` hands a stored calibration in by hand: a file from another host, thread count
or torch version, or one that does not parse, is refused in one line.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import cpu_count, cpu_identity
from draftnas.core.records import CpuIdentity, Record, write_json_file
from draftnas.latency.records import HostCalibration

FORMAT = 2  # 2: a quantized drafter reads a prompt dense where that timed faster (`MatmulChooser`)
DRIFT_TOLERANCE = 0.10  # the re-timed decode and verify may differ this much from the stored ones


@dataclass(frozen=True)
class HostKey(Record):
    """What a calibration's figures belong to besides the shapes: the CPU, threads and torch."""

    cpu: CpuIdentity
    threads: int
    torch: str

    def problems_here(self, here: HostKey) -> list[str]:
        out = []
        if self.cpu != here.cpu:  # a record of this machine: the same identity, recorded the same way
            out.append(f"it was measured on {self.cpu.label()}, this host is {here.cpu.label()}")
        if self.threads != here.threads:
            out.append(f"it was measured with {self.threads} threads, this run uses {here.threads}")
        if self.torch != here.torch:
            out.append(f"it was measured with torch {self.torch}, this is torch {here.torch}")
        return out


@dataclass(frozen=True)
class StoredCalibration(Record):
    """A calibration as stored: the host it belongs to, what was asked (the shapes, counts, dtype
    asked for and mode, as a dict) and the calibration itself."""

    host: HostKey
    request: dict[str, Any]
    calibration: HostCalibration
    format: int = FORMAT


def host_key() -> HostKey:
    """This host now: its CPU, the threads torch runs, torch's version."""
    import torch

    return HostKey(cpu=cpu_identity(), threads=torch.get_num_threads() or cpu_count(),
                   torch=torch.__version__)


def store_path(host: HostKey, request: dict[str, Any]) -> Path:
    """Where the calibration for `request` on `host` is kept (one file each, under the cache)."""
    from draftnas.models.sources import state_dir

    text = json.dumps([host.to_dict(), request, FORMAT], sort_keys=True, default=str)
    return state_dir() / "calibrations" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"


def read_calibration(path: Path, flag: str = "--calibration") -> StoredCalibration:
    """A stored calibration, or one line saying why `path` is not one."""
    try:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a draftnas calibration of format {FORMAT}")
        return StoredCalibration.from_dict(data)
    except FileNotFoundError:
        raise InvalidInputError(f"{flag} {path}: no such file") from None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        fix = ("pass a file a search stored, or drop the flag" if flag.startswith("--")
               else "delete it to calibrate again")
        raise InvalidInputError(f"{flag} {path}: not a readable calibration ({type(exc).__name__}: {exc}); "
                                f"{fix}") from None


def check_here(stored: StoredCalibration, path: Path, flag: str = "--calibration") -> None:
    """Refuse, in one line, a calibration that belongs to another host, thread count or torch."""
    problems = stored.host.problems_here(host_key())
    if problems:
        raise InvalidInputError(f"{flag} {path} does not belong to this host: " + "; ".join(problems)
                                + "; calibrate here instead (drop the flag)")


def write_calibration(path: Path, stored: StoredCalibration) -> None:
    """Written whole, then renamed over `path`."""
    write_json_file(path, stored.to_dict())


def drift(stored: HostCalibration, retimed: dict[int, float]) -> dict[str, float]:
    """Re-timed over stored - 1 for the decode (1 new token) and the largest count re-timed."""
    out = {}
    for n in sorted(retimed):
        if n in stored.target_ms and stored.target_ms[n] > 0:
            out["decode" if n == 1 else f"verify{n}"] = retimed[n] / stored.target_ms[n] - 1.0
    return out


def drifted(changes: dict[str, float], tolerance: float = DRIFT_TOLERANCE) -> bool:
    return not changes or any(abs(v) > tolerance for v in changes.values())
