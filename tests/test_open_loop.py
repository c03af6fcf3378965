"""The best open-loop rule: its model value is the simulated return, the search beats every
two-phase schedule, and the policy reads nothing but the candidates and its own step count."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

import fedrec  # noqa: F401  (registers the ids)
from fedrec.agents.open_loop import (
    JointOpenLoopPolicy,
    OpenLoopModel,
    OpenLoopPolicy,
    best_open_loop_plan,
    fixed_rules,
)
from fedrec.agents.reference import LowestFeaturePolicy, OptimalPlanner, env_params
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.eval.rollout import evaluate_joint_policy, evaluate_policy

LONG_TERM = "fedrec/ChocKaleLongTerm-v0"


def _params(env_id: str, **kwargs):
    return env_params(gym.make(env_id, **kwargs))


def test_rules_span_top_x_to_bottom_x_without_duplicates() -> None:
    mnl = _params(LONG_TERM)  # N = 10, n = 3, MNL: only the set of ranks matters
    names = [rule.name for rule in fixed_rules(mnl)]
    assert names[:2] == ["top_x", "bottom_x"]
    assert {"top1+bottom2", "top2+bottom1", "ranks1-3"} <= set(names)
    assert "ranks7-9" not in names  # the same set as bottom_x
    sets = [frozenset(rule.ranks) for rule in fixed_rules(mnl)]
    assert len(sets) == len(set(sets))
    first_slot = _params("fedrec/ChocKale-v0")  # only the rank in slot 0 matters
    heads = [rule.ranks[0] for rule in fixed_rules(first_slot)]
    assert sorted(heads) == list(range(first_slot.num_candidates))


@pytest.mark.parametrize("env_id", [LONG_TERM, "fedrec/ChocKaleUserTypes-v0"])
def test_the_model_value_is_the_simulated_return(env_id: str) -> None:
    params = _params(env_id)
    plan = best_open_loop_plan(params)
    summary = evaluate_policy(
        env_id, OpenLoopPolicy(plan, slate_size=3), episodes=3000, num_envs=1500, seed=11
    )
    # Monte Carlo CI plus a 0.5% allowance for the grid and the estimated choice distributions
    assert abs(summary.mean - plan.value) < summary.half_width + 0.005 * plan.value


def test_a_constant_schedule_is_the_fixed_rule() -> None:
    params = _params(LONG_TERM)
    rules = fixed_rules(params)
    model = OpenLoopModel(params, rules, params.time_budget)
    bottom = [r.name for r in rules].index("bottom_x")
    summary = evaluate_policy(
        LONG_TERM, LowestFeaturePolicy(slate_size=3), episodes=3000, num_envs=1500, seed=11
    )
    value = model.value([bottom] * params.time_budget)
    assert abs(summary.mean - value) < summary.half_width + 0.005 * value


def test_the_search_beats_every_two_phase_schedule_and_bottom_x() -> None:
    params = dataclasses.replace(_params(LONG_TERM), time_budget=20)
    rules = fixed_rules(params)
    model = OpenLoopModel(params, rules, 20)
    plan = model.search()
    two_phase = max(
        model.value([a] * s + [b] * (20 - s))
        for a in range(len(rules))
        for b in range(len(rules))
        for s in range(21)
    )
    assert plan.value >= two_phase - 1e-9
    assert plan.value == pytest.approx(model.value(plan.schedule))
    assert plan.value >= plan.best_constant_value
    # long-term dynamics: kale first, chocolate at the very end (the planner's shape)
    assert rules[plan.schedule[0]].name == "bottom_x" and rules[plan.schedule[-1]].name == "top_x"
    assert plan.describe().startswith("bottom_x (1-") and plan.describe().endswith("-20)")


def test_on_the_long_term_env_it_beats_bottom_x_and_reaches_the_planner() -> None:
    params = _params(LONG_TERM)
    plan = best_open_loop_plan(params)
    planner_value = OptimalPlanner(params).expected_return()
    assert plan.value > plan.best_constant_value + 15  # bottom_x, the best single rule
    assert plan.value > 0.99 * planner_value


def test_the_policy_reads_only_the_candidates_and_counts_its_own_steps() -> None:
    plan = best_open_loop_plan(_params(LONG_TERM))
    policy = OpenLoopPolicy(plan, slate_size=3)
    env = gym.make_vec(LONG_TERM, num_envs=4)
    observations, _ = env.reset(seed=0)
    policy.begin_episodes(np.ones(4, bool))
    table = plan.rank_table()
    for step in range(61):
        only_candidates = {"candidates": observations["candidates"]}
        slates = policy.act_batch(only_candidates, infos=None)
        order = np.argsort(-observations["candidates"][..., 0], axis=1, kind="stable")
        np.testing.assert_array_equal(slates, order[:, table[step]])
        observations, *_ = env.step(slates)
    state = policy.state_dict()
    policy.begin_episodes(np.array([True, False, False, True]))
    np.testing.assert_array_equal(policy.steps, [0, 61, 61, 0])
    policy.load_state_dict(state)
    np.testing.assert_array_equal(policy.steps, [61] * 4)


def test_the_joint_schedule_runs_over_the_visits() -> None:
    kwargs = {"sensitivity": 0.05}
    env = ChocKaleMultiPlatformBatchEnv(1, **kwargs)
    policy = JointOpenLoopPolicy.for_env(env)
    assert len(policy.plan.schedule) == 122  # 61 joint steps of 2 visits
    summary = evaluate_joint_policy(policy, episodes=1000, num_envs=500, seed=2, env_kwargs=kwargs)[
        "total"
    ]
    assert abs(summary.mean - policy.plan.value) < summary.half_width + 0.005 * policy.plan.value
