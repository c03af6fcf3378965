"""The registered entry points of the logged-data environments: pick the mode's env class.

``gymnasium.make("fedrec/MovieLens100K-v0", mode=...)`` calls :func:`make_logged_env` and
``gymnasium.make_vec`` calls :func:`make_logged_vector_env`, which build the evaluation mode
(:mod:`fedrec.envs.datasets.logged_evaluation`) or the interaction mode
(:mod:`fedrec.envs.datasets.logged_interaction`). This module is also the import path of both
modes' env classes (it re-exports them).
"""

from __future__ import annotations

from typing import Any, Literal

from fedrec.envs.datasets.core_envs import Observation
from fedrec.envs.datasets.logged_evaluation import (
    EVALUATION_HIDDEN_KEYS,
    LoggedEvaluationEnv,
    LoggedEvaluationVectorEnv,
    score_rankings,
)
from fedrec.envs.datasets.logged_interaction import (
    INTERACTION_HIDDEN_KEYS,
    LoggedInteractionEnv,
    LoggedInteractionVectorEnv,
)

__all__ = [
    "EVALUATION_HIDDEN_KEYS",
    "INTERACTION_HIDDEN_KEYS",
    "LoggedEvaluationEnv",
    "LoggedEvaluationVectorEnv",
    "LoggedInteractionEnv",
    "LoggedInteractionVectorEnv",
    "Mode",
    "Observation",
    "make_logged_env",
    "make_logged_vector_env",
    "score_rankings",
]

Mode = Literal["interaction", "evaluation"]


def make_logged_env(
    dataset: str, mode: Mode = "interaction", **kwargs: Any
) -> LoggedInteractionEnv | LoggedEvaluationEnv:
    """The single env of ``dataset`` in ``mode`` ("interaction" or "evaluation")."""
    if mode == "interaction":
        return LoggedInteractionEnv(dataset, **kwargs)
    if mode == "evaluation":
        return LoggedEvaluationEnv(dataset, **kwargs)
    raise ValueError(f"mode must be 'interaction' or 'evaluation', got {mode!r}")


def make_logged_vector_env(
    num_envs: int = 1, *, dataset: str, mode: Mode = "interaction", **kwargs: Any
) -> LoggedInteractionVectorEnv | LoggedEvaluationVectorEnv:
    """The native vector env of ``dataset`` in ``mode`` (the EnvSpec's ``vector_entry_point``)."""
    if mode == "interaction":
        return LoggedInteractionVectorEnv(num_envs, dataset, **kwargs)
    if mode == "evaluation":
        return LoggedEvaluationVectorEnv(num_envs, dataset, **kwargs)
    raise ValueError(f"mode must be 'interaction' or 'evaluation', got {mode!r}")
