"""A host's calibration kept between runs: reused after a drift check, timed again when the host, its
threads or torch differ or when it drifted, and refused in one line when handed in from elsewhere."""

from __future__ import annotations

import dataclasses
import json

import pytest

import draftnas.latency.calibrate as calibrate
import draftnas.latency.calibration_store as store
from draftnas.core.errors import InvalidInputError
from draftnas.core.records import CpuIdentity
from draftnas.latency.calibrate import CalibrationPlan, calibrate_host, stored_or_calibrated
from draftnas.latency.calibration_store import HostKey, read_calibration, store_path
from tests.latency.test_calibrate import OPTIONS, TARGET

REQUEST = {"target": TARGET.to_dict(), "counts": [3], "dtype": "fp32"}
HERE = HostKey(cpu=CpuIdentity(vendor="GenuineIntel", family=6, model=143, isa=("avx2", "avx512f"),
                               name="Intel Xeon"), threads=1, torch="2.13.0+cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTNAS_STATE", str(tmp_path / "cache"))
    monkeypatch.setattr(store, "host_key", lambda threads=None: HERE)
    monkeypatch.setattr(calibrate, "host_key", lambda threads=None: HERE)
    return tmp_path


class Counting:
    """The calibration to run when nothing stored holds: the real one, counted."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return calibrate_host(OPTIONS, TARGET, CalibrationPlan((3,), overheads=False))


def _retimed(monkeypatch, factor: float) -> None:
    """The drift check's re-timing reads the stored figures times `factor`."""
    def fake(options, target, plan, progress=None):
        stored = read_calibration(next((store_path(HERE, REQUEST).parent).glob("*.json")))
        ms = {n: v * factor for n, v in stored.calibration.target_ms.items()}
        return dataclasses.replace(stored.calibration, target_ms=ms)
    monkeypatch.setattr(calibrate, "calibrate_host", fake)


def test_a_second_run_reuses_the_stored_calibration_after_a_drift_check(cache, monkeypatch):
    run = Counting()
    first, where = stored_or_calibrated(OPTIONS, TARGET, REQUEST, run)
    assert run.calls == 1 and "stored in" in where and store_path(HERE, REQUEST).is_file()
    _retimed(monkeypatch, 1.04)  # the host reads 4% slower now: within tolerance
    second, where = stored_or_calibrated(OPTIONS, TARGET, REQUEST, run)
    assert run.calls == 1 and second == first
    assert "reused from" in where and "decode +4.0%" in where


def test_a_drifted_host_is_calibrated_again(cache, monkeypatch):
    run = Counting()
    stored_or_calibrated(OPTIONS, TARGET, REQUEST, run)
    _retimed(monkeypatch, 1.30)
    _, where = stored_or_calibrated(OPTIONS, TARGET, REQUEST, run)
    assert run.calls == 2 and "drifted (decode +30.0%" in where


@pytest.mark.parametrize("change", [
    {"cpu": CpuIdentity(vendor="AuthenticAMD", family=25, model=1, isa=("avx2",), name="AMD EPYC")},
    {"torch": "2.14.1+cpu"},
    {"threads": 2},
])
def test_another_cpu_torch_or_thread_count_has_its_own_calibration(cache, monkeypatch, change):
    run = Counting()
    stored_or_calibrated(OPTIONS, TARGET, REQUEST, run)
    other = dataclasses.replace(HERE, **change)
    monkeypatch.setattr(calibrate, "host_key", lambda threads=None: other)
    assert store_path(other, REQUEST) != store_path(HERE, REQUEST)
    stored_or_calibrated(OPTIONS, TARGET, REQUEST, run)
    assert run.calls == 2 and store_path(other, REQUEST).is_file()


def test_a_calibration_from_another_host_is_refused_in_one_line(cache, monkeypatch):
    run = Counting()
    stored_or_calibrated(OPTIONS, TARGET, REQUEST, run)
    path = store_path(HERE, REQUEST)
    amd = dataclasses.replace(HERE, cpu=CpuIdentity(vendor="AuthenticAMD", family=25, model=1, isa=("avx2",),
                                                     name="AMD EPYC"))
    monkeypatch.setattr(store, "host_key", lambda threads=None: amd)
    before = sorted(p.name for p in cache.rglob("*"))
    with pytest.raises(InvalidInputError, match=r"does not belong to this host: it was measured on Intel"):
        stored_or_calibrated(OPTIONS, TARGET, REQUEST, run, given=path)
    assert run.calls == 1 and sorted(p.name for p in cache.rglob("*")) == before  # nothing written


def test_a_corrupt_stored_calibration_is_one_line_naming_the_file(cache):
    path = store_path(HERE, REQUEST)
    path.parent.mkdir(parents=True)
    path.write_text('{"format": 1, "host": ')
    with pytest.raises(InvalidInputError, match=r"stored calibration .* not a readable calibration.*delete"):
        stored_or_calibrated(OPTIONS, TARGET, REQUEST, Counting())
    other = cache / "other.json"
    other.write_text(json.dumps({"format": 99}))
    with pytest.raises(InvalidInputError, match=r"--calibration .*other.json: not a readable calibration"):
        stored_or_calibrated(OPTIONS, TARGET, REQUEST, Counting(), given=other)
