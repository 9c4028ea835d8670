"""Suite-wide settings: a hypothesis profile that tolerates a slow 2-core CI machine."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=int(os.environ.get("KVCOMPAT_HYPOTHESIS_EXAMPLES", "100")),
)
settings.load_profile("ci")
