"""Drafter families declared once (`table`): the model drafter, lookup, the hybrid of the two and the head on
the target's hidden states, each in its own module, registered in `FAMILIES` on import. A new family is one
more module here, its import below and its tests."""

from __future__ import annotations

from draftnas.drafter.families import head, hybrid, lookup, model  # noqa: F401  (registers the families)
from draftnas.drafter.families.table import (
    FAMILIES,
    NOT_RUN,
    DrafterFamily,
    DrafterSpec,
    family,
    parse_drafter,
    register_family,
)

__all__ = ["FAMILIES", "NOT_RUN", "DrafterFamily", "DrafterSpec", "family", "parse_drafter",
           "register_family"]
