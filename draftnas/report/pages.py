"""Pages whose figure tables are rendered, never typed: a Markdown page marks a table with
`<!-- table: NAME FILE... -->` ... `<!-- /table -->` (FILEs relative to `benchmarks/results/`), and
`render_page` rewrites what lies between the markers from those files with the renderer NAME
(`report.tables`). `python scripts/render_tables.py` renders every page; the docs test fails where a
page differs from its rendering.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from draftnas.report.tables import (
    ablation_table,
    batched_table,
    bench_table,
    hosts_table,
    replay_table,
    workloads_table,
)
from draftnas.report.training_tables import curves_table, heal_recipes_table, training_table

MARK = re.compile(r"<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)<!-- /table -->", re.S)


def transcript(root: Path, files: Sequence[str]) -> list[str]:
    """A command's kept output as it printed it (a text file under `root`), in a code block."""
    (name,) = files
    path = root / name
    if not path.is_file():
        raise FileNotFoundError(f"a page cites {name}, which is not in {root}")
    return ["```", *path.read_text("utf-8").rstrip("\n").splitlines(), "```"]


RENDERERS: dict[str, Callable[[Path, Sequence[str]], list[str]]] = {
    "bench": bench_table, "workloads": workloads_table, "training": training_table,
    "replay": replay_table, "batched": batched_table, "ablation": ablation_table, "curves": curves_table,
    "hosts": hosts_table, "heal_recipes": heal_recipes_table, "transcript": transcript}


def render_page(text: str, root: Path) -> str:
    """`text` with every marked table rendered from the files under `root` it names."""
    def one(match: re.Match[str]) -> str:
        kind, *files = match["spec"].split()
        if kind not in RENDERERS:
            raise ValueError(f"unknown table {kind!r} (known: {', '.join(RENDERERS)})")
        body = "\n".join(RENDERERS[kind](root, files))
        return f"<!-- table: {match['spec']} -->\n{body}\n<!-- /table -->"
    return MARK.sub(one, text)


def cited_files(text: str) -> list[str]:
    """The results files a page's tables are rendered from."""
    return [f for m in MARK.finditer(text) for spec in m["spec"].split()[1:] for f in spec.split("+")]
