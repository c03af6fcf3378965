"""Bad slates and bad configuration raise ValueError naming the problem."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import fedrec  # noqa: F401
from fedrec.envs.choc_kale import ChocKaleEnv
from fedrec.envs.choc_kale_vector import ChocKaleVectorEnv
from fedrec.envs.multi_platform import ChocKaleMultiPlatformEnv

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
