"""Batched steps timed on the host price batches above 1: a synthetic compute-bound host of known truth."""

from __future__ import annotations

import pytest

from draftnas.core.options import OptionError
from draftnas.core.registry import get_architecture
from draftnas.latency.batch_records import BatchTiming
from draftnas.latency.batched import check_batches, timed_batches
from draftnas.latency.corrected import CalibratedModel
from draftnas.latency.records import HostCalibration, StackCalibration
from draftnas.search.scoring import assumed_acceptance, batch_economics
from draftnas.search.space import GammaRange, Workload

TARGET, BASE = get_architecture("qwen2.5-coder-1.5b"), get_architecture("qwen2.5-coder-0.5b")
GAMMA = 4


class _BatchBlind:
    """A profile that prices a batch as free (memory-bound at every B): 2 ms a layer, 0.5 ms a new token."""

    def predict_ms(self, arch, *, batch_size=1, new_tokens=1, context_tokens=128, head_vocab_size=None):
        return 1.0 + 2.0 * arch.num_hidden_layers + 0.5 * (new_tokens - 1)


def _truth(arch, batch, new_tokens):
    """This synthetic host: a step is bound by reading the weights up to 8 rows, by compute past them."""
    decode = 57.0 if arch.num_hidden_layers == TARGET.num_hidden_layers else 15.0
    return decode * max(1.0, batch * new_tokens / 8)


def _calibration(batches):
    timings = (
        BatchTiming(arch=TARGET, weights="dense", context_tokens=128,
                    ms={f"{b}x{n}": _truth(TARGET, b, n) for b in batches for n in (1, GAMMA + 1)}),
        BatchTiming(arch=BASE, weights="dense", context_tokens=128,
                    ms={f"{b}x1": _truth(BASE, b, 1) for b in batches}),
    ) if batches else ()
    return HostCalibration(
        target=TARGET.name, device_name="here", threads=2, context_tokens=128,
        target_ms={n: _truth(TARGET, 1, n) for n in range(1, GAMMA + 2)}, prefix_ms={1: 5.0, 2: 7.0},
        stacks={BASE.name: StackCalibration(arch=BASE, prefix_ms={1: 3.0, 2: 4.0}, full_ms=15.0)},
        batched=timings)


def test_a_timed_batch_is_priced_at_its_timing_and_a_later_one_from_the_largest_timed():
    model = CalibratedModel(_BatchBlind(), _calibration((2, 4, 8, 16)), TARGET)
    assert model.timed_batches() == (2, 4, 8, 16)
    for b in (2, 4, 8, 16):
        assert model.predict_ms(TARGET, batch_size=b) == pytest.approx(_truth(TARGET, b, 1))
        assert model.predict_ms(TARGET, batch_size=b, new_tokens=GAMMA + 1) == pytest.approx(
            _truth(TARGET, b, GAMMA + 1))
        assert model.predict_ms(BASE, batch_size=b) == pytest.approx(_truth(BASE, b, 1))
    # a drafter cut from the base takes the base's correction at each batch
    cut = BASE.with_shape(num_hidden_layers=12, name="cut")
    ratio = model.predict_ms(cut, batch_size=16) / model.predict_ms(cut)
    assert ratio == pytest.approx(_truth(BASE, 16, 1) / _truth(BASE, 1, 1), rel=0.05)
    # past the largest timed batch: the profile's growth times the correction at B = 16 (here, none)
    assert model.predict_ms(TARGET, batch_size=64) == pytest.approx(_truth(TARGET, 16, 1))
    # batch 1 is the batch-1 calibration, untouched
    assert model.predict_ms(TARGET) == _truth(TARGET, 1, 1)


def test_the_break_even_batch_follows_the_timed_batches_not_the_profile():
    work = Workload(batch_sizes=(1,), batch_weights=(1.0,), context_tokens=128)
    gamma = GammaRange(GAMMA, GAMMA)
    drafter = BASE.with_shape(name="drafter")

    def crossover(batches):
        model = CalibratedModel(_BatchBlind(), _calibration(batches), TARGET)
        return batch_economics(model, model, "here", drafter, TARGET, work, gamma,
                               assumed_acceptance(0.8)).crossover_batch

    # the truth: speculation pays while a verify of 5 tokens is still priced near a decode
    truth_speedups = {}
    for b in (1, 2, 4, 8, 16):
        tokens = (1 - 0.8 ** (GAMMA + 1)) / (1 - 0.8)
        step = GAMMA * _truth(BASE, b, 1) + _truth(TARGET, b, GAMMA + 1)
        truth_speedups[b] = tokens / step * _truth(TARGET, b, 1)
    truth = next(b for b, s in sorted(truth_speedups.items()) if s <= 1.0)
    assert crossover((2, 4, 8, 16)) == truth
    assert crossover(()) is None  # batch-blind: it would say speculation pays at every batch


def test_the_batches_timed_are_powers_of_two_up_to_the_largest_and_bad_ones_are_refused():
    assert timed_batches((1,)) == () and timed_batches((1, 8, 32)) == (2, 4, 8, 16, 32)
    assert timed_batches((12,)) == (2, 4, 8, 12)
    assert check_batches((1, 4, 2)) == (2, 4)
    with pytest.raises(OptionError, match="batch size 0"):
        check_batches((0, 4))


def test_a_batch_whose_caches_do_not_fit_is_refused_in_one_line():
    from draftnas.latency.batched import check_batch_fits

    check_batch_fits(TARGET, "bf16", 16, 1024, available=16 << 30)
    with pytest.raises(OptionError, match=r"of 4096 sequences of 1024 tokens does not fit here.*at most \d+"):
        check_batch_fits(TARGET, "bf16", 4096, 1024, available=16 << 30)


def test_a_step_timed_dearer_than_a_larger_one_is_timed_again():
    from draftnas.latency.batch_records import suspect_points

    # the 1.5B's decode at batch 8 once read 12.3 s in a slow spell, batch 16 0.39 s
    ms = {"2x1": 208.9, "4x1": 235.3, "8x1": 12324.7, "16x1": 386.5, "2x11": 379.7, "8x11": 897.4,
          "16x11": 1676.5}
    assert suspect_points(ms) == ["8x1"]
    assert suspect_points({**ms, "8x1": 316.2}) == []  # what the next process read
    assert suspect_points({"2x1": 100.0, "2x5": 90.0}) == []  # within the tolerance


def test_a_step_still_dearer_than_a_larger_one_prices_nothing():
    """The 1.5B's decode at batch 8 stayed at 9.9 s when timed again in the calibration's process: the
    record keeps it, the pricing takes batch 8's decode from its verify's correction instead."""
    from draftnas.latency.batch_records import factor

    truth = {f"{b}x{n}": _truth(TARGET, b, n) for b in (2, 4, 8, 16) for n in (1, GAMMA + 1)}
    slow = BatchTiming(arch=TARGET, weights="dense", context_tokens=128, ms={**truth, "8x1": 9948.9})

    def single(arch, b, n, ctx):
        return _truth(arch, 1, 1) + 0.0 * b  # a batch-blind price: the factor carries the batch

    assert factor(slow, 8, 1, single) == pytest.approx(factor(slow, 8, GAMMA + 1, single))
    assert factor(slow, 8, 1, single) == pytest.approx(_truth(TARGET, 8, GAMMA + 1) / _truth(TARGET, 1, 1))
    assert factor(slow, 8, 1, single) < 9948.9 / _truth(TARGET, 1, 1) / 10  # not the slow reading's


def test_verifies_are_timed_either_side_of_the_row_count_where_the_kernel_changes():
    from draftnas.latency.batched import timed_counts
    from draftnas.models.records import MAX_WEIGHT_ONCE_ROWS

    assert MAX_WEIGHT_ONCE_ROWS == 16
    assert timed_counts(4, 11) == (1, 4, 5, 11) and timed_counts(2, 11) == (1, 8, 9, 11)
    assert timed_counts(16, 11) == (1, 2, 11) and timed_counts(32, 11) == (1, 11)
    assert timed_counts(4, 3) == (1, 3)  # nothing past the largest verify

    def kinked(batch, new_tokens):  # past the limit the products leave the few-row kernel: a jump
        rows = batch * new_tokens
        return (57.0 if rows <= MAX_WEIGHT_ONCE_ROWS else 150.0) + 2.0 * rows

    def priced(counts):
        timing = BatchTiming(arch=TARGET, weights="dense", context_tokens=128,
                             ms={f"4x{n}": kinked(4, n) for n in counts})
        calibration = HostCalibration(
            target=TARGET.name, device_name="here", threads=2, context_tokens=128,
            target_ms={n: kinked(1, n) for n in range(1, 12)}, prefix_ms={1: 5.0, 2: 7.0}, batched=(timing,))
        return CalibratedModel(_BatchBlind(), calibration, TARGET).predict_ms(TARGET, batch_size=4,
                                                                              new_tokens=GAMMA + 1)

    truth = kinked(4, GAMMA + 1)
    assert priced(timed_counts(4, 11)) == pytest.approx(truth)
    assert priced((1, 11)) < 0.8 * truth  # interpolated over the jump, from 4 rows to 44
