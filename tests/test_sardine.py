"""SARDINE's environments through fedrec's adapter (fedrec.envs.sardine; the ``sardine`` extra)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

pytest.importorskip("sardine")

import fedrec
from fedrec.agents.base import visible_infos
from fedrec.agents.reference import RandomPolicy
from fedrec.agents.sac_topk import SACTopKAgent, SACTopKConfig
from fedrec.agents.slateq import SlateQAgent, SlateQConfig
from fedrec.cli import main
from fedrec.envs.hidden import hidden_info_keys
from fedrec.envs.sardine import HIDDEN_KEYS, SARDINE_IDS, SardineEnv, SardineVectorEnv, fedrec_id
from fedrec.registration import SARDINE_ENVIRONMENTS

BORED = "sardine/SlateTopK-Bored-fedrec-v0"
SARDINE_TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "sardine_table.py"


def _slates(seed: int, env: SardineEnv, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.choice(env.num_items, env.slate_size, replace=False) for _ in range(count)]


def test_every_sardine_id_is_registered() -> None:
    assert [e.id for e in SARDINE_ENVIRONMENTS] == [fedrec_id(i) for i in SARDINE_IDS]
    assert fedrec_id("sardine/SlateTopK-Bored-v0") == BORED
    for entry in SARDINE_ENVIRONMENTS:
        assert entry.id in gym.registry
    assert BORED in fedrec.environment_ids()  # so the suites over every entry cover them


@pytest.mark.parametrize(
    "sardine_id",
    ["sardine/SlateTopK-Bored-v0", "sardine/SingleItem-Static-v0", "sardine/SlateRerank-Bored-v0"],
)
def test_env_checker(sardine_id: str) -> None:
    env = gym.make(fedrec_id(sardine_id))
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert {"user_state", "bored", "oracle_slate"} <= set(info)  # step adds relevances, scores
    assert hidden_info_keys(env) == HIDDEN_KEYS


def test_reproducible_by_seed_and_identical_to_sardine() -> None:
    """Same seed and slates: the same episode, and the one SARDINE's own env produces."""
    one, two = SardineEnv(), SardineEnv()
    raw = gym.make("sardine/SlateTopK-Bored-v0").unwrapped
    a, _ = one.reset(seed=7)
    b, _ = two.reset(seed=7)
    r, _ = raw.reset(seed=7)
    np.testing.assert_array_equal(a["response_click"][0], r["clicks"])
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    steps = 0
    for slate in _slates(1, one, 200):
        a, ra, ta, _, _ = one.step(slate)
        b, rb, tb, _, _ = two.step(slate)
        r, rr, tr, _, _ = raw.step(slate.copy())
        assert ra == rb == float(rr) and ta == tb == tr
        np.testing.assert_array_equal(a["response_click"][0], r["clicks"])
        np.testing.assert_array_equal(a["user"], r["hist"])
        np.testing.assert_array_equal(a["slate_features"], one.items[r["slate"]])
        steps += 1
        if ta:
            break
    assert steps == 100  # SARDINE's episode_length
    with pytest.raises(RuntimeError, match="reset"):
        one.step(slate)


def test_oracle_slate_is_sardines_greedy_oracle() -> None:
    env, raw = SardineEnv(), gym.make("sardine/SlateTopK-Bored-v0").unwrapped
    _, info = env.reset(seed=3)
    raw.reset(seed=3)
    for _ in range(30):
        _, reward, _, _, info_next = env.step(info["oracle_slate"])
        _, raw_reward, _, _, raw_info = raw.step(-np.ones(env.slate_size, dtype=np.int64))
        np.testing.assert_array_equal(info_next["slate"], raw_info["slate"])
        assert reward == raw_reward
        info = info_next


def test_invalid_slates_are_refused() -> None:
    env = SardineEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="repeats"):
        env.step(np.zeros(env.slate_size, dtype=np.int64))
    with pytest.raises(ValueError, match="outside"):
        env.step(-np.ones(env.slate_size, dtype=np.int64))  # SARDINE's oracle wildcard


def test_state_dict_resumes_bit_for_bit() -> None:
    env, twin = SardineEnv(), SardineEnv()
    slates = _slates(2, env, 60)
    env.reset(seed=11)
    for slate in slates[:25]:
        env.step(slate)
    twin.load_state_dict(env.state_dict())
    for slate in slates[25:]:
        a, ra, *_ = env.step(slate)
        b, rb, *_ = twin.step(slate)
        assert ra == rb
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    with pytest.raises(ValueError, match="unexpected keys"):
        twin.load_state_dict({**env.state_dict(), "extra": 1})


@pytest.mark.parametrize("autoreset", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_native_vector_env_gives_sync_vector_envs_episodes(autoreset: AutoresetMode) -> None:
    """make_vec's SardineVectorEnv: the same observations, rewards and episode ends as
    Gymnasium's SyncVectorEnv over the single env (so runs made with either agree)."""
    kwargs = {"num_envs": 3, "episode_length": 4}
    native = gym.make_vec(BORED, autoreset_mode=autoreset, **kwargs)
    sync = gym.make_vec(
        BORED, vectorization_mode="sync", vector_kwargs={"autoreset_mode": autoreset}, **kwargs
    )
    assert isinstance(native, SardineVectorEnv)
    assert hidden_info_keys(native) == HIDDEN_KEYS
    a, _ = native.reset(seed=3)
    b, _ = sync.reset(seed=3)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(11):
        slates = np.stack([rng.choice(1000, 10, replace=False) for _ in range(3)])
        a, ra, ta, ua, info_a = native.step(slates)
        b, rb, tb, ub, info_b = sync.step(slates)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
        for x, y in ((ra, rb), (ta, tb), (ua, ub)):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(info_a["clicks"], info_b["clicks"])
        for user in np.flatnonzero(ta) if autoreset == AutoresetMode.SAME_STEP else []:
            for key in a:  # batched final observations here, SyncVectorEnv's per user
                np.testing.assert_array_equal(
                    info_a["final_obs"][key][user], info_b["final_obs"][user][key]
                )
        ended += int(ta.sum())
    assert ended >= 3


def test_native_vector_env_refuses_a_bad_row_before_any_user_steps() -> None:
    envs = gym.make_vec(BORED, num_envs=2, episode_length=4)
    envs.reset(seed=0)
    before = envs.unwrapped.state_dict()
    slates = np.stack([np.arange(10), np.zeros(10, dtype=np.int64)])  # row 1 repeats an item
    with pytest.raises(ValueError, match="repeats"):
        envs.step(slates)
    after = envs.unwrapped.state_dict()
    for old, new in zip(before["envs"], after["envs"], strict=True):
        np.testing.assert_array_equal(old["cur_user_embedd"], new["cur_user_embedd"])
        assert old["np_random"] == new["np_random"] and old["t"] == new["t"]


def test_sardine_table_merges_runs_over_disjoint_seeds(tmp_path: Path) -> None:
    """benchmarks/sardine_table.py --merge: runs over seeds 0-2 and 3-4 give one 5-seed table."""
    spec = importlib.util.spec_from_file_location("sardine_table", SARDINE_TABLE)
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    budget = {"episodes": 2, "num_envs": 2, "eval_episodes": 3, "configs": {}}
    for first, seeds in ((0, 3), (3, 2)):
        cells = [
            {"env": BORED, "policy": policy, "seed": seed, "eval_mean": float(seed)}
            for seed in range(first, first + seeds)
            for policy in ("random", "sac_topk")
        ]
        meta = {**budget, "seeds": seeds, "first_seed": first, "command": f"run {first}"}
        (tmp_path / str(first)).mkdir()
        (tmp_path / str(first) / "table.json").write_text(
            json.dumps({"meta": meta, "cells": cells})
        )
    out = tmp_path / "merged"
    assert table.main(["--merge", str(tmp_path / "0"), str(tmp_path / "3"), "--out", str(out)]) == 0
    merged = json.loads((out / "table.json").read_text())
    assert merged["meta"]["seeds"] == 5 and len(merged["cells"]) == 10
    assert "| random | 2.0 ± 2.0 |" in (out / "table.md").read_text()  # mean of 0..4, t CI
    with pytest.raises(SystemExit, match="overlap"):
        table.main(["--merge", str(tmp_path / "0"), str(tmp_path / "0"), "--out", str(out)])


def test_hidden_keys_are_stripped_for_learners() -> None:
    envs = gym.make_vec(BORED, num_envs=2, vectorization_mode="sync")
    _, infos = envs.reset(seed=0)
    hidden = hidden_info_keys(envs)
    seen = visible_infos(RandomPolicy(slate_size=10), infos, hidden)
    assert not HIDDEN_KEYS & set(seen)
    assert "clicks" in seen


def test_learners_build_or_refuse_clearly() -> None:
    envs = gym.make_vec(BORED, num_envs=2, vectorization_mode="sync")
    obs, _ = envs.reset(seed=0)
    sac = SACTopKAgent.from_env(envs, config=SACTopKConfig(action_box="features"), seed=0)
    slateq = SlateQAgent.from_env(envs, config=SlateQConfig(choice_model="learned"), seed=0)
    for agent in (sac, slateq):
        slates = agent.act_batch(obs)
        assert slates.shape == (2, 10) and envs.single_action_space.contains(slates[0])
    with pytest.raises(ValueError, match="Choc-vs-Kale"):  # the true choice model is Choc-Kale's
        SlateQAgent.from_env(envs, config=SlateQConfig(), seed=0)


def test_train_and_eval_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["train", "random", "--env", BORED, "--episodes", "2", "--num-envs", "2"]
    argv += ["--eval-episodes", "2", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    assert (out / "checkpoint.pt").is_file()
    final = json.loads((out / "final_eval.json").read_text())
    assert set(final["policies"]) == {"agent"}
    table = tmp_path / "eval.csv"
    assert main(["eval", str(out), "--csv", str(table)]) == 0
    assert "random" in table.read_text() or BORED.split("/")[1] in table.read_text()


def test_without_sardine_nothing_is_registered_and_the_error_names_the_extra() -> None:
    """Without the package fedrec imports as before, and the adapter says what to install."""
    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "sardine" or name.startswith("sardine."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
import importlib.util
found = importlib.util.find_spec  # what find_spec answers for a package that is not installed
importlib.util.find_spec = lambda name, *a: None if name == "sardine" else found(name, *a)
import gymnasium as gym
import fedrec
from fedrec.registration import SARDINE_ENVIRONMENTS
assert SARDINE_ENVIRONMENTS == () and not any(i.startswith("sardine/") for i in gym.registry)
from fedrec.envs.sardine import SardineEnv
try:
    SardineEnv()
except ModuleNotFoundError as error:
    assert "fedrec[sardine]" in str(error), error
    print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.stdout.strip() == "ok", result.stderr
