"""Provenance written beside results (profiles, traces, exports): which library versions made them.
"""

from __future__ import annotations

import importlib.metadata as md
from collections.abc import Iterable

CORE_PACKAGES: tuple[str, ...] = ("draftnas", "torch", "transformers")


def package_versions(packages: Iterable[str] = CORE_PACKAGES, missing: str = "unknown") -> dict[str, str]:
    """Installed version of each package, `missing` for one that is not installed."""
    out = {}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = missing
    return out
