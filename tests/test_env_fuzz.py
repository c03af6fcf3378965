"""Property-based tests: every env validates every action completely before it changes anything.

For every registered id (single env through ``gymnasium.make``, native vector env through
``gymnasium.make_vec`` in the three autoreset modes, the PettingZoo env and the batched
multi-platform env), a Hypothesis program interleaves valid actions, actions drawn from a
strategy that mixes valid and invalid ones (wrong length or batch size, repeated or out-of-range
indices, floats, NaN, None, strings, nested lists, bools, huge ints, scores outside [0, 1], ...)
and episode ends. Every action must either step or raise ``ValueError``; after a ``ValueError``
the env's whole state (:func:`fedrec.envs.state.env_state`: generator, users, wrappers) must be
exactly what it was, and a twin env that only ever saw the accepted actions must produce the
same outputs and state. Short episodes make invalid actions arrive right after episode ends, and
with autoreset ``DISABLED`` every step of a finished sub-env must be refused.

The number of examples comes from the Hypothesis profile (``tests/conftest.py``:
``HYPOTHESIS_PROFILE=ci`` by default, ``long`` for a long campaign).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import hypothesis.strategies as st
import numpy as np
import pettingzoo
import pytest
from gymnasium.vector import AutoresetMode
from hypothesis import event, given, settings

import fedrec
from fedrec.envs.datasets.synthetic import write_synthetic
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.envs.state import env_state
from fedrec.registration import ENVIRONMENTS

MULTI_PLATFORM = "fedrec/ChocKaleMultiPlatform-v0"
MULTI_PLATFORM_USER_TYPES = "fedrec/ChocKaleMultiPlatformUserTypes-v0"
TAOBAO = "fedrec/TaobaoAds-v0"
INTEREST_EVOLUTION = "fedrec/InterestEvolution-v0"
NUM_ENVS = 3
#: ints that do not fit the candidate range, int64 or any integer dtype at all
HUGE_INTS = [2**31, 2**63 - 1, 2**63, 2**64, 2**70, -(2**63) - 1, -(2**70)]


def _examples(factor: float = 1.0) -> int:
    """Examples per test case: the loaded profile's ``max_examples`` times ``factor``."""
    return max(1, round(settings().max_examples * factor))


def _cases() -> list[tuple[str, str]]:
    """(env id, mode) of every registered Gymnasium id; logged data sets in both modes."""
    cases = []
    for entry in ENVIRONMENTS:
        if entry.api != "gymnasium":
            continue
        cases.append((entry.id, "interaction"))
        if "dataset" in entry.kwargs:
            cases.append((entry.id, "evaluation"))
    return cases


GYM_CASES = _cases()
AUTORESET_MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    for name in ("ml-100k", "ml-1m", "lastfm-2k", "foursquare-nyc", "taobao-ads"):
        write_synthetic(name, root / name)
    return root


def _kwargs(env_id: str, mode: str, data_dir: Path) -> dict[str, Any]:
    """Short episodes for every env, so a few steps cross an episode end."""
    if env_id.startswith("fedrec/ChocKale"):  # the cascade env too
        return {"time_budget": 3}
    if env_id == INTEREST_EVOLUTION:  # minutes: 1-6 steps
        return {"time_budget": 3.0}
    if env_id.startswith("sardine/"):  # SARDINE's envs (the extra), 1,000 or 10 items
        return {"episode_length": 3}
    if env_id == TAOBAO:
        return {"data_dir": data_dir, "split": "all", "max_episode_steps": 3}
    if mode == "evaluation":
        return {"data_dir": data_dir, "mode": "evaluation", "top_k": 4}
    return {"data_dir": data_dir, "num_candidates": 12, "slate_size": 4, "max_steps": 3}


# --------------------------------------------------------------------------------------------
# Comparing states and outputs


def _assert_same(a: Any, b: Any, path: str = "out") -> None:
    """Exact equality of nested data: dicts, lists, tuples, scalars, arrays (NaN equals NaN)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: {a.keys()} != {b!r:.200}"
        for key in a:
            _assert_same(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {a!r:.200} != {b!r:.200}"
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{path}[{index}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{path}: array != {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{path}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        )
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), f"{path}: {a} != {b}"
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), f"{path}: nan != {b!r}"
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} != {b!r}"


def _state(env: Any) -> dict[str, Any]:
    """``env_state(env)``, less the one flag Gymnasium's ``PassiveEnvChecker`` sets *before* it
    forwards the first step (so a rejected first step flips it; it only says whether the
    passive output check has run, and nothing of the env depends on it)."""
    state = env_state(env)
    for wrapper in state["wrappers"]:
        if wrapper["wrapper"] == "PassiveEnvChecker":
            wrapper["state"].pop("checked_step")
    return state


# --------------------------------------------------------------------------------------------
# Action strategies: valid actions and a mix of valid and invalid ones


def _valid_slate(num_candidates: int, slate_size: int) -> st.SearchStrategy[np.ndarray]:
    if num_candidates > 64:  # SARDINE's 1,000 items: a permutation of all would be huge data
        return st.lists(
            st.integers(0, num_candidates - 1), min_size=slate_size, max_size=slate_size,
            unique=True,
        ).map(lambda items: np.array(items, dtype=np.int64))  # fmt: skip
    return st.permutations(range(num_candidates)).map(
        lambda order: np.array(order[:slate_size], dtype=np.int64)
    )


def _valid_slates(num_candidates: int, slate_size: int, batch: int) -> st.SearchStrategy:
    return st.lists(_valid_slate(num_candidates, slate_size), min_size=batch, max_size=batch).map(
        np.stack
    )


_ODD_OBJECTS = st.sampled_from(
    [None, "abc", "0 1 2", "0.5", b"\x00\x01", {"slate": [0, 1]}, object(), set(), 1j, True, 3.5]
)


def _slate_mutations(slate: np.ndarray, num_candidates: int) -> st.SearchStrategy:
    """Variants of one valid slate: other containers and dtypes (valid), and faults."""
    n = len(slate)
    as_list = slate.tolist()
    options = [
        st.just(slate),
        st.just(as_list),
        st.just(tuple(as_list)),
        st.just(slate.astype(np.int32)),
        st.just(slate.astype(np.uint16)),
        st.just(slate[:-1]),  # too short
        st.just([*as_list, *as_list[:1]]),  # too long (and repeated)
        st.just(np.concatenate([slate, np.setdiff1d(np.arange(num_candidates), slate)[:1]])),
        st.just([]),
        st.just(slate.astype(np.float64)),
        st.just(slate.astype(np.float32)),
        st.just(np.where(np.arange(n) == 0, np.nan, slate.astype(np.float64))),
        st.just([*as_list[:-1], as_list[-1] + 0.5]),
        st.just(slate.astype(np.complex128)),
        st.just(slate.astype(object)),
        st.just(slate.astype(bool)),
        st.just([True] * n),
        st.just([slate]),  # nested one level too deep
        st.just([as_list, as_list[:1]]),  # ragged
        st.just([[item] for item in as_list]),
        st.just(slate[0]),  # a scalar
        st.just(np.array(slate)[::-1].copy()),
        st.just(str(as_list)),
        _ODD_OBJECTS,
        st.sampled_from([num_candidates, num_candidates + 1, -1, *HUGE_INTS]).flatmap(
            lambda bad: st.integers(0, n - 1).map(
                lambda where: [bad if i == where else x for i, x in enumerate(as_list)]
            )
        ),
    ]
    if n >= 2:
        options.append(
            st.integers(1, n - 1).map(
                lambda where: [as_list[0] if i == where else x for i, x in enumerate(as_list)]
            )
        )
    return st.one_of(options)


def _batch_mutations(slates: np.ndarray, num_candidates: int) -> st.SearchStrategy:
    """Variants of a valid batch of slates: faults in one row, in the batch size, or all over."""
    b, n = slates.shape

    def row_fault(row: int, bad: int, column: int) -> np.ndarray:
        out = slates.copy().astype(object) if abs(bad) >= 2**63 else slates.copy()
        out[row, column] = bad
        return out.tolist() if out.dtype == object else out

    options = [
        st.just(slates),
        st.just(slates.tolist()),
        st.just(slates.astype(np.int32)),
        st.just(slates.astype(np.uint8)),
        st.just(slates[:-1]),  # one row short
        st.just(np.concatenate([slates, slates[:1]])),  # one row too many
        st.just(slates[:, :-1]),
        st.just(slates[None]),
        st.just(slates.T.copy()),
        st.just(slates.reshape(-1)),
        st.just(slates[0]),  # one slate, not a batch
        st.just(slates.astype(np.float64)),
        st.just(np.full(slates.shape, np.nan)),
        st.just(slates.astype(bool)),
        st.just(slates.astype(object)),
        st.just([row.tolist() for row in slates[:-1]] + [slates[-1, :-1].tolist()]),  # ragged
        st.just([slates.tolist()]),
        _ODD_OBJECTS,
        st.builds(
            row_fault,
            st.integers(0, b - 1),
            st.sampled_from([num_candidates, -1, *HUGE_INTS]),
            st.integers(0, n - 1),
        ),
    ]
    if n >= 2:
        options.append(
            st.integers(0, b - 1).map(
                lambda row: np.where(
                    (np.arange(b)[:, None] == row) & (np.arange(n) == 1), slates[:, :1], slates
                )
            )  # a repeated candidate in one row
        )
    return st.one_of(options)


def _score_mutations(shape: tuple[int, ...]) -> st.SearchStrategy:
    """Scores for a ``Box(0, 1, shape)`` action: valid ones, other containers, and faults."""
    size = int(np.prod(shape))
    unit = st.floats(0.0, 1.0)
    valid = st.lists(unit, min_size=size, max_size=size).map(lambda v: np.reshape(v, shape))
    bad_value = st.sampled_from([np.nan, np.inf, -np.inf, -1e-6, 1.0 + 1e-6, 2.0, -1.0, 1e300])

    def with_bad(values: np.ndarray, bad: float, where: int) -> np.ndarray:
        out = values.astype(np.float64).reshape(-1)
        out[where] = bad
        return out.reshape(shape)

    return st.one_of(
        valid,
        valid.map(lambda v: v.astype(np.float32)),
        valid.map(lambda v: v.tolist()),
        valid.map(lambda v: v.reshape(-1)),  # (B,) for (B, 1): accepted
        valid.map(lambda v: v.reshape(-1)[0] if size == 1 else v.reshape(-1, 1, 1)),
        st.builds(with_bad, valid, bad_value, st.integers(0, size - 1)),
        valid.map(lambda v: v > 0.5),  # bools
        valid.map(lambda v: v.astype(np.complex128)),
        valid.map(lambda v: v.astype(str)),
        valid.map(lambda v: np.concatenate([v.reshape(-1), [0.5]])),  # one too many
        valid.map(lambda v: v.reshape(-1)[:-1]),  # one too few
        valid.map(lambda v: [v.reshape(-1).tolist(), [0.5]]),  # ragged
        st.just(np.ones(shape, dtype=np.int64)),
        st.just(np.full(shape, 2, dtype=np.int64)),
        st.sampled_from([[2**70] * size, HUGE_INTS[:size], ["0.5"] * size]),
        _ODD_OBJECTS,
    )


class _Spec:
    """What a valid action of one env looks like, and how to draw mixed ones."""

    def __init__(self, space: gym.Space, batch: int | None) -> None:
        self.batch = batch
        self.slates = hasattr(space, "num_candidates")
        if self.slates:
            self.num_candidates, self.slate_size = space.num_candidates, space.slate_size
        else:
            assert isinstance(space, gym.spaces.Box) and space.shape == (1,)
            self.shape = (1,) if batch is None else (batch, 1)

    def valid(self) -> st.SearchStrategy:
        if not self.slates:
            size = int(np.prod(self.shape))
            return st.lists(st.floats(0.0, 1.0), min_size=size, max_size=size).map(
                lambda v: np.reshape(v, self.shape)
            )
        if self.batch is None:
            return _valid_slate(self.num_candidates, self.slate_size)
        return _valid_slates(self.num_candidates, self.slate_size, self.batch)

    def mixed(self) -> st.SearchStrategy:
        if not self.slates:
            return _score_mutations(self.shape)
        if self.batch is None:
            return self.valid().flatmap(lambda s: _slate_mutations(s, self.num_candidates))
        return self.valid().flatmap(lambda s: _batch_mutations(s, self.num_candidates))

    def check_accepted(self, action: Any) -> None:
        """An accepted action is of the right kind (rows being autoreset are not checked)."""
        array = np.asarray(action)
        if self.slates:
            assert array.dtype.kind in "iu", f"accepted non-integer slates {action!r}"
            expected = (self.slate_size,) if self.batch is None else (self.batch, self.slate_size)
            assert array.shape == expected, f"accepted slates of shape {array.shape}"
            if self.batch is None:
                slate = array.astype(np.int64)
                assert slate.min() >= 0 and slate.max() < self.num_candidates
                assert len(set(slate.tolist())) == self.slate_size
        else:
            assert array.dtype.kind in "iuf", f"accepted non-real scores {action!r}"
            assert array.size == int(np.prod(self.shape)), f"accepted scores {action!r}"
            if self.batch is None:
                assert np.isfinite(array).all() and ((array >= 0) & (array <= 1)).all()


# --------------------------------------------------------------------------------------------
# The program: valid steps, mixed steps, episode ends


def _try_step(
    env: Any, twin: Any, action: Any, spec: _Spec | None, *, after_end: bool = False
) -> tuple[bool, Any]:
    """Step ``env``; on success step the twin too and compare. Returns (accepted, result)."""
    before = _state(env)
    where = " right after an episode end" if after_end else ""
    try:
        result = env.step(action)
    except ValueError as error:
        assert str(error), "a ValueError must name the problem"
        _assert_same(_state(env), before, "state after a rejected action")
        event(f"rejected{where}")
        return False, None
    event(f"accepted{where}")
    if spec is not None:
        spec.check_accepted(action)
    _assert_same(result, twin.step(action), "step output (env vs twin)")
    return True, result


def _run_single(data: st.DataObject, env: Any, twin: Any, spec: _Spec) -> None:
    seed = data.draw(st.integers(0, 2**16), label="seed")
    _assert_same(env.reset(seed=seed), twin.reset(seed=seed), "reset")
    ops = data.draw(st.lists(st.sampled_from("vmmm"), min_size=3, max_size=14), label="ops")
    after_end = False
    for op in ops:
        action = data.draw(spec.valid() if op == "v" else spec.mixed(), label="action")
        accepted, result = _try_step(env, twin, action, spec, after_end=after_end)
        assert accepted or op != "v", f"a valid action was refused: {action!r}"
        if accepted:
            after_end = bool(result[2] or result[3])
            if after_end:
                _assert_same(env.reset(), twin.reset(), "reset after the episode end")
    _assert_same(_state(env), _state(twin), "state (env vs twin)")


def _run_vector(data: st.DataObject, env: Any, twin: Any, spec: _Spec) -> None:
    mode = env.metadata["autoreset_mode"]
    seed = data.draw(st.integers(0, 2**16), label="seed")
    _assert_same(env.reset(seed=seed), twin.reset(seed=seed), "reset")
    finished = np.zeros(env.num_envs, dtype=bool)
    after_end = False
    ops = data.draw(st.lists(st.sampled_from("vmmm"), min_size=3, max_size=14), label="ops")
    for op in ops:
        action = data.draw(spec.valid() if op == "v" else spec.mixed(), label="action")
        if finished.any():  # DISABLED: every step is refused until the finished envs are reset
            before = _state(env)
            with pytest.raises(ValueError, match=r"sub-envs \[[0-9, ]+\] have finished"):
                env.step(action)
            _assert_same(_state(env), before, "state after a refused step of a finished env")
            event("refused: a finished sub-env (DISABLED)")
            mask = finished.copy()
            _assert_same(
                env.reset(options={"reset_mask": mask}),
                twin.reset(options={"reset_mask": mask}),
                "reset of the finished envs",
            )
            finished[:] = False
            action = data.draw(spec.valid() if op == "v" else spec.mixed(), label="action")
        accepted, result = _try_step(env, twin, action, spec, after_end=after_end)
        assert accepted or op != "v", f"a valid action was refused: {action!r}"
        if accepted:
            after_end = bool((result[2] | result[3]).any())
            if mode == AutoresetMode.DISABLED:
                finished = result[2] | result[3]
    _assert_same(_state(env), _state(twin), "state (env vs twin)")


# --------------------------------------------------------------------------------------------
# Gymnasium: single envs and native vector envs


@pytest.mark.parametrize(("env_id", "mode"), GYM_CASES, ids=[f"{i}-{m}" for i, m in GYM_CASES])
def test_single_env_validates_before_it_changes(env_id: str, mode: str, data_dir: Path) -> None:
    kwargs = _kwargs(env_id, mode, data_dir)
    env, twin = gym.make(env_id, **kwargs), gym.make(env_id, **kwargs)
    spec = _Spec(env.action_space, None)

    @settings(max_examples=_examples(), deadline=None)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        _run_single(data, env, twin, spec)

    run()


VECTOR_CASES = [(i, m, a) for i, m in GYM_CASES for a in AUTORESET_MODES]


@pytest.mark.parametrize(
    ("env_id", "mode", "autoreset"),
    VECTOR_CASES,
    ids=[f"{i}-{m}-{a.value}" for i, m, a in VECTOR_CASES],
)
def test_vector_env_validates_before_it_changes(
    env_id: str, mode: str, autoreset: AutoresetMode, data_dir: Path
) -> None:
    kwargs = {**_kwargs(env_id, mode, data_dir), "autoreset_mode": autoreset}
    env = gym.make_vec(env_id, num_envs=NUM_ENVS, **kwargs)
    twin = gym.make_vec(env_id, num_envs=NUM_ENVS, **kwargs)
    assert env.metadata["autoreset_mode"] == autoreset
    spec = _Spec(env.single_action_space, NUM_ENVS)

    @settings(max_examples=_examples(), deadline=None)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        _run_vector(data, env, twin, spec)

    run()


# --------------------------------------------------------------------------------------------
# Multi-platform: the PettingZoo env and the batched env


def _platform_actions(agents: list[str], spec: _Spec) -> st.SearchStrategy:
    """Dicts of one action per platform, mixed with faults in the keys or the container."""
    valid = st.fixed_dictionaries({agent: spec.valid() for agent in agents})
    mixed_one = st.sampled_from(agents).flatmap(
        lambda bad: st.fixed_dictionaries(
            {agent: (spec.mixed() if agent == bad else spec.valid()) for agent in agents}
        )
    )
    return st.one_of(
        valid,
        mixed_one,
        valid.map(lambda d: {k: v for k, v in d.items() if k != agents[-1]}),  # missing
        valid.map(lambda d: {**d, "platform_z": d[agents[0]]}),  # unknown
        valid.map(lambda d: {**d, 0: d[agents[0]]}),
        valid.map(lambda d: list(d.values())),
        valid.map(lambda d: tuple(d.items())),
        valid.map(lambda d: np.stack(list(d.values()))),
        _ODD_OBJECTS,
        st.just({}),
    )


def _run_multi(data: st.DataObject, env: Any, twin: Any, spec: _Spec) -> None:
    agents = list(env.possible_agents)
    valid = st.fixed_dictionaries({agent: spec.valid() for agent in agents})
    mixed = _platform_actions(agents, spec)
    seed = data.draw(st.integers(0, 2**16), label="seed")
    _assert_same(env.reset(seed=seed), twin.reset(seed=seed), "reset")
    ops = data.draw(st.lists(st.sampled_from("vmmm"), min_size=3, max_size=14), label="ops")
    after_end = False
    for op in ops:
        action = data.draw(valid if op == "v" else mixed, label="actions")
        accepted, result = _try_step(env, twin, action, None, after_end=after_end)
        assert accepted or op != "v", f"valid actions were refused: {action!r}"
        if accepted:
            _assert_same(env.evaluation_engagement(), twin.evaluation_engagement(), "engagement")
            after_end = any(np.any(v) for v in (*result[2].values(), *result[3].values()))
            if after_end:
                _assert_same(env.reset(), twin.reset(), "reset after the episode end")
    _assert_same(_state(env), _state(twin), "state (env vs twin)")


@pytest.mark.parametrize("env_id", [MULTI_PLATFORM, MULTI_PLATFORM_USER_TYPES])
def test_pettingzoo_env_validates_before_it_changes(env_id: str) -> None:
    def make() -> Any:
        return pettingzoo.make("parallel", env_id, num_platforms=3, time_budget=7)

    env, twin = make(), make()
    spec = _Spec(env.action_space(env.possible_agents[0]), None)

    @settings(max_examples=_examples(3), deadline=None)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        _run_multi(data, env, twin, spec)

    run()


def test_batched_multi_platform_env_validates_before_it_changes() -> None:
    def make() -> ChocKaleMultiPlatformBatchEnv:
        return ChocKaleMultiPlatformBatchEnv(NUM_ENVS, time_budget=6, reward_mode="sparse_team")

    env, twin = make(), make()
    spec = _Spec(env.action_spaces[env.possible_agents[0]], NUM_ENVS)

    @settings(max_examples=_examples(3), deadline=None)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        _run_multi(data, env, twin, spec)

    run()


def test_every_registered_id_is_fuzzed() -> None:
    fuzzed = {env_id for env_id, _ in GYM_CASES} | {MULTI_PLATFORM, MULTI_PLATFORM_USER_TYPES}
    assert fuzzed == set(fedrec.environment_ids())
