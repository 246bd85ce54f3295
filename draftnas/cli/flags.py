"""Command-line flags built from request records: a flag exists in one place, the record's field.

`options_command(Record)` turns a command function taking `options: Record` into one whose
signature (what typer reads) has one flag per option field of the record — its name, short name,
help and default from the field's `Spec` (`draftnas.core.options`) — beside the function's own
parameters; the command gets the record built from them. `main` reports an `OptionError` under
these flags' names.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any

import typer

from draftnas.core.options import UNSET, flag_of, spec_of


def _flag_parameters(record: type, exclude: Sequence[str]) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(record)
    out = []
    for f in dataclasses.fields(record):
        spec = spec_of(f)
        if spec is None or not spec.cli or f.name in exclude:
            continue
        if spec.cli_default is not UNSET:
            default = spec.cli_default
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
            if spec.scale and default is not None:
                default = default / spec.scale
        names = [(spec.flag or flag_of(f))] + ([spec.short] if spec.short else [])
        allowed = f" Allowed: {', '.join(map(str, spec.choices))}." if spec.choices else ""
        out.append(inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, annotation=spec.cli_type or hints[f.name],
            default=typer.Option(default, *names, help=spec.help + allowed)))
    return out


def _field_value(field: dataclasses.Field[Any], value: Any) -> Any:
    spec = spec_of(field)
    assert spec is not None
    if spec.parse is not None:
        value = spec.parse(value)
    if spec.scale and value is not None:
        value = value * spec.scale
    return value


def options_command(record: type, *, param: str = "options", exclude: Sequence[str] = ()
                    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command one flag per option field of `record` (see the module docstring); the command
    receives them as `record(...)` in its `param` argument (fields in `exclude` keep their defaults)."""
    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command)
        hints = typing.get_type_hints(command)
        flags = _flag_parameters(record, exclude)
        names = {p.name for p in flags}
        fields = {f.name: f for f in dataclasses.fields(record)}
        rest = [p.replace(annotation=hints.get(p.name, p.annotation), kind=inspect.Parameter.KEYWORD_ONLY)
                for p in own.parameters.values() if p.name != param]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            values = {n: _field_value(fields[n], kwargs.pop(n)) for n in list(kwargs) if n in names}
            return command(**{param: record(**values)}, **kwargs)

        parameters = rest + flags
        run.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        del run.__wrapped__  # typer must read this signature, not the command's
        return run
    return wrap
