"""The env shells every logged-data environment shares around its batched core, written once.

The logged-data envs (evaluation and interaction mode, :mod:`fedrec.envs.datasets.environments`)
and the Taobao env keep their users in a *core* that steps many slots with numpy; the single env
is a core with one slot. What wraps a core is the same for all of them:

* :class:`CoreEnvState`: a single env's ``state_dict`` / ``load_state_dict`` (generator, seed,
  the core's state and the env's own entries) and its observation (the core's slot 0);
* :class:`AutoresetVectorEnv`: a native vector env's constructor tail, ``reset`` and the
  Gymnasium 1.x autoreset around each ``step`` (``NEXT_STEP``, ``SAME_STEP``, ``DISABLED`` with
  ``reset(options={"reset_mask": m})``); the env supplies how episodes start and how the active
  slots step;
* :func:`load_logged_data`: the data set of a logged-data env from its constructor's arguments.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fedrec.envs.datasets.catalog import load_prepared
from fedrec.envs.datasets.preprocess import PreparedData
from fedrec.envs.slates import reject_finished
from fedrec.envs.state import CoreVectorEnvState, StateReader, generator_state
from fedrec.envs.vector_utils import (
    check_render_mode,
    parse_autoreset_mode,
    reset_mask,
    with_masks,
)

Observation = dict[str, np.ndarray]
StepResult = tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


def load_logged_data(
    dataset: str,
    data_dir: str | Path | None,
    min_interactions: int,
    split_seed: int,
    rating_threshold: float | None,
    num_test_negatives: int = 100,
) -> PreparedData:
    """The prepared data set of a logged-data env (single or vector, evaluation or interaction
    mode), from its constructor's arguments of these names.

    The four constructors list these arguments one by one (their signatures are public and
    documented), so only this call is shared; ``num_test_negatives`` is evaluation mode's."""
    return load_prepared(
        dataset,
        data_dir,
        min_interactions=min_interactions,
        rating_threshold=rating_threshold,
        num_test_negatives=num_test_negatives,
        seed=split_seed,
    )


class CoreEnvState:
    """``state_dict`` / ``load_state_dict`` and the observation of a single env over a core.

    The state is the env's generator and seed, the core's own state (``core.state_dict()``,
    ``core.read_state(reader)`` to validate, ``core.set_state(value)`` to apply) and the env's
    entries named in :attr:`OWN_STATE` (kept as attribute ``_name``), in that order.
    """

    #: the env's own state entries, in order: name -> how :class:`StateReader` reads it
    #: (``"bool"``, ``"float"`` or ``"raw"``); each is kept as attribute ``_name``
    OWN_STATE: dict[str, str] = {}

    def _state_core(self) -> Any:
        return self._core

    def _set_render_mode(self, render_mode: str | None) -> None:
        """Keep ``render_mode`` if ``metadata["render_modes"]`` lists it (or it is None)."""
        check_render_mode(render_mode, self.metadata)
        self.render_mode = render_mode

    def _saved(self, name: str, kind: str) -> Any:
        """Entry ``name`` of :meth:`state_dict` (a ``"raw"`` one needs an override)."""
        return {"bool": bool, "float": float}[kind](getattr(self, f"_{name}"))

    def _checked(self, read: StateReader, checked: dict[str, Any]) -> dict[str, Any]:
        """Checks of the own entries beyond the reader's (run after :meth:`StateReader.finish`)."""
        return checked

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        return {
            "np_random": generator_state(self._np_random),
            "np_random_seed": self._np_random_seed,
            "core": self._state_core().state_dict(),
            **{name: self._saved(name, kind) for name, kind in self.OWN_STATE.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments (the data set is
        not part of the state). The whole state is checked first (``ValueError``; no change)."""
        core = self._state_core()
        read = StateReader(state, type(self).__name__)
        checked = {
            "np_random": read.generator(),
            "np_random_seed": read.seed(),
            "core": core.read_state(StateReader(read.dict("core"), f"{read.who} core")),
            **{name: getattr(read, kind)(name) for name, kind in self.OWN_STATE.items()},
        }
        read.finish()
        checked = self._checked(read, checked)
        core.set_state(checked.pop("core"))
        for name, value in checked.items():  # np_random, np_random_seed and the own entries
            setattr(self, f"_{name}", value)

    def _observation(self) -> Observation:
        return {key: value[0] for key, value in self._state_core().observation().items()}


class AutoresetVectorEnv(CoreVectorEnvState, VectorEnv, abc.ABC):
    """A native vector env over a core: constructor tail, ``reset`` and autoreset around ``step``.

    A subclass's constructor checks its arguments (``check_vector_args``), loads its data, calls
    :meth:`_vector_setup`, builds its core and calls :meth:`_vector_spaces`. It supplies
    :meth:`_start_episodes` (unless its core has a user sweep: ``shuffle`` and ``assign``),
    :meth:`_restart` (likewise) and :meth:`_step_active`. :attr:`FINISHED_MASK` names the mask
    (one of ``STATE_MASKS``) that marks the envs ``DISABLED`` autoreset refuses to step.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}
    FINISHED_MASK = "autoreset"

    def _vector_setup(self, num_envs: int, autoreset_mode: AutoresetMode | str) -> None:
        self.num_envs = num_envs
        self.render_mode = None
        self.metadata = {
            **type(self).metadata,
            "autoreset_mode": parse_autoreset_mode(autoreset_mode),
        }

    def _vector_spaces(
        self, single_observation: spaces.Space, single_action: spaces.Space, action: spaces.Space
    ) -> None:
        self.single_observation_space = single_observation
        self.single_action_space = single_action
        self.observation_space = batch_space(single_observation, self.num_envs)
        self.action_space = action
        for name in self.STATE_MASKS:
            setattr(self, f"_{name}", np.zeros(self.num_envs, dtype=bool))
        self._started = False

    def _start_episodes(self, mask: np.ndarray, users: Any, seed: int | None) -> None:
        """Start episodes in the ``mask`` slots: ``users`` (``options["users"]``), else the next
        users of the core's sweep, reshuffled on a seeded or the first reset."""
        core = self._state_core()
        if seed is not None or not self._started:
            core.shuffle(self.np_random)
        core.assign(mask, users)

    def _restart(self, mask: np.ndarray) -> None:
        """Autoreset the ``mask`` slots (``SAME_STEP``): the next users of the sweep."""
        self._state_core().assign(mask)

    @abc.abstractmethod
    def _step_active(
        self, actions: np.ndarray, active: np.ndarray, resetting: np.ndarray | None
    ) -> StepResult:
        """Validate ``actions`` (ignoring the ``resetting`` rows), restart the ``resetting`` slots
        (``NEXT_STEP``) and step the ``active`` ones: rewards, terminated, truncated and the info
        (without Gymnasium's ``_key`` masks)."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        mask = reset_mask(options, self.num_envs, started=self._started)
        self._start_episodes(mask, None if options is None else options.get("users"), seed)
        for name in self.STATE_MASKS:
            getattr(self, f"_{name}")[mask] = False
        self._started = True
        return self._state_core().observation(), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        mode = self.metadata["autoreset_mode"]
        if mode == AutoresetMode.DISABLED:
            reject_finished(getattr(self, f"_{self.FINISHED_MASK}"))
        resetting = self._autoreset.copy() if mode == AutoresetMode.NEXT_STEP else None
        active = np.ones(self.num_envs, bool) if resetting is None else ~resetting
        rewards, terminated, truncated, info = self._step_active(actions, active, resetting)
        info = with_masks(info, self.num_envs, active)
        done = terminated | truncated
        core = self._state_core()
        if mode == AutoresetMode.SAME_STEP and done.any():
            info["final_obs"] = core.observation()
            info["_final_obs"] = done.copy()
            info["final_info"] = {
                k: v for k, v in info.items() if not k.startswith(("final", "_final"))
            }
            info["_final_info"] = done.copy()
            self._restart(done)
        elif mode == AutoresetMode.NEXT_STEP:
            self._autoreset = done
        elif mode == AutoresetMode.DISABLED:  # refuse to step them until reset()
            setattr(self, f"_{self.FINISHED_MASK}", done)
        return core.observation(), rewards, terminated, truncated, info
