"""The bench: real speculative decoding of every arm in one interleaved run, with intervals and predictions.

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "BenchOptions": "request_records",
    "BenchRequest": "request_records",
    "BenchResult": "records",
    "ArmResult": "records",
    "BatchedBenchResult": "batch_records",
    "ReplayResult": "replay_records",
    "run_replay": "replay",
    "bench_from_request": "request",
    "run_bench": "run",
    "run_batch_sizes": "run",
}
__all__ = [
    "ArmResult",
    "BatchedBenchResult",
    "BenchOptions",
    "BenchRequest",
    "BenchResult",
    "ReplayResult",
    "bench_from_request",
    "run_batch_sizes",
    "run_bench",
    "run_replay",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.bench.batch_records import BatchedBenchResult
    from draftnas.bench.records import ArmResult, BenchResult
    from draftnas.bench.replay import run_replay
    from draftnas.bench.replay_records import ReplayResult
    from draftnas.bench.request import bench_from_request
    from draftnas.bench.request_records import BenchOptions, BenchRequest
    from draftnas.bench.run import run_batch_sizes, run_bench
