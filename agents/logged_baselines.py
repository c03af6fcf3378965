"""Non-learning baselines for the logged-data environments: popularity and random rankings."""

from __future__ import annotations

import numpy as np

from fedrec.agents.base import Info, Observation, SlateAgent


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

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        candidates = _candidates(observations)
        counts = self.item_counts[candidates]
        tie_break = self.rng.random(candidates.shape)
        order = np.lexsort((tie_break, -counts), axis=1)
        return order[:, : self.slate_size].astype(np.int64)
