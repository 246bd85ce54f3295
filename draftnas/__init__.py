"""draftnas: find the fastest speculative-decoding drafter for a target LLM on given hardware."""

from __future__ import annotations

__version__ = "0.1.0"

from draftnas.core.errors import DraftnasError

__all__ = ["DraftnasError", "__version__"]
