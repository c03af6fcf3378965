"""The multi-platform training loop: any multi-platform agent on the batched multi-platform env.

CleanRL-flat (:meth:`MultiPlatformTrainer.step`): reset the batched env of U users, repeat
``agent.explore -> env.step -> agent.observe`` until every user's episode ends (all users are
synchronised), log U episodes. The run directory, checkpoints, exact resume, logs and progress
are the shared training core's (:mod:`fedrec.train.core`). The agent is a built-in method
(``fedslate``, ``fedslate_exp``, ``fedq``, ``slateq``, ``random`` and the labelled variants of
:data:`fedrec.agents.registry.MULTI_PLATFORM_AGENTS`) or any
:class:`~fedrec.agents.multi_platform.MultiPlatformAgent` subclass, named ``module:Class`` or
``path/to/file.py:Class``. A run directory holds

* ``config.json`` -- method (``agent``), env id and kwargs, seed, users, the agent's config;
* ``episodes.csv`` -- ``episode,step,length,return/platform_a,return/platform_b,...``: each
  platform's *true* engagement in the episode. For a platform without feedback it is read from
  ``env.evaluation_engagement()``, used here **only for logging**: learners get observations,
  the rewards of platforms with feedback, and nothing else;
* ``checkpoint.pt`` -- atomic, at episode boundaries: the env's and the agent's states as data
  and the loop's counters; ``resume=True`` continues bit-for-bit;
* ``final_eval.json`` -- per-platform greedy evaluation of the trained agent on held-out episodes,
  beside random (and the joint optimal planner), as ``{"policies": {"agent": {"platform_a":
  {"mean", "half_width", "returns"}, ..., "total": ...}, "random": ..., "planner": ...}}``, plus
  the training wall time and the communication per user-episode and party.

``fedrec eval RUN_DIR`` reads these runs (``docs/metrics.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.agents.multi_platform import MultiPlatformAgent
from fedrec.agents.registry import build_multi_platform_agent
from fedrec.eval.rollout import EVAL_SEED_OFFSET
from fedrec.train.core import (
    AGENT_SETUP_KEYS,
    Trainer,
    config_dict,
    default_config_dict,
    env_kwargs_errors,
)
from fedrec.train.trained import prepare_multi_platform_agent

ENV_ID = "fedrec/ChocKaleMultiPlatform-v0"

AgentFactory = Callable[[Any], MultiPlatformAgent]


@dataclasses.dataclass(frozen=True)
class MultiPlatformTrainConfig:
    """What to train, on which multi-platform env, for how long."""

    method: str = "fedslate"
    """built-in method (fedslate, fedslate_exp, fedq, slateq, random, ...) or module:Class /
    path/to/file.py:Class of a MultiPlatformAgent"""
    episodes: int = 5000
    """user-episodes to train (logged one row each)"""
    num_users: int = 16
    """users simulated in parallel (one batched env step = U transitions per platform)"""
    seed: int = 0
    """seeds the env and the agent"""
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """ChocKaleMultiPlatformBatchEnv kwargs: num_platforms, feedback, reward_mode, N, n, ..."""
    agent_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """the agent's Config overrides (e.g. global_network='linear')"""
    checkpoint_every: int = 500
    """user-episodes between atomic checkpoints (0: only at the end; none for an env that cannot
    save its state as data)"""
    eval_episodes: int = 500
    """held-out user-episodes for the final greedy evaluation (0: skip)"""
    planner: bool = True
    """also evaluate the joint optimal planner (an oracle upper bound) in the final evaluation"""
    progress: bool = True
    """show a progress bar"""
    torch_threads: int = 1
    """PyTorch intra-op threads"""
    label: str | None = None
    """group label for ``fedrec eval`` (default: grouped by config)"""
    env_id: str = ENV_ID
    """registered multi-platform env id"""

    @property
    def full_env_kwargs(self) -> dict[str, Any]:
        """The env's keyword arguments: the registered id's own, then ``env_kwargs`` over them."""
        from fedrec.registration import entry_of

        return {**entry_of(self.env_id).kwargs, **dict(self.env_kwargs)}

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"method must be a method name or module:Class, got {self.method!r}")
        if self.episodes < 1 or self.num_users < 1:
            raise ValueError("episodes and num_users must be >= 1")
        if self.checkpoint_every < 0 or self.eval_episodes < 0:
            raise ValueError("checkpoint_every and eval_episodes must be >= 0")


@dataclasses.dataclass
class MultiPlatformResult:
    """What a finished run produced (also on disk in ``out_dir``)."""

    out_dir: Path | None
    returns: dict[str, np.ndarray]
    steps: int
    wall_time: float
    final_eval: dict[str, Any] | None
    traffic: dict[str, dict[str, float]]


def make_env(config: MultiPlatformTrainConfig, num_users: int | None = None) -> Any:
    """The batched multi-platform env of ``config.env_id`` with ``num_users`` users."""
    from fedrec.registration import batched_entry_point

    build = batched_entry_point(config.env_id)
    with env_kwargs_errors(config.env_id, config.env_kwargs):
        return build(num_users or config.num_users, **config.full_env_kwargs)


def build_agent(config: MultiPlatformTrainConfig, env: Any) -> MultiPlatformAgent:
    """The agent named by ``config.method``, with its presets and ``config.agent_kwargs``."""
    return build_multi_platform_agent(
        config.method, env, seed=config.seed, **dict(config.agent_kwargs)
    )


class MultiPlatformTrainer(Trainer):
    """The multi-platform loop: one :meth:`step` plays a whole synchronised episode of U users."""

    row_tag = "episode"

    def __init__(
        self,
        config: MultiPlatformTrainConfig,
        *,
        agent: MultiPlatformAgent | AgentFactory | None = None,
        out_dir: Path | str | None = None,
        resume: bool = False,
        run_info: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.env = make_env(config)
        if agent is None:
            agent = build_agent(config, self.env)
        elif not isinstance(agent, MultiPlatformAgent):
            agent = agent(self.env)
        if not isinstance(agent, MultiPlatformAgent):
            raise TypeError(f"{type(agent).__name__} is not a MultiPlatformAgent")
        # what the method REQUIRES of the env, and the weights of a run it starts from
        prepare_multi_platform_agent(agent, self.env)
        self.agent = agent
        self.platforms = list(self.env.possible_agents)
        self.header = ("episode", "step", "length", *[f"return/{p}" for p in self.platforms])
        run_config = {
            "agent": config.method,
            "env_id": config.env_id,
            "seed": config.seed,
            "episodes": config.episodes,
            "num_envs": config.num_users,
            "env_kwargs": dict(config.env_kwargs),
            "agent_config": config_dict(getattr(agent, "config", None)),
            "feedback": self.env.feedback,
            **({"label": config.label} if config.label else {}),
            **dict(run_info or {}),
        }
        super().__init__(
            run_config=run_config,
            setup_keys=AGENT_SETUP_KEYS,
            out_dir=out_dir,
            resume=resume,
            progress=config.progress,
            checkpoint_every=config.checkpoint_every,
            total=config.episodes,
            torch_threads=config.torch_threads,
            config_defaults=default_config_dict(type(agent).Config),
        )
        self.steps = 0
        self.started = False

    def start(self) -> None:
        self.steps, self.started = 0, False

    def finished(self) -> bool:
        return len(self.log.rows) >= self.config.episodes

    def progress(self) -> float:
        return len(self.log.rows)

    def step(self) -> tuple[list[Any], Mapping[str, float]]:
        env, agent, platforms, users = self.env, self.agent, self.platforms, self.config.num_users
        first = platforms[0]
        obs, _ = env.reset(seed=None if self.started else self.config.seed)
        self.started = True
        length, running, metrics = 0, True, {}
        while running:
            slates = agent.explore(obs)
            next_obs, rewards, terminated, truncated, _ = env.step(slates)
            # The privacy contract: only the feedback platforms' rewards reach the agent.
            feedback_rewards = {p: rewards[p] for p in platforms if env.feedback[p]}
            metrics = agent.observe(obs, slates, feedback_rewards, next_obs, terminated[first])
            metrics = metrics or {}
            obs = next_obs
            self.steps += users
            length += 1
            running = not (terminated[first].all() or truncated[first].all())
        # Logging only: true engagement of every platform (never handed to the agent).
        engagement = env.evaluation_engagement()
        agent.end_episode(users)
        done = len(self.log.rows)
        room = self.config.episodes - done
        rows = [
            [done + 1 + user, self.steps, length, *[float(engagement[p][user]) for p in platforms]]
            for user in range(min(users, room))
        ]
        return rows, metrics

    def parse_row(self, row: list[str]) -> list[Any]:
        return [int(row[0]), int(row[1]), int(row[2]), *map(float, row[3:])]

    def postfix(self) -> dict[str, str]:
        recent = self.log.rows[-100:]
        return {
            p.removeprefix("platform_"): f"{np.mean([r[3 + i] for r in recent]):.0f}"
            for i, p in enumerate(self.platforms)
        }

    def loop_state(self) -> dict[str, Any]:
        return {"steps": self.steps, "started": self.started}

    def load_loop_state(self, state: Mapping[str, Any]) -> None:
        self.steps, self.started = int(state["steps"]), bool(state["started"])

    def evaluate(self) -> dict[str, Any] | None:
        if not self.config.eval_episodes:
            return None
        final_eval = final_evaluation(self.agent, config=self.config)
        final_eval["traffic_bytes_per_episode"] = self.agent.traffic()
        return final_eval


def train_multi_platform(
    config: MultiPlatformTrainConfig,
    *,
    out_dir: Path | str | None = None,
    resume: bool = False,
    agent: MultiPlatformAgent | AgentFactory | None = None,
    run_info: Mapping[str, Any] | None = None,
) -> MultiPlatformResult:
    """Train ``config.method`` (or ``agent``) on the multi-platform env; see the module doc.

    :param agent: an agent or ``agent(env)`` factory to train instead of ``config.method``
        (``config.method`` is then only the name recorded in ``config.json``).
    """
    trainer = MultiPlatformTrainer(
        config, agent=agent, out_dir=out_dir, resume=resume, run_info=run_info
    )
    record = trainer.run()
    rows = record.rows
    returns = {p: np.array([r[3 + i] for r in rows]) for i, p in enumerate(trainer.platforms)}
    traffic = trainer.agent.traffic()
    return MultiPlatformResult(
        trainer.out, returns, trainer.steps, record.wall_time, record.final_eval, traffic
    )


def final_evaluation(agent: Any, *, config: MultiPlatformTrainConfig) -> dict[str, Any]:
    """Greedy per-platform returns of ``agent``, random, the fixed heuristics ``top_x`` and
    ``bottom_x``, the best open-loop schedule of fixed rules and (optionally) the oracles: the
    joint planner, myopic and, with hidden user types, the joint belief planner, on the same
    held-out episodes (true engagement, read through the env's evaluation channel). With several
    platforms also ``agent_alone`` and ``top_x_alone``: each platform's return when it alone
    follows the policy and every other platform serves random slates (a comparison of one
    platform across methods that holds the others fixed)."""
    from fedrec.agents.multi_platform import (
        HeuristicConfig,
        HeuristicMultiPolicy,
        RandomMultiPolicy,
    )
    from fedrec.agents.open_loop import JointOpenLoopPolicy
    from fedrec.agents.reference import JointReferencePolicy, MyopicPolicy, OptimalPlanner
    from fedrec.eval.rollout import evaluate_joint_policy

    seed = EVAL_SEED_OFFSET + config.seed
    probe = make_env(config, 1)
    parties = {
        "platforms": probe.possible_agents,
        "feedback": probe.feedback,
        "params": probe.params,
    }
    policies: dict[str, Any] = {
        "agent": agent,
        "random": RandomMultiPolicy(**parties, seed=seed),
        **{
            rule: HeuristicMultiPolicy(**parties, config=HeuristicConfig(rule), seed=seed)
            for rule in ("top_x", "bottom_x")
        },
        # the best schedule of fixed rules over the visits (no feedback, no learning)
        "best_open_loop": JointOpenLoopPolicy.for_env(probe),
    }
    if config.planner and probe.params.heterogeneous:  # knows the model, infers the user
        from fedrec.agents.belief_planner import JointBeliefPlanner

        policies["belief_planner"] = JointBeliefPlanner.for_env(probe)
    if config.planner:
        planner = OptimalPlanner(probe.params, seed=seed)
        policies["planner"] = JointReferencePolicy(planner, probe.params, probe.possible_agents)
        myopic = MyopicPolicy(probe.params, seed=seed)  # what pays now, from the true state
        policies["myopic"] = JointReferencePolicy(myopic, probe.params, probe.possible_agents)
    results = {}
    diagnostics = None
    for name, policy in policies.items():
        record = name == "agent" and hasattr(policy, "start_diagnostics")
        if record:  # e.g. FedSlate: saturated item values, greedy slates equal to top-x
            policy.start_diagnostics()
        summaries = evaluate_joint_policy(
            policy,
            episodes=config.eval_episodes,
            num_envs=min(config.eval_episodes, 500),
            seed=seed,
            env_kwargs=config.full_env_kwargs,
        )
        results[name] = {platform: _summary(summary) for platform, summary in summaries.items()}
        if record:
            diagnostics = policy.diagnostics()
    if len(probe.possible_agents) > 1:
        # Fair comparison of one platform across methods: the policy serves platform p and every
        # other platform serves the same fixed policy (random, same seed), so p's return does
        # not depend on how well a method's other platforms serve the shared user.
        for name in ("agent", "top_x"):
            results[f"{name}_alone"] = {
                platform: _summary(
                    evaluate_joint_policy(
                        OthersFixed(
                            policies[name], RandomMultiPolicy(**parties, seed=seed), platform
                        ),
                        episodes=config.eval_episodes,
                        num_envs=min(config.eval_episodes, 500),
                        seed=seed,
                        env_kwargs=config.full_env_kwargs,
                    )[platform]
                )
                for platform in probe.possible_agents
            }
    final = {"episodes": config.eval_episodes, "seed": seed, "policies": results}
    if diagnostics is not None:
        final["diagnostics"] = diagnostics
    return final


def _summary(summary: Any) -> dict[str, Any]:
    return {
        "mean": summary.mean,
        "half_width": summary.half_width,
        "returns": summary.returns.tolist(),
    }


class OthersFixed:
    """``policy`` on platform ``focus``, ``fixed`` on every other platform (evaluation only)."""

    def __init__(self, policy: Any, fixed: Any, focus: str) -> None:
        self.policy, self.fixed, self.focus = policy, fixed, focus

    def act_joint(self, observations: Any, oracle: Any = None) -> dict[str, np.ndarray]:
        slates = self.policy.act_joint(observations, oracle)
        others = self.fixed.act(observations)
        return {p: slates[p] if p == self.focus else others[p] for p in slates}
