"""Ranking metrics for the logged-data environments: HR@K, NDCG@K and AUC (ties handled).

:func:`evaluate_ranking_agent` runs an agent through the evaluation mode (every user once, in one
batched step) and :func:`collect_scores` runs a scorer through the Taobao env for AUC.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def hit_rate_at_k(ranks: np.ndarray, k: int) -> float:
    """HR@K from 0-based ranks of the held-out item (-1 or >= k means a miss)."""
    ranks = np.asarray(ranks)
    return float(np.mean((ranks >= 0) & (ranks < k)))


def ndcg_at_k(ranks: np.ndarray, k: int) -> float:
    """NDCG@K with one relevant item: mean of 1/log2(rank + 2) for 0-based ranks < k, else 0."""
    ranks = np.asarray(ranks, dtype=np.float64)
    hit = (ranks >= 0) & (ranks < k)
    return float(np.mean(np.where(hit, 1.0 / np.log2(np.where(hit, ranks, 0) + 2.0), 0.0)))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC via the Mann-Whitney statistic; tied scores count one half (average ranks).

    :raises ValueError: if the labels are not all 0/1 or only one class is present.
    """
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    if scores.shape != labels.shape:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} differ in shape")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs at least one positive and one negative label")
    from scipy.stats import rankdata  # here: scipy.stats takes a second to import

    ranks = rankdata(scores)  # average ranks for ties
    u = ranks[labels == 1].sum() - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))


@dataclass(frozen=True)
class RankingResult:
    """HR@K and NDCG@K over ``users`` evaluated users."""

    hit_rate: float
    ndcg: float
    users: int
    k: int


def evaluate_ranking_agent(
    env_id: str, agent: object, *, seed: int = 0, **env_kwargs: object
) -> RankingResult:
    """Evaluate a slate agent in evaluation mode on every user once (one batched step).

    ``agent.act_batch(observations)`` must return (U, K) rankings; ``env_kwargs`` go to
    ``gymnasium.make_vec`` (e.g. ``data_dir``, ``top_k``).
    """
    import gymnasium as gym

    import fedrec  # noqa: F401  (registers the ids)

    probe = gym.make(env_id, mode="evaluation", **env_kwargs)
    users = probe.unwrapped.data.num_users
    k = probe.unwrapped.action_space.slate_size
    probe.close()
    envs = gym.make_vec(env_id, num_envs=users, mode="evaluation", **env_kwargs)
    obs, _ = envs.reset(seed=seed)
    rankings = agent.act_batch(obs)  # type: ignore[attr-defined]
    _, rewards, _, _, info = envs.step(rankings)
    envs.close()
    if len(np.unique(obs["user_id"][:, 0])) != users:
        raise RuntimeError("the sweep did not visit every user exactly once")
    return RankingResult(float(rewards.mean()), float(info["ndcg"].mean()), users, k)


def collect_scores(
    env: object, scorer: Callable[[dict], float], *, episodes: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``scorer(obs)`` through ``episodes`` Taobao episodes; returns (scores, logged clicks)."""
    scores, clicks = [], []
    obs, _ = env.reset(seed=seed)  # type: ignore[attr-defined]
    for episode in range(episodes):
        if episode:
            obs, _ = env.reset()  # type: ignore[attr-defined]
        done = False
        while not done:
            score = float(scorer(obs))
            obs, reward, terminated, truncated, _ = env.step(np.array([score], np.float32))  # type: ignore[attr-defined]
            scores.append(score)
            clicks.append(reward)
            done = terminated or truncated
    return np.asarray(scores), np.asarray(clicks)
