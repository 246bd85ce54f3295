"""Which latency profile a host starts from: the shipped profile measured on this very CPU kind, else
this CPU's roofline prior (`host_cpu_profile`; never another CPU's profile); whether a calibration can
correct a profile here (`calibrates`); and the line saying when a profile was measured elsewhere
(`host_mismatch`).
"""

from __future__ import annotations

from draftnas.core.engine_kinds import engine_kind
from draftnas.core.machine import cpu_count, cpu_identity
from draftnas.latency.files import SHIPPED_PROFILES, default_profile
from draftnas.latency.hardware import CPU_ROOFLINE
from draftnas.latency.records import LatencyProfile


def host_mismatch(profile: LatencyProfile) -> str | None:
    """One line when `profile` was not measured on this CPU (model or thread count), or is a
    spec sheet; None when it was, or when it is a GPU profile (judged where it is used).

    CPU hosts of one machine kind differ 2x in decode time (an Intel Xeon and an AMD EPYC
    host, both "2-core"), so a shipped profile is a prior, never this machine's figures.
    """
    if profile.kind == "spec-sheet" and profile.device == "cpu":
        return (f"no shipped profile was measured on this CPU: the search starts from its "
                f"{profile.device_name} (NOT MEASURED), which the calibration corrects")
    if profile.kind == "spec-sheet":
        return f"the latency profile is a spec-sheet roofline for {profile.device_name}, not a measurement"
    if profile.device != "cpu":
        return None
    here, cores = cpu_identity(), cpu_count()
    same_cpu = profile.cpu is not None and profile.cpu.same_kernels(here)  # unrecorded: never this CPU
    same_threads = profile.threads in (None, cores)
    if same_cpu and same_threads:
        return None
    measured_on = profile.cpu.label() if profile.cpu is not None else profile.device_name
    return (f"the latency profile was measured on {measured_on}, {profile.threads or '?'} threads; this "
            f"machine is {here.label()} with {cores} cores, so its predictions may be far off here (the "
            "calibration corrects them; or measure this host: draftnas profile --device cpu --mode static "
            "--out my-cpu.json, then --profile my-cpu.json)")


def calibrates(profile: LatencyProfile) -> bool:
    """Whether the calibration corrects `profile`: a measured one, or a CPU's roofline prior."""
    return profile.kind == "measured" or profile.device == "cpu"


def host_cpu_profile(engine: str = "static", dtype: str | None = None) -> str:
    """The shipped CPU profile to start from here: one measured on this CPU (vendor, family, model
    and instruction sets) with this many threads, in the mode that prices `engine` and the `dtype`
    asked for if there is one, else any measured here, else this CPU's roofline prior (never another
    CPU's profile: `draftnas.latency.hardware.cpu_roofline_profile`)."""
    mode = engine_kind(engine).graph_mode("cpu") or "eager"
    cpu = {k: default_profile(k) for k in SHIPPED_PROFILES if k.startswith("cpu")}
    here = [(p.mode != mode, dtype is not None and p.dtype != dtype, k) for k, p in cpu.items()
            if host_mismatch(p) is None]
    return min(here)[2] if here else CPU_ROOFLINE
