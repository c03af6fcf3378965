"""Native batched interest evolution: many users in one NumPy operation (a Gymnasium ``VectorEnv``)."""

from __future__ import annotations

import numpy as np

from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.interest_evolution import observation_space
from fedrec.envs.interest_evolution_model import (
    HIDDEN_STATE_KEYS,
    InterestEvolutionSimulator,
    make_params,
)
from fedrec.envs.vector_utils import SimulatorVectorEnv


class InterestEvolutionVectorEnv(SimulatorVectorEnv):
    """``num_envs`` independent interest-evolution users, stepped together.

    The dynamics and parameters of :class:`fedrec.envs.interest_evolution.InterestEvolutionEnv`
    (see its card), simulated for all users by
    :class:`fedrec.envs.interest_evolution_model.InterestEvolutionSimulator`; with
    ``num_envs=1`` and the same seed it reproduces the single env exactly.

    The constructor's ``**kwargs`` are
    :class:`~fedrec.envs.interest_evolution_model.InterestEvolutionParams` fields; its other
    arguments, autoreset, validation and saving are those of
    :class:`~fedrec.envs.vector_utils.SimulatorVectorEnv`.
    """

    metadata = {**SimulatorVectorEnv.metadata, HIDDEN_INFO_KEYS: HIDDEN_STATE_KEYS}
    _params_from = staticmethod(make_params)
    _observation_space_of = staticmethod(observation_space)
    _simulator_class = InterestEvolutionSimulator

    def _advance(
        self, slates: np.ndarray, active: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        outcome = self._sim.step(self.np_random, slates, active)
        return outcome.stepped, outcome.watch_time, outcome.clicked_slot
