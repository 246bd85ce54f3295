"""Latency: timing decoder shapes on this device (or in llama.cpp), the fitted latency model, the
shipped profiles.

The public names below load their module on first use (see `draftnas.core.public`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from draftnas.core.public import lazy_exports

_EXPORTS = {
    "ProfileOptions": "records",
    "ProfileRequest": "records",
    "ProfileOutcome": "records",
    "LatencyProfile": "records",
    "profile_from_request": "request",
    "measure_profile": "measure",
    "LatencyModel": "model",
    "load_profile": "files",
    "save_profile": "files",
    "default_profile": "files",
    "SHIPPED_PROFILES": "files",
    "cpu_roofline_profile": "hardware",
    "spec_sheet_profile": "hardware",
    "host_cpu_profile": "host_profile",
    "host_mismatch": "host_profile",
}
__all__ = [
    "LatencyModel",
    "LatencyProfile",
    "ProfileOptions",
    "ProfileOutcome",
    "ProfileRequest",
    "SHIPPED_PROFILES",
    "cpu_roofline_profile",
    "default_profile",
    "host_cpu_profile",
    "host_mismatch",
    "load_profile",
    "measure_profile",
    "profile_from_request",
    "save_profile",
    "spec_sheet_profile",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    from draftnas.latency.files import SHIPPED_PROFILES, default_profile, load_profile, save_profile
    from draftnas.latency.hardware import cpu_roofline_profile, spec_sheet_profile
    from draftnas.latency.host_profile import host_cpu_profile, host_mismatch
    from draftnas.latency.measure import measure_profile
    from draftnas.latency.model import LatencyModel
    from draftnas.latency.records import LatencyProfile, ProfileOptions, ProfileOutcome, ProfileRequest
    from draftnas.latency.request import profile_from_request
