"""Native batched Choc-vs-Kale: many users in one NumPy operation (a Gymnasium ``VectorEnv``)."""

from __future__ import annotations

import numpy as np

from fedrec.envs.choc_kale import Observation, observation_space
from fedrec.envs.choc_kale_model import make_params
from fedrec.envs.choc_kale_sim import HIDDEN_STATE_KEYS, ChocKaleSimulator
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.vector_utils import SimulatorVectorEnv


class ChocKaleVectorEnv(SimulatorVectorEnv):
    """``num_envs`` independent Choc-vs-Kale users, stepped together.

    The same dynamics and parameters as :class:`fedrec.envs.choc_kale.ChocKaleEnv` (see its card),
    simulated for all users by :class:`fedrec.envs.choc_kale_sim.ChocKaleSimulator` with whole-array
    operations; with ``num_envs=1`` and the same seed it reproduces the single env exactly.

    The constructor's ``**kwargs`` are
    :class:`~fedrec.envs.choc_kale_model.ChocKaleParams` fields; its other
    arguments, autoreset, validation and saving are those of
    :class:`~fedrec.envs.vector_utils.SimulatorVectorEnv`.
    """

    metadata = {**SimulatorVectorEnv.metadata, HIDDEN_INFO_KEYS: HIDDEN_STATE_KEYS}
    _params_from = staticmethod(make_params)
    _observation_space_of = staticmethod(observation_space)
    _simulator_class = ChocKaleSimulator

    def _advance(
        self, slates: np.ndarray, active: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        outcome = self._sim.visit(self.np_random, 0, slates, active)
        return outcome.visited, outcome.engagement, outcome.clicked_slot

    def _observation(self) -> Observation:
        return self._sim.observation(self.np_random)  # draws the satisfaction noise
