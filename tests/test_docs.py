"""The README is a guide: short, opening with the two commands CI runs, its links resolving."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_short_guide_opening_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None and text.index("```bash") < text.index("\n## ")
    commands = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert len(commands) == 2 and commands[0].startswith("bash scripts/setup.sh && draftnas ")
    assert commands[1] == "bash scripts/setup.sh && python3 -m pytest -q"


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_docs_are_guides_no_page_over_250_lines_and_dated_headings_only_in_the_journal():
    long = [f"{p.relative_to(ROOT)} ({n})" for p in _pages() if (n := len(p.read_text().splitlines())) > 250]
    dated = [f"{p.relative_to(ROOT)}: {line}" for p in _pages() if p.name != "journal.md"
             for line in p.read_text().splitlines()
             if line.startswith("#") and re.search(r"20\d\d-\d\d", line)]
    assert long == [] and dated == []


# a speedup, an interval, a speed, a percentage; or a cell of plain decimals (2+ places) or of seconds
FIGURE = re.compile(r"\d\.\d+ ?(x|×)|\[\d+\.\d+, \d+\.\d+\]|\d\.\d+ ?(ms|tok/s|tokens/s)\b|\d\.\d+%"
                    r"|\| ?\**-?\d+\.\d{2,}\** ?\||\| ?\**\d+ ?(s|min|ms)\** ?\|")


def test_the_figure_pattern_catches_tables_of_plain_decimals_and_seconds():
    """The typed healing table of docs/stages.md held no x, % or tokens/s: its cells were plain decimals and
    integer seconds, which the pattern missed."""
    typed = "| 0 | live target | 80 | 28 | 25 s | 91 s | 0.196 | 1.242 |\n"
    assert FIGURE.search(typed)
    assert FIGURE.search("| 128 | **0.252** |\n") and FIGURE.search("| run | 6 min |\n")
    assert not FIGURE.search("| shape | layers | 24 | 0,29 |\n")  # counts and names are not figures


def test_every_table_of_figures_is_rendered_from_results_not_typed():
    """A Markdown table quoting a measured figure (a speedup, an interval, tokens/s, ms, a percentage) lies
    between the markers `scripts/render_tables.py` fills; typed tables drift from their results."""
    from draftnas.report.pages import MARK

    typed = []
    for page in _pages():
        text = MARK.sub("", page.read_text())
        typed += [f"{page.relative_to(ROOT)}: {block.splitlines()[0][:80]}"
                  for block in re.findall(r"(?m)(?:^\|.*\|\n)+", text) if FIGURE.search(block)]
    assert typed == []


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


def test_every_marked_table_is_its_rendering_from_the_results_it_names():
    """Figures are rendered, not typed: `python scripts/render_tables.py` rewrites what differs."""
    from draftnas.report.pages import cited_files, render_page

    results = ROOT / "benchmarks" / "results"
    stale = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text()
        for name in cited_files(text):
            assert (results / name).is_file(), f"{page.relative_to(ROOT)} cites {name}, not in results"
        if render_page(text, results) != text:
            stale.append(str(page.relative_to(ROOT)))
    assert not stale, f"re-render with `python scripts/render_tables.py`: {stale}"


def test_a_table_renders_from_its_file_and_a_changed_figure_is_caught(tmp_path):
    import json

    from draftnas.bench.records import ArmResult, BenchResult
    from draftnas.report.pages import render_page

    arms = (ArmResult(name="target", engine="static", tokens_per_s=10.0, tokens_per_s_interval=(9.0, 11.0)),
            ArmResult(name="draftnas", engine="static", drafter="d", tokens_per_s=15.0,
                      tokens_per_s_interval=(14.0, 16.0), speedup=1.5, speedup_interval=(1.4, 1.6),
                      tokens_per_step=2.0, lossless=True))
    bench = BenchResult(target="t", drafters={"draftnas": "d"}, gamma=3, temperature=0.0, max_new_tokens=8,
                        n_prompts=1, device="cpu", dtype="bf16", threads=2, engine="static", arms=arms,
                        host="h", load_average_before="0.1")
    (tmp_path / "b.json").write_text(json.dumps(bench.to_dict()))
    page = render_page("x\n<!-- table: bench b.json -->\n<!-- /table -->\n", tmp_path)
    assert "| draftnas | d | 15.00 [14.00, 16.00] | 1.500x [1.400, 1.600] | 2.00 | yes |" in page
    assert render_page(page, tmp_path) == page
    assert render_page(page.replace("1.500x", "1.600x"), tmp_path) == page  # a typed figure is re-rendered
