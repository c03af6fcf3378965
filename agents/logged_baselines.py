"""Non-learning baselines for the logged-data environments: popularity and random rankings."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedrec.agents.base import Info, Observation, SlateAgent, slate_size_of


class RandomAgent(SlateAgent):
    """A uniformly random slate (ranking) of distinct candidates: HR@K = K / num_candidates."""

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        batch, num_candidates = np.asarray(observations["candidate_ids"]).shape
        keys = self.rng.random((batch, num_candidates))
        return np.argsort(keys, axis=1)[:, : self.slate_size].astype(np.int64)


def _candidates(observations: Observation) -> np.ndarray:
    return np.asarray(observations["candidate_ids"], dtype=np.int64)


class PopularityAgent(SlateAgent):
    """Rank candidates by how often each item occurs in the training log (most popular first).

    ``item_counts[i]`` is item ``i``'s number of training positives (e.g.
    ``PreparedData.item_popularity()``); ties are broken uniformly at random by the agent's rng.
    """

    def __init__(
        self, item_counts: np.ndarray, *, slate_size: int, seed: int | None = None
    ) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        self.item_counts = np.asarray(item_counts, dtype=np.float64)

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        """Build for a logged-data env (single or batched): the item counts are its data's
        training positives per item (``PreparedData.item_popularity()``)."""
        del config
        data = getattr(getattr(env, "unwrapped", env), "data", None)
        if data is None or not hasattr(data, "item_popularity"):
            raise ValueError(
                f"{type(env).__name__} has no logged data: the popularity agent needs a "
                "logged-data env (e.g. fedrec/MovieLens100K-v0)"
            )
        return cls(data.item_popularity(), slate_size=slate_size_of(env), seed=seed)

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        candidates = _candidates(observations)
        counts = self.item_counts[candidates]
        tie_break = self.rng.random(candidates.shape)
        order = np.lexsort((tie_break, -counts), axis=1)
        return order[:, : self.slate_size].astype(np.int64)
