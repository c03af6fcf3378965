"""Any single-platform agent on a multi-platform env: one independent copy per platform.

:class:`PerPlatformAgent` runs a :class:`~fedrec.agents.base.SlateAgent` (``rule_search``,
``rule_search_adaptive``, ``ppo``, ``slateq``, your own ``file.py:Class``) on every platform with
feedback, each copy trained on its own platform's observations and rewards only, exactly as it
would be trained alone on a single-platform env. A platform **without feedback** has no reward to
learn from, and nothing crosses a party boundary (there is no server and no channel), so it serves
a fixed no-learning policy (``silent``: random by default). This is the local, non-federated
baseline of every single-platform agent: a federated method has to beat it on the platforms
without feedback, and equal it on the platforms with feedback.

How the multi-platform env is shown to each copy: a platform's observation is exactly a
single-platform observation (``candidates``, the noisy ``user`` satisfaction where the env shows
it, and the platform's own ``response_*`` history), and an episode is that platform's share of the
shared time budget (``time_budget // platforms`` steps: 61 of 122 with two platforms), so a copy is
built by its own ``from_env`` on a :class:`PlatformView` whose ``params.time_budget`` is that
share. The loop's joint steps become the copy's steps; the copy's ``begin_episodes`` runs at every
episode start (training and evaluation alike), and its ``learn`` gets one
:class:`~fedrec.agents.base.Transitions` per joint step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from fedrec.agents.base import SlateAgent, Transitions
from fedrec.agents.multi_platform import (
    MultiPlatformAgent,
    Observations,
    Slates,
    episode_length_of,
)
from fedrec.envs.choc_kale import observation_space
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.envs.slates import SlateSpace
from fedrec.util import parse_key_value

#: No-learning policies a platform without feedback may serve.
SILENT_POLICIES = ("random", "top_x", "bottom_x")


@dataclasses.dataclass(frozen=True)
class PerPlatformConfig:
    agent: str = dataclasses.field(
        default="rule_search",
        metadata={
            "help": "single-platform agent every feedback platform runs: a built-in name "
            "(fedrec train --help lists them), module:Class or path/file.py:Class"
        },
    )
    agent_options: tuple[str, ...] = dataclasses.field(
        default=(),
        metadata={"help": "that agent's hyperparameters as KEY=VALUE, e.g. population=64"},
    )
    silent: Literal["random", "top_x", "bottom_x"] = dataclasses.field(
        default="random",
        metadata={"help": "what a platform without feedback serves (it cannot learn)"},
    )
    from_run: str = dataclasses.field(
        default="",
        metadata={
            "help": "a single-platform run directory (fedrec train AGENT --env "
            "fedrec/ChocKaleSlate-v0 --out RUN): every feedback platform's copy is that run's "
            "agent with its trained weights (agent and agent_options then come from the run; "
            "empty: fresh copies)"
        },
    )

    def __post_init__(self) -> None:
        if self.silent not in SILENT_POLICIES:
            raise ValueError(f"silent must be one of {SILENT_POLICIES}, got {self.silent!r}")
        self.options()  # malformed KEY=VALUE is a config error, not a late crash

    def options(self) -> dict[str, Any]:
        """``agent_options`` as a dict (values parsed as in ``--env-kwarg``)."""
        parsed = {}
        for text in self.agent_options:
            try:
                key, value = parse_key_value(text)
            except ValueError as error:
                raise ValueError(f"agent_options: {error}") from None
            parsed[key] = tuple(value) if isinstance(value, list) else value
        return parsed


class PlatformView:
    """What a single-platform agent's ``from_env`` reads, for one platform of a multi-platform
    env: the Choc-vs-Kale parameters (``time_budget``: the platform's steps per episode), the
    per-user observation and slate spaces and the number of users stepped together."""

    def __init__(
        self, params: ChocKaleParams, *, feedback: bool, episode_length: int, num_users: int
    ) -> None:
        self.params = dataclasses.replace(params, time_budget=int(episode_length))
        self.single_observation_space = observation_space(params, feedback=feedback)
        self.single_action_space = SlateSpace(params.num_candidates, params.slate_size)
        self.observation_space = self.single_observation_space
        self.action_space = self.single_action_space
        self.num_envs = int(num_users)
        self.unwrapped = self


class PerPlatformAgent(MultiPlatformAgent):
    """A single-platform agent per feedback platform, trained locally (see the module doc).

    :param episode_length: joint steps per episode (default: the env's time budget divided
        among the platforms, as in the multi-platform env).
    :param num_users: users per training step (what a copy with a rollout buffer sizes it by).
    """

    Config = PerPlatformConfig

    def __init__(
        self,
        *,
        platforms: Sequence[str],
        feedback: Mapping[str, bool],
        params: ChocKaleParams,
        config: PerPlatformConfig | None = None,
        seed: int | None = None,
        episode_length: int | None = None,
        num_users: int = 1,
    ) -> None:
        from fedrec.agents.registry import make_config, resolve_agent

        super().__init__(
            platforms=platforms, feedback=feedback, params=params, config=config, seed=seed
        )
        self.episode_length = int(episode_length or params.time_budget // len(self.names))
        if self.episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {self.episode_length}")
        #: the run whose trained weights the copies start from, until they are loaded
        #: (:meth:`start_from`, called by the training loop: fedrec.train loads checkpoints)
        self.pending_run: str | None = None
        if self.config.from_run:
            learner_name, learner_cls, learner_config = _run_learner(self.config)
            self.pending_run = self.config.from_run
        else:
            learner_name = self.config.agent
            learner_cls = resolve_agent(learner_name)
            learner_config = make_config(learner_cls, self.config.options())
        if learner_cls.oracle:
            raise ValueError(
                f"{learner_name} reads the user's hidden state (an oracle); a per-platform "
                "agent learns from what its platform observes"
            )
        silent_cls = resolve_agent(self.config.silent)
        seeds = self.rng.integers(2**31, size=len(self.names))
        self.agents: dict[str, SlateAgent] = {}
        for name, agent_seed in zip(self.names, seeds, strict=True):
            view = PlatformView(
                params,
                feedback=self.feedback[name],
                episode_length=self.episode_length,
                num_users=num_users,
            )
            if self.feedback[name]:
                if self.pending_run is not None:
                    _check_spaces(self.pending_run, view)
                agent = learner_cls.from_env(view, config=learner_config, seed=int(agent_seed))
            else:
                agent = silent_cls.from_env(view, seed=int(agent_seed))
            self.agents[name] = agent
        self.t = 0
        self.users = 0  # users of the current episode
        self.begun = 0  # users whose next episode end_episode has begun already (0: none)

    @classmethod
    def from_env(
        cls, env: Any, *, config: Any = None, seed: int | None = None
    ) -> MultiPlatformAgent:
        return cls(
            platforms=env.possible_agents,
            feedback=env.feedback,
            params=env.params,
            config=config,
            seed=seed,
            episode_length=episode_length_of(env),
            num_users=env.num_users,
        )

    def _begin_episodes(self, users: int) -> None:
        for agent in self.agents.values():
            agent.begin_episodes(np.ones(users, dtype=bool))

    def start_from(self, state: Mapping[str, Any]) -> None:
        """Load a trained single-platform agent's ``state_dict()`` (the ``from_run`` run's) into
        every feedback platform's copy."""
        for name in self.feedback_platforms:
            try:
                self.agents[name].load_state_dict(state)
            except (KeyError, IndexError, RuntimeError, ValueError) as error:
                raise ValueError(
                    f"from_run {self.config.from_run}: its weights do not fit {name}'s copy "
                    f"({type(error).__name__}: {error})"
                ) from error
        self.pending_run = None

    def _slates(self, observations: Observations, *, explore: bool) -> Slates:
        if self.pending_run is not None:
            raise ValueError(
                f"from_run {self.pending_run}: the trained weights were not loaded; build the "
                "agent through fedrec train / fedrec.train.train_multi_platform (or call "
                "fedrec.train.trained.prepare_multi_platform_agent(agent, env))"
            )
        users = len(observations[self.names[0]]["candidates"])
        if self.t == 0:  # an episode starts for every user (episodes are synchronised)
            if users != self.begun:  # not yet told by end_episode (evaluation, the first one)
                self._begin_episodes(users)
            self.begun = 0
        self.users = users
        self.t += 1
        slates = {}
        for name, agent in self.agents.items():
            obs = observations[name]
            act = agent.explore_batch if explore and self.feedback[name] else agent.act_batch
            slates[name] = np.asarray(act(obs), dtype=np.int64)
        return slates

    def act(self, observations: Observations) -> Slates:
        slates = self._slates(observations, explore=False)
        self.t %= self.episode_length  # evaluation rollouts do not call end_episode
        return slates

    def explore(self, observations: Observations) -> Slates:
        return self._slates(observations, explore=True)

    def observe(
        self,
        observations: Observations,
        slates: Mapping[str, np.ndarray],
        rewards: Mapping[str, np.ndarray],
        next_observations: Observations,
        terminated: np.ndarray,
    ) -> dict[str, float]:
        terminated = np.asarray(terminated, dtype=bool)
        # The loop's episodes end on the budget (terminated) or on a cycle cap (truncated).
        truncated = ~terminated & (self.t >= self.episode_length)
        metrics: dict[str, float] = {}
        for name in self.feedback_platforms:  # rewards: the feedback platforms' only
            learned = self.agents[name].learn(
                Transitions(
                    observations=observations[name],
                    slates=np.asarray(slates[name]),
                    rewards=np.asarray(rewards[name], dtype=np.float64),
                    next_observations=next_observations[name],
                    terminated=terminated,
                    truncated=truncated,
                )
            )
            metrics.update({f"{name}/{key}": value for key, value in (learned or {}).items()})
        return metrics

    def end_episode(self, episodes: int) -> None:
        # Close the training episodes now, as the single-platform loop does right after its
        # autoreset, so that a checkpoint taken next holds what they taught.
        self._begin_episodes(self.users)
        self.begun, self.t = self.users, 0
        super().end_episode(episodes)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "t": self.t,
            "users": self.users,
            "begun": self.begun,
            "agents": {name: agent.state_dict() for name, agent in self.agents.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = [name for name in self.names if name not in state["agents"]]
        if missing:
            raise ValueError(f"saved per-platform state has no agent for platforms {missing}")
        super().load_state_dict(state)
        self.t, self.users, self.begun = int(state["t"]), int(state["users"]), int(state["begun"])
        for name, agent in self.agents.items():
            agent.load_state_dict(state["agents"][name])
        self.pending_run = None  # a saved per-platform state holds the copies' weights


def _run_learner(config: PerPlatformConfig) -> tuple[str, type[SlateAgent], Any]:
    """The agent of the single-platform run ``config.from_run``: its name, class and Config as
    saved in its ``config.json`` (read as JSON; its weights are loaded by the training loop)."""
    import json
    from pathlib import Path

    from fedrec.agents.registry import config_from_json, resolve_agent
    from fedrec.registration import is_multi_platform

    path = Path(config.from_run) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"from_run: {config.from_run} is not a run directory (no config.json)"
        )
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"from_run: {path} is not valid JSON ({error})") from error
    if not isinstance(saved, dict) or not isinstance(saved.get("agent"), str):
        raise ValueError(f"from_run: {path} names no agent (not a fedrec training run?)")
    if is_multi_platform(str(saved.get("env_id"))):
        raise ValueError(
            f"from_run: {config.from_run} is a multi-platform run; per_platform starts from a "
            "single-platform one (fedrec train AGENT --env fedrec/ChocKaleSlate-v0)"
        )
    name = saved["agent"]
    if ".py:" in name and config.agent != name:
        raise ValueError(
            f"from_run: {config.from_run} was trained with the agent file {name}: a run "
            f"directory's files never choose code to run, so name it yourself (agent={name})"
        )
    default_agent = PerPlatformConfig.agent
    if config.agent_options or config.agent not in (default_agent, name):
        raise ValueError(
            f"from_run: the agent and its hyperparameters come from {config.from_run} ({name}); "
            "leave out agent and agent_options"
        )
    try:
        cls = resolve_agent(name)
    except ImportError as error:
        raise ValueError(f"from_run: cannot import its agent {name!r} ({error})") from error
    agent_config = saved.get("agent_config") or {}
    if not isinstance(agent_config, dict):
        raise ValueError(f"from_run: {path}: agent_config is not an object")
    return name, cls, config_from_json(cls, agent_config)


def _check_spaces(run: str, view: PlatformView) -> None:
    """Refuse a run whose env's observation or slate space differs from the platform's."""
    import json
    from pathlib import Path

    import gymnasium as gym

    saved = json.loads((Path(run) / "config.json").read_text(encoding="utf-8"))
    env_id, kwargs = str(saved.get("env_id")), saved.get("env_kwargs") or {}
    try:
        env = gym.make(env_id, **kwargs)
    except (gym.error.Error, TypeError) as error:
        raise ValueError(f"from_run: cannot build its env {env_id!r} ({error})") from error
    try:
        theirs = (env.observation_space, env.action_space)
    finally:
        env.close()
    ours = (view.single_observation_space, view.single_action_space)
    for what, a, b in zip(("observation", "slate"), theirs, ours, strict=True):
        if a != b:
            raise ValueError(
                f"from_run: {run} was trained on {env_id} whose {what} space {a} differs from "
                f"this platform's {b} (train it on an env of the same candidates and slate size)"
            )
