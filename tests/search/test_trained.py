"""Trained shapes priced at a budget from their training curve, and the budget that beats a bar."""

from __future__ import annotations

import math

import pytest

from draftnas.core.registry import resolve_architecture
from draftnas.core.throughput import expected_tokens_per_step
from draftnas.drafter.training.distill_records import CurvePoint, CurveSet, TrainingCurve
from draftnas.search.records import LatencyReading
from draftnas.search.space import GammaRange, Workload
from draftnas.search.trained import curve_arch, price_trained, tokens_to_beat

WORKLOAD = Workload(context_tokens=128, prompt_tokens=0)
GAMMA = GammaRange(min=1, max=4)


def _curve(a: float = 1.0, b: float = 0.05) -> TrainingCurve:
    pts = tuple(CurvePoint(t, a + b * math.log(t), 0.3) for t in (1_000, 10_000, 100_000))
    return TrainingCurve(label="L2x-h9kv3-i1536-v8192", base="smollm2-135m", layers=(0, 29), head_rows=8192,
                         gamma=4, points=pts, intercept=a, slope=b, fitted_from=1_000, untrained=1.05)


def _latency(arch, head_rows) -> LatencyReading:
    # a synthetic profile: the target 20 ms a decode, a verify of g + 1 tokens 20 + 2g ms, the drafter 1 ms a
    # layer plus 1 ms
    return LatencyReading(profile="synthetic", batch_sizes=(1,), context_tokens=128,
                          draft_ms=(1.0 + arch.num_hidden_layers,), target_ms=(20.0,),
                          verify_ms=(tuple(20.0 + 2 * g for g in range(5)),))


def test_a_trained_shape_is_priced_from_its_curve_by_hand():
    curve = _curve()
    arch = curve_arch(curve, resolve_architecture("smollm2-135m"))
    assert arch.num_hidden_layers == 2 and arch.hidden_size == 576
    (price,) = price_trained(CurveSet(target="smollm2-135m", curves=(curve,)), 100_000, _latency,
                             resolve_architecture, WORKLOAD, GAMMA, bar_tps=None)
    tps = 1.0 + 0.05 * math.log(100_000)
    assert price.tokens_per_step == pytest.approx(tps)
    assert expected_tokens_per_step(price.acceptance_rate, 4) == pytest.approx(tps, rel=1e-6)
    # by hand at the best gamma: tokens per step over (gamma drafts of 3 ms + a verify of gamma + 1)
    best = max(range(1, 5), key=lambda g: expected_tokens_per_step(price.acceptance_rate,
                                                                   g) / (3.0 * g + 20 + 2 * g))
    g = price.best_gamma
    assert g == best
    by_hand = expected_tokens_per_step(price.acceptance_rate, g) / (3.0 * g + 20.0 + 2.0 * g) * 1000
    assert price.tokens_per_s == pytest.approx(by_hand, rel=1e-6)
    assert price.speedup == pytest.approx(by_hand / 50.0, rel=1e-6)
    assert not price.extrapolated and price.measured_to_tokens == 100_000
    (far,) = price_trained(CurveSet(target="smollm2-135m", curves=(curve,)), 10**7, _latency,
                           resolve_architecture, WORKLOAD, GAMMA, bar_tps=None)
    assert far.extrapolated and far.tokens_per_s > price.tokens_per_s


def test_the_budget_to_beat_a_bar_is_where_the_priced_speed_crosses_it():
    curve = _curve()
    arch = curve_arch(curve, resolve_architecture("smollm2-135m"))
    latency = _latency(arch, 8192)
    (at_1e5,) = price_trained(CurveSet(target="t", curves=(curve,)), 100_000, _latency, resolve_architecture,
                              WORKLOAD, GAMMA, bar_tps=None)
    needed = tokens_to_beat(curve, at_1e5.tokens_per_s, latency, WORKLOAD, GAMMA)
    assert needed == pytest.approx(100_000, rel=1e-3)
    assert tokens_to_beat(curve, 1.0, latency, WORKLOAD, GAMMA) == 0.0  # the untrained shape already beats it
    flat = _curve(b=0.0)
    assert tokens_to_beat(flat, 1e6, latency, WORKLOAD, GAMMA) is None  # a bar above what gamma + 1 gives


@pytest.mark.parametrize("target, shapes, budget", [("smollm2-135m", 3, 500_000),
                                                    ("qwen2.5-coder-1.5b", 2, 100_000)])
def test_the_shipped_curves_are_checked_on_their_gain_with_its_command(target, shapes, budget):
    """SmolLM2's curves rise measurably and predict the gain over 1 at their held-out budget within 20%;
    the Qwen cuts' slopes are statistically zero, so no budget is read off them."""
    from draftnas.drafter.training.curve_fit import shipped_curves

    curves = shipped_curves(target)
    assert curves is not None and curves.target == target and len(curves.curves) >= shapes
    for c in curves.curves:
        assert c.check is not None and c.measurable_slope == (target == "smollm2-135m"), c.label
        if c.measurable_slope:
            assert abs(c.check.error) < 0.20, c.label
        else:
            low, high = c.slope_interval()
            assert low < 0 < high, c.label
        assert c.command.startswith("draftnas distill train") and len(c.delta_sha256) == 64
        assert c.host and c.points and all(p.tokens >= c.fitted_from for p in c.points)
        assert c.measured_max() >= budget  # a measured point at the budget the issue asks for


def test_no_curves_ship_for_a_target_never_trained():
    from draftnas.drafter.training.curve_fit import shipped_curves

    assert shipped_curves("gemma-3-270m") is None


def test_a_budget_without_curves_is_one_line_exit_2():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "draftnas", "search", "--target", "gemma-3-270m",
                           "--train-tokens", "1000"], capture_output=True, text=True)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1
    assert "--train-tokens" in lines[0] and "--curves" in lines[0]
    zero = subprocess.run([sys.executable, "-m", "draftnas", "search", "--target", "smollm2-135m",
                           "--train-tokens", "0"], capture_output=True, text=True)
    assert zero.returncode == 2 and "--train-tokens" in zero.stderr and "Traceback" not in zero.stderr


def test_a_curve_whose_slope_interval_spans_zero_gives_no_budget_and_says_so():
    """Readings that wobble around a flat line (the Qwen cuts' kind): no budget is read off the fit, and the
    search's table says "no measurable slope" with the interval instead of a budget."""
    from draftnas.cli.search_render import _tokens

    wobble = (1.03, 1.01, 1.04, 1.02, 1.03)
    pts = tuple(CurvePoint(t, y, 0.03) for t, y in zip((10_000, 20_000, 40_000, 80_000, 160_000), wobble,
                                                       strict=True))
    curve = TrainingCurve(label="L2x-h9kv3-i1536-v8192", base="smollm2-135m", layers=(0, 29), head_rows=8192,
                          gamma=4, points=pts, intercept=1.0, slope=0.001, fitted_from=10_000, untrained=1.0)
    low, high = curve.slope_interval()
    assert low < 0 < high and not curve.measurable_slope
    (price,) = price_trained(CurveSet(target="t", curves=(curve,)), 160_000, _latency, resolve_architecture,
                             WORKLOAD, GAMMA, bar_tps=1e9)
    assert price.tokens_to_beat_bar is None and not price.measurable_slope
    assert _tokens(price).startswith("no measurable slope (") and "per e-fold" in _tokens(price)
    speeds = [price_trained(CurveSet(target="t", curves=(_curve(),)), t, _latency, resolve_architecture,
                            WORKLOAD, GAMMA, bar_tps=None)[0].tokens_per_s for t in (100_000, 10**7)]
    (rising,) = price_trained(CurveSet(target="t", curves=(_curve(),)), 1_000, _latency, resolve_architecture,
                              WORKLOAD, GAMMA, bar_tps=sum(speeds) / 2)  # reached past the last reading
    assert rising.measurable_slope and _tokens(rising).endswith("(extrapolated)")


def _head_curve() -> TrainingCurve:
    pts = tuple(CurvePoint(t, 0.5 + 0.06 * math.log(t), 0.2) for t in (10_000, 30_000, 90_000))
    return TrainingCurve(label="head L2/15/27 V4096 F768", base="smollm2-135m", layers=(2, 15, 27),
                         head_rows=4096, gamma=4, points=pts, intercept=0.5, slope=0.06, fitted_from=10_000,
                         untrained=1.0, family="head", ffn=768)


def test_a_head_is_priced_as_one_target_layer_of_its_weights_with_its_draft_vocabulary():
    from draftnas.drafter.head.shape import HeadShape, TargetKey

    target = resolve_architecture("smollm2-135m")
    arch = curve_arch(_head_curve(), target)
    assert arch.num_hidden_layers == 1 and arch.hidden_size == target.hidden_size
    shape = HeadShape(target=TargetKey("smollm2-135m", 30, 576, 49152), layers=(2, 15, 27), draft_vocab=4096,
                      ffn=768, heads=9, kv_heads=3, head_dim=64, rope_theta=1e5, rms_norm_eps=1e-5,
                      max_positions=2048)
    h, qkv = 576, (9 + 2 * 3) * 64
    layer = h * qkv + (9 * 64) * h + 3 * h * arch.intermediate_size  # the priced layer's weights
    head = shape.parameters() - shape.draft_vocab * h - 4 * h  # the head's, its output rows and norms aside
    assert head <= layer < head + 3 * h * 64  # equal weights, the width rounded up to a multiple of 64
    rows = []

    def read(arch, head_rows):
        rows.append(head_rows)
        return _latency(arch, head_rows)

    (price,) = price_trained(CurveSet(target="smollm2-135m", curves=(_head_curve(),)), 90_000, read,
                             resolve_architecture, WORKLOAD, GAMMA, bar_tps=None)
    assert rows == [4096] and price.family == "head" and price.draft_ms == 2.0  # one layer in the profile
    assert price_trained(CurveSet(target="smollm2-135m", curves=(_head_curve(),)), 90_000, read,
                         resolve_architecture, WORKLOAD, GAMMA, bar_tps=None, heads_run=False) == ()


def test_a_head_that_can_beat_the_bar_gets_a_gpu_plan_to_that_budget():
    import dataclasses

    from draftnas.cli.search_render import _tokens
    from draftnas.search.trained import head_flops_per_token

    curve = _head_curve()
    (price,) = price_trained(CurveSet(target="smollm2-135m", curves=(curve,)), 90_000, _latency,
                             resolve_architecture, WORKLOAD, GAMMA, bar_tps=1e9)
    assert price.tokens_to_beat_bar is None and price.plan == ""  # a bar no budget reaches: no plan
    at = price_trained(CurveSet(target="smollm2-135m", curves=(curve,)), 90_000, _latency,
                       resolve_architecture, WORKLOAD, GAMMA, bar_tps=None)[0].tokens_per_s
    (price,) = price_trained(CurveSet(target="smollm2-135m", curves=(curve,)), 90_000, _latency,
                             resolve_architecture, WORKLOAD, GAMMA, bar_tps=at * 1.05)
    needed = price.tokens_to_beat_bar
    assert needed is not None and needed > 90_000 and "extrapolated" in _tokens(price)
    assert f"--tokens {math.ceil(needed)} " in price.plan
    assert "--draft-vocab 4096 --ffn 768 --unroll 1" in price.plan
    assert "--layers 2,15,27" in price.plan and price.plan.count("--device cuda") == 2
    target = resolve_architecture("smollm2-135m")
    # the head's share grows with its unrolled steps and its rows; the target's share is the same
    assert head_flops_per_token(dataclasses.replace(curve, unroll=3), target) > price.flops_per_token > 0
    wider = head_flops_per_token(dataclasses.replace(curve, head_rows=8192), target)
    assert wider - price.flops_per_token == pytest.approx(6 * 4096 * 576)
    from types import SimpleNamespace

    from rich.console import Console

    from draftnas.cli.search_render import trained_table

    def rendered(engine: str) -> str:
        console = Console(width=400, record=True)
        console.print(trained_table(SimpleNamespace(trained=(price,),  # type: ignore[arg-type]
                                                    info=SimpleNamespace(engine=engine))))
        return console.export_text()

    text = rendered("static")
    hours = needed * price.flops_per_token / 30e12 / 3600
    assert f"GPU plan for {price.label}" in text and f"about {hours:.2g} GPU-hours from FLOPs" in text
    assert "smollm2-135m's hidden states" in text and "a head is priced as one layer" in text
    # in vLLM the head was timed as its eagle3 drafter, and the caption says so
    vllm = rendered("vllm")
    assert "timed as vLLM's eagle3 drafter" in vllm and "priced as one layer" not in vllm
