"""Every third-party distribution the code imports is declared in pyproject.toml.

CI's system Python once had scipy installed while pyproject.toml did not declare it, so
the suite passed there and failed in a fresh virtualenv. This test reads the imports
themselves (with `ast`, nothing is executed) and maps each module to the distribution
that provides it in this environment.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent


#: Scripts that run in another engine's own environment (vLLM's virtualenv, made by `draftnas engines
#: --install vllm`), never in draftnas's: what they import is that environment's.
OTHER_ENVIRONMENTS = {"vllm_driver.py"}


def _imported_modules(folder: Path) -> dict[str, set[str]]:
    """Top-level module name -> files that import it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in sorted(p for p in folder.rglob("*.py") if p.name not in OTHER_ENVIRONMENTS):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(folder.parent)))
    return found


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(groups: tuple[str, ...]) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for group in groups:
        specs += project.get("optional-dependencies", {}).get(group, [])
    return {_normalize(re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0]) for spec in specs}


def _undeclared(folder: Path, declared: set[str]) -> list[str]:
    providers = md.packages_distributions()
    problems = []
    for module, files in sorted(_imported_modules(folder).items()):
        if module in sys.stdlib_module_names or module in {"draftnas", "tests", "benchmarks"}:
            continue
        dists = {_normalize(d) for d in providers.get(module, [])}
        if not dists:
            problems.append(f"{module} (imported by {', '.join(sorted(files))}) is not installed here")
        elif not dists & declared:
            problems.append(f"{module} comes from {', '.join(sorted(dists))}, which pyproject.toml does "
                            f"not declare (imported by {', '.join(sorted(files))})")
    return problems


def test_the_package_imports_only_declared_distributions() -> None:
    assert _undeclared(ROOT / "draftnas", _declared(())) == []


def test_tests_and_benchmarks_import_only_declared_or_dev_distributions() -> None:
    declared = _declared(("dev",))
    assert _undeclared(ROOT / "tests", declared) + _undeclared(ROOT / "benchmarks", declared) == []


def test_a_script_for_another_environment_imports_only_the_stdlib_and_that_engine() -> None:
    """vLLM's driver runs in vLLM's virtualenv, which has no draftnas: it imports the standard library, vllm
    and torch (which vLLM itself requires; its timers synchronize CUDA with it) alone."""
    (driver,) = [p for p in (ROOT / "draftnas").rglob("*.py") if p.name in OTHER_ENVIRONMENTS]
    assert {m for m in _modules_of(driver) if m not in sys.stdlib_module_names} == {"vllm", "torch"}


def _modules_of(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_the_checker_catches_an_undeclared_import(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text("import yaml\nimport json\nfrom draftnas import errors\n")
    problems = _undeclared(tmp_path, declared={"numpy"})
    assert len(problems) == 1 and problems[0].startswith("yaml comes from pyyaml")
