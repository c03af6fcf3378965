"""Reference policies for Choc-vs-Kale: random, the fixed heuristics, the best open-loop rule,
and (from :mod:`fedrec.agents.oracles` and :mod:`fedrec.agents.belief_planner`) the oracles.

They implement :class:`fedrec.agents.base.SlateAgent`, so every benchmark can report an agent's
return beside them and its regret against the planner. The heuristics ``top_x`` (the n candidates
with the largest feature x, largest first) and ``bottom_x`` (its mirror) neither learn nor read
the user's state; in the papers' settings ``top_x`` is (nearly) the planner's slate, so a learning
claim is a claim over the best no-learning rule, not over random. The myopic policy and the
planner are *oracles*: they read the user's true state from the env's info (``user_exposure``,
``user_satisfaction``, ``budget_left``), which learners must not use. This module gathers them
in :func:`reference_policies`; it is imported by the benchmarks, never by the policies it lists.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedrec.agents.base import Info, Observation, SlateAgent
from fedrec.agents.belief_planner import BeliefPlanner
from fedrec.agents.open_loop import OpenLoopPolicy, best_open_loop_plan
from fedrec.agents.oracles import (
    MyopicPolicy,
    OptimalPlanner,
    candidate_features,
    env_params,
)
from fedrec.envs.choc_kale_model import ChocKaleModel, ChocKaleParams


class RandomPolicy(SlateAgent):
    """A uniformly random slate of distinct candidates (RecSim's ``RandomAgent``)."""

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        features = candidate_features(observations)
        keys = self.rng.random(features.shape)
        return np.argsort(keys, axis=1)[:, : self.slate_size].astype(np.int64)


class HighestFeaturePolicy(SlateAgent):
    """``top_x``: the n candidates with the largest feature, largest first (no learning, no
    oracle; ties keep candidate order)."""

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        order = np.argsort(-candidate_features(observations), axis=1, kind="stable")
        return order[:, : self.slate_size].astype(np.int64)


class LowestFeaturePolicy(SlateAgent):
    """``bottom_x``: the mirror of :class:`HighestFeaturePolicy` (smallest feature first)."""

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        order = np.argsort(candidate_features(observations), axis=1, kind="stable")
        return order[:, : self.slate_size].astype(np.int64)


#: The fixed heuristics by name.
HEURISTICS: dict[str, type[SlateAgent]] = {
    "top_x": HighestFeaturePolicy,
    "bottom_x": LowestFeaturePolicy,
}


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
            exposure = self._expected_next_exposure(
                exposure, candidate_features(observations[agent]), slate
            )
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
