"""End to end: profile, trace, search, export and bench in one resumable run, with the baselines.

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "E2EOptions": "records",
    "E2EResult": "records",
    "Budget": "records",
    "BUDGETS": "records",
    "budget_preset": "records",
    "run_e2e": "run",
}
__all__ = [
    "BUDGETS",
    "Budget",
    "E2EOptions",
    "E2EResult",
    "budget_preset",
    "run_e2e",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.e2e.records import BUDGETS, Budget, E2EOptions, E2EResult, budget_preset
    from draftnas.e2e.run import run_e2e
