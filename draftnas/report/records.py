"""What the report stage writes and draws (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from draftnas.core.options import check_options, option, parse_words
from draftnas.core.records import Record


@dataclass(frozen=True)
class ReportRequest(Record):
    """What `draftnas report` was asked: a study, and where its report goes."""

    study: str = option(help="Study name (as printed by draftnas search).")
    out: str = option(help="Folder for report.md and the PNG plots.")
    storage: str | None = option(None, help="Storage URL (default: runs/<study>/study.db).")
    run_dir: str = option("runs", help="Folder of studies' outputs.")
    top: int = option(20, low=1, help="Rows in the ranking.")


@dataclass(frozen=True)
class VerdictRequest(Record):
    """What `draftnas verdict` was asked: the results to join into what pays where."""

    results: tuple[str, ...] = option(
        help="Results, comma-separated: `draftnas lookup` folders (or their lookup.json), one per workload, "
             "and `draftnas bench --out-json` files run on their held-out prompts.",
        argument=True, parse=parse_words, cli_type=str, nonempty=True)

    def validate(self) -> VerdictRequest:
        check_options(self)
        return self


@dataclass(frozen=True)
class ReportFiles(Record):
    """What `write_report` wrote."""

    study_name: str
    markdown: str
    plots: tuple[str, ...]
    n_ranked: int
    acceptance_assumed: bool


@dataclass(frozen=True)
class ReportRow(Record):
    series: str  # "depth" | "width"
    shape: str
    layers: int
    hidden_size: int
    non_embedding_params: int
    measured_ms: float | None
    q1_ms: float | None
    q3_ms: float | None
    predicted_ms: float
    split: str


@dataclass(frozen=True)
class DepthWidthReport(Record):
    """Draft latency (batch 1, one new token) against depth and against width."""

    device_name: str
    dtype: str
    batch_size: int
    new_tokens: int
    context_tokens: int
    rows: tuple[ReportRow, ...]
    ms_per_layer_overhead: float  # the fitted per-layer fixed cost
    ms_per_million_layer_params: float  # the fitted marginal cost of layer weights at batch 1
