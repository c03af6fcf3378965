"""fedrec/ChocKaleUserTypes-v0: users with a hidden sensitivity, the planner told each user's tau,
no fixed heuristic close to it, and an agent that reads the observed satisfaction level."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pettingzoo
import pytest

from fedrec.agents.reference import MyopicPolicy, OptimalPlanner, env_params, reference_policies
from fedrec.agents.slate_rule import AdaptiveRuleSearchAgent, AdaptiveRuleSearchConfig
from fedrec.envs.choc_kale_model import make_params
from fedrec.eval.rollout import evaluate_policy
from fedrec.registration import LONG_TERM_KWARGS, USER_TYPES_KWARGS
from fedrec.train.loop import TrainConfig, train

USER_TYPES = "fedrec/ChocKaleUserTypes-v0"


def test_each_user_gets_a_hidden_type_per_episode_that_drives_its_satisfaction() -> None:
    envs = gym.make_vec(USER_TYPES, num_envs=2000)
    obs, info = envs.reset(seed=0)
    tau = info["user_sensitivity"]
    assert set(np.unique(tau)) == {0.0, 0.1}
    assert 0.45 < (tau == 0.1).mean() < 0.55  # equally likely
    # satisfaction = sigmoid(tau * exposure): exactly 1/2 for the indifferent users
    expected = 1 / (1 + np.exp(-tau * info["user_exposure"]))
    np.testing.assert_allclose(info["user_satisfaction"], expected)
    assert (info["user_satisfaction"][tau == 0] == 0.5).all()
    assert "user_sensitivity" not in obs  # hidden: not in the observation
    kale = np.tile(np.arange(3), (2000, 1))  # any slate; then serve the lowest features
    for _ in range(20):
        order = np.argsort(obs["candidates"][..., 0], axis=1)[:, :3]
        obs, _, _, _, info = envs.step(order if _ else kale)
    sat = info["user_satisfaction"]
    assert sat[tau == 0.1].mean() > 0.6 > 0.5 == sat[tau == 0].max()  # kale lifts the sensitive


def test_single_and_batched_envs_draw_the_same_types() -> None:
    single = gym.make(USER_TYPES)
    batched = gym.make_vec(USER_TYPES, num_envs=1)
    for seed in range(6):
        _, info_s = single.reset(seed=seed)
        _, info_b = batched.reset(seed=seed)
        assert info_s["user_sensitivity"] == info_b["user_sensitivity"][0]


def test_the_best_heuristic_is_far_below_the_planner_and_random_is_on_the_papers_scale() -> None:
    params = make_params(USER_TYPES_KWARGS)
    policies = reference_policies(params)
    means = {
        name: evaluate_policy(USER_TYPES, policies[name], episodes=600, seed=3).mean
        for name in ("random", "top_x", "bottom_x", "planner")
    }
    assert max(means["top_x"], means["bottom_x"]) < 0.9 * means["planner"]
    assert 900 < means["random"] < 1100
    # told each user's tau, the planner beats a planner that assumes the mean tau for everyone
    assumed = OptimalPlanner(make_params({**LONG_TERM_KWARGS, "sensitivity": 0.05}))
    assert means["planner"] > evaluate_policy(USER_TYPES, assumed, episodes=600, seed=3).mean + 20
    dp = policies["planner"].expected_return()
    assert abs(dp - means["planner"]) < 0.03 * means["planner"]


def test_the_planner_needs_each_users_tau() -> None:
    planner = OptimalPlanner(make_params(USER_TYPES_KWARGS))
    env = gym.make_vec(USER_TYPES, num_envs=4)
    obs, info = env.reset(seed=0)
    hidden = {k: v for k, v in info.items() if k != "user_sensitivity"}
    with pytest.raises((KeyError, ValueError), match="user_sensitivity"):
        planner.act_batch(obs, infos=hidden)
    assert planner.act_batch(obs, infos=info).shape == (4, 3)
    assert MyopicPolicy(env_params(env)).act_batch(obs, infos=info).shape == (4, 3)


def test_bad_types_are_refused_on_every_env() -> None:
    with pytest.raises(ValueError, match="user_sensitivities"):
        gym.make(USER_TYPES, user_sensitivities=())
    with pytest.raises(ValueError, match="user_sensitivities"):
        gym.make(USER_TYPES, user_sensitivities=[0.0, float("nan")])
    with pytest.raises(ValueError, match="user_sensitivities"):
        gym.make(USER_TYPES, user_sensitivities="0.1")
    with pytest.raises(ValueError, match="user_sensitivities"):  # types run on several platforms
        pettingzoo.make(  # type: ignore[attr-defined]
            "parallel", "fedrec/ChocKaleMultiPlatform-v0", user_sensitivities=(0.0, float("nan"))
        )
    with pytest.raises(ValueError, match="satisfaction_edges"):
        AdaptiveRuleSearchConfig(satisfaction_edges=(0.6, 0.4))
    with pytest.raises(ValueError, match="episodes_per_rule"):
        AdaptiveRuleSearchConfig(episodes_per_rule=0)


def test_an_env_state_with_a_foreign_type_is_refused() -> None:
    env = gym.make_vec(USER_TYPES, num_envs=2)
    env.reset(seed=0)
    state = env.unwrapped.state_dict()
    state["simulator"]["sensitivity"] = np.array([0.0, 0.3])
    with pytest.raises(ValueError, match="sensitivity"):
        env.unwrapped.load_state_dict(state)


def _adaptive(episodes: int, out=None, *, resume: bool = False):
    config = AdaptiveRuleSearchConfig(population=16, episodes_per_rule=2)
    return train(
        lambda env: AdaptiveRuleSearchAgent.from_env(env, config=config, seed=1),
        config=TrainConfig(
            env_id=USER_TYPES, episodes=episodes, num_envs=8, seed=1, eval_episodes=50,
            references=False, checkpoint_every=40, progress=False,
        ),
        out_dir=out, resume=resume, run_info={"agent": "rule_search_adaptive"},
    )  # fmt: skip


def test_the_adaptive_rule_reads_the_satisfaction_level_and_resumes_exactly(tmp_path) -> None:
    agent = AdaptiveRuleSearchAgent(slate_size=3, episode_length=61, seed=0)
    agent.begin_episodes(np.ones(2, dtype=bool))
    candidates = np.tile(np.linspace(0, 1, 10, dtype=np.float32)[None, :, None], (2, 1, 1))
    # weights: in every time bin, low level -> kale (rank by -x), mid and high -> chocolate (+x)
    # (the rule's weights: on x, then on x^2; each per (time bin, level))
    weights = np.zeros((2, agent.config.time_bins, agent.config.contexts))
    weights[0, :, 0], weights[0, :, 1:] = -1.0, 1.0
    agent.mean = weights.reshape(-1)
    slates = agent.act_batch({"candidates": candidates, "user": np.array([[0.3], [0.5]])})
    assert slates[0].tolist() == [0, 1, 2] and slates[1].tolist() == [9, 8, 7]
    with pytest.raises(ValueError, match="observed satisfaction"):
        agent.act_batch({"candidates": candidates})

    whole = _adaptive(160, tmp_path / "whole")
    _adaptive(80, tmp_path / "part")
    resumed = _adaptive(160, tmp_path / "part", resume=True)
    assert (tmp_path / "whole" / "episodes.csv").read_bytes() == (
        tmp_path / "part" / "episodes.csv"
    ).read_bytes()
    assert whole.final_eval["policies"] == resumed.final_eval["policies"]
