"""Shared pytest configuration: Hypothesis profiles for the property-based (fuzz) tests.

``HYPOTHESIS_PROFILE=long`` selects the long campaign; the default ``ci`` profile keeps
``make test`` fast and is derandomized (the same examples every run, so CI is reproducible); the
long profile draws new examples every run. Neither keeps an example database (nothing is written
to the working tree).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long",
    max_examples=2000,
    deadline=None,
    derandomize=False,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
