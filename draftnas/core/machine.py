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
from draftnas.core.records import CpuIdentity, MachineInfo


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


#: instruction sets that decide which matrix-product kernels a CPU runs (in /proc/cpuinfo's flags)
KERNEL_ISA: tuple[str, ...] = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
#: any of these: the CPU multiplies bf16 natively (else torch emulates it, slower than fp32)
NATIVE_BF16: tuple[str, ...] = ("avx512_bf16", "amx_bf16")


def _cpuinfo_fields() -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo ({} where there is none)."""
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            out[key.strip()] = value.strip()
    except OSError:
        pass
    return out


#: ATEN_CPU_CAPABILITY caps the instruction sets torch's kernels use ("avx2": none of AVX-512's; "default":
#: none of these); draftnas then reads the CPU as having only those (how a smaller host kind is simulated
#: on a larger one, with oneDNN's ONEDNN_MAX_CPU_ISA capped alike)
CAPABILITY_ISA: dict[str, tuple[str, ...]] = {"avx2": ("avx2",), "default": ()}


def cpu_identity() -> CpuIdentity:
    """This CPU's vendor, family, model and kernel-deciding instruction sets (as ATEN_CPU_CAPABILITY caps
    them, `CAPABILITY_ISA`)."""
    info = _cpuinfo_fields()
    flags = set(info.get("flags", "").split())
    capped = CAPABILITY_ISA.get(os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower())
    if capped is not None:
        flags &= set(capped)

    def number(key: str) -> int | None:
        return int(info[key]) if info.get(key, "").isdigit() else None

    return CpuIdentity(vendor=info.get("vendor_id") or None, family=number("cpu family"),
                       model=number("model"), isa=tuple(f for f in KERNEL_ISA if f in flags),
                       name=cpu_model_name())


def cpu_mhz() -> float | None:
    """The clock /proc/cpuinfo states for this CPU (MHz), None where it states none."""
    try:
        return float(_cpuinfo_fields().get("cpu MHz", ""))
    except ValueError:
        return None


def cpu_has_native_bf16(identity: CpuIdentity | None = None) -> bool:
    """Whether the CPU multiplies bf16 natively (AVX512_BF16 or AMX)."""
    return bool(set((identity or cpu_identity()).isa or ()) & set(NATIVE_BF16))


def available_memory_bytes(meminfo: str | Path = "/proc/meminfo") -> int:
    """Memory a new allocation can get without swapping: the kernel's MemAvailable (free pages plus
    the page cache it can drop), else free pages alone, else 4 GiB. Free pages alone undercount
    badly right after large files were written (converted GGUF files fill the page cache)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 4 << 30


def cpu_count() -> int:
    """Cores this process may run on (its affinity), else the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


DEVICES = ("cpu", "cuda")


def require_device(device: str) -> None:
    """Refuse in one line a device this machine does not have (an `OptionError` on `device`, exit 2)."""
    from draftnas.core.options import option_error

    if device not in DEVICES:
        raise option_error("device", f"{device!r} is not known (allowed: {', '.join(DEVICES)})")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise option_error("device", f"cuda asked for, but torch {torch.__version__} sees no CUDA device "
                                         "here; use cpu")


def torch_threads() -> int:
    """The threads torch computes with in this process (the cores this process may use when torch is
    not loaded yet: this module stays importable without it)."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else cpu_count()


def host_fields() -> dict[str, Any]:
    """The host a benchmark's figures came from: CPU model, torch threads, load average now."""
    return {"host": cpu_model_name(), "cpu": cpu_identity().label(), "threads": torch_threads(),
            "load_average": load_average()}


def host_line() -> str:
    """`host_fields` in one line: CPU, threads, load average now."""
    h = host_fields()
    return f"{h['cpu']}, {h['threads']} threads, load {h['load_average']}"


def print_figures(result: dict[str, Any], out: Path | None = None) -> None:
    """A benchmark's figures as JSON on stdout, and into `out` when given."""
    import json

    text = json.dumps(result, indent=1)
    print(text)
    if out is not None:
        out.write_text(text + "\n")


def machine_info() -> MachineInfo:
    return MachineInfo(cpu_model=cpu_model_name(), logical_cores=os.cpu_count() or 1,
                       torch_threads=torch_threads(), cpu=cpu_identity(), platform=platform.platform(),
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
