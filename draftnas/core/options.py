"""Declarative options: what a request record allows, written once, in its fields' metadata.

An option field says its help text, its flag, its bounds or allowed values:

    gamma: int = option(4, help="Draft tokens per step.", low=1, high=32, short="-g")

`check_options(record)` checks every option field of a record at once and raises one
`OptionError` naming each bad field with what is allowed; the CLI builds its flags (names, help,
defaults) from the same fields (`draftnas.cli.flags`) and reports the errors under the flags'
names. A field made with `option_group()` holds another such record (a request's study settings):
its options are checked with the outer record's and become flags beside them. A message may name
another field as `{field}`: a Python caller reads the field's name there, the command line its flag.
Pure: no torch, no typer.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from draftnas.core.errors import InvalidInputError

OPTION = "draftnas_option"
GROUP = "draftnas_option_group"
T = TypeVar("T")


class _Unset:
    """The flag's default is the field's (`Spec.cli_default` not given)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Spec:
    """One option's help, flag and allowed values. `low`/`high` bound a number (or every item of a
    tuple); `low_open` excludes `low` itself; `choices` lists the allowed values; `cli` False keeps the
    field out of the flags (set by the library, not a user); `parse` turns the flag's text into the
    field's value (for tuples: "0,0.7" -> (0.0, 0.7)); `scale` converts the flag's unit to the field's
    (minutes on the command line, seconds in the record); `cli_type`/`cli_default`: the flag's type and
    default where they differ from the field's."""

    help: str
    flag: str | None = None
    short: str | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[Any, ...] | None = None
    cli: bool = True
    parse: Callable[[Any], Any] | None = None
    scale: float | None = None
    distinct: bool = False  # the items of a tuple must not repeat
    nonempty: bool = False  # a tuple needs at least one item
    cli_type: Any = None  # the flag's type when it is not the field's (e.g. str for a parsed tuple)
    cli_default: Any = UNSET  # the flag's default when it is not the field's
    argument: bool = False  # a positional argument on the command line, not a --flag


def option(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = None,
           short: str | None = None, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False, choices: Sequence[Any] | None = None,
           cli: bool = True,
           parse: Callable[[Any], Any] | None = None, scale: float | None = None, distinct: bool = False,
           nonempty: bool = False, cli_type: Any = None, cli_default: Any = UNSET,
           argument: bool = False, factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field carrying its option `Spec` (see the module docstring); `factory` makes a
    default that is not a constant."""
    spec = Spec(help=help, flag=flag, short=short, low=low, high=high, low_open=low_open, high_open=high_open,
                choices=tuple(choices) if choices is not None else None, cli=cli, parse=parse, scale=scale,
                distinct=distinct, nonempty=nonempty, cli_type=cli_type, cli_default=cli_default,
                argument=argument)
    if isinstance(default, (list, dict, set)):
        raise TypeError("an option's default must be immutable (a tuple, not a list)")
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={OPTION: spec})
    return dataclasses.field(default=default, metadata={OPTION: spec})


def option_group(factory: Callable[[], Any]) -> Any:
    """A field holding a record of options (built by `factory` by default): checked with the outer
    record, its options flags of the outer record's command."""
    return dataclasses.field(default_factory=factory, metadata={GROUP: True})


def is_group(field: dataclasses.Field[Any]) -> bool:
    return bool(field.metadata.get(GROUP))


def spec_of(field: dataclasses.Field[Any]) -> Spec | None:
    spec = field.metadata.get(OPTION)
    return spec if isinstance(spec, Spec) else None


def flag_of(field: dataclasses.Field[Any]) -> str:
    """The command-line flag of an option field: its own, else `--` and the name with dashes."""
    spec = spec_of(field)
    flag = (spec.flag if spec is not None and spec.flag else None) or "--" + field.name.replace("_", "-")
    return flag.split("/")[0]


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value) if isinstance(value, str) else str(value)


def _value_problem(spec: Spec, value: Any) -> str | None:
    if spec.choices is not None and value not in spec.choices:
        return f"must be one of {', '.join(map(str, spec.choices))}, got {_fmt(value)}"
    if spec.low is None and spec.high is None:
        return None
    if isinstance(value, float) and value != value:  # NaN compares false with every bound
        return "must be a number, got nan"
    too_low = spec.low is not None and (value <= spec.low if spec.low_open else value < spec.low)
    too_high = spec.high is not None and (value >= spec.high if spec.high_open else value > spec.high)
    if not (too_low or too_high):
        return None
    if spec.high is None:
        return f"must be {'>' if spec.low_open else '>='} {_fmt(spec.low)}, got {_fmt(value)}"
    if spec.low is None:
        return f"must be {'<' if spec.high_open else '<='} {_fmt(spec.high)}, got {_fmt(value)}"
    opening, closing = "(" if spec.low_open else "[", ")" if spec.high_open else "]"
    return f"must be in {opening}{_fmt(spec.low)}, {_fmt(spec.high)}{closing}, got {_fmt(value)}"


def field_problem(spec: Spec, value: Any) -> str | None:
    """What is wrong with `value` for an option of `spec` (None: nothing; None values are unset)."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):  # a list: the same values decoded from JSON
        if spec.nonempty and not value:
            return "must name at least one value"
        if spec.distinct and len(set(value)) != len(value):
            return f"repeats a value: {list(value)}"
        bad = [v for v in value if _value_problem(spec, v) is not None]
        return f"{_value_problem(spec, bad[0])} (in {list(value)})" if bad else None
    return _value_problem(spec, value)


_NAMED = re.compile(r"\{(\w+)\}")


class OptionError(InvalidInputError):
    """Options out of their allowed values: `problems` holds (field name, message) pairs; a message
    may name another field as `{field}`. Its text names the fields; `for_flags` names the
    command-line flags instead."""

    def __init__(self, problems: Sequence[tuple[str, str]], flags: dict[str, str] | None = None) -> None:
        self.problems, self.flags = tuple(problems), dict(flags or {})
        super().__init__(self._text({}))

    def _text(self, names: dict[str, str]) -> str:
        def name(m: re.Match[str]) -> str:
            return names.get(m.group(1), m.group(1))

        return "; ".join(f"{names.get(field, field)} {_NAMED.sub(name, message)}"
                         for field, message in self.problems)

    def for_flags(self) -> str:
        return self._text(self.flags)


def option_error(field: str, message: str, flag: str | None = None, **flags: str) -> OptionError:
    """One option's problem raised where a library function finds it: `field` named as Python calls
    it, `flag` (default `--` and the field's name with dashes) on the command line; `flags` gives the
    flags of other fields the message names as `{field}`."""
    names = {field: flag or "--" + field.replace("_", "-"), **flags}
    for name in _NAMED.findall(message):
        names.setdefault(name, "--" + name.replace("_", "-"))
    return OptionError([(field, message)], names)


def option_problems(record: Any) -> list[tuple[str, str]]:
    """Every (field, message) of `record`'s option fields whose value is not allowed (those of its
    groups' records included, under their own field names)."""
    out = []
    for f in dataclasses.fields(record):
        spec, value = spec_of(f), getattr(record, f.name)
        if spec is not None and (problem := field_problem(spec, value)) is not None:
            out.append((f.name, problem))
        elif is_group(f) and value is not None:
            out += option_problems(value)
    return out


def option_flags(record: Any) -> dict[str, str]:
    """Field name -> command-line flag of `record` (a record or its type) and its groups' records."""
    import typing

    hints = typing.get_type_hints(record if isinstance(record, type) else type(record))
    out = {}
    for f in dataclasses.fields(record):
        if is_group(f):
            out.update(option_flags(hints[f.name]))
        out[f.name] = f.name.upper() if (s := spec_of(f)) is not None and s.argument else flag_of(f)
    return out


def check_options(record: T, extra: Sequence[tuple[str, str]] = ()) -> T:
    """`record` when every option field (and `extra`: problems its own rules found) is fine; else one
    `OptionError` naming them all."""
    problems = option_problems(record) + list(extra)
    if problems:
        raise OptionError(problems, option_flags(record))
    return record


def _parse_list(text: str, cast: Callable[[str], T], noun: str, example: str) -> tuple[T, ...]:
    """A flag's comma-separated items cast one by one; one line naming the first bad item."""
    values = []
    for item in (t.strip() for t in str(text).split(",") if t.strip()):
        try:
            values.append(cast(item))
        except ValueError:
            raise InvalidInputError(f"{item!r} is not a {noun}: give {noun}s separated by commas, e.g. "
                                    f"{example}") from None
    return tuple(values)


def parse_words(text: object) -> tuple[str, ...]:
    """'a, b' -> ('a', 'b'): a flag's comma-separated words (a tuple passes through)."""
    if isinstance(text, tuple):
        return tuple(str(t) for t in text)
    return tuple(t.strip() for t in str(text).split(",") if t.strip())


def parse_floats(text: str) -> tuple[float, ...]:
    """'0,0.7' -> (0.0, 0.7): a flag's comma-separated numbers; one line naming the bad item."""
    return _parse_list(text, float, "number", "0,0.7")


def parse_ints(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4): a flag's comma-separated whole numbers; one line naming the bad item."""
    return _parse_list(text, int, "whole number", "1,2,4,8")
