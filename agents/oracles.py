"""The oracle reference policies: the myopic policy and the dynamic-programming planner.

Both read the user's true state from the env's info (``user_exposure``, ``user_satisfaction``,
``budget_left``; with hidden types ``user_sensitivity``), which learners must not use, and both
declare ``oracle = True``. :class:`ValueGreedyPolicy` is their shared slate choice (the
choice-weighted best slate for given item values), also used by the belief planner.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fedrec.agents.assortment import optimal_slates
from fedrec.agents.base import Info, Observation, SlateAgent
from fedrec.agents.planner import DEFAULT_PLANNER_CONFIG, PlannerConfig, value_table
from fedrec.envs.choc_kale_model import ChocKaleModel, ChocKaleParams


def env_params(env: Any) -> ChocKaleParams:
    """The :class:`ChocKaleParams` of any Choc-vs-Kale env (wrapped, vector or multi-platform)."""
    for candidate in (env, getattr(env, "unwrapped", None)):
        params = getattr(candidate, "params", None)
        if isinstance(params, ChocKaleParams):
            return params
    raise ValueError(f"{type(env).__name__} is not a Choc-vs-Kale environment (no ChocKaleParams)")


def candidate_features(observations: Observation) -> np.ndarray:
    """Each candidate's feature x, shape (users, candidates)."""
    return np.asarray(observations["candidates"], dtype=np.float64)[..., 0]


def _require(infos: Info | None, *keys: str) -> list[np.ndarray]:
    if infos is None or any(key not in infos for key in keys):
        raise ValueError(
            f"this oracle policy needs the env's info with {list(keys)}; pass infos=info from "
            "reset()/step() (multi-platform: use JointReferencePolicy)"
        )
    return [np.atleast_1d(np.asarray(infos[key])) for key in keys]


class ValueGreedyPolicy(SlateAgent):
    """Picks the slate that maximises the choice-weighted value of the consumed item."""

    def __init__(self, params: ChocKaleParams, *, seed: int | None = None) -> None:
        super().__init__(slate_size=params.slate_size, seed=seed)
        self.params = params
        self.model = ChocKaleModel(params)

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        """Build for a Choc-vs-Kale env (the oracle needs the env's true parameters)."""
        del config
        return cls(env_params(env), seed=seed)

    def _choose(
        self, features: np.ndarray, values: np.ndarray, null_value: np.ndarray
    ) -> np.ndarray:
        k = self.slate_size
        if self.params.choice_model == "first_slot":
            return np.argsort(-values, axis=1, kind="stable")[:, :k].astype(np.int64)
        weights, null_weight = self.model.choice_weights(features)
        return optimal_slates(weights, values, k, null_weight=null_weight, null_value=null_value)


class MyopicPolicy(ValueGreedyPolicy):
    """Maximises the expected engagement of this step only (an oracle of current satisfaction)."""

    oracle = True

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        (satisfaction,) = _require(infos, "user_satisfaction")
        features = candidate_features(observations)
        chocness = self.model.chocness(features)
        values = self.model.expected_engagement(satisfaction[:, None], chocness)
        return self._choose(features, values, np.zeros(len(features)))


class OptimalPlanner(ValueGreedyPolicy):
    """Bayes-optimal slates from dynamic programming over (exposure, remaining budget).

    See :mod:`fedrec.agents.planner`. Construction solves (and caches) the value table; at (N, n) =
    (100, 10) that takes a few seconds.
    """

    oracle = True

    def __init__(
        self,
        params: ChocKaleParams,
        *,
        config: PlannerConfig = DEFAULT_PLANNER_CONFIG,
        seed: int | None = None,
    ) -> None:
        super().__init__(params, seed=seed)
        # One value table per user type: with hidden types the planner is told each user's tau.
        self.tables = {
            tau: value_table(
                dataclasses.replace(params, sensitivity=tau, user_sensitivities=None), config
            )
            for tau in (params.user_sensitivities or (params.sensitivity,))
        }
        self.table = next(iter(self.tables.values())) if len(self.tables) == 1 else None

    def expected_return(self, exposure: np.ndarray | float | None = None) -> float:
        """The DP's value V_T: at a given start exposure, or averaged over the start distribution."""
        p = self.params
        if exposure is None:
            u = (np.arange(1000) + 0.5) / 1000
            exposure = (u - 0.5) / (1.0 - p.memory_discount)
        exposure = np.atleast_1d(exposure)
        types = p.user_sensitivities or (p.sensitivity,)  # hidden user types: each as likely
        values = [self.tables[tau].value(p.time_budget, exposure) for tau in types]
        return float(np.mean(values))

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        exposure, budget = _require(infos, "user_exposure", "budget_left")
        features = candidate_features(observations)
        budget = np.maximum(budget, 1)
        if self.table is not None:
            values = self.table.item_values(budget, exposure, features)
            null_value = self.table.value(budget - 1, exposure)
            return self._choose(features, values, null_value)
        (sensitivity,) = _require(infos, "user_sensitivity")
        values = np.empty(features.shape)
        null_value = np.empty(len(features))
        for tau, table in self.tables.items():
            users = sensitivity == tau
            values[users] = table.item_values(budget[users], exposure[users], features[users])
            null_value[users] = table.value(budget[users] - 1, exposure[users])
        return self._choose(features, values, null_value)


__all__ = [
    "MyopicPolicy",
    "OptimalPlanner",
    "ValueGreedyPolicy",
    "candidate_features",
    "env_params",
]
