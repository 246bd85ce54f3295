"""Declarative options: bounds and allowed values live in the records' fields, checked by one
function, and the CLI's flags and error lines come from the same fields."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import OptionError, check_options, option, parse_floats
from draftnas.core.records import Record


@dataclass(frozen=True)
class Asked(Record):
    gamma: int = option(4, help="Draft tokens per step.", low=1, high=32)
    lr: float = option(1e-3, help="Learning rate.", low=0.0, low_open=True, high=1.0)
    device: str = option("cpu", help="Device.", choices=("cpu", "cuda"))
    temperatures: tuple[float, ...] = option((0.0,), help="Temperatures.", low=0.0, high=10.0, nonempty=True,
                                             distinct=True, flag="--temperature")
    budget: int | None = option(None, help="Optional budget.", low=1)


def test_every_bad_field_is_named_at_once_with_what_is_allowed():
    with pytest.raises(OptionError) as caught:
        check_options(Asked(gamma=0, lr=0.0, device="tpu", temperatures=(0.0, 11.0), budget=0))
    err = caught.value
    assert [name for name, _ in err.problems] == ["gamma", "lr", "device", "temperatures", "budget"]
    assert "gamma must be in [1, 32], got 0" in str(err)
    assert "lr must be in (0, 1], got 0" in str(err)
    assert "device must be one of cpu, cuda, got 'tpu'" in str(err)
    assert "temperatures must be in [0, 10], got 11 (in [0.0, 11.0])" in str(err)
    assert "budget must be >= 1, got 0" in str(err)
    assert "--temperature must be in" in err.for_flags() and "--gamma must be in" in err.for_flags()
    assert isinstance(err, InvalidInputError)


def test_good_values_and_unset_optionals_pass_and_tuples_are_checked_as_wholes():
    ok = Asked(gamma=32, lr=1.0, device="cuda", temperatures=(0.0, 0.7))
    assert check_options(ok) is ok
    with pytest.raises(OptionError, match="temperatures repeats a value"):
        check_options(Asked(temperatures=(0.7, 0.7)))
    with pytest.raises(OptionError, match="temperatures must name at least one value"):
        check_options(Asked(temperatures=()))
    with pytest.raises(OptionError, match="extra rule"):
        check_options(ok, [("gamma", "extra rule")])
    # a list (the same values read back from JSON) is checked as a tuple is, not compared as one value
    assert check_options(Asked(temperatures=[0.0, 0.7])).temperatures == [0.0, 0.7]  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=r"temperatures must be in \[0, 10\], got 11"):
        check_options(Asked(temperatures=[0.0, 11.0]))  # type: ignore[arg-type]


def test_parse_floats_names_the_bad_item():
    assert parse_floats("0, 0.7") == (0.0, 0.7)
    with pytest.raises(InvalidInputError, match="'x' is not a number"):
        parse_floats("0,x")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "draftnas", *args], capture_output=True, text=True)


def test_the_cli_reports_record_errors_under_their_flags_in_one_line():
    out = _cli("bench", "-t", "smollm2-135m", "-d", "nowhere", "--gamma", "0", "--dtype", "int4")
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr
    assert "--gamma must be in [1, 32], got 0" in lines[0] and "--dtype must be one of fp32" in lines[0]


def test_flags_come_from_the_record_fields_with_their_help_and_defaults():
    text = _cli("heal", "--help").stdout
    for flag in ("--steps", "--batch-size", "--lr", "--per-domain", "--max-minutes", "--teacher-topk"):
        assert flag in text
    assert "--checkpoint-every" not in text  # a library-only field (cli=False) is no flag
    assert "Allowed: layers, all" in text
