"""Interaction mode of the logged-data environments: replay a user's log as slate recommendation.

An episode is a user; each step offers candidates and the user consumes the slate's item the log
shows earliest. The single env and the native vector env step the same batched core
(:mod:`fedrec.envs.datasets.logged_interaction_core`) through one step function
(:class:`_InteractionStepper`), so ``num_envs=1`` reproduces the single env exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from fedrec.envs.datasets.core_envs import (
    AutoresetVectorEnv,
    CoreEnvState,
    Observation,
    StepResult,
    load_logged_data,
)
from fedrec.envs.datasets.logged_interaction_core import _InteractionCore
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.slates import SlateBatchSpace, SlateSpace, validate_slates
from fedrec.envs.vector_utils import check_vector_args

#: Interaction mode's hidden info keys: how many logged positives the user has left is what the
#: log holds next, which a deployed recommender cannot know.
INTERACTION_HIDDEN_KEYS = frozenset({"positives_left"})


class _InteractionStepper:
    """Shared step logic for the single and vector interaction envs (no loop over slots)."""

    core: _InteractionCore
    max_steps: int | None

    def _state_core(self) -> _InteractionCore:
        return self.core

    def _step_slots(
        self,
        rng: np.random.Generator,
        slates: np.ndarray,
        active: np.ndarray,
        fresh: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Step the ``active`` slots, then draw candidates (one batched draw) for those still
        running and for the ``fresh`` ones (just reset with ``draw=False``)."""
        core = self.core
        b = core.num_envs
        everyone = bool(active.all())
        slots = np.arange(b) if everyone else np.flatnonzero(active)
        consumed_slot, consumed_item = core.respond(slots, slates if everyone else slates[slots])
        rating, stamp = core.logged(slots, consumed_item)
        core.steps[slots] += 1
        ended = core.exhausted(slots)
        if fresh is None and everyone:
            core.draw_candidates(rng, np.flatnonzero(~ended))
        else:
            redraw = np.zeros(b, dtype=bool) if fresh is None else fresh.copy()
            redraw[slots[~ended]] = True
            core.draw_candidates(rng, np.flatnonzero(redraw))
        truncated = np.zeros(len(slots), dtype=bool)
        if self.max_steps is not None:
            truncated = ~ended & (core.steps[slots] >= self.max_steps)
        columns = {  # name: (values of the stepped slots, value for the others)
            "consumed_slot": (consumed_slot, -1),
            "consumed_item": (consumed_item, -1),
            "logged_timestamp": (stamp, -1),
            "positives_left": (core.positives_left[slots], 0),
        }
        if core.has_ratings:
            columns["logged_rating"] = (rating, 0.0)
        columns["rewards"] = ((consumed_slot >= 0).astype(np.float64), 0.0)
        columns["terminated"] = (ended, False)
        columns["truncated"] = (truncated, False)
        out = {}
        for key, (values, fill) in columns.items():
            if everyone:
                out[key] = values
            else:  # slots not stepped (being autoreset): no reward, not done
                out[key] = np.full(b, fill, dtype=values.dtype)
                out[key][slots] = values
        rewards, terminated, truncated = (
            out.pop(k) for k in ("rewards", "terminated", "truncated")
        )
        return rewards, terminated, truncated, out


_STATE_CARD = """
    ## Saving and restoring
    ``state_dict()`` returns what changes while the env runs (the generator state, the users'
    sweep or episode progress, step and autoreset bookkeeping) as plain data, and
    ``load_state_dict(state)`` restores it into an env built with the same arguments; the data set
    is not part of it (it is rebuilt from the arguments). See :mod:`fedrec.envs.state`.
    """


_INTERACTION_ARGS = """``dataset``, ``data_dir=None``, ``num_candidates=20``, ``slate_size=5``,
    ``positives_per_step=2`` (None: candidates uniform over the unrecommended items),
    ``max_steps=50`` (truncation; None for none), ``split="train"`` (``"all"`` includes the
    held-out items), ``min_interactions=5``, ``split_seed=0``, ``rating_threshold=None``."""


class LoggedInteractionEnv(_InteractionStepper, CoreEnvState, gym.Env[Observation, np.ndarray]):
    # built from shared parts, so assigned: a concatenation is not a docstring
    __doc__ = (
        r"""Replay a logged data set as slate recommendation: an episode is a user.

    ## Description
    At reset a user is drawn (uniformly, from ``self.np_random``). Each step offers
    ``num_candidates`` items that have not been recommended to this user yet: up to
    ``positives_per_step`` of the user's logged positives (not yet recommended) and the rest
    other items, in random order. The agent recommends a slate of ``slate_size`` of them.
    **Choice rule:** the user consumes, among the slate's items that are logged positives, the
    one the log shows *earliest* (chronological order, file order on ties), i.e. the next
    interaction the log would replay; if the slate holds none, nothing is consumed. Every
    slate item counts as recommended and is never offered again in the episode.

    ## Action Space
    ``SlateSpace(num_candidates, slate_size)``: distinct indices into ``candidate_ids``.

    ## Observation Space
    | key | shape | meaning |
    |---|---|---|
    | ``user_id`` | (1,) int64 | remapped user id |
    | ``user_features`` | (du,) float32 | public user features, only where the data set has them |
    | ``candidate_ids`` | (N,) int64 | remapped item ids |
    | ``candidate_features`` | (N, di) float32 | item features, only where available |
    | ``last_slate`` | (n,) int64 | item ids of the previous slate (-1 before the first step) |
    | ``last_click`` | (n,) float32 | one-hot consumed slot of the previous slate |

    ## Rewards
    1.0 when an item is consumed, else 0.0.

    ## Starting State
    A uniformly drawn user (``options={"user": u}`` picks one) with nothing recommended yet.

    ## Episode End
    Terminates when every logged positive of the user has been recommended, or fewer than
    ``num_candidates`` unrecommended items remain; truncated after ``max_steps`` steps.

    ## Info
    ``consumed_slot`` / ``consumed_item`` (-1 for none), ``logged_timestamp`` (-1 for none),
    ``logged_rating`` (0.0 for none; only for data sets with ratings), ``positives_left``. These data sets have no logging
    policy, so there is no logged action or propensity (the Taobao env has them, under Open
    Bandit Pipeline's keys).

    ``positives_left`` (the user's logged positives not yet recommended) is **hidden**
    (``metadata["hidden_info_keys"]``): it tells what the log holds next, which a deployed
    recommender cannot know; fedrec's loops, rollouts and SB3 adapters strip it for every agent
    that is not an oracle. The other keys are the response to the agent's own slate (which item
    was consumed, and when and how the log rated it), as a deployed recommender would see it.

    ## Arguments
    """
        + _INTERACTION_ARGS
        + """

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B)`` returns :class:`LoggedInteractionVectorEnv`, which
    steps all ``B`` users with numpy (no Python loop over users). This env runs the same
    batched core with one slot, so ``num_envs=1`` reproduces it exactly for the same seed.
    """
        + _STATE_CARD
    )

    metadata = {
        "render_modes": ["ansi"],
        "render_fps": 4,
        HIDDEN_INFO_KEYS: INTERACTION_HIDDEN_KEYS,
    }
    OWN_STATE = {"done": "bool", "reward": "float"}

    def __init__(
        self,
        dataset: str,
        *,
        data_dir: str | Path | None = None,
        num_candidates: int = 20,
        slate_size: int = 5,
        positives_per_step: int | None = 2,
        max_steps: int | None = 50,
        split: Literal["train", "all"] = "train",
        min_interactions: int = 5,
        split_seed: int = 0,
        rating_threshold: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        self._set_render_mode(render_mode)
        self.data = load_logged_data(
            dataset, data_dir, min_interactions, split_seed, rating_threshold
        )
        self.max_steps = max_steps
        self.core = _InteractionCore(
            self.data,
            num_envs=1,
            num_candidates=num_candidates,
            slate_size=slate_size,
            positives_per_step=positives_per_step,
            split=split,
        )
        self.observation_space = self.core.observation_space()
        self.action_space = SlateSpace(num_candidates, slate_size)
        self._done = True
        self._reward = 0.0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        user = None if options is None else options.get("user")
        slot = np.zeros(1, dtype=np.int64)
        self.core.reset_slots(self.np_random, slot, None if user is None else [user])
        self._done = False
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        slate = validate_slates(
            action, num_candidates=self.core.num_candidates, slate_size=self.core.slate_size
        )
        rewards, terminated, truncated, info = self._step_slots(
            self.np_random, slate[None], np.ones(1, bool)
        )
        self._done = bool(terminated[0] or truncated[0])
        self._reward = float(rewards[0])
        single = {key: value[0].item() for key, value in info.items()}
        return self._observation(), self._reward, bool(terminated[0]), bool(truncated[0]), single

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        core = self.core
        return (
            f"user {int(core.users[0])} step {int(core.steps[0])} "
            f"last slate {core.last_slate[0].tolist()} clicks {core.last_click[0].tolist()}"
        )


class LoggedInteractionVectorEnv(_InteractionStepper, AutoresetVectorEnv):
    """``num_envs`` interaction-mode users stepped together (card: :class:`LoggedInteractionEnv`).

    With ``num_envs=1`` and the same seed it reproduces the single env exactly. Autoreset follows
    Gymnasium 1.x (``NEXT_STEP`` default, ``SAME_STEP``, ``DISABLED`` with ``reset_mask``);
    ``max_episode_steps`` (from ``make_vec``) overrides ``max_steps``.
    ``state_dict()`` / ``load_state_dict(state)`` save and restore its dynamic state as plain data.
    """

    metadata = {**AutoresetVectorEnv.metadata, HIDDEN_INFO_KEYS: INTERACTION_HIDDEN_KEYS}

    # :class:`LoggedInteractionEnv`'s arguments again, listed rather than taken as
    # ``**kwargs``: the constructors' signatures are public, documented and introspected.
    def __init__(
        self,
        num_envs: int = 1,
        dataset: str = "ml-100k",
        *,
        data_dir: str | Path | None = None,
        num_candidates: int = 20,
        slate_size: int = 5,
        positives_per_step: int | None = 2,
        max_steps: int | None = 50,
        split: Literal["train", "all"] = "train",
        min_interactions: int = 5,
        split_seed: int = 0,
        rating_threshold: float | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        check_vector_args(num_envs, render_mode, max_episode_steps, who=type(self).__name__)
        self.data = load_logged_data(
            dataset, data_dir, min_interactions, split_seed, rating_threshold
        )
        self._vector_setup(num_envs, autoreset_mode)
        self.max_steps = max_episode_steps if max_episode_steps is not None else max_steps
        self.core = _InteractionCore(
            self.data,
            num_envs=num_envs,
            num_candidates=num_candidates,
            slate_size=slate_size,
            positives_per_step=positives_per_step,
            split=split,
        )
        self._vector_spaces(
            self.core.observation_space(),
            SlateSpace(num_candidates, slate_size),
            SlateBatchSpace(num_candidates, slate_size, num_envs),
        )

    def _start_episodes(self, mask: np.ndarray, users: Any, seed: int | None) -> None:
        self.core.reset_slots(self.np_random, np.flatnonzero(mask), users)

    def _restart(self, mask: np.ndarray) -> None:
        self.core.reset_slots(self.np_random, np.flatnonzero(mask))

    def _step_active(
        self, actions: np.ndarray, active: np.ndarray, resetting: np.ndarray | None
    ) -> StepResult:
        # the whole action is checked before anything changes (the resetting rows are ignored)
        slates = validate_slates(
            actions,
            num_candidates=self.core.num_candidates,
            slate_size=self.core.slate_size,
            batch_size=self.num_envs,
            who="slates",
            ignore=resetting,
        )
        if resetting is not None and resetting.any():  # their candidates come with the step's
            self.core.reset_slots(self.np_random, np.flatnonzero(resetting), draw=False)
        return self._step_slots(self.np_random, slates, active, fresh=resetting)
