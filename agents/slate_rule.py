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
import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.agents.base import Info, Observation, SlateAgent, Transitions


def check_search_settings(config: Any) -> None:
    """The cross-entropy search's settings every rule-search config shares: ``population``,
    ``elite_fraction``, ``smoothing``, ``initial_std`` and ``min_std`` (a ``ValueError`` naming
    the setting)."""
    if config.population < 4:
        raise ValueError(f"population must be >= 4, got {config.population}")
    if not 0 < config.elite_fraction < 1 or config.elite_fraction * config.population < 2:
        raise ValueError(
            f"elite_fraction must be in (0, 1) and keep >= 2 of the population, got "
            f"{config.elite_fraction} of {config.population}"
        )
    if not 0 < config.smoothing <= 1:
        raise ValueError(f"smoothing must be in (0, 1], got {config.smoothing}")
    if not config.initial_std > 0 or not 0 <= config.min_std <= config.initial_std:
        raise ValueError(
            f"need initial_std > 0 and 0 <= min_std <= initial_std, got "
            f"{config.initial_std}, {config.min_std}"
        )


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
        check_search_settings(self)

    @property
    def contexts(self) -> int:
        """Contexts with their own weights (1: the rule sees only the feature and the time)."""
        return 1

    @property
    def size(self) -> int:
        """Weights of one rule."""
        return 2 * int(self.time_bins) * self.contexts


@dataclasses.dataclass(frozen=True)
class AdaptiveRuleSearchConfig(RuleSearchConfig):
    """A rule that also reads the user's observed satisfaction level; the search scores each
    drawn rule on several user-episodes (defaults measured on ``fedrec/ChocKaleUserTypes-v0``,
    docs/longterm.md)."""

    population: int = dataclasses.field(
        default=128, metadata={"help": "drawn rules per search update"}
    )
    satisfaction_edges: tuple[float, ...] = dataclasses.field(
        default=(0.45, 0.55),
        metadata={
            "help": "edges of the satisfaction levels with their own weights (the level is the "
            "mean of the user's last observed, noisy satisfaction readings)"
        },
    )
    satisfaction_window: int = dataclasses.field(
        default=15, metadata={"help": "readings averaged into the satisfaction level"}
    )
    episodes_per_rule: int = dataclasses.field(
        default=8,
        metadata={
            "help": "user-episodes each drawn rule is scored on (its mean return): users of "
            "different hidden types score very differently, whatever the rule"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        edges = tuple(float(e) for e in self.satisfaction_edges)
        if not edges or any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError(
                f"satisfaction_edges must be a non-empty increasing sequence, got {edges}"
            )
        object.__setattr__(self, "satisfaction_edges", edges)
        for name in ("satisfaction_window", "episodes_per_rule"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

    @property
    def contexts(self) -> int:
        return len(self.satisfaction_edges) + 1


def basis(
    candidates: np.ndarray,
    fraction: float | np.ndarray,
    time_bins: int,
    *,
    context: np.ndarray | None = None,
    contexts: int = 1,
) -> np.ndarray:
    """(U, N) features -> (U, N, 2 B C): x and x^2, placed in the slot of the time bin (of B equal
    parts of the episode) that each user's ``fraction`` (one for all, or one per user) falls in,
    and of the user's ``context`` (an index in [0, C), e.g. a satisfaction level; none: C = 1);
    zeros elsewhere.

    So the rule has its own weights on x and x^2 in each part of the episode (and context) and
    can change its mind near the end (the optimal plan's shape under long-term dynamics). Terms
    without x would add the same amount to every candidate and never change a ranking.
    """
    x = np.asarray(candidates, dtype=np.float64)
    bins = np.minimum((np.asarray(fraction) * time_bins).astype(int), time_bins - 1)
    if context is not None:
        bins = np.broadcast_to(bins, x.shape[:1]) * contexts + np.asarray(context)
    slots = time_bins * contexts
    slot = np.eye(slots)[np.broadcast_to(bins, x.shape[:1])][:, None, :]  # (U, 1, B C)
    return np.concatenate([x[..., None] * slot, (x * x)[..., None] * slot], axis=-1)


def observed_satisfaction(observations: Observation, agent: object) -> np.ndarray:
    """Each user's noisy satisfaction reading (observation key ``user``), for the rules that
    read it; an env that does not observe it is refused by name."""
    if "user" not in observations:
        raise ValueError(
            f"{type(agent).__name__} reads the observed satisfaction (observation key 'user'): "
            "use an env with satisfaction_noise_stddev set, e.g. fedrec/ChocKaleUserTypes-v0"
        )
    return np.asarray(observations["user"], dtype=np.float64)[:, 0]


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
        self.config = config if config is not None else type(self).Config()
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

    def _context(self, observations: Observation) -> np.ndarray | None:
        """Each user's context index (None: the rule has no context)."""
        del observations
        return None

    def _scores(self, observations: Observation, weights: np.ndarray) -> np.ndarray:
        # Each user's own time in the episode (users may be at different steps after an autoreset).
        phi = basis(
            observations["candidates"][..., 0],
            self.steps / self.episode_length,
            self.config.time_bins,
            context=self._context(observations),
            contexts=self.config.contexts,
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
        self._close(np.flatnonzero(ended))
        population = self._population()
        if population is not None:
            thetas, returns = population
            self.mean, self.std = cross_entropy_step(
                self.mean, self.std, thetas, returns, self.config
            )
            self.std = np.maximum(self.std, self._std_floor())
            self.updates += 1
        self._assign(mask)
        self.steps[mask], self.returns[mask], self.learned[mask] = 0, 0.0, False

    def _std_floor(self) -> float | np.ndarray:
        """The search spread's floor, per number or one for all (``config.min_std``)."""
        return self.config.min_std

    def _close(self, users: np.ndarray) -> None:
        """The ended training episodes of ``users`` join the population."""
        self.finished += [(self.draws[u].copy(), float(self.returns[u])) for u in users]

    def _population(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(rules, returns) for an update once the population is complete (and start a new one)."""
        if len(self.finished) < self.config.population:
            return None
        thetas = np.stack([t for t, _ in self.finished])
        returns = np.array([r for _, r in self.finished])
        self.finished = []
        return thetas, returns

    def _assign(self, mask: np.ndarray) -> None:
        """Rules for the users starting an episode: one fresh draw each."""
        self.draws[mask] = self._draw(int(mask.sum()))

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


class ScoredRuleSearchAgent(RuleSearchAgent):
    """:class:`RuleSearchAgent` that scores every drawn rule on ``config.episodes_per_rule``
    user-episodes (its mean return) before the rule joins a population: where users differ a lot
    whatever the rule (hidden types), one episode says little about a rule. The base of
    :class:`AdaptiveRuleSearchAgent` and
    :class:`fedrec.agents.slate_rule_sequential.SequentialRuleSearchAgent`."""

    def __init__(
        self,
        *,
        slate_size: int,
        episode_length: int,
        config: Any = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            slate_size=slate_size, episode_length=episode_length, config=config, seed=seed
        )
        # ``queue``: rules still to be handed out (rule, id, episodes left); ``scores``: id ->
        # [rule, return sum, count] of the current population; ``rule_ids``: each user's rule
        # (-1: not scored).
        self.queue: list[tuple[np.ndarray, int, int]] = []
        self.scores: dict[int, list[Any]] = {}
        self.rule_ids = np.zeros(0, dtype=np.int64)
        self.next_id = 0

    def _ensure_users(self, users: int) -> None:
        if len(self.steps) != users:
            self.rule_ids = np.full(users, -1, dtype=np.int64)  # their first rules are not scored
        super()._ensure_users(users)

    def _close(self, users: np.ndarray) -> None:
        for user in users:
            score = self.scores.get(int(self.rule_ids[user]))
            if score is not None:  # a rule of an earlier population is not scored
                score[1] += self._episode_score(int(user))
                score[2] += 1

    def _episode_score(self, user: int) -> float:
        """What a user's ended episode adds to its rule's score: its return."""
        return float(self.returns[user])

    def _population(self) -> tuple[np.ndarray, np.ndarray] | None:
        k = self.config.episodes_per_rule
        scored = [score for score in self.scores.values() if score[2] >= k]
        if len(scored) < self.config.population:
            return None
        self.queue, self.scores = [], {}  # the next population draws from the new distribution
        return np.stack([s[0] for s in scored]), np.array([s[1] / s[2] for s in scored])

    def _assign(self, mask: np.ndarray) -> None:
        users = np.flatnonzero(mask)
        k = self.config.episodes_per_rule
        missing = len(users) - sum(left for _, _, left in self.queue)
        if missing > 0:  # one draw for all new rules, as RuleSearchAgent draws
            for rule in self._draw(-(-missing // k)):
                self.queue.append((rule, self.next_id, k))
                self.scores[self.next_id] = [rule, 0.0, 0]
                self.next_id += 1
        for user in users:
            rule, rule_id, left = self.queue[0]
            self.draws[user], self.rule_ids[user] = rule, rule_id
            self.queue = (
                self.queue[1:] if left == 1 else [(rule, rule_id, left - 1), *self.queue[1:]]
            )

    def state_dict(self) -> dict[str, Any]:
        size = self.config.size
        return {
            **super().state_dict(),
            "queue_rules": np.array([q[0] for q in self.queue]).reshape(-1, size),
            "queue_ids": np.array([q[1] for q in self.queue], dtype=np.int64),
            "queue_left": np.array([q[2] for q in self.queue], dtype=np.int64),
            "score_ids": np.array(list(self.scores), dtype=np.int64),
            "score_rules": np.array([s[0] for s in self.scores.values()]).reshape(-1, size),
            "score_sums": np.array([s[1] for s in self.scores.values()], dtype=np.float64),
            "score_counts": np.array([s[2] for s in self.scores.values()], dtype=np.int64),
            "rule_ids": self.rule_ids.copy(),
            "next_id": self.next_id,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.queue = [
            (np.array(rule, dtype=np.float64), int(i), int(left))
            for rule, i, left in zip(
                state["queue_rules"], state["queue_ids"], state["queue_left"], strict=True
            )
        ]
        self.scores = {
            int(i): [np.array(rule, dtype=np.float64), float(total), int(count)]
            for i, rule, total, count in zip(
                state["score_ids"],
                state["score_rules"],
                state["score_sums"],
                state["score_counts"],
                strict=True,
            )
        }
        self.rule_ids = np.array(state["rule_ids"], dtype=np.int64)
        self.next_id = int(state["next_id"])


class AdaptiveRuleSearchAgent(ScoredRuleSearchAgent):
    """:class:`RuleSearchAgent` whose rule also depends on the user's satisfaction level.

    The agent keeps, per user, the mean of the last ``satisfaction_window`` *observed* (noisy)
    satisfaction readings of the episode and gives each level (``satisfaction_edges``) its own weights in every part of the episode. On
    ``fedrec/ChocKaleUserTypes-v0``, where some users' satisfaction does not react to what they
    consume and others' does, the level tells the two apart after a few steps, so one searched
    rule can serve each type its own plan. Needs an env that observes satisfaction; reads no
    hidden state.
    """

    Config = AdaptiveRuleSearchConfig
    config: AdaptiveRuleSearchConfig

    def __init__(
        self,
        *,
        slate_size: int,
        episode_length: int,
        config: AdaptiveRuleSearchConfig | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            slate_size=slate_size, episode_length=episode_length, config=config, seed=seed
        )
        # per user: the last readings of the observed satisfaction, newest last (NaN: none yet)
        self.readings = np.zeros((0, self.config.satisfaction_window))

    def _context(self, observations: Observation) -> np.ndarray:
        seen = observed_satisfaction(observations, self)
        if len(self.readings) != len(seen):
            self.readings = np.full((len(seen), self.config.satisfaction_window), np.nan)
        self.readings[self.steps == 0] = np.nan  # a new episode forgets the last one's readings
        self.readings = np.concatenate([self.readings[:, 1:], seen[:, None]], axis=1)
        level = np.nanmean(self.readings, axis=1)
        return np.searchsorted(self.config.satisfaction_edges, level, side="right")

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "readings": self.readings.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.readings = np.array(state["readings"], dtype=np.float64)
