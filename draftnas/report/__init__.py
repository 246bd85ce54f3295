"""Reports: a study's Markdown and plots, a profile's latency against depth and width, and what pays where
(the verdict joining lookup searches and benches).

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "ReportRequest": "records",
    "ReportFiles": "records",
    "report_from_request": "study",
    "write_report": "study",
    "VerdictRequest": "records",
    "WorkloadVerdict": "verdict",
    "verdicts_from_request": "verdict",
}
__all__ = [
    "ReportFiles",
    "ReportRequest",
    "VerdictRequest",
    "WorkloadVerdict",
    "report_from_request",
    "verdicts_from_request",
    "write_report",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.report.records import ReportFiles, ReportRequest, VerdictRequest
    from draftnas.report.study import report_from_request, write_report
    from draftnas.report.verdict import WorkloadVerdict, verdicts_from_request
