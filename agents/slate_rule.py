"""Slate rules over (candidate feature, time in the episode), searched by the cross-entropy method.

A *rule* theta ranks the candidates by the linear score theta . phi(x_i, tau), where x_i is a
candidate's feature and tau the fraction of the episode played: phi holds x and x^2 in the slot
of the part of the episode (``time_bins`` equal parts) that tau falls in. It serves the n
best-scored candidates. The fixed heuristics top-x and bottom-x are two of its points; the
optimal plan under long-term dynamics ("kale, then chocolate at the very end") is close to
another. The search keeps a Gaussian N(mean, diag std^2) over theta, gives every user-episode its
own draw, and moves towards the draws of the best episode returns (the cross-entropy method):
it compares whole episodes, which a per-step policy gradient does not (from the random policy the
local gradient under long-term dynamics points to the myopic slate; ``docs/fedcem.md``).

:class:`RuleSearchAgent` is the single-platform agent; :class:`fedrec.agents.fedcem.FedCEMAgent`
runs the same search across platforms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.agents.base import Info, Observation, SlateAgent, Transitions


@dataclasses.dataclass(frozen=True)
class RuleSearchConfig:
    time_bins: int = dataclasses.field(
        default=10,
        metadata={"help": "equal parts of the episode with their own weights (1: no clock)"},
    )
    population: int = dataclasses.field(
        default=256, metadata={"help": "user-episodes (own draws of theta) per search update"}
    )
    elite_fraction: float = dataclasses.field(
        default=0.25, metadata={"help": "fraction of the population that the update moves to"}
    )
    smoothing: float = dataclasses.field(
        default=0.5, metadata={"help": "weight of the elite's mean and spread in each update"}
    )
    initial_std: float = dataclasses.field(
        default=1.0, metadata={"help": "initial search spread of every weight (mean 0)"}
    )
    min_std: float = dataclasses.field(
        default=0.05, metadata={"help": "floor of the search spread (keeps exploring)"}
    )

    def __post_init__(self) -> None:
        if isinstance(self.time_bins, bool) or not 1 <= int(self.time_bins) <= 100:
            raise ValueError(f"time_bins must be an integer in [1, 100], got {self.time_bins!r}")
        if self.population < 4:
            raise ValueError(f"population must be >= 4, got {self.population}")
        if not 0 < self.elite_fraction < 1 or self.elite_fraction * self.population < 2:
            raise ValueError(
                f"elite_fraction must be in (0, 1) and keep >= 2 of the population, got "
                f"{self.elite_fraction} of {self.population}"
            )
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {self.smoothing}")
        if not self.initial_std > 0 or not 0 <= self.min_std <= self.initial_std:
            raise ValueError(
                f"need initial_std > 0 and 0 <= min_std <= initial_std, got "
                f"{self.initial_std}, {self.min_std}"
            )

    @property
    def size(self) -> int:
        """Weights of one rule."""
        return 2 * int(self.time_bins)


def basis(candidates: np.ndarray, fraction: float | np.ndarray, time_bins: int) -> np.ndarray:
    """(U, N) features -> (U, N, 2 B): x and x^2, placed in the slot of the time bin (of B equal
    parts of the episode) that each user's ``fraction`` (one for all, or one per user) falls in;
    zeros elsewhere.

    So the rule has its own weights on x and x^2 in each part of the episode and can change
    its mind near the end (the optimal plan's shape under long-term dynamics). Terms without x
    would add the same amount to every candidate and never change a ranking.
    """
    x = np.asarray(candidates, dtype=np.float64)
    bins = np.minimum((np.asarray(fraction) * time_bins).astype(int), time_bins - 1)
    slot = np.eye(time_bins)[np.broadcast_to(bins, x.shape[:1])][:, None, :]  # (U, 1, B)
    return np.concatenate([x[..., None] * slot, (x * x)[..., None] * slot], axis=-1)


def top_slates(scores: np.ndarray, n: int) -> np.ndarray:
    """The n best-scored candidates per row (ties: lower index first)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :n].astype(np.int64)


def cross_entropy_step(
    mean: np.ndarray,
    std: np.ndarray,
    thetas: np.ndarray,
    returns: np.ndarray,
    config: RuleSearchConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """Move (mean, std) towards the draws with the ``elite_fraction`` best returns."""
    best = np.argsort(-returns, kind="stable")[: int(config.elite_fraction * len(returns))]
    a = config.smoothing
    new_mean = (1 - a) * mean + a * thetas[best].mean(axis=0)
    new_std = np.maximum((1 - a) * std + a * thetas[best].std(axis=0), config.min_std)
    return new_mean, new_std


class RuleSearchAgent(SlateAgent):
    """Cross-entropy search over a slate rule of (feature, time in the episode), on one platform.

    Every user-episode gets its own rule drawn from the search distribution (training); after
    ``population`` user-episodes the distribution moves towards the draws with the best returns.
    The greedy policy (evaluation) is the mean rule. Episodes must have a fixed length
    (``episode_length`` steps; a Choc-vs-Kale episode is ``time_budget`` steps): the agent counts
    each user's steps since :meth:`begin_episodes` itself. Reads no hidden state.
    """

    Config = RuleSearchConfig

    def __init__(
        self,
        *,
        slate_size: int,
        episode_length: int,
        config: RuleSearchConfig | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        if episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {episode_length}")
        self.config = config if config is not None else RuleSearchConfig()
        self.episode_length = int(episode_length)
        self.mean = np.zeros(self.config.size)
        self.std = np.full(self.config.size, self.config.initial_std)
        self.steps = np.zeros(0, dtype=np.int64)  # per user: steps played in this episode
        self.draws = np.zeros((0, self.config.size))  # per user: this episode's rule
        self.returns = np.zeros(0)  # per user: this episode's return so far
        self.learned = np.zeros(0, dtype=bool)  # per user: this episode is a training one
        self.finished: list[tuple[np.ndarray, float]] = []  # (rule, return) of ended episodes
        self.updates = 0

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        from fedrec.agents.base import slate_size_of
        from fedrec.agents.reference import env_params

        return cls(
            slate_size=slate_size_of(env),
            episode_length=env_params(env).time_budget,
            config=config,
            seed=seed,
        )

    def _ensure_users(self, users: int) -> None:
        if len(self.steps) != users:
            self.steps = np.zeros(users, dtype=np.int64)
            self.draws = self._draw(users)
            self.returns = np.zeros(users)
            self.learned = np.zeros(users, dtype=bool)

    def _draw(self, users: int) -> np.ndarray:
        noise = self.rng.standard_normal((users, self.config.size))
        return self.mean + self.std * noise

    def _scores(self, observations: Observation, weights: np.ndarray) -> np.ndarray:
        # Each user's own time in the episode (users may be at different steps after an autoreset).
        phi = basis(
            observations["candidates"][..., 0],
            self.steps / self.episode_length,
            self.config.time_bins,
        )
        return np.einsum("und,ud->un", phi, np.broadcast_to(weights, (len(phi), self.config.size)))

    def _slates(self, observations: Observation, weights: np.ndarray) -> np.ndarray:
        self._ensure_users(len(observations["candidates"]))
        slates = top_slates(self._scores(observations, weights), self.slate_size)
        self.steps = self.steps + 1  # the clock: every act is one step of every user
        return slates

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        return self._slates(observations, self.mean)

    def explore_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        return self._slates(observations, self.draws)

    def learn(self, transitions: Transitions) -> dict[str, float]:
        self.returns = self.returns + transitions.rewards
        self.learned[:] = True
        return {"search_updates": float(self.updates), "search_std": float(self.std.mean())}

    def begin_episodes(self, mask: np.ndarray) -> None:
        """Close the ended episodes (their rule and return join the population), draw new rules."""
        mask = np.asarray(mask, dtype=bool)
        if len(self.steps) != len(mask):
            self._ensure_users(len(mask))
            return
        ended = mask & self.learned  # training episodes only (evaluation does not learn)
        self.finished += [
            (self.draws[u].copy(), float(self.returns[u])) for u in np.flatnonzero(ended)
        ]
        if len(self.finished) >= self.config.population:
            thetas = np.stack([t for t, _ in self.finished])
            returns = np.array([r for _, r in self.finished])
            self.mean, self.std = cross_entropy_step(
                self.mean, self.std, thetas, returns, self.config
            )
            self.finished, self.updates = [], self.updates + 1
        self.draws[mask] = self._draw(int(mask.sum()))
        self.steps[mask], self.returns[mask], self.learned[mask] = 0, 0.0, False

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "mean": self.mean.copy(),
            "std": self.std.copy(),
            "steps": self.steps.copy(),
            "draws": self.draws.copy(),
            "returns": self.returns.copy(),
            "learned": self.learned.copy(),
            "finished_rules": np.array([t for t, _ in self.finished]).reshape(-1, self.config.size),
            "finished_returns": np.array([r for _, r in self.finished], dtype=np.float64),
            "updates": self.updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.mean, self.std = np.array(state["mean"], float), np.array(state["std"], float)
        if self.mean.shape != (self.config.size,) or self.std.shape != (self.config.size,):
            raise ValueError(
                f"saved rule has shape {self.mean.shape}, expected ({self.config.size},)"
            )
        self.steps = np.array(state["steps"], dtype=np.int64)
        self.draws, self.returns = (
            np.array(state["draws"], float),
            np.array(state["returns"], float),
        )
        self.learned = np.array(state["learned"], dtype=bool)
        rules, returns = np.array(state["finished_rules"], float), state["finished_returns"]
        self.finished = [(rule, float(r)) for rule, r in zip(rules, returns, strict=True)]
        self.updates = int(state["updates"])
