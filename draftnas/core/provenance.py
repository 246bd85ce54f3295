"""Provenance written beside results (profiles, traces, exports): which library versions made them, and
the sha256 a file is checked by.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
from collections.abc import Iterable
from pathlib import Path

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


def sha256_file(path: str | Path) -> str:
    """The file's sha256 (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
