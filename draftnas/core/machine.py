"""The machine a figure was taken on, and the one wall-clock timer for whole calls.

Every figure draftnas prints names its host: CPU model, cores, torch threads and load
average (`machine_info`). Profiles, calibration, bench terms and e2e all read them here.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftnas.core.provenance import package_versions
from draftnas.core.records import MachineInfo


def load_average() -> str:
    """The 1, 5 and 15-minute load averages, or "unknown"."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def cpu_model_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_count() -> int:
    """Cores this process may run on (its affinity), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def torch_threads() -> int:
    """The threads torch computes with in this process (the cores this process may use when torch is
    not loaded yet: this module stays importable without it)."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else cpu_count()


def host_fields() -> dict[str, Any]:
    """The host a benchmark's figures came from: CPU model, torch threads, load average now."""
    return {"host": cpu_model_name(), "threads": torch_threads(), "load_average": load_average()}


def print_figures(result: dict[str, Any], out: Path | None = None) -> None:
    """A benchmark's figures as JSON on stdout, and into `out` when given."""
    import json

    text = json.dumps(result, indent=1)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


def machine_info() -> MachineInfo:
    return MachineInfo(cpu_model=cpu_model_name(), logical_cores=os.cpu_count() or 1,
                       torch_threads=torch_threads(), platform=platform.platform(),
                       load_average_before=load_average(), versions=package_versions())


def median_ms(fn: Callable[[], Any], repeats: int, warmup: int = 1,
              sync: Callable[[], Any] | None = None) -> float:
    """Median wall ms of `fn()` over `repeats` calls after `warmup` calls; `sync` (e.g.
    `torch.cuda.synchronize`) runs before each clock read so queued device work is counted."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        t0 = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)
