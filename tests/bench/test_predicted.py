"""A search's predictions written beside the study and read back by a bench, arm by arm."""

from __future__ import annotations

from dataclasses import replace

import pytest

from draftnas.bench.predicted import check_predictions
from draftnas.bench.records import ArmResult, BenchResult
from draftnas.core.errors import InvalidInputError
from draftnas.core.throughput import RequestTerms
from draftnas.search.loop import run_search
from draftnas.search.predictions import (
    ArmPrediction,
    SearchPredictions,
    read_predictions,
    search_predictions,
    write_predictions,
)
from tests.helpers import FakeMeasured, StubLatency, smol_options


def bench(target_tps: float, winner_tps: float, reference_tps: float) -> BenchResult:
    # pooled figures (all tokens over all seconds) 10% below the medians, as when prompts differ
    arms = (ArmResult(name="target", engine="static", tokens_per_s=target_tps,
                      pooled_tokens_per_s=target_tps),
            ArmResult(name="draftnas", engine="static", tokens_per_s=winner_tps, baseline="target",
                      speedup=winner_tps / target_tps, pooled_tokens_per_s=0.9 * winner_tps),
            ArmResult(name="reference", engine="static", tokens_per_s=reference_tps, baseline="target",
                      speedup=reference_tps / target_tps, pooled_tokens_per_s=0.9 * reference_tps))
    return BenchResult(target="t", drafters={"draftnas": "drafters/w", "reference": "ref-0.5b"}, gamma=4,
                       temperature=0.0, max_new_tokens=64, n_prompts=9, device="cpu", dtype="bf16", threads=2,
                       engine="static", arms=arms)


PREDICTED = SearchPredictions(study="s", target="t", dtype="bf16", engine="static", calibration="", arms=(
    ArmPrediction(role="target", name="t", tokens_per_s=8.0),
    ArmPrediction(role="winner", name="w", tokens_per_s=16.0, speedup=2.0, gamma=4),
    ArmPrediction(role="reference", name="ref-0.5b", tokens_per_s=11.0, speedup=1.375, gamma=2),
    ArmPrediction(role="reference", name="ref-0.5b", tokens_per_s=12.0, speedup=1.5, gamma=2, held_out=True),
    ArmPrediction(role="reference", name="another", tokens_per_s=99.0, speedup=9.0, gamma=2)))


def test_each_arm_gets_its_prediction_and_error_and_the_held_out_one_comes_apart():
    checks = check_predictions(bench(10.0, 16.0, 10.0), PREDICTED)
    assert [(c.arm, c.held_out) for c in checks] == [("target", False), ("draftnas", False),
                                                     ("reference", False), ("reference", True)]
    target, winner, ref, held = checks
    assert target.tokens_per_s_error == pytest.approx(-0.2) and target.speedup_error is None
    assert winner.tokens_per_s_error == pytest.approx(0.0)
    assert winner.speedup_error == pytest.approx(2.0 / 1.6 - 1)
    assert ref.tokens_per_s_error == pytest.approx(0.1) and held.tokens_per_s_error == pytest.approx(0.2)
    assert all(c.name != "another" for c in checks)  # only the reference this bench ran
    # beside the pooled figures too: the winner's 16.0 predicted against 14.4 pooled, speedup 2.0 vs 1.44
    assert winner.pooled_tokens_per_s == pytest.approx(14.4)
    assert winner.pooled_tokens_per_s_error == pytest.approx(16.0 / 14.4 - 1)
    assert winner.pooled_speedup == pytest.approx(1.44) and target.pooled_speedup is None
    assert winner.pooled_speedup_error == pytest.approx(2.0 / 1.44 - 1)


def test_a_search_writes_its_predictions_and_they_read_back(tmp_path):
    options = smol_options(tmp_path, n_trials=3)
    result = run_search(options, StubLatency(), FakeMeasured())
    predictions = search_predictions(result, StubLatency(), options)
    assert [a.role for a in predictions.arms][:2] == ["target", "winner"]
    winner = predictions.get("winner")
    assert winner is not None and result.best is not None
    assert winner.tokens_per_s == result.best.throughput.tokens_per_s
    assert predictions.get("target").tokens_per_s == result.best.throughput.baseline_tokens_per_s
    path = write_predictions(tmp_path / "predictions.json", predictions)
    assert read_predictions(path) == predictions
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(InvalidInputError, match="predictions .*bad.json: not a search's predictions"):
        read_predictions(tmp_path / "bad.json")
    with pytest.raises(InvalidInputError, match="no such file"):
        read_predictions(tmp_path / "none.json")


def test_the_median_is_predicted_on_the_benchs_own_prompts_where_it_walked_them():
    # the search priced its median on its own prompts (2.0x); the bench walked three others at gamma 4
    terms = RequestTerms(draft_ms=2.0, target_ms=20.0, verify_ms=(20.0, 21.0, 22.0, 23.0, 24.0),
                         new_tokens=128)
    winner = ArmPrediction(role="winner", name="w", tokens_per_s=90.0, speedup=1.8, gamma=4,
                           median_tokens_per_s=100.0, median_speedup=2.0, request=terms)
    predicted = SearchPredictions(study="s", target="t", dtype="bf16", engine="static", calibration="",
                                  arms=(winner,))
    walked = replace(bench(50.0, 90.0, 50.0), arms=(
        ArmResult(name="target", engine="static", tokens_per_s=50.0),
        ArmResult(name="draftnas", engine="static", tokens_per_s=90.0, baseline="target", speedup=1.8,
                  gamma=4, predicted_prompt_tokens_per_step=(2.0, 4.0, 3.0),
                  predicted_prompt_drafted_per_step=(4.0, 4.0, 4.0))))
    (check,) = check_predictions(walked, predicted)
    # the median prompt: 3 tokens in 4 drafts of 2 ms and a 24 ms verify; the search's own median kept apart
    assert check.predicted_bench_median_tokens_per_s == pytest.approx(1000 * 3.0 / 32.0)
    assert check.predicted_bench_median_speedup == pytest.approx(1000 * 3.0 / 32.0 / 50.0)
    assert check.tokens_per_s_error == pytest.approx(1000 * 3.0 / 32.0 / 90.0 - 1)
    assert check.speedup_error == pytest.approx(1000 * 3.0 / 32.0 / 50.0 / 1.8 - 1)
    assert check.predicted_median_speedup == 2.0
    # without the bench's walks (or the terms) the search's median stands
    unwalked = replace(walked.arms[1], predicted_prompt_tokens_per_step=(),
                       predicted_prompt_drafted_per_step=())
    (plain,) = check_predictions(replace(walked, arms=(walked.arms[0], unwalked)), predicted)
    assert plain.predicted_bench_median_speedup is None
    assert plain.speedup_error == pytest.approx(2.0 / 1.8 - 1)
