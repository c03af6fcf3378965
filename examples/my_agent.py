"""A complete slate agent written outside the package: an epsilon-greedy engagement regressor.

It learns, by recursive least squares, how much engagement a clicked item brings as a function
of the item's features, and shows the items with the highest predicted engagement. Train and
evaluate it with fedrec's loop and benchmarks, unchanged:

    fedrec train examples/my_agent.py:EngagementBandit --env fedrec/ChocKale-v0 --episodes 300
    fedrec eval runs/my_agent-ChocKale-v0-seed0
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedrec.agents.base import SlateAgent, Transitions, random_slates, slate_size_of


@dataclasses.dataclass(frozen=True)
class BanditConfig:
    """Hyperparameters (each becomes a ``fedrec train`` option)."""

    epsilon: float = dataclasses.field(default=0.1, metadata={"help": "exploration rate"})
    ridge: float = dataclasses.field(default=1.0, metadata={"help": "L2 prior of the regression"})


class EngagementBandit(SlateAgent):
    """Top-k items by predicted engagement, E[r | item] = w . [1, features]."""

    Config = BanditConfig

    def __init__(
        self, *, slate_size: int, num_features: int, config: BanditConfig, seed: int | None = None
    ) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        self.config = config
        dim = num_features + 1
        self.precision = config.ridge * np.eye(dim)  # X^T X + ridge I
        self.moment = np.zeros(dim)  # X^T y

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> EngagementBandit:
        space = getattr(env, "single_observation_space", None) or env.observation_space
        return cls(
            slate_size=slate_size_of(env),
            num_features=space["candidates"].shape[-1],
            config=config or BanditConfig(),
            seed=seed,
        )

    def _design(self, candidates: np.ndarray) -> np.ndarray:
        ones = np.ones((*candidates.shape[:-1], 1))
        return np.concatenate([ones, candidates], axis=-1)

    def act_batch(self, observations, *, infos=None) -> np.ndarray:
        weights = np.linalg.solve(self.precision, self.moment)
        predicted = self._design(np.asarray(observations["candidates"])) @ weights
        return np.argsort(-predicted, axis=1, kind="stable")[:, : self.slate_size]

    def explore_batch(self, observations, *, infos=None) -> np.ndarray:
        greedy = self.act_batch(observations)
        batch, num_candidates = greedy.shape[0], np.shape(observations["candidates"])[1]
        random = random_slates(self.rng, batch, num_candidates, self.slate_size)
        explore = self.rng.random(batch) < self.config.epsilon
        return np.where(explore[:, None], random, greedy)

    def learn(self, transitions: Transitions) -> dict[str, float]:
        clicks = np.asarray(transitions.next_observations["response_click"])[:, -1, :]
        users, slots = np.nonzero(clicks)  # who clicked which slot of their slate
        items = transitions.slates[users, slots]
        x = self._design(np.asarray(transitions.observations["candidates"])[users, items])
        self.precision += x.T @ x
        self.moment += x.T @ transitions.rewards[users]
        return {"clicks": float(len(users))}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "precision": self.precision, "moment": self.moment}

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.precision, self.moment = np.array(state["precision"]), np.array(state["moment"])
