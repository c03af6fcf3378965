"""Env state as plain data: every env saves and restores its state so a resumed run is exact."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pettingzoo
import pytest
import torch
from gymnasium.vector import AutoresetMode

import fedrec
from fedrec.envs.datasets.synthetic import write_synthetic
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.envs.state import check_plain_data, env_state, load_env_state

GYM_IDS = fedrec.environment_ids("gymnasium")
MULTI_PLATFORM = "fedrec/ChocKaleMultiPlatform-v0"
SLATE = {"num_candidates": 10, "slate_size": 3}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logged")
    for name in ("ml-100k", "ml-1m", "lastfm-2k", "foursquare-nyc", "taobao-ads"):
        write_synthetic(name, root / name)
    return root


def _kwargs(env_id: str, data_dir: Path, mode: str = "interaction") -> dict[str, Any]:
    """Small episodes for every env, so a few steps cross an episode end."""
    if env_id.startswith("fedrec/ChocKale"):  # the cascade env too
        return {**SLATE, "time_budget": 5}
    if env_id == "fedrec/InterestEvolution-v0":  # minutes: 2-10 steps
        return {**SLATE, "time_budget": 5.0}
    if env_id.startswith("sardine/"):  # SARDINE's envs (the extra): its catalogue and slate
        return {"episode_length": 5}
    if env_id == "fedrec/TaobaoAds-v0":
        return {"data_dir": data_dir, "max_episode_steps": 3}
    if mode == "evaluation":
        return {"data_dir": data_dir, "mode": "evaluation", "top_k": 3}
    return {"data_dir": data_dir, **SLATE, "max_steps": 4}


CASES = [(env_id, "interaction") for env_id in GYM_IDS] + [
    (env_id, "evaluation") for env_id in GYM_IDS if gym.spec(env_id).kwargs.get("dataset")
]


# --------------------------------------------------------------------------------------------
# Helpers


def _action(space: gym.Space, rng: np.random.Generator) -> np.ndarray:
    """A random valid action of a single env (a slate of distinct candidates, or a score)."""
    if hasattr(space, "num_candidates"):
        return rng.permutation(space.num_candidates)[: space.slate_size].astype(np.int64)
    if isinstance(space, gym.spaces.Box):
        return rng.random(space.shape).astype(space.dtype)
    raise AssertionError(f"no action sampler for {space}")


def _assert_same(a: Any, b: Any, path: str = "out") -> None:
    """Exact equality of nested results (dicts, sequences, arrays incl. object arrays)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: {a.keys()} != {b.keys()}"
        for key in a:
            _assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), path
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{index}]")
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and a.shape == b.shape and b.dtype == object, path
        for index, (x, y) in enumerate(zip(a.ravel(), b.ravel(), strict=True)):
            _assert_same(x, y, f"{path}.flat[{index}]")
    else:
        np.testing.assert_array_equal(a, b, err_msg=path, strict=True)


def _through_torch(state: Any) -> Any:
    """``torch.save`` the state with arrays as tensors, ``torch.load(weights_only=True)`` it back."""

    def to_torch(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: to_torch(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(to_torch(item) for item in value)
        return torch.from_numpy(value.copy()) if isinstance(value, np.ndarray) else value

    def to_numpy(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: to_numpy(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(to_numpy(item) for item in value)
        return value.numpy() if isinstance(value, torch.Tensor) else value

    buffer = io.BytesIO()
    torch.save(to_torch(state), buffer)
    buffer.seek(0)
    return to_numpy(torch.load(buffer, weights_only=True))


def _scramble(state: Any) -> None:
    """Overwrite every array of a state in place (an env must have copied them on load)."""
    if isinstance(state, dict):
        state = list(state.values())
    if isinstance(state, list | tuple):
        for item in state:
            _scramble(item)
    elif isinstance(state, np.ndarray) and state.size:
        state[...] = 1


def _gym_stepper(env: Any, actions: list[Any]) -> list[Any]:
    """Step a Gymnasium env (single: reset when an episode ends) and record everything."""
    vector = isinstance(env.unwrapped, gym.vector.VectorEnv)
    out = []
    for action in actions:
        result = env.step(action)
        out.append(result)
        if not vector and (result[2] or result[3]):
            out.append(env.reset())
    return out


def _parallel_stepper(env: Any, actions: list[Any]) -> list[Any]:
    """Step a PettingZoo env or the multi-platform batch env (reset at episode ends) and record
    everything, including the true engagement read for evaluation."""
    out = []
    for action in actions:
        result = env.step(action)
        out.append(result)
        out.append(env.evaluation_engagement())  # kept apart from what learners see
        if any(np.any(done) for done in (*result[2].values(), *result[3].values())):
            out.append(env.reset())
    return out


def _check_resume(
    make: Callable[[], Any],
    seed: int,
    sample: Callable[[Any, np.random.Generator], Any],
    stepper: Callable[[Any, list[Any]], list[Any]],
    saves: tuple[int, ...] = (4, 5, 6, 7),
    steps: int = 15,
) -> dict[str, Any]:
    """Step with seeded random actions, saving the state after each of ``saves`` steps (several
    points, so that some fall right after an episode end); a fresh env loaded from each state
    (through torch) must reproduce the rest of the run exactly. Returns the first state."""
    rng = np.random.default_rng(seed)
    env = make()
    env.reset(seed=seed)
    actions = [sample(env, rng) for _ in range(steps)]
    states, expected = {}, []
    for index, action in enumerate(actions):
        if index in saves:
            states[index] = env_state(env)
            check_plain_data(states[index])
        expected.append(stepper(env, [action]))
    final = env_state(env)

    for index, state in states.items():
        restored = make()
        loaded = _through_torch(state)
        load_env_state(restored, loaded)
        _scramble(loaded)  # the env holds copies
        resumed = [stepper(restored, [action]) for action in actions[index:]]
        _assert_same(resumed, expected[index:], f"resumed after {index} steps")
        _assert_same(env_state(restored), final, f"final state, resumed after {index} steps")
    return states[saves[0]]


def _gym_sample(env: Any, rng: np.random.Generator) -> Any:
    if isinstance(env.unwrapped, gym.vector.VectorEnv):
        return np.stack([_action(env.single_action_space, rng) for _ in range(env.num_envs)])
    return _action(env.action_space, rng)


def _parallel_sample(env: Any, rng: np.random.Generator) -> dict[str, Any]:
    batch = getattr(env, "num_users", None)
    p = env.params
    keys = rng.random((batch or 1, len(env.possible_agents), p.num_candidates))
    slates = np.argsort(keys, axis=2)[:, :, : p.slate_size].astype(np.int64)
    return {
        agent: slates[:, index] if batch else slates[0, index]
        for index, agent in enumerate(env.possible_agents)
    }


# --------------------------------------------------------------------------------------------
# Exact resume


@pytest.mark.parametrize(("env_id", "mode"), CASES)
def test_single_env_resumes_exactly(env_id: str, mode: str, data_dir: Path) -> None:
    kwargs = _kwargs(env_id, data_dir, mode)
    state = _check_resume(lambda: gym.make(env_id, **kwargs), 3, _gym_sample, _gym_stepper)
    assert state["env"]["np_random"] is not None
    assert state["wrappers"][0]["wrapper"] == (
        "TimeLimit" if "max_episode_steps" in kwargs else "OrderEnforcing"
    )


@pytest.mark.parametrize("autoreset", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize(("env_id", "mode"), CASES)
def test_vector_env_resumes_exactly(
    env_id: str, mode: str, autoreset: AutoresetMode, data_dir: Path
) -> None:
    kwargs = _kwargs(env_id, data_dir, mode)

    def make() -> gym.vector.VectorEnv:  # as fedrec.train.loop.make_env builds it
        return gym.make_vec(
            env_id,
            num_envs=3,
            vectorization_mode="vector_entry_point",
            autoreset_mode=autoreset,
            **kwargs,
        )

    state = _check_resume(make, 5, _gym_sample, _gym_stepper)
    assert state["wrappers"] == []


SYNC_IDS = ["fedrec/ChocKaleSlate-v0", "fedrec/MovieLens100K-v0", "fedrec/TaobaoAds-v0"]


@pytest.mark.parametrize("autoreset", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
@pytest.mark.parametrize("env_id", SYNC_IDS)
def test_sync_vector_env_resumes_exactly(
    env_id: str, autoreset: AutoresetMode, data_dir: Path
) -> None:
    kwargs = _kwargs(env_id, data_dir)

    def make() -> gym.vector.VectorEnv:  # the training loop's fallback for envs without one
        return gym.make_vec(
            env_id,
            num_envs=3,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": autoreset},
            **kwargs,
        )

    state = _check_resume(make, 7, _gym_sample, _gym_stepper)
    assert len(state["env"]["envs"]) == 3
    assert state["env"]["envs"][0]["wrappers"][0]["state"] is not None


def test_multi_platform_batch_env_resumes_exactly() -> None:
    def make() -> ChocKaleMultiPlatformBatchEnv:
        return ChocKaleMultiPlatformBatchEnv(
            3, time_budget=6, reward_mode="sparse_team", reward_interval=2, **SLATE
        )

    _check_resume(make, 11, _parallel_sample, _parallel_stepper)


def test_multi_platform_pettingzoo_env_resumes_exactly() -> None:
    def make() -> Any:
        return pettingzoo.make("parallel", MULTI_PLATFORM, time_budget=6, num_platforms=3, **SLATE)

    state = _check_resume(make, 13, _parallel_sample, _parallel_stepper)
    assert state["env"]["agents"] == ["platform_a", "platform_b", "platform_c"]


def test_unseeded_env_state_has_no_generator() -> None:
    env, other = gym.make("fedrec/ChocKale-v0"), gym.make("fedrec/ChocKale-v0")
    state = env_state(env)
    assert state["env"]["np_random"] is None
    check_plain_data(state)
    other.reset(seed=1)
    load_env_state(other, state)
    assert other.unwrapped._np_random is None
    with pytest.raises(gym.error.ResetNeeded):
        other.step(np.arange(3))
    _assert_same(other.reset(seed=2), env.reset(seed=2))


# --------------------------------------------------------------------------------------------
# Rejected states leave the env unchanged


def _stepped(make: Callable[[], Any], seed: int, steps: int = 3) -> Any:
    env = make()
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    _gym_stepper(env, [_gym_sample(env, rng) for _ in range(steps)])
    return env


def _assert_refused(env: Any, state: dict[str, Any], match: str) -> None:
    before = env_state(env)
    with pytest.raises(ValueError, match=match):
        load_env_state(env, state)
    _assert_same(env_state(env), before)


@pytest.mark.parametrize(("env_id", "mode"), CASES)
def test_state_of_another_num_envs_is_refused(env_id: str, mode: str, data_dir: Path) -> None:
    kwargs = _kwargs(env_id, data_dir, mode)
    env = _stepped(lambda: gym.make_vec(env_id, num_envs=3, **kwargs), 1)
    other = _stepped(lambda: gym.make_vec(env_id, num_envs=4, **kwargs), 2)
    _assert_refused(env, env_state(other), "num_envs=3")


@pytest.mark.parametrize("env_id", ["fedrec/ChocKale-v0", "fedrec/Lastfm2K-v0"])
def test_state_of_another_num_candidates_is_refused(env_id: str, data_dir: Path) -> None:
    kwargs = _kwargs(env_id, data_dir)
    env = _stepped(lambda: gym.make(env_id, **kwargs), 1)
    other = _stepped(lambda: gym.make(env_id, **{**kwargs, "num_candidates": 12}), 2)
    _assert_refused(env, env_state(other), "num_candidates=10")
    vec = _stepped(lambda: gym.make_vec(env_id, num_envs=3, **kwargs), 1)
    other_vec = _stepped(
        lambda: gym.make_vec(env_id, num_envs=3, **{**kwargs, "num_candidates": 12}), 2
    )
    _assert_refused(vec, env_state(other_vec), "num_candidates=10")


def test_multi_platform_state_of_another_size_is_refused() -> None:
    env = ChocKaleMultiPlatformBatchEnv(3, **SLATE)
    env.reset(seed=0)
    _assert_refused(env, env_state(ChocKaleMultiPlatformBatchEnv(2, **SLATE)), "num_users=3")
    wide = ChocKaleMultiPlatformBatchEnv(3, num_platforms=3, **SLATE)
    _assert_refused(env, env_state(wide), "num_platforms=2")
    single = pettingzoo.make("parallel", MULTI_PLATFORM)
    single.reset(seed=0)
    other = pettingzoo.make("parallel", MULTI_PLATFORM, num_candidates=12)
    _assert_refused(single, env_state(other), "num_candidates=10")


def test_sync_vector_env_refuses_a_bad_sub_env_state_as_a_whole() -> None:
    def make(**extra: Any) -> gym.vector.VectorEnv:
        kwargs = {**SLATE, "time_budget": 5, **extra}
        return gym.make_vec("fedrec/ChocKale-v0", num_envs=3, vectorization_mode="sync", **kwargs)

    env = _stepped(make, 1)
    state = env_state(_stepped(make, 2))
    state["env"]["envs"][2] = env_state(_stepped(lambda: make(num_candidates=12), 3).envs[2])
    _assert_refused(env, state, "num_candidates=10")  # sub-envs 0 and 1 were rolled back
    four = gym.make_vec("fedrec/ChocKale-v0", num_envs=4, vectorization_mode="sync", **SLATE)
    _assert_refused(env, env_state(four), "num_envs=3")


def test_malformed_states_are_refused() -> None:
    env = _stepped(lambda: gym.make("fedrec/ChocKaleSlate-v0", **SLATE), 0)
    good = env_state(env)
    missing = {**good, "env": {k: v for k, v in good["env"].items() if k != "exposure"}}
    _assert_refused(env, missing, "lacks the key 'exposure'")
    extra = {**good, "env": {**good["env"], "surprise": 1}}
    _assert_refused(env, extra, "unexpected keys")
    wrong_dtype = {**good, "env": {**good["env"], "documents": good["env"]["documents"] * 1.0}}
    wrong_dtype["env"]["documents"] = wrong_dtype["env"]["documents"].astype(np.float64)
    _assert_refused(env, wrong_dtype, "dtype float64")
    bad_rng = {**good, "env": {**good["env"], "np_random": {"bit_generator": "Nope"}}}
    _assert_refused(env, bad_rng, "np_random")
    wrappers = {**good, "wrappers": good["wrappers"][1:]}
    _assert_refused(env, wrappers, "wrappers")
    vector = gym.make_vec("fedrec/ChocKaleSlate-v0", num_envs=1, **SLATE)
    _assert_refused(env, env_state(vector), "saved from a ChocKaleVectorEnv")


# --------------------------------------------------------------------------------------------
# Envs that cannot save their state, and plain data


class _NoState(gym.Env):
    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)


def test_envs_without_state_methods_are_refused() -> None:
    message = "_NoState cannot save its state as data; exact resume needs state_dict"
    with pytest.raises(TypeError, match=message):
        env_state(_NoState())
    with pytest.raises(TypeError, match=message):
        load_env_state(_NoState(), {"env_class": "_NoState", "wrappers": [], "env": {}})
    with pytest.raises(TypeError, match="CartPoleEnv cannot save its state as data"):
        env_state(gym.make("CartPole-v1"))
    sync = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(TypeError, match="CartPoleEnv cannot save its state as data"):
        env_state(sync)
    stats = gym.wrappers.RecordEpisodeStatistics(gym.make("fedrec/ChocKale-v0"))
    with pytest.raises(TypeError, match="RecordEpisodeStatistics keeps state"):
        env_state(stats)


def test_check_plain_data_names_the_offending_path() -> None:
    check_plain_data({"a": [1, 2.0, True, None, "x", (np.zeros(3, np.float32),)]})
    cases = [
        ({"a": {"b": np.float64(1.0)}}, r"state\['a'\]\['b'\] is a numpy.float64"),
        ({"a": [0, np.array(["x"])]}, r"state\['a'\]\[1\] is an array of dtype <U1"),
        ({"a": np.array([object()])}, r"state\['a'\] is an array of dtype object"),
        ({1: 2}, "key 1 of type int"),
        ({"f": len}, r"state\['f'\] is a builtins"),
        ({"m": AutoresetMode.NEXT_STEP}, "AutoresetMode"),
    ]
    for value, match in cases:
        with pytest.raises(TypeError, match=match):
            check_plain_data(value)
