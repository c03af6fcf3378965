"""Shared pytest configuration: Hypothesis profiles for the property-based (fuzz) tests, and
Stable-Baselines3's log folder kept out of the system temp dir.

``HYPOTHESIS_PROFILE=long`` selects the long campaign; the default ``ci`` profile keeps
``make test`` fast and is derandomized (the same examples every run, so CI is reproducible); the
long profile draws new examples every run. Neither keeps an example database (nothing is written
to the working tree).
"""

from __future__ import annotations

import os

import pytest
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


@pytest.fixture(scope="session", autouse=True)
def _sb3_logs_in_the_session_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Stable-Baselines3 models trained directly (tests/test_sb3.py, the example) make an empty
    ``SB3-<date>`` folder in the system temp dir per model unless ``SB3_LOGDIR`` names one: keep
    them in pytest's own temp dir (subprocesses inherit the variable)."""
    os.environ.setdefault("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))
