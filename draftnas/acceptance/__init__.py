"""Acceptance: the target's traces over a prompt set, and a drafter's acceptance estimated on them.

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "TraceOptions": "records",
    "TraceRequest": "records",
    "TraceMetadata": "records",
    "AcceptanceEstimate": "records",
    "AcceptsFile": "accepts",
    "read_accepts": "accepts",
    "trace_from_request": "tracing",
    "build_traces": "tracing",
    "load_traces": "traces",
    "estimate_acceptance": "estimate",
}
__all__ = [
    "AcceptanceEstimate",
    "AcceptsFile",
    "TraceMetadata",
    "TraceOptions",
    "TraceRequest",
    "build_traces",
    "estimate_acceptance",
    "load_traces",
    "read_accepts",
    "trace_from_request",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.acceptance.accepts import AcceptsFile, read_accepts
    from draftnas.acceptance.estimate import estimate_acceptance
    from draftnas.acceptance.records import AcceptanceEstimate, TraceMetadata, TraceOptions, TraceRequest
    from draftnas.acceptance.traces import load_traces
    from draftnas.acceptance.tracing import build_traces, trace_from_request
