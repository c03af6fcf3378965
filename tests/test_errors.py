"""Bad slates and bad configuration raise ValueError naming the problem."""

from __future__ import annotations

import re
from pathlib import Path

import gymnasium as gym
import numpy as np
import pettingzoo
import pytest

import fedrec  # noqa: F401
from fedrec.envs.choc_kale import ChocKaleEnv
from fedrec.envs.choc_kale_vector import ChocKaleVectorEnv
from fedrec.envs.datasets.synthetic import write_synthetic
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv, ChocKaleMultiPlatformEnv
from fedrec.envs.state import env_state

BAD_SLATES = [
    ([0, 1], r"length 2, expected shape \(3,\)"),
    ([0, 1, 2, 3], r"length 4, expected shape \(3,\)"),
    ([0, 1, 10], r"candidate index 10, outside \[0, 10\)"),
    ([-1, 1, 2], r"candidate index -1, outside \[0, 10\)"),
    ([4, 1, 4], r"repeats candidate 4"),
    (np.array([0.0, 1.0, 2.0]), r"integer candidate indices, got dtype float64"),
    (np.array([True, False, True]), r"integer candidate indices, got dtype bool"),
    ("abc", r"integer candidate indices"),
]


@pytest.mark.parametrize(("slate", "message"), BAD_SLATES)
def test_single_env_rejects_bad_slates(slate, message) -> None:
    env = gym.make("fedrec/ChocKaleSlate-v0")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=message):
        env.step(slate)


def test_vector_env_rejects_bad_slates() -> None:
    envs = gym.make_vec("fedrec/ChocKale-v0", num_envs=4)
    envs.reset(seed=0)
    good = np.tile(np.arange(3), (4, 1))
    bad = good.copy()
    bad[2] = [5, 5, 1]
    with pytest.raises(ValueError, match=r"repeats candidate 5 \(row 2\)"):
        envs.step(bad)
    with pytest.raises(ValueError, match=r"shape \(3, 3\), expected shape \(4, 3\)"):
        envs.step(good[:3])
    with pytest.raises(ValueError, match="outside"):
        envs.step(good + 8)
    with pytest.raises(ValueError, match="dtype float32"):
        envs.step(good.astype(np.float32))


def test_multi_platform_rejects_bad_actions() -> None:
    env = ChocKaleMultiPlatformEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"missing \['platform_b'\]"):
        env.step({"platform_a": [0, 1, 2]})
    with pytest.raises(ValueError, match=r"unknown \['platform_z'\]"):
        env.step({"platform_a": [0, 1, 2], "platform_b": [0, 1, 2], "platform_z": [0, 1, 2]})
    with pytest.raises(ValueError, match="slate of platform_b repeats candidate 1"):
        env.step({"platform_a": [0, 1, 2], "platform_b": [1, 1, 2]})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slate_size": 11}, "slate_size=11 exceeds num_candidates=10"),
        ({"num_candidates": 0}, "num_candidates must be >= 1"),
        ({"time_budget": 0}, "time_budget must be >= 1"),
        ({"time_budget": 2.5}, "time_budget must be an integer"),
        ({"choice_model": "cascade"}, "choice_model must be 'first_slot' or 'mnl'"),
        ({"no_click_logit": 0.0}, "no_click_logit needs choice_model='mnl'"),
        ({"memory_discount": 1.0}, r"memory_discount must be in \[0, 1\)"),
        ({"innovation_stddev": -1.0}, "innovation_stddev must be >= 0"),
        ({"satisfaction_noise_stddev": -0.1}, "satisfaction_noise_stddev must be >= 0"),
        ({"engagement_clip": 0.0}, "engagement_clip must be > 0"),
        ({"semantics": "paper"}, "semantics must be 'code' or 'prose'"),
        ({"render_mode": "human"}, "render_mode must be one of"),
    ],
)
def test_bad_constructor_arguments(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ChocKaleEnv(**kwargs)


def test_bad_vector_and_multi_platform_arguments() -> None:
    with pytest.raises(ValueError, match=r"unknown Choc-vs-Kale argument\(s\) \['slatesize'\]"):
        gym.make_vec("fedrec/ChocKale-v0", num_envs=2, slatesize=3)
    with pytest.raises(ValueError, match="num_envs must be a positive integer"):
        ChocKaleVectorEnv(0)
    with pytest.raises(ValueError, match="autoreset_mode must be one of"):
        ChocKaleVectorEnv(2, autoreset_mode="sometimes")
    with pytest.raises(ValueError, match="feedback must be 3 booleans"):
        ChocKaleMultiPlatformEnv(num_platforms=3, feedback=[True, False])
    with pytest.raises(ValueError, match=r"num_platforms must be in \[1, 26\]"):
        ChocKaleMultiPlatformEnv(num_platforms=0)
    with pytest.raises(ValueError, match="reward_mode must be"):
        ChocKaleMultiPlatformEnv(reward_mode="dense")


def test_step_before_reset_and_after_the_end() -> None:
    env = ChocKaleEnv(time_budget=1)
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(np.arange(3))
    env.reset(seed=0)
    assert env.step(np.arange(3))[2]
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(np.arange(3))


# --------------------------------------------------------------------------------------------
# Every action is validated in full before the env changes anything (regressions of fuzz finds)


def _same_state(a: object, b: object) -> bool:
    """Exact equality of two env_state() results (arrays compared with np.array_equal)."""
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_state, a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


@pytest.fixture(scope="module")
def logged_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logged")
    for name in ("ml-100k", "taobao-ads"):
        write_synthetic(name, root / name)
    return root


def test_vector_env_rejects_bad_slates_after_an_episode_end_without_a_change() -> None:
    slates = np.tile(np.arange(3), (2, 1))
    env = ChocKaleVectorEnv(2, time_budget=1)
    twin = ChocKaleVectorEnv(2, time_budget=1)
    for e in (env, twin):
        e.reset(seed=0)
        assert e.step(slates)[2].all()  # both users are reset at the next step
    before = env_state(env)
    for bad, message in [
        (slates.astype(np.float64), "integer candidate indices, got dtype float64"),
        (np.full((2, 3), np.nan), "integer candidate indices, got dtype float64"),
        (None, "integer candidate indices, got dtype object"),
        (slates[:1], r"shape \(1, 3\), expected shape \(2, 3\)"),
        ([[0, 1, 2], [0, 1]], "slates is not an array of numbers"),
    ]:
        with pytest.raises(ValueError, match=message):
            env.step(bad)
        assert _same_state(env_state(env), before)
    out, expected = env.step(slates), twin.step(slates)  # the trajectory still follows the seed
    np.testing.assert_array_equal(out[1], expected[1])
    assert _same_state(env_state(env), env_state(twin))


def test_disabled_autoreset_refuses_to_step_a_finished_env(logged_dir: Path) -> None:
    cases = [
        (
            ChocKaleVectorEnv(3, time_budget=2, autoreset_mode="Disabled"),
            np.tile(np.arange(3), (3, 1)),
        ),
        (
            gym.make_vec(
                "fedrec/MovieLens100K-v0",
                num_envs=3,
                data_dir=logged_dir,
                max_steps=1,
                num_candidates=10,
                slate_size=3,
                autoreset_mode="Disabled",
            ),
            np.tile(np.arange(3), (3, 1)),
        ),
        (
            gym.make_vec(
                "fedrec/MovieLens100K-v0",
                num_envs=3,
                data_dir=logged_dir,
                mode="evaluation",
                top_k=3,
                autoreset_mode="Disabled",
            ),
            np.tile(np.arange(3), (3, 1)),
        ),
        (
            gym.make_vec(
                "fedrec/TaobaoAds-v0",
                num_envs=3,
                data_dir=logged_dir,
                split="all",
                max_episode_steps=1,
                autoreset_mode="Disabled",
            ),
            np.full((3, 1), 0.5),
        ),
    ]
    for env, action in cases:
        env.reset(seed=0)
        done = np.zeros(3, bool)
        while not done.any():
            _, _, terminated, truncated, _ = env.step(action)
            done = terminated | truncated
        before = env_state(env)
        with pytest.raises(
            ValueError, match=re.escape(f"sub-envs {np.flatnonzero(done).tolist()} have finished")
        ):
            env.step(action)
        assert _same_state(env_state(env), before), type(env).__name__
        env.reset(options={"reset_mask": done})
        env.step(action)  # accepted again once the finished envs are reset


def test_multi_platform_envs_reject_non_dict_actions() -> None:
    env = pettingzoo.make("parallel", "fedrec/ChocKaleMultiPlatform-v0")
    env.reset(seed=0)
    before = env_state(env)
    for bad in ([[0, 1, 2], [0, 1, 2]], None, "platform_a"):
        with pytest.raises(ValueError, match="actions must be a dict keyed by platform"):
            env.step(bad)
    with pytest.raises(
        ValueError, match=r"slate of platform_a has shape \(1, 3\), expected shape \(3,\)"
    ):
        env.step({"platform_a": [[0, 1, 2]], "platform_b": [0, 1, 2]})
    assert _same_state(env_state(env), before)
    batch = ChocKaleMultiPlatformBatchEnv(2)
    batch.reset(seed=0)
    before = env_state(batch)
    good = np.tile(np.arange(3), (2, 1))
    for bad, message in [
        ({"platform_a": good}, r"missing \['platform_b'\]"),
        ({"platform_a": good, "platform_b": good, 7: good}, r"unknown \[7\]"),
        ({"platform_a": good, "platform_b": good[:1]}, r"slate of platform_b has shape \(1, 3\)"),
        ({"platform_a": good * 1.0, "platform_b": good}, "slate of platform_a must hold integer"),
        (
            {"platform_a": good, "platform_b": [[0, 0, 1], [0, 1, 2]]},
            "platform_b repeats candidate 0",
        ),
        ({"platform_a": good + 8, "platform_b": good}, "platform_a contains candidate index 10"),
        ([good, good], "actions must be a dict"),
    ]:
        with pytest.raises(ValueError, match=message):
            batch.step(bad)
    assert _same_state(env_state(batch), before)


@pytest.mark.parametrize(
    ("score", "message"),
    [
        (np.array([1.5]), r"outside \[0.0, 1.0\]"),
        (np.array([-0.1], np.float32), r"outside \[0.0, 1.0\]"),
        ("0.5", "must be real scores"),
        ({"score": 0.5}, "must be real scores"),
        (np.array([np.nan]), "finite scores"),
        (np.array([True]), "must be real scores"),
        (np.array([0.5, 0.5]), r"shape \(1,\), got shape \(2,\)"),
    ],
)
def test_taobao_rejects_scores_outside_its_action_space(score, message, logged_dir: Path) -> None:
    env = gym.make("fedrec/TaobaoAds-v0", data_dir=logged_dir, split="all")
    env.reset(seed=0)
    env.step(np.array([0.5], np.float32))  # past the checker's first step
    before = env_state(env)
    with pytest.raises(ValueError, match=message):
        env.step(score)
    assert _same_state(env_state(env), before)
    envs = gym.make_vec("fedrec/TaobaoAds-v0", num_envs=2, data_dir=logged_dir, split="all")
    envs.reset(seed=0)
    before = env_state(envs)
    with pytest.raises(ValueError):
        if isinstance(score, np.ndarray):  # one row per env, or one row too many
            score = np.stack([score] * 2) if score.size == 1 else np.full((3, 1), 0.5)
        envs.step(score)
    assert _same_state(env_state(envs), before)
