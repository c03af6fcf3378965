"""The slate-agent interface: what any recommender implements to run in fedrec's loops.

A slate agent maps observations to slates, i.e. arrays of distinct candidate indices. The batched
method is the primary one (environments are batched); the single-observation method is derived
from it. The interface has four parts, of which only the first is required:

* ``act_batch`` -- the agent's own (greedy, evaluation) slates;
* ``explore_batch`` -- the behaviour policy while training (default: ``act_batch``);
* ``learn`` -- consume a batch of transitions and update (default: nothing to learn);
* ``state_dict`` / ``load_state_dict`` -- everything needed to resume bit-for-bit (default: the
  agent's random generator state);
* ``begin_episodes`` -- told which users start a new episode, for agents that keep a per-user
  memory across steps (default: nothing to reset). Loops call it after every reset.

Fixed policies (random, myopic, optimal planner, popularity) need only ``act_batch``. To be built
by name from the command line (``fedrec train``), an agent also defines a ``Config`` dataclass
(one field per hyperparameter, with a ``help`` entry in the field metadata) and a
``from_env(env, *, config, seed)`` class method; see ``README.md``, "Plug in your own agent".
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import numpy as np

# Choc-vs-Kale's hidden user state, re-exported: each env declares its own hidden info keys
# (fedrec.envs.hidden), and the loops strip them for every agent that is not an oracle.
from fedrec.envs.choc_kale_sim import HIDDEN_STATE_KEYS as HIDDEN_STATE_KEYS
from fedrec.envs.hidden import strip_hidden

Observation = Mapping[str, np.ndarray]
Info = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Transitions:
    """One vector-env step for B users: ``(s, A, r, s', terminated, truncated)``.

    ``next_observations`` holds the *true* next observation of every user, also where the episode
    ended (the loop takes it from the env's ``final_obs``), so ``terminated`` means "no
    bootstrap" and ``truncated`` means "bootstrap from ``next_observations``".
    """

    observations: Mapping[str, np.ndarray]
    slates: np.ndarray
    rewards: np.ndarray
    next_observations: Mapping[str, np.ndarray]
    terminated: np.ndarray
    truncated: np.ndarray

    @property
    def batch_size(self) -> int:
        return int(self.slates.shape[0])


@dataclasses.dataclass(frozen=True)
class NoConfig:
    """Agents without hyperparameters."""


class SlateAgent(abc.ABC):
    """Recommends slates of ``slate_size`` distinct candidates.

    Subclasses implement :meth:`act_batch`. Observations are the env's Dict observations with a
    leading batch axis (as returned by a vector env); ``infos`` is the env's info dict of arrays.
    """

    #: Hyperparameters, for construction by name (``fedrec train``); a frozen dataclass.
    Config: ClassVar[type] = NoConfig
    #: True only for reference policies that read the user's hidden state from ``infos``
    #: (the keys the env declares hidden, :func:`fedrec.envs.hidden.hidden_info_keys`); every
    #: other agent gets ``infos`` without them, at any depth (:func:`visible_infos`).
    oracle: ClassVar[bool] = False

    #: Number of items per slate.
    slate_size: int

    def __init__(self, *, slate_size: int, seed: int | None = None) -> None:
        if slate_size < 1:
            raise ValueError(f"slate_size must be >= 1, got {slate_size}")
        self.slate_size = slate_size
        self.rng = np.random.default_rng(seed)

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        """Build the agent for ``env`` (a Gymnasium env or vector env) with ``config``.

        The default reads the slate size from the env's action space; agents that need more of
        the env (its parameters, its data) override this.
        """
        del config
        return cls(slate_size=slate_size_of(env), seed=seed)

    def reset(self, *, seed: int | None = None) -> None:
        """Reseed the agent's own randomness (exploration, tie-breaking)."""
        self.rng = np.random.default_rng(seed)

    def begin_episodes(self, mask: np.ndarray) -> None:
        """Users ``mask`` (bool, one per user of the batch) start a new episode now.

        Called by the training loop and the evaluation rollouts right after ``reset`` (all users)
        and after every autoreset (the users whose episode just ended), before the next act.
        Stateless agents ignore it; agents with a per-user memory clear those rows.
        """
        del mask

    @abc.abstractmethod
    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        """Slates for a batch of observations: int64 array of shape (B, slate_size)."""

    def explore_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        """Slates of the behaviour policy used while training (e.g. epsilon-greedy)."""
        return self.act_batch(observations, infos=infos)

    def learn(self, transitions: Transitions) -> dict[str, float]:
        """Consume one step of experience for B users; return training metrics (may be empty)."""
        del transitions
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: parameters, optimiser, buffers, RNG states."""
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.rng.bit_generator.state = state["rng"]

    def act(self, observation: Observation, *, info: Info | None = None) -> np.ndarray:
        """The slate for one (unbatched) observation: int64 array of shape (slate_size,)."""
        batch = {key: np.asarray(value)[None] for key, value in observation.items()}
        batched_info = None
        if info is not None:
            batched_info = {key: np.asarray(value)[None] for key, value in info.items()}
        return self.act_batch(batch, infos=batched_info)[0]


def visible_infos(agent: object, infos: Info | None, hidden: Collection[str]) -> Info | None:
    """What of the env's ``infos`` ``agent`` may read: all of it for an oracle, otherwise the info
    without the keys in ``hidden`` (the env's declaration,
    :func:`fedrec.envs.hidden.hidden_info_keys`) and their ``_key`` masks at every depth -- a
    vector env's ``final_info`` included -- so that no learner can read what it should infer."""
    if infos is None or getattr(agent, "oracle", False):
        return infos
    return strip_hidden(infos, hidden)


def slate_size_of(env: Any) -> int:
    """Slate size of a (vector) env, read from its single-user action space."""
    space = getattr(env, "single_action_space", None) or env.action_space
    shape = getattr(space, "shape", None)
    if not shape:
        raise ValueError(f"cannot read a slate size from action space {space!r}")
    return int(shape[-1])


def random_slates(
    rng: np.random.Generator, num_users: int, num_candidates: int, k: int
) -> np.ndarray:
    """Uniformly random slates of k distinct candidates for each of ``num_users`` users."""
    keys = rng.random((num_users, num_candidates))
    return np.argsort(keys, axis=1)[:, :k].astype(np.int64)
