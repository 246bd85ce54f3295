"""The README is a guide: short, opening with the two commands CI runs, its links resolving."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_short_guide_opening_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None and text.index("```bash") < text.index("\n## ")
    commands = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert len(commands) == 2 and commands[0].startswith("bash scripts/setup.sh && draftnas ")
    assert commands[1] == "bash scripts/setup.sh && python3 -m pytest -q"


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = []
    for page in [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken


def _python_blocks() -> list[tuple[str, str]]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [(str(page.relative_to(ROOT)), block) for page in pages
            for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]


def test_the_docs_python_imports_only_public_names_and_they_import():
    import ast
    import importlib

    blocks = _python_blocks()
    assert any(page == "docs/python.md" for page, _ in blocks)
    stages = {"draftnas", *(f"draftnas.{p.name}" for p in (ROOT / "draftnas").iterdir()
                           if (p / "__init__.py").is_file() and p.name != "cli")}
    private = []
    for page, block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Import) and any(a.name.startswith("draftnas") for a in node.names):
                private.append(f"{page}: import {', '.join(a.name for a in node.names)}")
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("draftnas")):
                continue
            if node.module not in stages:
                private.append(f"{page}: from {node.module}")
                continue
            public = importlib.import_module(node.module).__all__
            private += [f"{page}: {node.module}.{a.name}" for a in node.names if a.name not in public]
            exec(compile(ast.Module(body=[node], type_ignores=[]), page, "exec"), {})
    assert private == []


def test_every_kept_result_is_cited_and_none_is_a_large_dump():
    """benchmarks/results/ holds what the README, the docs or the changelog cite by file name (git keeps
    the rest), each small enough to read: a search's dump is summarized before it is kept."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", ROOT / "CHANGELOG.md",
                                             *sorted((ROOT / "docs").rglob("*.md"))])
    results = [p for p in sorted((ROOT / "benchmarks" / "results").rglob("*")) if p.is_file()]
    assert results
    uncited = [str(p.relative_to(ROOT)) for p in results if p.name not in text]
    large = [f"{p.relative_to(ROOT)} ({p.stat().st_size // 1024} KB)" for p in results
             if p.stat().st_size > 1 << 20]
    assert uncited == [] and large == []


def test_the_profiles_table_lists_every_shipped_profile():
    from draftnas.latency.files import SHIPPED_PROFILES

    text = (ROOT / "docs" / "commands.md").read_text()
    table = text[text.index("### Shipped profiles"):]
    missing = [f"{k} ({f})" for k, f in SHIPPED_PROFILES.items() if f"| `{k}` | `{f}` |" not in table]
    assert missing == [] and "| `cpu-roofline` |" in table
