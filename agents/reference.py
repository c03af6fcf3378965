"""Reference policies for Choc-vs-Kale: random, the two fixed heuristics, myopic and the planner.

They implement :class:`fedrec.agents.base.SlateAgent`, so every benchmark can report an agent's
return beside them and its regret against the planner. The heuristics ``top_x`` (the n candidates
with the largest feature x, largest first) and ``bottom_x`` (its mirror) neither learn nor read
the user's state; in the papers' settings ``top_x`` is (nearly) the planner's slate, so a learning
claim is a claim over the best heuristic, not over random. The myopic policy and the planner are
*oracles*: they read the user's true state from the env's info (``user_exposure``,
``user_satisfaction``, ``budget_left``), which learners must not use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.agents.assortment import optimal_slates
from fedrec.agents.base import Info, Observation, SlateAgent
from fedrec.agents.open_loop import OpenLoopPolicy, best_open_loop_plan
from fedrec.agents.planner import DEFAULT_PLANNER_CONFIG, PlannerConfig, value_table
from fedrec.envs.choc_kale_model import ChocKaleModel, ChocKaleParams


def env_params(env: Any) -> ChocKaleParams:
    """The :class:`ChocKaleParams` of any Choc-vs-Kale env (wrapped, vector or multi-platform)."""
    for candidate in (env, getattr(env, "unwrapped", None)):
        params = getattr(candidate, "params", None)
        if isinstance(params, ChocKaleParams):
            return params
    raise ValueError(f"{type(env).__name__} is not a Choc-vs-Kale environment (no ChocKaleParams)")


def _features(observations: Observation) -> np.ndarray:
    return np.asarray(observations["candidates"], dtype=np.float64)[..., 0]


def _require(infos: Info | None, *keys: str) -> list[np.ndarray]:
    if infos is None or any(key not in infos for key in keys):
        raise ValueError(
            f"this oracle policy needs the env's info with {list(keys)}; pass infos=info from "
            "reset()/step() (multi-platform: use JointReferencePolicy)"
        )
    return [np.atleast_1d(np.asarray(infos[key])) for key in keys]


class RandomPolicy(SlateAgent):
    """A uniformly random slate of distinct candidates (RecSim's ``RandomAgent``)."""

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        features = _features(observations)
        keys = self.rng.random(features.shape)
        return np.argsort(keys, axis=1)[:, : self.slate_size].astype(np.int64)


class HighestFeaturePolicy(SlateAgent):
    """``top_x``: the n candidates with the largest feature, largest first (no learning, no
    oracle; ties keep candidate order)."""

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        order = np.argsort(-_features(observations), axis=1, kind="stable")
        return order[:, : self.slate_size].astype(np.int64)


class LowestFeaturePolicy(SlateAgent):
    """``bottom_x``: the mirror of :class:`HighestFeaturePolicy` (smallest feature first)."""

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        order = np.argsort(_features(observations), axis=1, kind="stable")
        return order[:, : self.slate_size].astype(np.int64)


#: The fixed heuristics by name.
HEURISTICS: dict[str, type[SlateAgent]] = {
    "top_x": HighestFeaturePolicy,
    "bottom_x": LowestFeaturePolicy,
}


class _ValueGreedyPolicy(SlateAgent):
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


class MyopicPolicy(_ValueGreedyPolicy):
    """Maximises the expected engagement of this step only (an oracle of current satisfaction)."""

    oracle = True

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        (satisfaction,) = _require(infos, "user_satisfaction")
        features = _features(observations)
        chocness = self.model.chocness(features)
        values = self.model.expected_engagement(satisfaction[:, None], chocness)
        return self._choose(features, values, np.zeros(len(features)))


class OptimalPlanner(_ValueGreedyPolicy):
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
        features = _features(observations)
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


class JointReferencePolicy:
    """Runs a reference policy on every platform of a multi-platform env for one joint step.

    Platforms act on the state at the start of the joint step, but the user visits them in order;
    for the oracle policies the state each later platform plans for is the *expected* exposure
    after the earlier platforms' slates (certainty equivalence), and its remaining budget is
    reduced by the earlier visits. The planner's DP value assumes each platform sees the state at
    its own visit, so it is an upper bound on what parallel acting can reach.
    """

    #: It reads the users' hidden state (``env.oracle_state()``) in evaluation.
    oracle = True

    def __init__(self, policy: SlateAgent, params: ChocKaleParams, agents: list[str]) -> None:
        self.policy, self.params, self.agents = policy, params, list(agents)
        self.model = ChocKaleModel(params)

    def act_joint(
        self, observations: Mapping[str, Observation], oracle: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Slates for every platform from batched observations and ``env.oracle_state()``."""
        exposure = np.atleast_1d(np.asarray(oracle["user_exposure"], dtype=np.float64)).copy()
        budget = np.atleast_1d(np.asarray(oracle["budget_left"])).copy()
        sensitivity = oracle.get("user_sensitivity")  # hidden user types: each user's tau
        if sensitivity is not None:
            sensitivity = np.atleast_1d(np.asarray(sensitivity, dtype=np.float64))
        slates: dict[str, np.ndarray] = {}
        for agent in self.agents:
            info = {
                "user_exposure": exposure,
                "user_satisfaction": self.model.satisfaction(exposure, sensitivity),
                "budget_left": budget,
            }
            if sensitivity is not None:
                info["user_sensitivity"] = sensitivity
            slate = self.policy.act_batch(observations[agent], infos=info)
            slates[agent] = slate
            exposure = self._expected_next_exposure(exposure, _features(observations[agent]), slate)
            budget = budget - 1
        return slates

    def _expected_next_exposure(
        self, exposure: np.ndarray, features: np.ndarray, slates: np.ndarray
    ) -> np.ndarray:
        p, model = self.params, self.model
        slate_x = np.take_along_axis(features, slates, axis=1)
        weights, null_weight = model.choice_weights(slate_x)
        probabilities = weights / (weights.sum(axis=1, keepdims=True) + null_weight)
        moved = p.memory_discount * exposure[:, None] - 2.0 * (model.chocness(slate_x) - 0.5)
        stay = 1.0 - probabilities.sum(axis=1)
        return (probabilities * moved).sum(axis=1) + stay * exposure


def reference_policies(params: ChocKaleParams, *, seed: int = 0) -> dict[str, SlateAgent]:
    """The reference policies for an env's parameters, by name: random, the fixed heuristics
    (``top_x``, ``bottom_x``), the best open-loop schedule of fixed rules (``best_open_loop``,
    :mod:`fedrec.agents.open_loop`: the best no-learning policy that reads no user state), and
    the oracles (myopic, planner). On a multi-platform env's parameters ``best_open_loop``
    schedules the visits (called once per platform, in visit order). With hidden user types
    also ``belief_planner`` (:mod:`fedrec.agents.belief_planner`): it knows the model but not
    the user, and acts on the exact posterior from what it observes (elsewhere it is the
    planner)."""
    policies: dict[str, SlateAgent] = {
        "random": RandomPolicy(slate_size=params.slate_size, seed=seed),
        "top_x": HighestFeaturePolicy(slate_size=params.slate_size, seed=seed),
        "bottom_x": LowestFeaturePolicy(slate_size=params.slate_size, seed=seed),
        "best_open_loop": OpenLoopPolicy(
            best_open_loop_plan(params), slate_size=params.slate_size, seed=seed
        ),
        "myopic": MyopicPolicy(params, seed=seed),
        "planner": OptimalPlanner(params, seed=seed),
    }
    if params.heterogeneous:
        from fedrec.agents.belief_planner import BeliefPlanner  # it builds on this module

        policies["belief_planner"] = BeliefPlanner(params, seed=seed)
    return policies


__all__ = [
    "HEURISTICS",
    "HighestFeaturePolicy",
    "JointReferencePolicy",
    "LowestFeaturePolicy",
    "MyopicPolicy",
    "OptimalPlanner",
    "RandomPolicy",
    "env_params",
    "reference_policies",
]
