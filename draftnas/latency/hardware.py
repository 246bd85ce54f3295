"""GPU data sheets and the spec-sheet roofline profiles derived from them, and the roofline prior
of a CPU no shipped profile was measured on (all NOT measured).
"""

from __future__ import annotations

import dataclasses

from draftnas.core.errors import InvalidInputError
from draftnas.core.machine import cpu_count, cpu_identity, cpu_mhz
from draftnas.core.placement import Hardware, Interconnect
from draftnas.latency.model import FIT_TERMS, RIDGE, TILE
from draftnas.latency.records import SCHEMA_VERSION, LatencyProfile, SpecSheet

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
    return _roofline(sheet, key, dtype)


def _roofline(sheet: SpecSheet, key: str, dtype: str) -> LatencyProfile:
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
        mode="cuda-graph", notes=notes, command=f"draftnas.latency.hardware.spec_sheet_profile({key!r})",
        spec={
            "memory_bandwidth_gb_s": sheet.memory_bandwidth_gb_s, "peak_tflops": sheet.peak_tflops,
            "kernel_overhead_us": sheet.kernel_overhead_us,
            "kernels_per_layer": float(sheet.kernels_per_layer),
            "call_overhead_us": sheet.call_overhead_us},
        hardware=sheet.hardware,
    )


#: The CPU roofline prior's assumptions (no data sheet is read for a CPU): streaming bandwidth per
#: core, two FMA units per core, and per-operator and per-call overheads of an eager framework.
CPU_GB_S_PER_CORE = 10.0
CPU_KERNEL_US, CPU_CALL_US = 10.0, 200.0
CPU_ROOFLINE = "cpu-roofline"


def cpu_roofline_profile(dtype: str = "fp32", mode: str = "static") -> LatencyProfile:
    """This CPU's roofline prior, NOT MEASURED: its cores x clock x SIMD width (AVX-512 or AVX2, two
    FMA units; native bf16 doubles it) as the peak, an assumed 10 GB/s per core as the bandwidth.
    A search on a CPU no shipped profile was measured on starts from it and the calibration corrects
    it with this host's own timings."""
    here, cores = cpu_identity(), cpu_count()
    lanes = 16 if "avx512f" in (here.isa or ()) else 8
    native_bf16 = bool({"avx512_bf16", "amx_bf16"} & set(here.isa or ()))
    ghz = (cpu_mhz() or 2500.0) / 1e3
    tflops = cores * ghz * lanes * 2 * 2 * (2 if dtype == "bf16" and native_bf16 else 1) / 1e3
    sheet = SpecSheet(f"roofline prior for {here.label()}, {cores} cores", CPU_GB_S_PER_CORE * cores, tflops,
                      kernel_overhead_us=CPU_KERNEL_US, call_overhead_us=CPU_CALL_US,
                      source=f"ASSUMED {CPU_GB_S_PER_CORE:g} GB/s per core; peak {tflops * 1e3:.0f} GFLOP/s "
                             "from "
                             f"{cores} cores x {ghz:.2f} GHz x {lanes} fp32 lanes x 2 FMA units")
    profile = _roofline(sheet, CPU_ROOFLINE, dtype)
    notes = (f"ROOFLINE PRIOR, NOT MEASURED: no shipped profile was measured on this CPU ({here.label()}). "
             f"{sheet.source}. The calibration corrects it with this host's timings; `draftnas profile "
             "--device cpu --mode static` measures this host.")
    return dataclasses.replace(profile, device="cpu", mode=mode, notes=notes, hardware=None, cpu=here,
                               threads=cores)
