"""Random, myopic and optimal-planner policies; exact slate optimisation."""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest

import fedrec  # noqa: F401
from fedrec.agents.assortment import optimal_slates, slate_value
from fedrec.agents.reference import (
    JointReferencePolicy,
    MyopicPolicy,
    OptimalPlanner,
    RandomPolicy,
    env_params,
    reference_policies,
)
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.eval.rollout import evaluate_joint_policy, evaluate_policy


@pytest.mark.parametrize("with_null", [False, True])
def test_optimal_slates_match_enumeration(with_null: bool) -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 8))
        k = int(rng.integers(1, n + 1))
        weights = rng.lognormal(size=(1, n))
        values = rng.normal(size=(1, n)) * rng.choice([1.0, 20.0])
        null_weight = rng.lognormal() if with_null else 0.0
        null_value = rng.normal() * 5
        best = max(
            slate_value(
                weights, values, np.array([c]), null_weight=null_weight, null_value=null_value
            )[0]
            for c in itertools.combinations(range(n), k)
        )
        slate = optimal_slates(weights, values, k, null_weight=null_weight, null_value=null_value)
        assert len(set(slate[0])) == k
        got = slate_value(weights, values, slate, null_weight=null_weight, null_value=null_value)[0]
        assert got == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_random_policy_matches_the_closed_form() -> None:
    """Library env: random slot-0 document, E[return] = 948.7 (s.d. 163 per episode; see
    docs/choc_kale.md, "Random-policy reference values")."""
    summary = evaluate_policy(
        "fedrec/ChocKale-v0", RandomPolicy(slate_size=3, seed=0), episodes=4000, num_envs=2000
    )
    assert abs(summary.mean - 948.71) < max(3 * 163 / np.sqrt(4000), summary.half_width * 1.6)


def test_random_policy_slates_are_uniform_and_distinct() -> None:
    policy = RandomPolicy(slate_size=3, seed=1)
    slates = policy.act_batch({"candidates": np.zeros((30_000, 10, 1))})
    assert all(len(set(row)) == 3 for row in slates[:1000])
    counts = np.bincount(slates.ravel(), minlength=10)
    assert np.all(np.abs(counts / counts.sum() - 0.1) < 0.005)


def test_myopic_policy_puts_the_most_engaging_item_first() -> None:
    env = gym.make("fedrec/ChocKale-v0")
    policy = MyopicPolicy(env_params(env))
    obs, info = env.reset(seed=0)
    slate = policy.act(obs, info=info)
    assert slate[0] == np.argmax(obs["candidates"][:, 0])


def test_oracle_policies_need_the_info() -> None:
    env = gym.make("fedrec/ChocKale-v0")
    obs, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match="needs the env's info"):
        OptimalPlanner(env_params(env)).act(obs)


@pytest.mark.parametrize("env_id", ["fedrec/ChocKale-v0", "fedrec/ChocKaleLongTerm-v0"])
def test_planner_dp_value_matches_its_simulated_return(env_id: str) -> None:
    planner = OptimalPlanner(env_params(gym.make(env_id)))
    summary = evaluate_policy(env_id, planner, episodes=3000, num_envs=1500, seed=5)
    predicted = planner.expected_return()
    # Monte Carlo CI plus 0.5% discretisation allowance of the DP
    assert abs(summary.mean - predicted) < summary.half_width + 0.005 * predicted


def test_planning_pays_on_the_long_term_env_only() -> None:
    results = {}
    for env_id in ("fedrec/ChocKaleSlate-v0", "fedrec/ChocKaleLongTerm-v0"):
        policies = reference_policies(env_params(gym.make(env_id)), seed=0)
        results[env_id] = {
            name: evaluate_policy(env_id, policy, episodes=1000, num_envs=1000, seed=1).mean
            for name, policy in policies.items()
        }
    short, long = results["fedrec/ChocKaleSlate-v0"], results["fedrec/ChocKaleLongTerm-v0"]
    assert short["planner"] >= short["myopic"] - 1.0  # tau = 0.01: planning gains nothing
    assert short["myopic"] > short["random"] + 50
    assert long["planner"] > 1.10 * long["myopic"]  # the bar; measured about +35%
    assert long["planner"] > long["random"] > long["myopic"]


def test_joint_planner_on_the_multi_platform_env() -> None:
    env = ChocKaleMultiPlatformBatchEnv(num_users=1, sensitivity=0.05)
    names = reference_policies(env.params)
    totals = {
        name: evaluate_joint_policy(
            JointReferencePolicy(policy, env.params, env.possible_agents),
            episodes=600,
            num_envs=600,
            seed=3,
            env_kwargs={"sensitivity": 0.05},
        )["total"].mean
        for name, policy in names.items()
    }
    assert totals["planner"] > 1.10 * totals["myopic"]
    assert totals["planner"] > totals["random"]
