"""Models: loading the embedded and local weights, the engines the loops drive, the speculative loop itself.

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "load_model": "sources",
    "inspect_model": "sources",
    "has_weights": "sources",
    "InspectRequest": "records",
    "EnginesRequest": "records",
    "EngineRow": "records",
    "EMBEDDED": "records",
    "engines_here": "llama_cpp",
    "Engine": "engines",
    "HFEngine": "engines",
    "StaticEngine": "engines",
    "as_engine": "engines",
    "speculative_generate": "speculative",
    "greedy_decode": "speculative",
    "route_linears": "linears",
}
__all__ = [
    "EMBEDDED",
    "Engine",
    "EngineRow",
    "EnginesRequest",
    "HFEngine",
    "InspectRequest",
    "StaticEngine",
    "as_engine",
    "engines_here",
    "greedy_decode",
    "has_weights",
    "inspect_model",
    "load_model",
    "route_linears",
    "speculative_generate",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.models.engines import Engine, HFEngine, StaticEngine, as_engine
    from draftnas.models.linears import route_linears
    from draftnas.models.llama_cpp import engines_here
    from draftnas.models.records import EMBEDDED, EngineRow, EnginesRequest, InspectRequest
    from draftnas.models.sources import has_weights, inspect_model, load_model
    from draftnas.models.speculative import greedy_decode, speculative_generate
