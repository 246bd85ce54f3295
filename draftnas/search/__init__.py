"""The search: an Optuna study over drafter shapes ranked by predicted throughput, what it says,
acceptance (alpha) models, and lookup drafting priced per workload (`search_lookup`).

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "SearchRequest": "requests",
    "StudySettings": "records",
    "SearchResult": "records",
    "RankedTrial": "records",
    "search": "resolve",
    "plan_search": "resolve",
    "summary_lines": "explain",
    "next_commands": "explain",
    "load_search_space": "spaces",
    "default_space_for": "spaces",
    "registry_space": "spaces",
    "SearchSpace": "space",
    "load_results": "results",
    "AlphaMeasureRequest": "requests",
    "AlphaFitRequest": "requests",
    "pairs_from_request": "pairs",
    "fit_from_request": "alpha",
    "LookupRequest": "lookup_records",
    "LookupResult": "lookup_records",
    "search_lookup": "lookup",
}
__all__ = [
    "AlphaFitRequest",
    "AlphaMeasureRequest",
    "LookupRequest",
    "LookupResult",
    "RankedTrial",
    "SearchRequest",
    "SearchResult",
    "SearchSpace",
    "StudySettings",
    "default_space_for",
    "fit_from_request",
    "load_results",
    "load_search_space",
    "next_commands",
    "pairs_from_request",
    "plan_search",
    "registry_space",
    "search",
    "search_lookup",
    "summary_lines",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.search.alpha import fit_from_request
    from draftnas.search.explain import next_commands, summary_lines
    from draftnas.search.lookup import search_lookup
    from draftnas.search.lookup_records import LookupRequest, LookupResult
    from draftnas.search.pairs import pairs_from_request
    from draftnas.search.records import RankedTrial, SearchResult, StudySettings
    from draftnas.search.requests import AlphaFitRequest, AlphaMeasureRequest, SearchRequest
    from draftnas.search.resolve import plan_search, search
    from draftnas.search.results import load_results
    from draftnas.search.space import SearchSpace
    from draftnas.search.spaces import default_space_for, load_search_space, registry_space
