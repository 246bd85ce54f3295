"""Reports: a study's Markdown and plots, and a profile's latency against depth and width.

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
}
__all__ = [
    "ReportFiles",
    "ReportRequest",
    "report_from_request",
    "write_report",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.report.records import ReportFiles, ReportRequest
    from draftnas.report.study import report_from_request, write_report
