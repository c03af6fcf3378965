"""What an *offline* slate agent adds to the slate-agent interface: it learns from a fixed logged
dataset, never from its own interaction.

An offline agent (``bc``, ``cql_slateq``) is a :class:`fedrec.agents.base.SlateAgent` that also
mixes in :class:`OfflineLearner`. The offline trainer (:mod:`fedrec.train.offline`) hands it the
whole dataset once as a dict of arrays (:data:`DATASET_KEYS`, one row per logged transition),
first to :meth:`OfflineLearner.prepare` (statistics of the data: input normalisation, reward
scale), then to :meth:`OfflineLearner.offline_step` for each gradient step, which draws its own
minibatch with the agent's random generator (so the agent's ``state_dict`` is everything an
exact resume needs). Acting is the usual ``act_batch``; ``learn`` (online experience) is refused.

Rows of the dataset:

* ``obs/<key>`` and ``next_obs/<key>`` -- every observation key, (M, ...) each;
* ``slate`` -- the logged slate, int64 (M, K);
* ``clicked_slot`` -- the clicked slot, int64 (M,), -1 for no click;
* ``reward`` -- float64 (M,); ``terminated`` / ``truncated`` -- bool (M,).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from fedrec.agents.base import Transitions

#: The non-observation arrays of an offline dataset (see the module doc).
DATASET_KEYS = ("slate", "clicked_slot", "reward", "terminated", "truncated")

OfflineData = Mapping[str, np.ndarray]


def observations_of(data: OfflineData, prefix: str = "obs/") -> dict[str, np.ndarray]:
    """The observation dict (``obs/`` or ``next_obs/`` keys, prefix removed) of ``data``."""
    return {key[len(prefix) :]: value for key, value in data.items() if key.startswith(prefix)}


def minibatch(data: OfflineData, rng: np.random.Generator, size: int) -> dict[str, np.ndarray]:
    """``size`` rows of ``data`` drawn uniformly with replacement with ``rng``."""
    rows = rng.integers(0, len(data["slate"]), size=size)
    return {key: np.asarray(value)[rows] for key, value in data.items()}


class OfflineLearner(abc.ABC):
    """Mixin of the offline agents: learn from a logged dataset (see the module doc)."""

    #: Read by the command line and the offline trainer: this agent trains from ``--dataset``.
    offline: ClassVar[bool] = True

    def prepare(self, data: OfflineData) -> None:
        """Statistics of the whole dataset, before the first gradient step (default: none)."""
        del data

    @abc.abstractmethod
    def offline_step(self, data: OfflineData) -> dict[str, float]:
        """One gradient step on a minibatch of ``data``; returns metrics (``loss`` at least)."""

    def learn(self, transitions: Transitions) -> dict[str, float]:
        del transitions
        raise ValueError(
            f"{type(self).__name__} is an offline agent: it learns from a logged dataset "
            "(fedrec train NAME --dataset PATH; fedrec.train.offline), not from online experience"
        )


def is_offline(cls: type) -> bool:
    """Whether the agent class learns from a logged dataset."""
    return bool(getattr(cls, "offline", False))
