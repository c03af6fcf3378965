"""Roll out policies on batched environments and summarise episode returns with confidence intervals."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from fedrec.agents.base import SlateAgent, visible_infos
from fedrec.envs.hidden import hidden_info_keys
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.eval.stats import mean_ci

#: Final evaluations seed their episodes at this offset plus the run's seed, far from any training
#: seed, so the evaluation episodes are held out.
EVAL_SEED_OFFSET = 1_000_000


@dataclass(frozen=True)
class ReturnSummary:
    """Mean episode return with a t-based confidence interval."""

    returns: np.ndarray
    confidence: float = 0.95

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def half_width(self) -> float:
        """Half-width of the confidence interval of the mean (``nan`` for fewer than 2 returns)."""
        return mean_ci(self.returns, self.confidence)[1]

    def __str__(self) -> str:
        return f"{self.mean:.1f} ± {self.half_width:.1f}"


def _batches(episodes: int, num_envs: int) -> list[int]:
    if episodes < 1 or num_envs < 1:
        raise ValueError(f"episodes and num_envs must be >= 1, got {episodes}, {num_envs}")
    full, rest = divmod(episodes, num_envs)
    return [num_envs] * full + ([rest] if rest else [])


def evaluate_policy(
    env_id: str,
    policy: SlateAgent,
    *,
    episodes: int = 1000,
    num_envs: int = 500,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReturnSummary:
    """Mean return of ``policy`` over ``episodes`` episodes of a registered Gymnasium id.

    Runs the native batched env (``gymnasium.make_vec``); batch i is reset with seed ``seed + i``,
    so results are reproducible and independent of the agent's own randomness. A policy that is
    not an oracle gets the infos without the keys the env declares hidden.
    """
    returns: list[np.ndarray] = []
    for index, size in enumerate(_batches(episodes, num_envs)):
        env = gym.make_vec(env_id, num_envs=size, **dict(env_kwargs or {}))
        hidden = hidden_info_keys(env)
        observations, infos = env.reset(seed=seed + index)
        policy.begin_episodes(np.ones(size, dtype=bool))
        total = np.zeros(size)
        done = np.zeros(size, dtype=bool)
        while not done.all():
            slates = policy.act_batch(observations, infos=visible_infos(policy, infos, hidden))
            observations, rewards, terminated, truncated, infos = env.step(slates)
            total += np.where(done, 0.0, rewards)
            done |= terminated | truncated
        env.close()
        returns.append(total)
        if progress is not None:
            progress(size)
    return ReturnSummary(np.concatenate(returns))


class JointPolicy(Protocol):
    """Anything that picks every platform's slates for one joint step. ``oracle`` is the users'
    hidden state (``env.oracle_state()``) for a policy with ``oracle = True``, else None."""

    def act_joint(
        self,
        observations: Mapping[str, Mapping[str, np.ndarray]],
        oracle: Mapping[str, np.ndarray] | None,
    ) -> dict[str, np.ndarray]: ...


def evaluate_joint_policy(
    policy: JointPolicy,
    *,
    episodes: int = 1000,
    num_envs: int = 500,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, ReturnSummary]:
    """Per-platform true engagement per episode on the batched multi-platform env.

    Returns one summary per platform plus ``"total"``; engagement of platforms without feedback is
    read through the env's evaluation channel, never from rewards.
    """
    per_platform: dict[str, list[np.ndarray]] = {}
    for index, size in enumerate(_batches(episodes, num_envs)):
        env = ChocKaleMultiPlatformBatchEnv(num_users=size, **dict(env_kwargs or {}))
        observations, _ = env.reset(seed=seed + index)
        running = True
        while running:
            # The users' hidden state only for an oracle (the joint planner, myopic).
            oracle = env.oracle_state() if getattr(policy, "oracle", False) else None
            slates = policy.act_joint(observations, oracle)
            observations, _, terminations, truncations, _ = env.step(slates)
            first = env.possible_agents[0]
            running = not (terminations[first].all() or truncations[first].all())
        engagement = env.evaluation_engagement()
        engagement["total"] = sum(engagement.values())
        for agent, values in engagement.items():
            per_platform.setdefault(agent, []).append(values)
        if progress is not None:
            progress(size)
    return {agent: ReturnSummary(np.concatenate(v)) for agent, v in per_platform.items()}
