"""``fedrec/ChocKaleCascade-v0``: the cascade click model, its exact optimum and oracle, the card,
seeding, Gymnasium's checker, state, and the native vector env.

Monte Carlo tests use ``ALPHA = 0.001`` (two-sided) and fixed seeds, so they are deterministic;
a correct implementation fails one at a new seed with probability at most 0.3 % (3 tests).
"""

from __future__ import annotations

import itertools
import math
import re
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from scipy import stats

import fedrec  # noqa: F401  (registers the environments)
from fedrec.agents.cascade_oracle import CascadeOraclePolicy
from fedrec.agents.reference import RandomPolicy
from fedrec.envs.cascade import ChocKaleCascadeEnv
from fedrec.envs.cascade_model import (
    attraction_probabilities,
    click_probability,
    optimal_slates,
)
from fedrec.envs.cascade_vector import ChocKaleCascadeVectorEnv
from fedrec.envs.hidden import hidden_info_keys
from fedrec.eval.rollout import evaluate_policy

ENV_ID = "fedrec/ChocKaleCascade-v0"
ALPHA = 0.001
HIDDEN = {"candidate_attraction", "slate_click_probability", "optimal_click_probability"}


def test_card_has_the_gymnasium_sections_and_names_the_hidden_keys() -> None:
    doc = ChocKaleCascadeEnv.__doc__ or ""
    found = re.findall(r"^\s*## (.+?)\s*$", doc, flags=re.MULTILINE)
    for section in (
        "Description", "Action Space", "Observation Space", "Dynamics", "Rewards",
        "Episode End", "Info", "Arguments",
    ):  # fmt: skip
        assert section in found, section
    info = doc.split("## Info", 1)[1].split("\n    ## ", 1)[0]
    assert "hidden" in info and all(f"``{key}``" in info for key in HIDDEN)


def test_attraction_function() -> None:
    a = attraction_probabilities(np.array([0.0, 0.75, 1.0]))
    np.testing.assert_allclose(a, [1 / (1 + math.e**3), 1 / (1 + math.e**0.75), 1 / (1 + math.e)])
    grid = np.linspace(0, 1, 1001)
    assert grid[attraction_probabilities(grid).argmax()] == pytest.approx(0.75)
    # the candidates observation's trailing axis is kept
    assert attraction_probabilities(np.zeros((4, 10, 1))).shape == (4, 10, 1)
    env = ChocKaleCascadeEnv(attraction_coefficients=(0.0, 0.0, 0.0))
    np.testing.assert_allclose(env.attraction_probabilities(np.array([0.3])), [0.5])


def test_optimal_slate_is_exact() -> None:
    """No ordered slate of distinct candidates has a higher click probability (brute force)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = attraction_probabilities(rng.random(7))
        best = optimal_slates(a, 3)
        value = click_probability(a[best])
        others = max(click_probability(a[list(s)]) for s in itertools.permutations(range(7), 3))
        assert value == pytest.approx(others, abs=1e-15)
        assert (np.diff(a[best]) <= 0).all()  # most attractive first


def test_click_positions_follow_the_cascade() -> None:
    """P(click at position k) = prod_{j<k} (1 - a_j) a_k: observed counts per position (and no
    click) against the expected ones, chi-square at ALPHA; the click rate against the mean
    click probability, a z-test."""
    b, steps = 4000, 10
    env = ChocKaleCascadeVectorEnv(b, time_budget=steps)
    obs, info = env.reset(seed=5)
    rng = np.random.default_rng(5)
    observed, expected = np.zeros(4), np.zeros(4)
    clicks, probability = 0.0, 0.0
    for _ in range(steps):
        slates = np.argsort(rng.random((b, 10)), axis=1)[:, :3]
        a = np.take_along_axis(info["candidate_attraction"], slates, axis=1)
        reach = np.cumprod(np.concatenate([np.ones((b, 1)), 1 - a], axis=1), axis=1)
        expected += np.concatenate([reach[:, :3] * a, reach[:, 3:]], axis=1).sum(axis=0)
        obs, reward, _, _, info = env.step(slates)
        slot = info["clicked_slot"]
        observed += np.bincount(np.where(slot < 0, 3, slot), minlength=4)
        np.testing.assert_allclose(info["slate_click_probability"], click_probability(a))
        assert ((obs["response_click"].sum(axis=1) == 1) == (slot >= 0)).all()
        clicks += reward.sum()
        probability += info["slate_click_probability"].sum()
    assert stats.chisquare(observed, expected).pvalue > ALPHA, (observed, expected)
    n = b * steps
    p = probability / n
    z = (clicks / n - p) / math.sqrt(p * (1 - p) / n)
    assert 2 * stats.norm.sf(abs(z)) > ALPHA, (clicks / n, p)


def test_oracle_has_zero_regret_and_beats_random() -> None:
    env = gym.make_vec(ENV_ID, num_envs=500)
    oracle = CascadeOraclePolicy(slate_size=3)
    obs, info = env.reset(seed=1)
    regret = 0.0
    for _ in range(60):
        obs, _, _, _, info = env.step(oracle.act_batch(obs, infos=info))
        regret += (info["optimal_click_probability"] - info["slate_click_probability"]).sum()
    assert regret == 0.0
    with pytest.raises(ValueError, match="candidate_attraction"):
        oracle.act_batch(obs, infos={"clicked_slot": info["clicked_slot"]})
    # through fedrec's evaluation, which hands the hidden keys to oracles only
    best = evaluate_policy(ENV_ID, oracle, episodes=400, num_envs=400, seed=2)
    random = evaluate_policy(ENV_ID, RandomPolicy(slate_size=3, seed=0), episodes=400, seed=2)
    assert best.mean > random.mean + 5  # 4,000 episodes: 40.3 against 32.4 clicks (top_x 39.6)
    result = stats.ttest_ind(best.returns, random.returns, equal_var=False)
    assert result.pvalue < ALPHA


@pytest.mark.parametrize("resample", [True, False])
def test_vector_env_with_one_user_is_the_single_env(resample: bool) -> None:
    single = ChocKaleCascadeEnv(time_budget=7, resample_candidates=resample)
    vector = gym.make_vec(ENV_ID, num_envs=1, time_budget=7, resample_candidates=resample)
    assert isinstance(vector, ChocKaleCascadeVectorEnv)
    obs_s, _ = single.reset(seed=3)
    obs_v, _ = vector.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(40):
        slate = rng.permutation(10)[:3]
        obs_s, r_s, term_s, _, info_s = single.step(slate)
        obs_v, r_v, term_v, _, info_v = vector.step(slate[None])
        for key in obs_s:
            np.testing.assert_array_equal(obs_s[key], obs_v[key][0])
        assert (r_s, term_s, info_s["clicked_slot"]) == (
            r_v[0],
            term_v[0],
            info_v["clicked_slot"][0],
        )
        if term_s:
            obs_s, _ = single.reset()
            obs_v, *_ = vector.step(slate[None])
            np.testing.assert_array_equal(obs_s["candidates"], obs_v["candidates"][0])
    if not resample:  # one candidate set per episode
        assert np.array_equal(obs_s["candidates"], single.step(slate)[0]["candidates"])


def test_episode_length_reward_and_spaces() -> None:
    env = gym.make(ENV_ID)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert hidden_info_keys(env) == HIDDEN and HIDDEN <= set(info)
    total, steps, done = 0.0, 0, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert reward in (0.0, 1.0)
        total, steps, done = total + reward, steps + 1, terminated or truncated
    assert steps == 60 and terminated and 0 < total < 60


@pytest.mark.parametrize("size", [{}, {"num_candidates": 30, "slate_size": 5}])
def test_check_env_without_warnings(size: dict) -> None:
    env = gym.make(ENV_ID, **size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []


def test_seeding_and_state_dict() -> None:
    def play(env: ChocKaleCascadeEnv, slates: list) -> list:
        out = []
        for slate in slates:
            obs, reward, terminated, *_ = env.step(slate)
            out.append((obs["candidates"].copy(), reward))
            if terminated:
                env.reset()
        return out

    slates = [np.random.default_rng(i).permutation(10)[:3] for i in range(100)]
    first, second = ChocKaleCascadeEnv(), ChocKaleCascadeEnv()
    first.reset(seed=9)
    second.reset(seed=9)
    a, b = play(first, slates), play(second, slates)
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b, strict=True))
    state = first.state_dict()
    c = play(first, slates)
    first.load_state_dict(state)
    d = play(first, slates)
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(c, d, strict=True))


def test_invalid_arguments_and_actions() -> None:
    with pytest.raises(ValueError, match="attraction_coefficients"):
        ChocKaleCascadeEnv(attraction_coefficients=(1.0, 2.0))
    with pytest.raises(ValueError, match="slate_size"):
        ChocKaleCascadeEnv(num_candidates=2, slate_size=3)
    with pytest.raises(ValueError, match="unknown cascade argument"):
        ChocKaleCascadeVectorEnv(2, budget=3)
    env = ChocKaleCascadeEnv()
    env.reset(seed=0)
    before = env.state_dict()
    for bad in ([0, 0, 1], [0, 1], [0, 1, 10], [0.0, 1.0, 2.0]):
        with pytest.raises(ValueError):
            env.step(bad)
    assert env.state_dict()["np_random"] == before["np_random"]
