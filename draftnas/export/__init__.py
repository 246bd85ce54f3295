"""Export: a search trial or a plan as a Hugging Face folder (and a GGUF for llama.cpp), healed on the way.

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "ExportRequest": "records",
    "ExportResult": "records",
    "BestExport": "records",
    "HealRequest": "records",
    "export_from_request": "request",
    "export_best": "request",
    "heal_from_request": "heal",
    "load_drafter": "folder",
    "exported_record": "folder",
    "export_trained": "trained",
}
__all__ = [
    "BestExport",
    "ExportRequest",
    "ExportResult",
    "HealRequest",
    "export_best",
    "export_from_request",
    "export_trained",
    "exported_record",
    "heal_from_request",
    "load_drafter",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.export.folder import exported_record, load_drafter
    from draftnas.export.heal import heal_from_request
    from draftnas.export.records import BestExport, ExportRequest, ExportResult, HealRequest
    from draftnas.export.request import export_best, export_from_request
    from draftnas.export.trained import export_trained
