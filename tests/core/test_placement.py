"""Placement, tensor parallelism and memory-capped batches for targets bigger than one GPU."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.core.placement import (
    Interconnect,
    ShardedLatency,
    kv_bytes_per_sequence,
    place,
    shard,
    valid_degrees,
    weight_bytes,
)
from draftnas.core.registry import get_architecture
from draftnas.core.throughput import break_even_acceptance
from draftnas.latency.hardware import H100_SXM_NODE, spec_sheet_profile
from draftnas.latency.model import LatencyModel
from draftnas.search.scoring import (
    assumed_acceptance,
    batch_economics,
    break_even_alpha,
    predict_workload,
    read_latency,
    target_latency,
)
from draftnas.search.space import GammaRange, Workload

L65 = get_architecture("llama-65b")
L7 = get_architecture("llama-7b")
H100 = LatencyModel.from_profile(spec_sheet_profile("h100-sxm"))
WORKLOAD = Workload(batch_sizes=(1, 8, 32), batch_weights=(0.6, 0.3, 0.1), context_tokens=512)


def _place(**kw):
    return place(L65, H100_SXM_NODE, "fp16", batch_sizes=WORKLOAD.batch_sizes,
                 context_tokens=WORKLOAD.context_tokens, max_gamma=8, **kw)


def test_llama_65b_fp16_needs_more_than_one_h100_and_is_refused_on_one():
    assert weight_bytes(L65, "fp16") / 1e9 == pytest.approx(130.6, abs=0.1)
    default = _place()
    assert default.gpus >= 2 and default.chosen == "default"
    assert default.max_batch >= 32  # the default holds the workload's largest batch
    with pytest.raises(InvalidInputError) as err:
        _place(gpus=1)
    msg = str(err.value)
    assert "does not fit on 1 x NVIDIA H100" in msg and "130.6 GB weights" in msg
    assert "72.0 GB is usable" in msg
    assert "--gpus 2" in msg


def test_kv_cache_and_weights_shard_over_gpus():
    assert weight_bytes(L65, "fp16", 4) == math.ceil(weight_bytes(L65, "fp16") / 4) or \
        abs(weight_bytes(L65, "fp16", 4) * 4 - weight_bytes(L65, "fp16")) <= 4
    one = kv_bytes_per_sequence(L65, "fp16", 521)
    assert one == 2 * 80 * 64 * 128 * 2 * 521
    assert kv_bytes_per_sequence(L65, "fp16", 521, 4) == one // 4
    l70 = get_architecture("llama-2-70b")  # 8 KV heads: replicated beyond 8 GPUs, never below one per GPU
    assert kv_bytes_per_sequence(l70, "fp16", 100, 8) == kv_bytes_per_sequence(l70, "fp16", 100, 1) // 8


def test_bad_degrees_dtypes_and_margins_are_refused_in_one_line():
    assert valid_degrees(L65, 8) == (1, 2, 4, 8)
    with pytest.raises(InvalidInputError, match="does not shard llama-65b evenly"):
        _place(gpus=3)
    with pytest.raises(InvalidInputError, match="must be in 1..8"):
        _place(gpus=16)
    with pytest.raises(InvalidInputError, match="does not run fp8"):
        place(L65, spec_sheet_profile("a100-80gb").hardware, "fp8", batch_sizes=(1,), context_tokens=512,
              max_gamma=4)
    with pytest.raises(InvalidInputError, match="memory_margin"):
        _place(margin=-0.1)
    with pytest.raises(InvalidInputError, match="draft_tp must be one of 1, same"):
        _place(draft_tp="2")


def test_one_gpu_reproduces_the_single_gpu_model_exactly():
    sharded = ShardedLatency(H100, 1, H100_SXM_NODE.interconnect, "fp16")
    for arch in (L65, L7, L7.with_shape(num_hidden_layers=2)):
        for b, n, head in ((1, 1, None), (8, 5, None), (32, 9, 4096)):
            assert sharded.predict_ms(arch, batch_size=b, new_tokens=n, context_tokens=512,
                                      head_vocab_size=head) == \
                H100.predict_ms(arch, batch_size=b, new_tokens=n, context_tokens=512, head_vocab_size=head)


def test_tensor_parallel_latency_is_a_shard_plus_all_reduces():
    link = H100_SXM_NODE.interconnect
    assert link is not None
    tp = ShardedLatency(H100, 4, link, "fp16")
    b, n = 8, 5
    compute = H100.predict_ms(shard(L65, 4), batch_size=b, new_tokens=n, context_tokens=512,
                              head_vocab_size=L65.vocab_size // 4)
    comm = ((2 * L65.num_hidden_layers + 1) * link.allreduce_ms(b * n * L65.hidden_size * 2, 4)
            + link.allgather_ms(b * n * L65.vocab_size * 2, 4))
    assert tp.predict_ms(L65, batch_size=b, new_tokens=n, context_tokens=512) == pytest.approx(compute + comm)
    # weight streaming dominates a 65B decode step: 4 GPUs are faster than 2, which are faster than 1
    one, two = (ShardedLatency(H100, g, link, "fp16").predict_ms(L65, context_tokens=512) for g in (1, 2))
    assert one > two > tp.predict_ms(L65, context_tokens=512)


def test_all_reduce_time_matches_published_nccl_tests_figures():
    # nccl-tests all_reduce_perf, 2 x H100 PCIe over NVLink (github.com/NVIDIA/nccl/issues/1161): 1 GiB in
    # 9306.7 us at a bus bandwidth of 115.37 GB/s
    pcie_pair = Interconnect(name="H100 PCIe NVLink bridge", bus_bandwidth_gb_s=115.37, latency_us=0.0)
    assert pcie_pair.allreduce_ms(1073741824, 2) == pytest.approx(9.3067, rel=0.005)
    # NCCL maintainer (github.com/NVIDIA/nccl-tests/issues/212): 8 x H100 SXM, busbw ~480 GB/s is
    # algbw ~275 GB/s
    nvls = Interconnect(name="NVLS", bus_bandwidth_gb_s=480.0, latency_us=0.0)
    size = 8 * 2 ** 30
    assert size / (nvls.allreduce_ms(size, 8) / 1e3) / 1e9 == pytest.approx(275, rel=0.01)
    assert H100_SXM_NODE.interconnect is not None and H100_SXM_NODE.interconnect.bus_bandwidth_gb_s <= 480


def test_the_drafter_shrinks_the_feasible_batch_and_speculation_runs_at_it():
    p = _place(gpus=2)  # 2 GPUs: 65 GB of weights each, room for a few sequences only
    drafter = L7.with_shape(num_hidden_layers=5)
    assert 1 <= p.max_batch_with(drafter, None) < p.max_batch < 32
    sharded = ShardedLatency(H100, 2, p.interconnect, "fp16")
    draft = ShardedLatency(H100, 1, p.interconnect, "fp16")
    target = target_latency(sharded, L65, WORKLOAD, GammaRange(0, 8))
    reading = read_latency(draft, "h100", drafter, WORKLOAD, target, placement=p, target_arch=L65,
                           target_predictor=sharded)
    assert reading.spec_batch(2) == p.max_batch_with(drafter, None) and reading.plain_batch(2) == p.max_batch
    pred = predict_workload(reading, assumed_acceptance(0.7), WORKLOAD, GammaRange(0, 8))
    big = pred.per_batch[2]
    assert big.batch_size == reading.spec_batch(2) or big.gamma == 0
    assert big.baseline_tokens_per_s == pytest.approx(p.max_batch / (reading.target_ms[2] / 1e3))
    with pytest.raises(Exception, match="does not fit beside the target"):
        read_latency(draft, "h100", L65.with_shape(num_hidden_layers=40), WORKLOAD, target, placement=p,
                     target_arch=L65, target_predictor=sharded)


def test_break_even_alpha_matches_the_closed_form_and_the_crossover_is_where_speedup_drops():
    work = Workload(batch_sizes=(1,), batch_weights=(1.0,), context_tokens=512)
    drafter = L7.with_shape(num_hidden_layers=2)
    target = target_latency(H100, L7, work, GammaRange(1, 1))
    reading = read_latency(H100, "h100", drafter, work, target)
    closed = break_even_acceptance(1, reading.draft_ms[0], reading.target_ms[0], reading.verify_ms[0][1])
    assert break_even_alpha(reading, 0, GammaRange(1, 1)) == pytest.approx(closed, abs=1e-6)

    class ComputeBound:  # verify cost grows with the tokens it reads: speculation stops paying at batch 16
        def predict_ms(self, arch, *, batch_size=1, new_tokens=1, context_tokens=128, head_vocab_size=None):
            if arch.num_hidden_layers == L7.num_hidden_layers:
                return 10.0 * max(1.0, batch_size * new_tokens / 16)
            return 0.5

    e = batch_economics(ComputeBound(), ComputeBound(), "toy", drafter, L7, work, GammaRange(0, 4),
                        assumed_acceptance(0.6))
    paying = [b for b, s in zip(e.sweep_batches, e.sweep_speedup, strict=True) if s > 1]
    assert e.crossover_batch is not None and all(b < e.crossover_batch for b in paying)
    assert e.break_even_alpha_batch1 is not None and e.break_even_alpha_batch1 < 0.6


@pytest.mark.parametrize("args,needle", [
    (["--gpus", "1"], "does not fit on 1 x NVIDIA H100-SXM5-80GB"),
    (["--gpus", "3"], "--gpus 3 does not shard llama-65b evenly"),
    (["--profile", "a100-80gb", "--dtype", "fp8"], "NVIDIA A100-SXM4-80GB does not run fp8"),
    (["--memory-margin", "-0.1"], "--memory-margin must be in [0, 1)"),
    (["--draft-tp", "2"], "--draft-tp must be one of 1, same"),
    (["--acceptance-anchor", "0.7"], "--acceptance-anchor needs an acceptance model"),
])
def test_cli_refuses_bad_placements_in_one_line_and_writes_nothing(tmp_path, args, needle):
    out = subprocess.run([sys.executable, "-m", "draftnas", "search", "--target", "llama-65b", "--base-shape",
                          "llama-7b", "--acceptance-prior", "0.7", "--trials", "2", *args,
                          "--run-dir", str(tmp_path)], capture_output=True, text=True)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr
    assert needle in lines[0]
    assert not any(tmp_path.iterdir())  # nothing written
