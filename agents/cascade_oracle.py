"""The exact optimal policy of ``fedrec/ChocKaleCascade-v0``: the reference for cascading bandits.

It reads the candidates' true attraction probabilities from the env's info
(``candidate_attraction``, which the env declares hidden) and serves the ``slate_size`` most
attractive candidates, most attractive first (:func:`fedrec.envs.cascade_model.optimal_slates`):
no slate has a higher click probability. It declares ``oracle = True``, so fedrec's loops hand
it the hidden keys that they strip for every learner.
"""

from __future__ import annotations

import numpy as np

from fedrec.agents.base import Info, Observation, SlateAgent
from fedrec.envs.cascade_model import optimal_slates


class CascadeOraclePolicy(SlateAgent):
    """Ranks the candidates by their true attraction probability (the cascade model's optimum)."""

    oracle = True

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        if infos is None or "candidate_attraction" not in infos:
            raise ValueError(
                "CascadeOraclePolicy needs the env's info with 'candidate_attraction' (hidden: "
                "pass infos=info from reset()/step(); fedrec's loops do so for oracles)"
            )
        attraction = np.asarray(infos["candidate_attraction"], dtype=np.float64)
        return optimal_slates(attraction.reshape(len(attraction), -1), self.slate_size)
