"""Every command's flags come from its records' declared options: none is declared by hand."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import typer

from draftnas.cli import app
from draftnas.cli.flags import FLAGS_ATTR, Output, emit_json, options_command
from draftnas.core.options import OptionError, option, option_group


def _commands() -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []

    def walk(cmd: Any, name: str) -> None:
        if hasattr(cmd, "commands"):
            for sub, child in cmd.commands.items():
                walk(child, f"{name} {sub}".strip())
        else:
            out.append((name, cmd))

    walk(typer.main.get_command(app), "")
    return out


def test_every_command_declares_its_flags_through_records_only():
    commands = _commands()
    assert {"search", "export", "e2e", "bench", "alpha fit", "targets"} <= {n for n, _ in commands}
    hand_declared = []
    for name, cmd in commands:
        declared = getattr(cmd.callback, FLAGS_ATTR, frozenset())
        hand_declared += [f"{name}: {p.opts[0]}" for p in cmd.params if p.name not in declared]
    assert hand_declared == []


def test_json_is_declared_once_and_every_command_has_it():
    specs = {f.name: f for f in dataclasses.fields(Output)}
    for name, cmd in _commands():
        json_flags = [p for p in cmd.params if "--json" in p.opts]
        assert len(json_flags) == 1, name
        assert json_flags[0].help.startswith(specs["json"].metadata["draftnas_option"].help), name


@dataclasses.dataclass(frozen=True)
class _Inner:
    steps: int = option(3, low=1, help="Steps.")


@dataclasses.dataclass(frozen=True)
class _Asked:
    name: str = option(help="A name.", short="-N")
    items: tuple[str, ...] = option((), flag="--item", help="Repeatable.")
    mode: str = option("a", choices=("a", "b"), help="A mode.")
    inner: _Inner = option_group(_Inner)

    def validate(self) -> _Asked:
        from draftnas.core.options import check_options

        extra = [("mode", "b needs an {items} value")] if self.mode == "b" and not self.items else []
        return check_options(self, extra)


def _tiny_app(seen: list[object]) -> typer.Typer:
    tiny = typer.Typer()

    @tiny.command()
    @options_command(request=_Asked, output=Output)
    def run(request: _Asked, output: Output) -> None:
        seen.append(request)
        emit_json(output, dataclasses.asdict(request))

    @tiny.command()
    def other() -> None:  # a second command keeps `run` a named subcommand
        pass

    return tiny


def test_records_become_flags_groups_included_and_come_back_built_and_checked(tmp_path):
    from typer.testing import CliRunner

    seen: list[object] = []
    runner = CliRunner()
    out = tmp_path / "r.json"
    result = runner.invoke(_tiny_app(seen), ["run", "-N", "x", "--item", "p", "--item", "q", "--steps", "5",
                                             "--out-json", str(out)])
    assert result.exit_code == 0, result.output
    assert seen == [_Asked(name="x", items=("p", "q"), inner=_Inner(steps=5))]
    assert '"steps": 5' in out.read_text()
    bad = runner.invoke(_tiny_app(seen), ["run", "-N", "x", "--steps", "0", "--mode", "b"])
    assert isinstance(bad.exception, OptionError)
    assert bad.exception.for_flags() == "--steps must be >= 1, got 0; --mode b needs an --item value"
    assert str(bad.exception) == "steps must be >= 1, got 0; mode b needs an items value"  # Python's names


def test_a_flag_declared_twice_or_a_parameter_without_a_record_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Clash:
        json: bool = option(False, flag="--json", help="Twice.")

    with pytest.raises(TypeError, match="--json declared by"):
        options_command(request=Clash, output=Output)(lambda request, output: None)
    with pytest.raises(TypeError, match="must take exactly"):
        options_command(output=Output)(lambda request, output: None)


def test_a_flag_whose_text_does_not_parse_is_named_in_one_line():
    import subprocess
    import sys

    cases = ((["trace", "-t", "x", "-o", "y", "--temperature", "a"], "--temperature 'a' is not a number"),
             (["e2e", "--budget", "huge"], "--budget 'huge' is not a budget (allowed: smoke, quick, full)"))
    for args, needle in cases:
        out = subprocess.run([sys.executable, "-m", "draftnas", *args], capture_output=True, text=True)
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr
