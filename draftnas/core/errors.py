"""One exception hierarchy. The CLI turns any `DraftnasError` into one red line and exit 2.
"""

from __future__ import annotations


class DraftnasError(Exception):
    """Base of every error draftnas raises on purpose (a user's mistake or an unmet need)."""


class InvalidInputError(DraftnasError, ValueError):
    """A value outside its allowed range or set (the message names the field and what is allowed)."""


class UnknownTargetError(InvalidInputError):
    """A target/base spec that is no registry name, folder, GGUF file or hub id."""


class ModelSourceError(DraftnasError):
    """A model could not be located or loaded (missing package, missing file, offline hub)."""


class DeviceError(DraftnasError):
    """A device was asked for that this machine does not have."""


class ProfileError(DraftnasError):
    """A latency profile is missing, corrupted or of an unknown schema."""


class SearchSpaceError(InvalidInputError):
    """A search space file has one or more invalid fields (all are listed)."""


class PlanError(InvalidInputError):
    """A pruning plan that cannot be applied to its base model."""


class TraceError(DraftnasError):
    """Traces that are missing, corrupted, or do not match the drafter's tokenizer."""


class ExportError(DraftnasError):
    """An export that cannot be written (existing folder without --force, offline push)."""


def check_range(name: str, value: float, low: float, high: float) -> None:
    """Raise `InvalidInputError` unless low <= value <= high."""
    if not (low <= value <= high):
        raise InvalidInputError(f"{name} must be in [{low:g}, {high:g}], got {value:g}")


class InfeasibleCandidateError(PlanError):
    """A point of the search space that gives no usable drafter (pruned in the study, not crashed)."""
