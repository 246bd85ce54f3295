"""The core: the architecture registry, the throughput model, prompts, options and errors every stage shares.

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "Architecture": "registry",
    "get_architecture": "registry",
    "resolve_architecture": "registry",
    "load_registry": "registry",
    "TargetsRequest": "registry",
    "registered_targets": "registry",
    "ThroughputEstimate": "throughput",
    "PredictRequest": "throughput",
    "predict_from_request": "throughput",
    "predict_throughput": "throughput",
    "best_gamma": "throughput",
    "expected_tokens_per_step": "throughput",
    "Prompt": "prompts",
    "load_prompts": "prompts",
    "option": "options",
    "option_group": "options",
    "check_options": "options",
    "OptionError": "options",
    "DraftnasError": "errors",
    "InvalidInputError": "errors",
}
__all__ = [
    "Architecture",
    "DraftnasError",
    "InvalidInputError",
    "OptionError",
    "PredictRequest",
    "Prompt",
    "TargetsRequest",
    "ThroughputEstimate",
    "best_gamma",
    "check_options",
    "expected_tokens_per_step",
    "get_architecture",
    "load_prompts",
    "load_registry",
    "option",
    "option_group",
    "predict_from_request",
    "predict_throughput",
    "registered_targets",
    "resolve_architecture",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.core.errors import DraftnasError, InvalidInputError
    from draftnas.core.options import OptionError, check_options, option, option_group
    from draftnas.core.prompts import Prompt, load_prompts
    from draftnas.core.registry import (
        Architecture,
        TargetsRequest,
        get_architecture,
        load_registry,
        registered_targets,
        resolve_architecture,
    )
    from draftnas.core.throughput import (
        PredictRequest,
        ThroughputEstimate,
        best_gamma,
        expected_tokens_per_step,
        predict_from_request,
        predict_throughput,
    )
