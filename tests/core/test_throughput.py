from __future__ import annotations

import math

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.core.throughput import (
    RequestTerms,
    acceptance_rate_from_tokens_per_step,
    best_gamma,
    break_even_acceptance,
    expected_tokens_from_distribution,
    expected_tokens_per_step,
    median_request,
    predict_throughput,
    verify_at,
)


def test_expected_tokens_hand_computed():
    # (1 - 0.8^5) / (1 - 0.8) = (1 - 0.32768) / 0.2
    assert expected_tokens_per_step(0.8, 4) == pytest.approx(3.3616)
    assert expected_tokens_per_step(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_step(0.0, 5) == 1.0


def test_expected_tokens_edges():
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.999999999999, 4) == pytest.approx(5.0)
    assert expected_tokens_per_step(0.7, 0) == 1.0


@pytest.mark.parametrize("alpha,gamma", [(-0.1, 2), (1.1, 2), (0.5, -1)])
def test_expected_tokens_rejects_bad_input(alpha, gamma):
    with pytest.raises(InvalidInputError):
        expected_tokens_per_step(alpha, gamma)


def test_distribution_matches_iid_closed_form():
    alpha, gamma = 0.6, 3
    # P(k accepted) = alpha^k (1 - alpha) for k < gamma, alpha^gamma for k = gamma
    probs = [alpha**k * (1 - alpha) for k in range(gamma)] + [alpha**gamma]
    assert expected_tokens_from_distribution(probs) == pytest.approx(
        expected_tokens_per_step(alpha, gamma)
    )
    with pytest.raises(InvalidInputError):
        expected_tokens_from_distribution([0.5, 0.4])


def test_predict_throughput_issue_example():
    est = predict_throughput(gamma=4, draft_ms=2, target_ms=20, verify_ms=22, acceptance_rate=0.8)
    assert est.tokens_per_step == pytest.approx(3.3616)
    assert est.step_ms == 30
    assert est.tokens_per_s == pytest.approx(3.3616 / 0.030)
    assert est.baseline_tokens_per_s == pytest.approx(50.0)
    assert est.speedup == pytest.approx(3.3616 / 0.030 / 50.0)


def test_batch_scales_throughput_and_baseline():
    e1 = predict_throughput(gamma=2, draft_ms=1, target_ms=10, acceptance_rate=0.5)
    e8 = predict_throughput(gamma=2, draft_ms=1, target_ms=10, acceptance_rate=0.5, batch_size=8)
    assert e8.tokens_per_s == pytest.approx(8 * e1.tokens_per_s)
    assert e8.speedup == pytest.approx(e1.speedup)


def test_gamma_zero_is_plain_decoding():
    est = predict_throughput(gamma=0, draft_ms=5, target_ms=10, verify_ms=99, acceptance_rate=0.9)
    assert est.speedup == pytest.approx(1.0)


def test_best_gamma_prefers_no_speculation_for_slow_drafter():
    assert best_gamma(acceptance_rate=0.3, draft_ms=9, target_ms=10).gamma == 0
    good = best_gamma(acceptance_rate=0.9, draft_ms=0.5, target_ms=10)
    assert good.gamma == 8 and good.speedup > 4
    # hand check: alpha 0.8, draft 2, target 20, verify 22 -> gamma 6 (116.2 tok/s) beats 4 and 8
    assert best_gamma(acceptance_rate=0.8, draft_ms=2, target_ms=20, verify_ms=22).gamma == 6


def test_best_gamma_with_verify_function():
    est = best_gamma(acceptance_rate=0.8, draft_ms=2, target_ms=20, verify_ms=lambda g: 20 + 5 * g)
    assert est.verify_ms == 20 + 5 * est.gamma


def test_break_even_matches_field_notes():
    # FIELD-NOTES: 4-layer drafter 7.9 ms, target 34 ms -> break-even alpha ~0.23 at gamma 1
    alpha = break_even_acceptance(1, 7.9, 34.0)
    assert math.isclose(predict_throughput(
        gamma=1, draft_ms=7.9, target_ms=34.0, acceptance_rate=alpha).speedup, 1.0, rel_tol=1e-6)
    assert break_even_acceptance(1, 40.0, 34.0) is None  # a drafter slower than the target never pays


def test_inverse_acceptance():
    assert acceptance_rate_from_tokens_per_step(3.3616, 4) == pytest.approx(0.8, abs=1e-9)


def test_the_median_request_prices_each_prompts_walk_then_its_prefill():
    terms = RequestTerms(draft_ms=2.0, target_ms=20.0, verify_ms=(20.0, 21.0, 22.0, 23.0, 24.0))
    # three prompts at gamma 4: 2, 3 and 4 tokens a step; the last drafts 3.5 a step (a stop), its verify
    # halfway between 3 and 4 drafts
    tps, speedup = median_request(terms, 4, (2.0, 4.0, 3.0), (4.0, 3.5, 4.0))
    assert tps == pytest.approx(1000 * 3.0 / (4 * 2.0 + 24.0))  # the median prompt: 3 tokens in 32 ms
    assert speedup == pytest.approx(tps / 50.0)
    assert verify_at(terms.verify_ms, 3.5) == pytest.approx(23.5)
    # a prefill before each request's 64 tokens, the drafter's and the target's alike
    prefilled = RequestTerms(draft_ms=2.0, target_ms=20.0, verify_ms=terms.verify_ms, spec_prefill_ms=100.0,
                             target_prefill_ms=80.0, new_tokens=64)
    tps2, speedup2 = median_request(prefilled, 4, (2.0, 4.0, 3.0), (4.0, 3.5, 4.0))
    assert tps2 == pytest.approx(64 / (0.1 + 64 / tps))
    assert speedup2 == pytest.approx(tps2 / (64 / (0.08 + 64 / 50.0)))
    with pytest.raises(InvalidInputError, match="gamma 5 has no verify latency"):
        median_request(terms, 5, (2.0,), (5.0,))
    with pytest.raises(InvalidInputError, match="each prompt's tokens and drafts"):
        median_request(terms, 4, (), ())


def test_a_batch_in_lockstep_keeps_the_share_a_simulation_of_it_measures():
    import numpy as np

    from draftnas.core.lockstep import lockstep_share

    alpha, gamma, n = 0.8, 4, 32
    rng = np.random.default_rng(0)

    def steps() -> int:
        have = s = 0
        while have < n:
            k = 0
            while k < gamma and rng.random() < alpha:
                k += 1
            have, s = have + k + 1, s + 1
        return s

    draws = np.array([[steps() for _ in range(8)] for _ in range(3000)])
    for batch in (2, 4, 8):
        simulated = draws[:, 0].mean() / draws[:, :batch].max(axis=1).mean()
        assert lockstep_share(alpha, gamma, n, batch) == pytest.approx(simulated, rel=0.02)
    shares = [lockstep_share(alpha, gamma, n, b) for b in (1, 2, 4, 8, 64)]
    assert shares[0] == 1.0 and all(a > b for a, b in zip(shares, shares[1:], strict=False))
    assert lockstep_share(1.0, gamma, n, 8) == lockstep_share(0.0, gamma, n, 8) == 1.0  # every step alike
    with pytest.raises(InvalidInputError, match="lockstep needs"):
        lockstep_share(0.5, gamma, 0, 8)


def test_lockstep_scales_the_speculative_tokens_not_plain_decoding():
    from draftnas.core.lockstep import lockstep_share

    step = {"gamma": 4, "draft_ms": 5, "target_ms": 50, "verify_ms": 60, "acceptance_rate": 0.8,
            "batch_size": 4}
    free = predict_throughput(**step)
    held = predict_throughput(**step, lockstep_tokens=32)
    share = lockstep_share(0.8, 4, 32, 4)
    assert held.lockstep == pytest.approx(share) and held.tokens_per_step == free.tokens_per_step
    assert held.tokens_per_s == pytest.approx(free.tokens_per_s * share)
    assert held.speedup == pytest.approx(free.speedup * share)
    assert held.baseline_tokens_per_s == free.baseline_tokens_per_s
