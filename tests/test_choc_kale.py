"""Choc-vs-Kale dynamics, determinism, and agreement of the single and batched envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import fedrec  # noqa: F401  (registers the ids)
from fedrec.envs.choc_kale import ChocKaleEnv
from fedrec.envs.choc_kale_vector import ChocKaleVectorEnv
from fedrec.registration import CHOC_KALE_ENVIRONMENTS

GYM_ENTRIES = [e for e in CHOC_KALE_ENVIRONMENTS if e.api == "gymnasium"]
GYM_IDS = [e.id for e in GYM_ENTRIES]


def _random_slates(rng: np.random.Generator, batch: int, n_candidates: int, k: int) -> np.ndarray:
    return np.argsort(rng.random((batch, n_candidates)), axis=1)[:, :k]


def _single_trajectory(env_id: str, seed: int, steps: int = 200) -> list:
    env = gym.make(env_id)
    rng = np.random.default_rng(123)
    obs, info = env.reset(seed=seed)
    record = [obs, info]
    for _ in range(steps):
        slate = _random_slates(rng, 1, 10, 3)[0]
        obs, reward, terminated, truncated, info = env.step(slate)
        record += [obs, reward, terminated, info]
        if terminated or truncated:
            obs, info = env.reset()
            record += [obs, info]
    return record


def _assert_same(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("env_id", GYM_IDS)
def test_single_env_200_step_determinism(env_id: str) -> None:
    first = _single_trajectory(env_id, seed=7)
    _assert_same(first, _single_trajectory(env_id, seed=7))
    with pytest.raises(AssertionError):
        _assert_same(first, _single_trajectory(env_id, seed=8))


@pytest.mark.parametrize("env_id", GYM_IDS)
def test_batched_env_200_step_determinism(env_id: str) -> None:
    def run(seed: int) -> list:
        envs = gym.make_vec(env_id, num_envs=32)
        rng = np.random.default_rng(5)
        record = list(envs.reset(seed=seed))
        for _ in range(200):
            record += list(envs.step(_random_slates(rng, 32, 10, 3)))
        return record

    first = run(3)
    _assert_same(first, run(3))
    with pytest.raises(AssertionError):
        _assert_same(first, run(4))


@pytest.mark.parametrize("entry", GYM_ENTRIES, ids=GYM_IDS)
@pytest.mark.parametrize("size", [(10, 3), (100, 10)])
def test_single_env_equals_batched_env_of_one_user(entry, size) -> None:
    """The single env's scalar code path and the batched kernel are the same process, draw for draw."""
    n_candidates, k = size
    kwargs = {**entry.kwargs, "num_candidates": n_candidates, "slate_size": k}
    single, batched = ChocKaleEnv(**kwargs), ChocKaleVectorEnv(1, **kwargs)
    obs_s, _ = single.reset(seed=11)
    obs_b, _ = batched.reset(seed=11)
    rng = np.random.default_rng(0)
    for _ in range(200):  # crosses three episode boundaries (NEXT_STEP autoreset)
        slate = _random_slates(rng, 1, n_candidates, k)
        obs_s, r_s, term_s, _, info_s = single.step(slate[0])
        obs_b, r_b, term_b, _, info_b = batched.step(slate)
        assert info_s["clicked_slot"] == info_b["clicked_slot"][0]
        assert term_s == term_b[0]
        np.testing.assert_allclose(r_s, r_b[0], rtol=1e-12)
        for key in obs_s:
            np.testing.assert_allclose(obs_s[key], obs_b[key][0], rtol=1e-6)
        if term_s:
            obs_s, _ = single.reset()
            obs_b, r_b, *_ = batched.step(slate)  # the autoreset step
            assert r_b[0] == 0.0
            for key in obs_s:
                np.testing.assert_allclose(obs_s[key], obs_b[key][0], rtol=1e-6)


@pytest.mark.parametrize("env_id", ["fedrec/ChocKale-v0", "fedrec/ChocKaleLongTerm-v0"])
def test_batched_and_single_agree_in_distribution(env_id: str) -> None:
    """Per-step mean reward of 400 single-env episodes vs 4000 batched users (other seeds)."""
    rng = np.random.default_rng(1)
    env = gym.make(env_id)
    single = []
    for episode in range(400):
        env.reset(seed=10_000 + episode)
        rewards, done = [], False
        while not done:
            _, reward, done, _, _ = env.step(_random_slates(rng, 1, 10, 3)[0])
            rewards.append(reward)
        single.append(rewards)
    single = np.array(single)  # (episodes, T)
    envs = gym.make_vec(env_id, num_envs=4000)
    envs.reset(seed=99)
    batched = np.array(
        [envs.step(_random_slates(rng, 4000, 10, 3))[1] for _ in range(single.shape[1])]
    ).T
    se = np.sqrt(single.var(axis=0) / len(single) + batched.var(axis=0) / len(batched))
    z = (single.mean(axis=0) - batched.mean(axis=0)) / se
    assert np.abs(z).max() < 4.0  # 60 steps: max |z| of 60 N(0,1) exceeds 4 with p ~ 0.4%
    returns_z = (single.sum(1).mean() - batched.sum(1).mean()) / np.sqrt(
        single.sum(1).var() / len(single) + batched.sum(1).var() / len(batched)
    )
    assert abs(returns_z) < 3.5


def test_library_semantics() -> None:
    """Slot 0 always consumed, 60 steps, reward unclipped while the observation is clipped."""
    envs = gym.make_vec("fedrec/ChocKale-v0", num_envs=2000)
    obs, info = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    rewards, steps = [], 0
    done = np.zeros(2000, dtype=bool)
    while not done.all():
        obs, reward, terminated, truncated, info = envs.step(_random_slates(rng, 2000, 10, 3))
        steps += 1
        assert (info["clicked_slot"] == 0).all()
        assert (obs["response_click"][:, -1, 0] == 1).all()
        assert (obs["response_click"][:, -1, 1:] == 0).all()
        assert obs["response_engagement"].max() <= 100.0
        np.testing.assert_allclose(
            obs["response_engagement"][:, -1, 0], np.minimum(reward, 100.0), rtol=1e-6
        )
        rewards.append(reward)
        done |= terminated
        assert not truncated.any()
    assert steps == 60
    assert np.max(rewards) > 100.0  # about 1% of steps exceed the observation clip


def test_exposure_sign_follows_the_library() -> None:
    """Serving the highest clickbait score first drives exposure down (NPE' = bNPE - 2(c - 1/2))."""
    envs = gym.make_vec("fedrec/ChocKale-v0", num_envs=500)
    obs, info = envs.reset(seed=0)
    for _ in range(30):
        features = obs["candidates"][..., 0]
        slates = np.argsort(-features, axis=1)[:, :3]
        obs, _, _, _, info = envs.step(slates)
    # steady state of beta e - 2 (c - 1/2) with c ~ max of 10 uniforms (mean 10/11): about -2.7
    assert info["user_exposure"].mean() < -2.0


def test_mnl_choice_frequencies_match_the_model() -> None:
    """Empirical consumed-slot frequencies match softmax(1 - x) over the slate."""
    envs = gym.make_vec("fedrec/ChocKaleSlate-v0", num_envs=20_000)
    obs, _ = envs.reset(seed=0)
    slates = np.tile(np.arange(3), (20_000, 1))
    x = obs["candidates"][:, :3, 0].astype(np.float64)
    expected = np.exp(1 - x) / np.exp(1 - x).sum(axis=1, keepdims=True)
    _, _, _, _, info = envs.step(slates)
    clicked = info["clicked_slot"]
    assert (clicked >= 0).all()  # no null item: exactly one click
    for slot in range(3):
        observed = (clicked == slot).mean()
        predicted = expected[:, slot].mean()
        assert abs(observed - predicted) < 4 * np.sqrt(predicted * (1 - predicted) / 20_000)


def test_null_item_and_prose_semantics() -> None:
    env = ChocKaleEnv(choice_model="mnl", no_click_logit=3.0, time_budget=200)
    env.reset(seed=0)
    clicks = [env.step(np.arange(3))[4]["clicked_slot"] for _ in range(200)]
    assert np.mean(np.array(clicks) == -1) > 0.6  # e^3 vs about 3 e^0.5: mostly no click
    zero_reward = ChocKaleEnv(choice_model="mnl", no_click_logit=50.0)
    zero_reward.reset(seed=0)
    _, reward, _, _, info = zero_reward.step(np.arange(3))
    assert info["clicked_slot"] == -1 and reward == 0.0 and info["budget_left"] == 59

    # prose: x is kaleness, so serving high x (kale) raises exposure instead of lowering it
    for semantics, sign in (("code", -1), ("prose", 1)):
        envs = ChocKaleVectorEnv(300, semantics=semantics)
        obs, info = envs.reset(seed=0)
        for _ in range(20):
            slates = np.argsort(-obs["candidates"][..., 0], axis=1)[:, :3]
            obs, _, _, _, info = envs.step(slates)
        assert sign * info["user_exposure"].mean() > 2.0


def test_autoreset_modes() -> None:
    kwargs = {"time_budget": 3}
    slates = np.tile(np.arange(3), (4, 1))
    next_step = ChocKaleVectorEnv(4, **kwargs)
    next_step.reset(seed=0)
    for _ in range(3):
        _, _, terminated, _, _ = next_step.step(slates)
    assert terminated.all()
    _, reward, terminated, _, info = next_step.step(slates)
    assert (reward == 0).all() and not terminated.any() and (info["budget_left"] == 3).all()

    same_step = ChocKaleVectorEnv(4, autoreset_mode="SameStep", **kwargs)
    same_step.reset(seed=0)
    for _ in range(3):
        _, reward, terminated, _, info = same_step.step(slates)
    assert terminated.all() and (reward > 0).all()
    assert info["_final_obs"].all() and "candidates" in info["final_obs"]
    assert (info["budget_left"] == 3).all()  # already reset

    disabled = ChocKaleVectorEnv(4, autoreset_mode=AutoresetMode.DISABLED, **kwargs)
    disabled.reset(seed=0)
    for _ in range(3):
        disabled.step(slates)
    mask = np.array([True, False, True, False])
    _, info = disabled.reset(options={"reset_mask": mask})
    np.testing.assert_array_equal(info["budget_left"], [3, 0, 3, 0])


def test_max_episode_steps_truncates() -> None:
    envs = gym.make_vec("fedrec/ChocKale-v0", num_envs=2, max_episode_steps=5)
    envs.reset(seed=0)
    for _ in range(5):
        _, _, terminated, truncated, _ = envs.step(np.tile(np.arange(3), (2, 1)))
    assert truncated.all() and not terminated.any()


def test_render_ansi() -> None:
    env = gym.make("fedrec/ChocKale-v0", render_mode="ansi")
    env.reset(seed=0)
    env.step(np.array([4, 1, 2]))
    text = env.render()
    assert "slate=[4, 1, 2]" in text and "consumed=slot 0" in text
