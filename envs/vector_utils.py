"""Checks and helpers shared by fedrec's native batched (``gymnasium.vector.VectorEnv``) envs,
and :class:`SimulatorVectorEnv`, the shell of the simulator-backed ones; also
:func:`check_render_mode`, the single envs' constructor check."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fedrec.envs.slates import SlateBatchSpace, SlateSpace, reject_finished, validate_slates
from fedrec.envs.state import StateReader, generator_state


def parse_autoreset_mode(value: AutoresetMode | str) -> AutoresetMode:
    """The Gymnasium autoreset mode named by ``value``, or a ValueError listing the valid ones."""
    try:
        return AutoresetMode(value)
    except ValueError as error:
        valid = [mode.value for mode in AutoresetMode]
        raise ValueError(f"autoreset_mode must be one of {valid}, got {value!r}") from error


def check_render_mode(render_mode: str | None, metadata: dict[str, Any]) -> None:
    """Refuse a ``render_mode`` that ``metadata["render_modes"]`` does not list (None is fine)."""
    if render_mode is not None and render_mode not in metadata["render_modes"]:
        raise ValueError(f"render_mode must be one of {metadata['render_modes']} or None")


def check_vector_args(
    num_envs: object, render_mode: str | None, max_episode_steps: int | None, *, who: str
) -> None:
    """Validate the constructor arguments every batched env takes."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    if render_mode is not None:
        raise ValueError(f"{who} does not render; use the single env with render_mode='ansi'")
    if max_episode_steps is not None and max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps}")


def reset_mask(options: dict[str, Any] | None, num_envs: int, *, started: bool) -> np.ndarray:
    """Which envs a ``reset(options=...)`` resets: ``options["reset_mask"]`` or all of them."""
    mask = None if options is None else options.get("reset_mask")
    if mask is None:
        return np.ones(num_envs, dtype=bool)
    mask = np.asarray(mask)
    if mask.dtype != np.bool_ or mask.shape != (num_envs,):
        raise ValueError(f"reset_mask must be a bool array of shape ({num_envs},)")
    if not started and not mask.all():
        raise ValueError("the first reset must reset every env (omit reset_mask)")
    return mask


def with_masks(
    info: dict[str, Any], num_envs: int, present: np.ndarray | None = None
) -> dict[str, Any]:
    """Add Gymnasium's ``_key`` masks: every entry present for the envs in ``present`` (all)."""
    mask = np.ones(num_envs, dtype=bool) if present is None else present
    return {**info, **{f"_{key}": mask.copy() for key in info}}


class SimulatorVectorEnv(VectorEnv, abc.ABC):
    """A native batched slate env over a simulator of ``num_envs`` users, written once.

    The Choc-vs-Kale, cascade and interest-evolution vector envs share all but their dynamics:
    the constructor, ``reset`` (with ``options={"reset_mask": m}``), Gymnasium 1.x autoreset
    around each ``step``, ``max_episode_steps`` truncation, the info (the simulator's
    ``oracle_state()`` and ``clicked_slot``, with ``_key`` masks) and ``state_dict`` /
    ``load_state_dict``. A subclass names its parameters (:attr:`_params_from`), spaces
    (:attr:`_observation_space_of`) and simulator (:attr:`_simulator_class`: ``reset(rng,
    mask)``, ``observation()``, ``oracle_state()``, ``budget``, ``state_dict()`` /
    ``load_state_dict()``) and supplies :meth:`_advance`.

    :param num_envs: number of users.
    :param autoreset_mode: ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (Gymnasium 1.x
        semantics; declared in ``metadata["autoreset_mode"]``). With ``DISABLED``, stepping a
        user whose episode has ended before ``reset(options={"reset_mask": ...})`` raises
        :class:`~fedrec.envs.slates.FinishedEpisodeError` (a ``ValueError``).
    :param max_episode_steps: optional truncation (``gymnasium.make_vec`` passes the EnvSpec's
        value); episodes otherwise end by termination when the user's budget is spent.
    :param kwargs: any field of the env's parameters.

    Every action is validated in full (:func:`~fedrec.envs.slates.validate_slates`) before the
    env changes or draws anything, so a rejected step (``ValueError``) leaves it as it was.

    ``state_dict()`` / ``load_state_dict(state)`` save and restore the generator, every user's
    state (through the simulator's own methods), step counters and autoreset flags as plain data
    (see :mod:`fedrec.envs.state`), for an exact resume without pickling.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}
    #: the parameters from the constructor's keyword arguments (the model's ``make_params``)
    _params_from: Callable[[dict[str, Any]], Any]
    #: the per-user observation space of the parameters
    _observation_space_of: Callable[[Any], spaces.Space]
    #: the simulator class, built as ``_simulator_class(params, num_users=num_envs)``
    _simulator_class: Callable[..., Any]

    def __init__(
        self,
        num_envs: int = 1,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        check_vector_args(num_envs, render_mode, max_episode_steps, who=type(self).__name__)
        self.params = p = type(self)._params_from(kwargs)
        self.num_envs = num_envs
        self.render_mode = None
        self.max_episode_steps = max_episode_steps
        self.metadata = {
            **type(self).metadata,
            "autoreset_mode": parse_autoreset_mode(autoreset_mode),
        }
        self.single_observation_space = type(self)._observation_space_of(p)
        self.single_action_space = SlateSpace(p.num_candidates, p.slate_size)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = SlateBatchSpace(p.num_candidates, p.slate_size, num_envs)
        self._sim = type(self)._simulator_class(p, num_users=num_envs)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._started = False

    @property
    def autoreset_mode(self) -> AutoresetMode:
        return self.metadata["autoreset_mode"]

    @abc.abstractmethod
    def _advance(
        self, slates: np.ndarray, active: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step the ``active`` users (all when None) with validated ``slates``: which users
        stepped, their rewards and their clicked slots (-1 for none)."""

    def _observation(self) -> dict[str, np.ndarray]:
        """The batched observation (an override may draw from ``self.np_random``)."""
        return self._sim.observation()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        mask = reset_mask(options, self.num_envs, started=self._started)
        self._sim.reset(self.np_random, None if mask.all() else mask)
        self._steps[mask] = 0
        self._autoreset[mask] = False
        self._started = True
        return self._observation(), self._info(np.full(self.num_envs, -1))

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        p, sim, mode = self.params, self._sim, self.autoreset_mode
        if mode == AutoresetMode.DISABLED:
            reject_finished(self._autoreset)
        # Gymnasium NEXT_STEP: users whose episode ended last step are reset, their actions ignored.
        resetting = self._autoreset if mode == AutoresetMode.NEXT_STEP else None
        if resetting is not None and not resetting.any():
            resetting = None
        # The whole action is checked before anything changes or any number is drawn.
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
        stepped, rewards, clicked_slot = self._advance(slates, active)
        self._steps += stepped
        terminated = stepped & (sim.budget <= 0)
        truncated = np.zeros(self.num_envs, dtype=bool)
        if self.max_episode_steps is not None:
            truncated = stepped & ~terminated & (self._steps >= self.max_episode_steps)
        done = terminated | truncated
        info = self._info(clicked_slot)
        if mode == AutoresetMode.SAME_STEP and done.any():
            info["final_obs"] = self._observation()
            info["_final_obs"] = done.copy()
            info["final_info"] = self._info(clicked_slot)
            info["_final_info"] = done.copy()
            sim.reset(self.np_random, done)
            self._steps[done] = 0
            info.update(self._info(np.where(done, -1, clicked_slot)))
        elif mode != AutoresetMode.SAME_STEP:
            # NEXT_STEP: reset at the next step; DISABLED: refuse to step them until reset()
            self._autoreset = done
        return self._observation(), rewards, terminated, truncated, info

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
        """Restore :meth:`state_dict` into an env built with the same arguments.

        The whole state is checked first (``ValueError`` naming the problem; nothing changes).
        """
        read = StateReader(state, type(self).__name__)
        hint = f"num_envs={self.num_envs}"
        rng = read.generator()
        seed = read.seed()
        simulator = read.dict("simulator")
        steps = read.array("steps", (self.num_envs,), np.int64, hint=hint)
        autoreset = read.array("autoreset", (self.num_envs,), bool, hint=hint)
        started = read.bool("started")
        read.finish()
        self._sim.load_state_dict(simulator)  # checks before it changes anything
        self._np_random, self._np_random_seed = rng, seed
        self._steps = steps
        self._autoreset = autoreset
        self._started = started

    def _info(self, clicked_slot: np.ndarray) -> dict[str, Any]:
        info = self._sim.oracle_state()
        info["clicked_slot"] = clicked_slot
        return with_masks(info, self.num_envs)
