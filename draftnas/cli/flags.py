"""Command-line flags built from request records: a flag exists in one place, the record's field.

`options_command(request=Record, output=Output)` turns a command function taking `request: Record`
and `output: Output` into one whose signature (what typer reads) has one flag (or positional
argument) per option field of those records and of their groups' records — name, short name, help
and default from the field's `Spec` (`draftnas.core.options`). The command gets the records built
from them and checked (`validate()` where the record has one), so a bad value is one `OptionError`
that `main` reports under the flags' names. A command declares no flag of its own:
`tests/cli/test_flags.py` walks every command and fails on one.

`Output` is the one declaration of `--json` and `--out-json`; `emit_json` the one writer of both.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from draftnas.core.errors import InvalidInputError
from draftnas.core.options import UNSET, OptionError, check_options, flag_of, is_group, option, spec_of

FLAGS_ATTR = "__draftnas_flags__"  # on a command: the parameter names its records declared


@dataclass(frozen=True)
class Output:
    """How a command hands its result over besides its tables (every command has `--json`)."""

    json: bool = option(False, flag="--json",
                        help="Print the result as JSON on stdout instead of tables (progress stays on "
                             "stderr).")
    out_json: str | None = option(None, flag="--out-json", help="Also write the result as JSON to this file.")


def command_line() -> str:
    """The command as the user typed it (for results files to say how they were made)."""
    import shlex

    return shlex.join(["draftnas", *sys.argv[1:]])


def emit_json(output: Output, data: Any) -> bool:
    """`data` as JSON: on stdout with --json, to --out-json's file (written whole) when given. True
    when stdout got it (the command prints nothing else there)."""
    import json

    from draftnas.core.records import write_json_file

    if output.out_json is not None:
        write_json_file(output.out_json, data, indent=2)
    if output.json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    return output.json


def _default(field: dataclasses.Field[Any]) -> Any:
    spec = spec_of(field)
    assert spec is not None
    if spec.cli_default is not UNSET:
        return spec.cli_default
    if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
        return ...  # required
    default = (field.default if field.default is not dataclasses.MISSING
               else field.default_factory())  # type: ignore[misc,operator]
    if spec.scale and default is not None:
        default = default / spec.scale
    return list(default) if isinstance(default, tuple) else default


def _annotation(field: dataclasses.Field[Any], hint: Any) -> Any:
    spec = spec_of(field)
    assert spec is not None
    if spec.cli_type is not None:
        return spec.cli_type
    origin = typing.get_origin(hint)
    if origin is tuple:  # tuple[str, ...] fields are repeatable flags
        return list[typing.get_args(hint)[0]]  # type: ignore[misc]
    return hint


@dataclass(frozen=True)
class _Flag:
    param: str  # the command's parameter name (unique across its records)
    path: tuple[str, ...]  # record parameter, then group fields, then the field
    field: dataclasses.Field[Any]
    parameter: inspect.Parameter


def _flags(record: type, path: tuple[str, ...]) -> list[_Flag]:
    hints = typing.get_type_hints(record)
    out: list[_Flag] = []
    for f in dataclasses.fields(record):
        if is_group(f):
            out += _flags(hints[f.name], path + (f.name,))
            continue
        spec = spec_of(f)
        if spec is None or not spec.cli:
            continue
        allowed = f" Allowed: {', '.join(map(str, spec.choices))}." if spec.choices else ""
        default = _default(f)
        if spec.argument:
            info = typer.Argument(default, metavar=f.name.upper(), help=spec.help + allowed)
        else:
            info = typer.Option(default, *([spec.flag or flag_of(f)] + ([spec.short] if spec.short else [])),
                                help=spec.help + allowed)
        param = "__".join(path[1:] + (f.name,)) if len(path) > 1 else f.name
        out.append(_Flag(param, path + (f.name,), f, inspect.Parameter(
            param, inspect.Parameter.KEYWORD_ONLY, annotation=_annotation(f, hints[f.name]), default=info)))
    return out


def _value(field: dataclasses.Field[Any], value: Any) -> Any:
    spec = spec_of(field)
    assert spec is not None
    if isinstance(value, list):
        value = tuple(value)
    if spec.parse is not None and value is not None:
        try:
            value = spec.parse(value)
        except InvalidInputError as exc:  # the flag's text did not parse: said under the flag
            raise OptionError([(field.name, str(exc))], {field.name: flag_of(field)}) from None
    if spec.scale and value is not None:
        value = value * spec.scale
    return value


def _build(record: type, values: dict[tuple[str, ...], Any], path: tuple[str, ...]) -> Any:
    hints = typing.get_type_hints(record)
    kwargs = {}
    for f in dataclasses.fields(record):
        if is_group(f) and any(p[:len(path) + 1] == path + (f.name,) for p in values):
            group = _build(hints[f.name], values, path + (f.name,))
            kwargs[f.name] = group.validate() if hasattr(group, "validate") else group  # its own rules
        elif path + (f.name,) in values:
            kwargs[f.name] = values[path + (f.name,)]
    return record(**kwargs)


def options_command(**records: type) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command one flag per option field of each record (see the module docstring): the
    command's parameter `name` receives `records[name]` built from them and checked."""
    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command)
        flags = [flag for name, record in records.items() for flag in _flags(record, (name,))]
        seen: dict[str, str] = {}
        for f in flags:
            info = f.parameter.default
            for decl in getattr(info, "param_decls", ()) or ():
                for token in str(decl).split("/"):
                    if token in seen:
                        raise TypeError(f"{command.__name__}: {token} declared by {seen[token]} and "
                                        f"{f.param}")
                    seen[token] = f.param
        if set(own.parameters) != set(records):
            raise TypeError(f"{command.__name__} must take exactly {sorted(records)}: its flags come from "
                            "them")
        # positional arguments first, in declaration order, then the options
        ordered = sorted(flags, key=lambda f: not spec_of(f.field).argument)  # type: ignore[union-attr]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            built = {}
            for name, record in records.items():
                values = {f.path[1:]: _value(f.field, kwargs[f.param]) for f in flags if f.path[0] == name}
                value = _build(record, values, ())
                built[name] = value.validate() if hasattr(value, "validate") else check_options(value)
            return command(**built)

        run.__signature__ = own.replace(parameters=[f.parameter for f in ordered])  # type: ignore[attr-defined]
        run.__annotations__ = {f.param: f.parameter.annotation for f in ordered}
        setattr(run, FLAGS_ATTR, frozenset(f.param for f in flags))
        del run.__wrapped__  # typer must read this signature, not the command's
        return run
    return wrap


__all__ = ["FLAGS_ATTR", "Output", "emit_json", "options_command"]
