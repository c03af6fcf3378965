"""The fixed heuristics top_x and bottom_x: what they serve, and how they compare with the planner
in the papers' setting (equal) and in the long-term setting (far apart)."""

from __future__ import annotations

import numpy as np

from fedrec.agents.reference import HighestFeaturePolicy, LowestFeaturePolicy, OptimalPlanner
from fedrec.agents.registry import build_multi_platform_agent, resolve_agent
from fedrec.envs.choc_kale_model import make_params
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.eval.rollout import evaluate_policy
from fedrec.registration import LONG_TERM_KWARGS

SMALL = {"num_candidates": 10, "slate_size": 3}


def test_top_x_serves_the_largest_features_in_order_and_bottom_x_the_smallest() -> None:
    x = np.array([[0.3, 0.9, 0.1, 0.5, 0.7]])[..., None]
    top = HighestFeaturePolicy(slate_size=3).act_batch({"candidates": x})
    bottom = LowestFeaturePolicy(slate_size=3).act_batch({"candidates": x})
    np.testing.assert_array_equal(top, [[1, 4, 3]])
    np.testing.assert_array_equal(bottom, [[2, 0, 3]])
    assert resolve_agent("top_x") is HighestFeaturePolicy


def test_top_x_is_the_planner_in_the_papers_setting_but_not_in_the_long_term_one() -> None:
    def mean(env_id, policy, kwargs=None):
        return evaluate_policy(
            env_id,
            policy,
            episodes=200,
            num_envs=200,
            seed=5,
            env_kwargs={**SMALL, **(kwargs or {})},
        ).mean

    params = make_params({**LONG_TERM_KWARGS, **SMALL, "sensitivity": 0.01})
    planner = mean("fedrec/ChocKaleSlate-v0", OptimalPlanner(params))
    top = mean("fedrec/ChocKaleSlate-v0", HighestFeaturePolicy(slate_size=3))
    assert abs(top - planner) < 0.01 * planner
    long_params = make_params({**LONG_TERM_KWARGS, **SMALL})
    long_planner = mean("fedrec/ChocKaleLongTerm-v0", OptimalPlanner(long_params))
    long_top = mean("fedrec/ChocKaleLongTerm-v0", HighestFeaturePolicy(slate_size=3))
    long_bottom = mean("fedrec/ChocKaleLongTerm-v0", LowestFeaturePolicy(slate_size=3))
    assert long_top < 0.8 * long_planner < long_bottom


def test_the_multi_platform_heuristics_are_agents_by_name() -> None:
    env = ChocKaleMultiPlatformBatchEnv(2, **SMALL)
    observations, _ = env.reset(seed=0)
    slates = build_multi_platform_agent("bottom_x", env).act(observations)
    for platform, obs in observations.items():
        x = obs["candidates"][..., 0]
        chosen = np.take_along_axis(x, slates[platform], axis=1)
        assert (chosen.max(axis=1) <= np.sort(x, axis=1)[:, 2]).all()
