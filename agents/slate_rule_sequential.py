"""A slate rule that tests, user by user, whether the observed satisfaction responds to what is
served, searched by the cross-entropy method.

Where users of hidden types need different plans (``fedrec/ChocKaleUserTypes-v0``: some users'
satisfaction follows what they consume, others' does not), a rule must tell them apart from the
noisy satisfaction readings before it can serve each its plan. :class:`AdaptiveRuleSearchAgent`
reads a window of the readings in fixed levels and searches 60 weights; its searches end at
different rules from seed to seed (docs/longterm.md). This rule has a sequential test built in and
8 numbers to search, so that every search can find the same rule:

* each user's *level* is the mean of its readings from step ``a`` on;
* from step ``k`` on, a user whose level is below ``c + g / sqrt(readings)`` is marked
  *unresponsive* for the rest of the episode (a one-sided test whose margin narrows as the
  readings add up; ``g < 0`` asks for more evidence early);
* an unresponsive user is served by the weight ``p_latched``, every other user by ``p_early``
  before step ``s`` and by ``p_late`` from it on; a weight p serves the n candidates with the
  largest p * x (p < 0: bottom-x, p > 0: top-x, the env's two fixed rules).

The search learns all eight (k, a, c, g, s and the three weights) from episode returns alone, as
:class:`RuleSearchAgent` does: every drawn rule is scored on ``episodes_per_rule`` user-episodes
and the Gaussian moves towards the best-scored draws. What the agent brings is the rule's form (a
fixed rule while it watches one statistic of the readings, then a fixed rule per verdict), not the
env's model: it reads no info key and knows neither the types nor tau. It searches in standard
units z (each number = centre + scale * z, :data:`UNITS`), so one spread floor fits all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.agents.base import Observation
from fedrec.agents.slate_rule import (
    ScoredRuleSearchAgent,
    check_search_settings,
    observed_satisfaction,
)

#: The rule's numbers: name -> (centre, scale) of theta = centre + scale * z; times are fractions
#: of the episode, the level and its margin are in units of the reading (the middle of its [0, 1]
#: range is 0.5), the weights are signs in effect.
UNITS: dict[str, tuple[float, float]] = {
    "test_from": (0.2, 0.1),  # k / episode length: a user may be marked from this step on
    "level_from": (0.07, 0.05),  # a / episode length: the readings averaged start here
    "threshold": (0.5, 0.05),  # c: marked unresponsive while the level is below c + g / sqrt(m)
    "margin": (0.0, 0.1),  # g
    "switch_at": (0.75, 0.15),  # s / episode length: p_early -> p_late for unmarked users
    "p_early": (0.0, 1.0),
    "p_latched": (0.0, 1.0),
    "p_late": (0.0, 1.0),
}


@dataclasses.dataclass(frozen=True)
class SequentialRuleSearchConfig:
    """Defaults measured on ``fedrec/ChocKaleUserTypes-v0`` (docs/longterm.md)."""

    population: int = dataclasses.field(
        default=64, metadata={"help": "drawn rules per search update"}
    )
    episodes_per_rule: int = dataclasses.field(
        default=16,
        metadata={"help": "user-episodes each drawn rule is scored on (its mean return)"},
    )
    elite_fraction: float = dataclasses.field(
        default=0.25, metadata={"help": "fraction of the rules that the update moves to"}
    )
    smoothing: float = dataclasses.field(
        default=0.5, metadata={"help": "weight of the elite's mean and spread in each update"}
    )
    initial_std: float = dataclasses.field(
        default=1.0, metadata={"help": "initial search spread, in each number's scale"}
    )
    min_std: float = dataclasses.field(
        default=0.05, metadata={"help": "floor of the search spread, in each number's scale"}
    )

    def __post_init__(self) -> None:
        for name in ("population", "episodes_per_rule"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        check_search_settings(self)

    @property
    def size(self) -> int:
        """Numbers of one rule."""
        return len(UNITS)


def rule_numbers(z: np.ndarray, episode_length: int) -> dict[str, np.ndarray]:
    """(..., 8) standard units -> the rule's numbers (times in steps)."""
    z = np.asarray(z, dtype=np.float64)
    out = {}
    for i, (name, (centre, scale)) in enumerate(UNITS.items()):
        value = centre + scale * z[..., i]
        if name in ("test_from", "level_from", "switch_at"):
            value = np.clip(np.rint(value * episode_length), 0, episode_length)
        out[name] = value
    return out


class SequentialRuleSearchAgent(ScoredRuleSearchAgent):
    """Cross-entropy search over a rule with a built-in sequential test of whether the user's
    observed satisfaction responds (see the module docstring). Needs an env that observes the
    satisfaction (observation key ``user``); reads no hidden state."""

    Config = SequentialRuleSearchConfig
    config: SequentialRuleSearchConfig

    def __init__(
        self,
        *,
        slate_size: int,
        episode_length: int,
        config: SequentialRuleSearchConfig | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            slate_size=slate_size,
            episode_length=episode_length,
            config=config,
            seed=seed,
        )
        # per user: sum and count of the readings averaged, and the verdict "unresponsive"
        self.level_sum = np.zeros(0)
        self.level_count = np.zeros(0)
        self.latched = np.zeros(0, dtype=bool)

    def _ensure_users(self, users: int) -> None:
        if len(self.latched) != users:
            self.level_sum, self.level_count = np.zeros(users), np.zeros(users)
            self.latched = np.zeros(users, dtype=bool)
        super()._ensure_users(users)

    def _scores(self, observations: Observation, weights: np.ndarray) -> np.ndarray:
        reading = observed_satisfaction(observations, self)
        x = np.asarray(observations["candidates"], dtype=np.float64)[..., 0]
        users = len(reading)
        rule = rule_numbers(
            np.broadcast_to(weights, (users, self.config.size)), self.episode_length
        )
        fresh = self.steps == 0  # a new episode forgets the last one's readings and verdict
        self.level_sum[fresh], self.level_count[fresh], self.latched[fresh] = 0.0, 0.0, False
        counted = self.steps >= rule["level_from"]
        self.level_sum += np.where(counted, reading, 0.0)
        self.level_count += counted
        level = self.level_sum / np.maximum(self.level_count, 1)
        bound = rule["threshold"] + rule["margin"] / np.sqrt(np.maximum(self.level_count, 1))
        self.latched |= (self.steps >= rule["test_from"]) & (self.level_count > 0) & (level < bound)
        p = np.where(
            self.latched,
            rule["p_latched"],
            np.where(self.steps < rule["switch_at"], rule["p_early"], rule["p_late"]),
        )
        return p[:, None] * x

    def greedy_rule(self) -> dict[str, float]:
        """The mean rule's numbers (times in steps): what the greedy policy does."""
        return {k: float(v) for k, v in rule_numbers(self.mean, self.episode_length).items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "level_sum": self.level_sum.copy(),
            "level_count": self.level_count.copy(),
            "latched": self.latched.copy(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.level_sum = np.array(state["level_sum"], dtype=np.float64)
        self.level_count = np.array(state["level_count"], dtype=np.float64)
        self.latched = np.array(state["latched"], dtype=bool)
