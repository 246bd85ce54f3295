"""Render every figure table of README.md and docs/ from benchmarks/results (`draftnas.report.tables`):
`python scripts/render_tables.py` rewrites the pages; `--check` only says which differ (exit 1)."""

from __future__ import annotations

import sys
from pathlib import Path

from draftnas.report.pages import render_page

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def main(check: bool) -> int:
    stale = []
    for page in pages():
        text = page.read_text("utf-8")
        rendered = render_page(text, RESULTS)
        if rendered != text:
            stale.append(page.relative_to(ROOT))
            if not check:
                page.write_text(rendered, "utf-8")
    for page in stale:
        print(f"{'differs from its rendering' if check else 'rendered'}: {page}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))
