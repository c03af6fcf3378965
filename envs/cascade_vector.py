"""Native batched cascade clicks: many users in one NumPy operation (a Gymnasium ``VectorEnv``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fedrec.envs.cascade import Observation, observation_space
from fedrec.envs.cascade_model import (
    HIDDEN_STATE_KEYS,
    CascadeSimulator,
    attraction_probabilities,
    make_params,
)
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.slates import SlateBatchSpace, SlateSpace, reject_finished, validate_slates
from fedrec.envs.state import StateReader, generator_state
from fedrec.envs.vector_utils import (
    check_vector_args,
    parse_autoreset_mode,
    reset_mask,
    with_masks,
)


class ChocKaleCascadeVectorEnv(VectorEnv):
    """``num_envs`` independent cascade-click users, stepped together.

    The dynamics and parameters of :class:`fedrec.envs.cascade.ChocKaleCascadeEnv` (see its
    card), simulated for all users by :class:`fedrec.envs.cascade_model.CascadeSimulator`; with
    ``num_envs=1`` and the same seed it reproduces the single env exactly.

    :param num_envs: number of users.
    :param autoreset_mode: ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (Gymnasium 1.x
        semantics). With ``DISABLED``, stepping a finished user before
        ``reset(options={"reset_mask": ...})`` raises
        :class:`~fedrec.envs.slates.FinishedEpisodeError` (a ``ValueError``).
    :param max_episode_steps: optional truncation (``gymnasium.make_vec`` passes the EnvSpec's).
    :param kwargs: any :class:`~fedrec.envs.cascade_model.CascadeParams` field.

    Every action is validated in full before the env changes or draws anything.
    """

    metadata = {
        "render_modes": [],
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        HIDDEN_INFO_KEYS: HIDDEN_STATE_KEYS,
    }

    def __init__(
        self,
        num_envs: int = 1,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        check_vector_args(num_envs, render_mode, max_episode_steps, who="ChocKaleCascadeVectorEnv")
        self.params = make_params(kwargs)
        self.num_envs = num_envs
        self.render_mode = None
        self.max_episode_steps = max_episode_steps
        self.metadata = {
            **type(self).metadata,
            "autoreset_mode": parse_autoreset_mode(autoreset_mode),
        }
        p = self.params
        self.single_observation_space = observation_space(p)
        self.single_action_space = SlateSpace(p.num_candidates, p.slate_size)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = SlateBatchSpace(p.num_candidates, p.slate_size, num_envs)
        self._sim = CascadeSimulator(p, num_users=num_envs)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._started = False

    def attraction_probabilities(self, features: np.ndarray) -> np.ndarray:
        """This env's attraction probability of items with ``features`` (any shape)."""
        return attraction_probabilities(features, self.params.attraction_coefficients)

    @property
    def autoreset_mode(self) -> AutoresetMode:
        return self.metadata["autoreset_mode"]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        mask = reset_mask(options, self.num_envs, started=self._started)
        self._sim.reset(self.np_random, None if mask.all() else mask)
        self._steps[mask] = 0
        self._autoreset[mask] = False
        self._started = True
        return self._sim.observation(), self._info(np.full(self.num_envs, -1))

    def step(
        self, actions: np.ndarray
    ) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        p, sim, mode = self.params, self._sim, self.autoreset_mode
        if mode == AutoresetMode.DISABLED:
            reject_finished(self._autoreset)
        resetting = self._autoreset if mode == AutoresetMode.NEXT_STEP else None
        if resetting is not None and not resetting.any():
            resetting = None
        slates = validate_slates(
            actions,
            num_candidates=p.num_candidates,
            slate_size=p.slate_size,
            batch_size=self.num_envs,
            who="slates",
            ignore=resetting,
        )
        active = None
        if resetting is not None:
            sim.reset(self.np_random, resetting)
            self._steps[resetting] = 0
            active = ~resetting
        clicked_slot, stepped = sim.step(self.np_random, slates, active)
        self._steps += stepped
        rewards = (clicked_slot >= 0).astype(np.float64)
        terminated = stepped & (sim.budget <= 0)
        truncated = np.zeros(self.num_envs, dtype=bool)
        if self.max_episode_steps is not None:
            truncated = stepped & ~terminated & (self._steps >= self.max_episode_steps)
        done = terminated | truncated
        info = self._info(clicked_slot)
        if mode == AutoresetMode.SAME_STEP and done.any():
            info["final_obs"] = sim.observation()
            info["_final_obs"] = done.copy()
            info["final_info"] = self._info(clicked_slot)
            info["_final_info"] = done.copy()
            sim.reset(self.np_random, done)
            self._steps[done] = 0
            info.update(self._info(np.where(done, -1, clicked_slot)))
        elif mode != AutoresetMode.SAME_STEP:
            self._autoreset = done
        return sim.observation(), rewards, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        return {
            "np_random": generator_state(self._np_random),
            "np_random_seed": self._np_random_seed,
            "simulator": self._sim.state_dict(),
            "steps": self._steps.copy(),
            "autoreset": self._autoreset.copy(),
            "started": bool(self._started),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments (checked first)."""
        read = StateReader(state, type(self).__name__)
        hint = f"num_envs={self.num_envs}"
        rng = read.generator()
        seed = read.seed()
        simulator = read.dict("simulator")
        steps = read.array("steps", (self.num_envs,), np.int64, hint=hint)
        autoreset = read.array("autoreset", (self.num_envs,), bool, hint=hint)
        started = read.bool("started")
        read.finish()
        self._sim.load_state_dict(simulator)
        self._np_random, self._np_random_seed = rng, seed
        self._steps = steps
        self._autoreset = autoreset
        self._started = started

    def _info(self, clicked_slot: np.ndarray) -> dict[str, Any]:
        info = self._sim.oracle_state()
        info["clicked_slot"] = clicked_slot
        return with_masks(info, self.num_envs)
