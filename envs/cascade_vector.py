"""Native batched cascade clicks: many users in one NumPy operation (a Gymnasium ``VectorEnv``)."""

from __future__ import annotations

import numpy as np

from fedrec.envs.cascade import observation_space
from fedrec.envs.cascade_model import (
    HIDDEN_STATE_KEYS,
    CascadeSimulator,
    attraction_probabilities,
    make_params,
)
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.vector_utils import SimulatorVectorEnv


class ChocKaleCascadeVectorEnv(SimulatorVectorEnv):
    """``num_envs`` independent cascade-click users, stepped together.

    The dynamics and parameters of :class:`fedrec.envs.cascade.ChocKaleCascadeEnv` (see its
    card), simulated for all users by :class:`fedrec.envs.cascade_model.CascadeSimulator`; with
    ``num_envs=1`` and the same seed it reproduces the single env exactly.

    The constructor's ``**kwargs`` are
    :class:`~fedrec.envs.cascade_model.CascadeParams` fields; its other
    arguments, autoreset, validation and saving are those of
    :class:`~fedrec.envs.vector_utils.SimulatorVectorEnv`.
    """

    metadata = {**SimulatorVectorEnv.metadata, HIDDEN_INFO_KEYS: HIDDEN_STATE_KEYS}
    _params_from = staticmethod(make_params)
    _observation_space_of = staticmethod(observation_space)
    _simulator_class = CascadeSimulator

    def attraction_probabilities(self, features: np.ndarray) -> np.ndarray:
        """This env's attraction probability of items with ``features`` (any shape)."""
        return attraction_probabilities(features, self.params.attraction_coefficients)

    def _advance(
        self, slates: np.ndarray, active: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        clicked_slot, stepped = self._sim.step(self.np_random, slates, active)
        return stepped, (clicked_slot >= 0).astype(np.float64), clicked_slot
