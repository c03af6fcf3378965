"""A slate rule that weighs, user by user, the evidence that the observed satisfaction follows
what was served, searched by the cross-entropy method.

Where users of hidden types need different plans (``fedrec/ChocKaleUserTypes-v0``: some users'
satisfaction follows what they consume, others' does not), a rule must tell them apart from the
noisy satisfaction readings. :class:`~fedrec.agents.slate_rule_sequential.SequentialRuleSearchAgent`
compares the mean reading with a threshold and marks a user for good. This rule keeps a running
log-likelihood ratio instead, so a verdict can be taken early and taken back:

* a *trace* of what the user was served, ``E <- decay * E + (1/2 - mean feature of the last
  slate)`` (positive after bottom-x slates, negative after top-x ones);
* the reading a responsive user would show, ``centre + effect * E``, against ``centre`` for an
  unresponsive one; with Gaussian noise the log-likelihood ratio of "unresponsive" grows by
  ``-((y - centre) m - m^2 / 2) / sd^2`` per reading y, with m = effect * E (the sd^2 is folded
  into the threshold);
* a user whose evidence ``sum((y - centre) m - m^2 / 2)`` is below ``-threshold`` is served by the
  weight ``p_unresponsive`` this step; every other user by ``p_early`` before step ``s`` and by
  ``p_late`` from it on. Nothing is latched: a user served top-x whose readings then fall (a
  responsive user) gains evidence the other way and is served ``p_early`` again.

A weight p serves the n candidates with the largest p * x (p < 0: bottom-x, p > 0: top-x, the
env's two fixed rules). The search learns all eight numbers from episode returns alone, as
:class:`~fedrec.agents.slate_rule.RuleSearchAgent` does: every drawn rule is scored on
``episodes_per_rule`` user-episodes and the Gaussian moves towards the best-scored draws. What
the agent brings is the rule's form (the trace and the Gaussian comparison), not the env's
model: it reads no info key, knows neither the types nor tau, and learns the trace's decay, the
effect and the centre of the readings. It searches in standard units z (each number = centre +
scale * z, :data:`UNITS`), so one spread floor fits all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.agents.base import Observation
from fedrec.agents.slate_rule import ScoredRuleSearchAgent, observed_satisfaction
from fedrec.agents.slate_rule_sequential import SequentialRuleSearchConfig

#: The rule's numbers: name -> (centre, scale) of theta = centre + scale * z. The decay is per
#: step, the effect is in units of the reading per unit of the trace, the centre of the readings
#: is in units of the reading (the middle of its [0, 1] range is 0.5), the threshold in units of
#: the reading squared, the switch step a fraction of the episode; the weights are signs in effect.
UNITS: dict[str, tuple[float, float]] = {
    "decay": (0.5, 0.25),  # clipped to [0, 0.99]
    "effect": (0.05, 0.05),  # clipped to >= 0.001
    "centre": (0.5, 0.05),
    "threshold": (0.05, 0.05),
    "switch_at": (0.75, 0.15),  # s / episode length: p_early -> p_late
    "p_early": (0.0, 1.0),
    "p_unresponsive": (0.0, 1.0),
    "p_late": (0.0, 1.0),
}


@dataclasses.dataclass(frozen=True)
class EvidenceRuleSearchConfig(SequentialRuleSearchConfig):
    """The search settings of :class:`SequentialRuleSearchConfig` (the same defaults)."""

    @property
    def size(self) -> int:
        """Numbers of one rule."""
        return len(UNITS)


def rule_numbers(z: np.ndarray, episode_length: int) -> dict[str, np.ndarray]:
    """(..., 8) standard units -> the rule's numbers (the switch in steps)."""
    z = np.asarray(z, dtype=np.float64)
    out = {}
    for i, (name, (centre, scale)) in enumerate(UNITS.items()):
        out[name] = centre + scale * z[..., i]
    out["decay"] = np.clip(out["decay"], 0.0, 0.99)
    out["effect"] = np.maximum(out["effect"], 0.001)
    out["switch_at"] = np.clip(np.rint(out["switch_at"] * episode_length), 0, episode_length)
    return out


class EvidenceRuleSearchAgent(ScoredRuleSearchAgent):
    """Cross-entropy search over a rule that weighs the evidence that a user's observed
    satisfaction follows what it was served (see the module docstring). Needs an env that
    observes the satisfaction (observation key ``user``); reads no hidden state."""

    Config = EvidenceRuleSearchConfig
    config: EvidenceRuleSearchConfig

    def __init__(
        self,
        *,
        slate_size: int,
        episode_length: int,
        config: EvidenceRuleSearchConfig | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            slate_size=slate_size,
            episode_length=episode_length,
            config=config,
            seed=seed,
        )
        # per user: the trace of what was served, the evidence, the mean feature of the last slate
        self.trace = np.zeros(0)
        self.evidence = np.zeros(0)
        self.served = np.zeros(0)

    def _ensure_users(self, users: int) -> None:
        if len(self.trace) != users:
            self.trace, self.evidence, self.served = (np.zeros(users) for _ in range(3))
        super()._ensure_users(users)

    def _scores(self, observations: Observation, weights: np.ndarray) -> np.ndarray:
        reading = observed_satisfaction(observations, self)
        x = np.asarray(observations["candidates"], dtype=np.float64)[..., 0]
        users = len(reading)
        rule = rule_numbers(
            np.broadcast_to(weights, (users, self.config.size)), self.episode_length
        )
        fresh = self.steps == 0  # a new episode forgets the last one's trace and evidence
        self.trace[fresh], self.evidence[fresh] = 0.0, 0.0
        served = np.where(fresh, 0.0, 0.5 - self.served)  # nothing served before the first step
        self.trace = rule["decay"] * self.trace + served
        m = rule["effect"] * self.trace
        self.evidence += (reading - rule["centre"]) * m - m * m / 2
        unresponsive = self.evidence < -rule["threshold"]
        p = np.where(
            unresponsive,
            rule["p_unresponsive"],
            np.where(self.steps < rule["switch_at"], rule["p_early"], rule["p_late"]),
        )
        return p[:, None] * x

    def _slates(self, observations: Observation, weights: np.ndarray) -> np.ndarray:
        slates = super()._slates(observations, weights)
        # the served slate's mean feature feeds the trace at the next step
        x = np.asarray(observations["candidates"], dtype=np.float64)[..., 0]
        self.served = np.take_along_axis(x, slates, axis=1).mean(axis=1)
        return slates

    def greedy_rule(self) -> dict[str, float]:
        """The mean rule's numbers (the switch in steps): what the greedy policy does."""
        return {k: float(v) for k, v in rule_numbers(self.mean, self.episode_length).items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "trace": self.trace.copy(),
            "evidence": self.evidence.copy(),
            "served": self.served.copy(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.trace = np.array(state["trace"], dtype=np.float64)
        self.evidence = np.array(state["evidence"], dtype=np.float64)
        self.served = np.array(state["served"], dtype=np.float64)
