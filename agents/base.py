"""The slate-agent interface: what any recommender must implement to run in fedrec's loops.

A slate agent maps observations to slates, i.e. arrays of distinct candidate indices. The batched
method is the primary one (environments are batched), and the single-observation method is
derived from it. Learning agents extend this with ``learn``/``state_dict`` (see the SlateQ work);
fixed policies (random, myopic, optimal planner, popularity) need only ``act_batch``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import numpy as np

Observation = Mapping[str, np.ndarray]
Info = Mapping[str, Any]


class SlateAgent(abc.ABC):
    """Recommends slates of ``slate_size`` distinct candidates.

    Subclasses implement :meth:`act_batch`. Observations are the env's Dict observations with a
    leading batch axis (as returned by a vector env); ``infos`` is the env's info dict of arrays.
    """

    #: Number of items per slate.
    slate_size: int

    def __init__(self, *, slate_size: int, seed: int | None = None) -> None:
        if slate_size < 1:
            raise ValueError(f"slate_size must be >= 1, got {slate_size}")
        self.slate_size = slate_size
        self.rng = np.random.default_rng(seed)

    def reset(self, *, seed: int | None = None) -> None:
        """Reseed the agent's own randomness (exploration, tie-breaking)."""
        self.rng = np.random.default_rng(seed)

    @abc.abstractmethod
    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        """Slates for a batch of observations: int64 array of shape (B, slate_size)."""

    def act(self, observation: Observation, *, info: Info | None = None) -> np.ndarray:
        """The slate for one (unbatched) observation: int64 array of shape (slate_size,)."""
        batch = {key: np.asarray(value)[None] for key, value in observation.items()}
        batched_info = None
        if info is not None:
            batched_info = {key: np.asarray(value)[None] for key, value in info.items()}
        return self.act_batch(batch, infos=batched_info)[0]


def batch_size_of(observations: Observation) -> int:
    """Number of users in a batched observation (leading axis of its ``candidates``)."""
    return int(np.asarray(observations["candidates"]).shape[0])
