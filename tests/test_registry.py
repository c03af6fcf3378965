"""Every registered id is constructible and passes its library's API checker."""

from __future__ import annotations

import pickle
import warnings

import gymnasium as gym
import numpy as np
import pettingzoo
import pytest
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import parallel_api_test

import fedrec
from fedrec.envs.slates import SlateSpace
from fedrec.registration import CHOC_KALE_ENVIRONMENTS

GYM_IDS = [e.id for e in CHOC_KALE_ENVIRONMENTS if e.api == "gymnasium"]
PZ_IDS = [e.id for e in CHOC_KALE_ENVIRONMENTS if e.api == "pettingzoo"]


def test_every_entry_is_registered() -> None:
    for entry in fedrec.ENVIRONMENTS:
        if entry.api == "gymnasium":
            assert entry.id in gym.registry
        else:
            assert entry.id in pettingzoo.parallel_registry
    assert set(GYM_IDS) >= {
        "fedrec/ChocKale-v0",
        "fedrec/ChocKaleSlate-v0",
        "fedrec/ChocKaleLongTerm-v0",
    }
    assert PZ_IDS == [
        "fedrec/ChocKaleMultiPlatform-v0",
        "fedrec/ChocKaleMultiPlatformUserTypes-v0",
    ]


def test_reimport_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fedrec.register_all()


@pytest.mark.parametrize("env_id", GYM_IDS)
@pytest.mark.parametrize("size", [{}, {"num_candidates": 100, "slate_size": 10}])
def test_check_env_without_warnings(env_id: str, size: dict) -> None:
    env = gym.make(env_id, **size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []
    assert isinstance(env.action_space, SlateSpace)
    assert isinstance(env.action_space, gym.spaces.MultiDiscrete)
    assert (env.action_space.start == 0).all()


@pytest.mark.parametrize("env_id", GYM_IDS)
def test_make_vec_returns_native_batched_env(env_id: str) -> None:
    from fedrec.envs.choc_kale_vector import ChocKaleVectorEnv

    envs = gym.make_vec(env_id, num_envs=4096)
    assert isinstance(envs, ChocKaleVectorEnv)
    assert envs.num_envs == 4096
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    obs, _ = envs.reset(seed=0)
    assert obs["candidates"].shape == (4096, 10, 1)
    assert envs.observation_space.contains(obs)
    actions = envs.action_space.sample()
    assert envs.action_space.contains(actions)
    envs.step(actions)


@pytest.mark.parametrize("env_id", GYM_IDS)
def test_pickle_round_trip(env_id: str) -> None:
    env = gym.make(env_id)
    env.reset(seed=1)
    clone = pickle.loads(pickle.dumps(env))
    slate = np.arange(3)
    a = env.step(slate)
    b = clone.step(slate)
    assert a[1] == b[1]
    np.testing.assert_array_equal(a[0]["candidates"], b[0]["candidates"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"num_platforms": 5, "feedback": [True] * 5},
        {"num_platforms": 5, "feedback": [True, True, True, False, False]},
        {"reward_mode": "sparse_team", "feedback": [True, True]},
        {"num_candidates": 100, "slate_size": 10},
    ],
)
def test_parallel_api(kwargs: dict) -> None:
    env = pettingzoo.make("parallel", "fedrec/ChocKaleMultiPlatform-v0", **kwargs)
    parallel_api_test(env, num_cycles=200)
