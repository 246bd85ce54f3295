"""Kernel choices kept per host: a product's form and a one-token step's row padding, timed once.

`MatmulChooser` times the forms of a product for each (rows, out, in) it meets, and
`choose_row_padding` times whole one-token steps padded and not. Both cost passes over every weight
of a shape; a calibration builds a dozen models of a few shapes, and a bench builds the same shapes
again, so without a store the same choice was timed many times per run (on the Zen 3 host most of a
25-minute calibration went there). Inside `kept_choices()`, every choice made is written to one JSON
file per host (CPU vendor, family, model and instruction sets, and the torch version) under the cache,
keyed by dtype, thread count and shape, and a choice found there is used without timing.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from draftnas.core.machine import cpu_identity
from draftnas.core.records import write_json_file

log = logging.getLogger(__name__)

_ACTIVE: list[KernelChoices | None] = []  # None: choices timed anew (`fresh_choices`)


def host_fingerprint() -> str:
    """Short stable name of what decides the kernels here: the CPU's identity and torch's version."""
    import hashlib

    ident = cpu_identity()
    text = json.dumps([ident.vendor, ident.family, ident.model, ident.isa, torch.__version__])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def kernel_choices_path() -> Path:
    from draftnas.models.sources import state_dir

    return state_dir() / "kernels" / f"{host_fingerprint()}.json"


class KernelChoices:
    """A dict of choices loaded from and saved to `path` (an unreadable file counts as empty: choices
    are a cache of timings, remade on demand)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.choices: dict[str, Any] = {}
        self.hits = self.misses = 0
        try:
            data = json.loads(path.read_text())
            self.choices = dict(data.get("choices", {})) if isinstance(data, dict) else {}
        except (OSError, ValueError):
            self.choices = {}

    @staticmethod
    def key(*parts: Any) -> str:
        return "|".join(str(p) for p in (*parts, torch.get_num_threads()))

    def get(self, key: str) -> Any:
        found = self.choices.get(key)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def put(self, key: str, value: Any) -> None:
        self.choices[key] = value
        self.save()

    def save(self) -> None:
        """Written whole, then renamed over the old file."""
        write_json_file(self.path, {"host": host_fingerprint(), "torch": torch.__version__,
                                    "cpu": cpu_identity().label(), "choices": self.choices}, indent=0)


def active() -> KernelChoices | None:
    """The store choices go to now, if any."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def fresh_choices() -> Iterator[None]:
    """Inside, kernel choices are timed anew and kept nowhere, even within `kept_choices`: a step that a
    kept choice made slow is timed as a fresh process would run it."""
    _ACTIVE.append(None)
    try:
        yield
    finally:
        _ACTIVE.pop()


@contextlib.contextmanager
def kept_choices(path: Path | None = None) -> Iterator[KernelChoices]:
    """Inside, kernel choices are looked up in and written to `path` (default: this host's file)."""
    store = KernelChoices(path or kernel_choices_path())
    _ACTIVE.append(store)
    try:
        yield store
    finally:
        _ACTIVE.remove(store)
        if store.hits or store.misses:
            log.info("kernel choices: %d reused, %d timed (%s)", store.hits, store.misses, store.path)
