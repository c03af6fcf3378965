"""Exact resume for every built-in agent: a run killed right after a checkpoint and resumed writes
the byte-identical ``episodes.csv``, the same ``final_eval.json`` (wall-clock fields aside) and
ends with the same agent state as an uninterrupted run with the same seed.

The agents are read from the registry's tables when the tests are collected, so an agent added
later is covered without editing this file: with its default Config and a short run, unless
:data:`SETUPS` gives its class tiny hyperparameters. Agents that learn are given
hyperparameters small enough that they learn *before* the kill, and the test checks that they
did (their learned state at the checkpoint differs from the freshly built agent's), so a resume
that silently restarts from scratch fails.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from resume_helpers import die_after_checkpoint, final_eval_without_clock

from fedrec.agents.per_platform import PerPlatformAgent, PerPlatformConfig
from fedrec.agents.registry import (
    AGENTS,
    MULTI_PLATFORM_AGENTS,
    build_multi_platform_agent,
    make_config,
    resolve_agent,
    resolve_multi_platform_agent,
)
from fedrec.envs.datasets.synthetic import write_synthetic
from fedrec.experiments.fedslate import env_for
from fedrec.train.checkpoint import load_checkpoint, save_checkpoint
from fedrec.train.loop import TrainConfig, train
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

SEED = 3
EPISODES = 12  # with 4 users and a checkpoint every 4 episodes: killed after 8 of 12
USERS = 4
SLATES = {"num_candidates": 10, "slate_size": 3}
CHOC_KALE = {**SLATES, "time_budget": 20}  # 20-step episodes (multi-platform: 10 joint steps)


@dataclasses.dataclass(frozen=True)
class Setup:
    """How an agent is trained here."""

    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """tiny hyperparameters (its Config's fields)"""
    learned: str | None = None
    """dotted path into the agent's ``state_dict()`` that training changes before the kill
    (None: a fixed policy, or an agent this table does not know)"""
    logged_data: bool = False
    """trains on a small synthetic MovieLens file (the agent needs logged data)"""


#: Tiny setups by agent class name; a class without one takes its nearest base class's (so a
#: subclass or a preset added later learns here too), else its Config's defaults.
SETUPS: dict[str, Setup] = {
    "SlateQAgent": Setup(
        {"hidden_sizes": (16,), "learning_starts": 80, "epsilon_decay": 300}, "q_network"
    ),
    # Every 4 finished user-episodes move the search (4 users: at episodes 4, 8 and 12).
    "RuleSearchAgent": Setup({"population": 4, "elite_fraction": 0.5}, "mean"),
    # Each rule scored on one user-episode (a user's first episode is not scored: update at 8).
    "AdaptiveRuleSearchAgent": Setup(
        {"population": 4, "elite_fraction": 0.5, "episodes_per_rule": 1}, "mean"
    ),
    "SequentialRuleSearchAgent": Setup(
        {"population": 4, "elite_fraction": 0.5, "episodes_per_rule": 1}, "mean"
    ),
    "EvidenceRuleSearchAgent": Setup(
        {"population": 4, "elite_fraction": 0.5, "episodes_per_rule": 1}, "mean"
    ),
    # ... and the readings' model fitted at every update (the first before the kill).
    "FittedRuleSearchAgent": Setup(
        {
            "population": 4,
            "elite_fraction": 0.5,
            "episodes_per_rule": 1,
            "fit_episodes": 16,
            "refit_every": 1,
        },
        "model",
    ),
    "PopularityAgent": Setup(logged_data=True),
    # An update every 16 steps of the 4 users (the kill comes after 40 steps).
    "PPOAgent": Setup(
        {"n_steps": 16, "batch_size": 32, "n_epochs": 2, "net_arch": (16,)}, "policy"
    ),
    "RecurrentPPOAgent": Setup(
        {"n_steps": 16, "batch_size": 32, "n_epochs": 2, "net_arch": (16,), "lstm_hidden_size": 8},
        "policy",
    ),
    # The bandits learn from the first step (their defaults are tiny already).
    "CascadeUCB1Agent": Setup(learned="examined"),
    "CascadeLinUCBAgent": Setup(learned="model.b"),
    "LinUCBSlateAgent": Setup(learned="model.b"),
    # An update per 4 finished user-episodes (the first at 80 transitions, the kill after 160).
    "ReinforceTopKAgent": Setup(
        {"hidden_sizes": (16,), "learning_starts": 40, "batch_episodes": 4}, "policy"
    ),
    # A gradient step per 8 transitions from the 41st on.
    "SACTopKAgent": Setup(
        {"hidden_sizes": (16,), "learning_starts": 40, "batch_size": 8, "train_frequency": 8},
        "actor",
    ),
    "FedSlateAgent": Setup(
        {"learning_starts": 40, "batch_size": 8, "local_hidden": (16,), "global_hidden": (16,)},
        "platforms.platform_a.q_network",
    ),
    # (closed-loop FedCEM: each rule on one user-episode here, as for the adaptive rule search)
    "FedCEMAgent": Setup(
        {"population": 4, "elite_fraction": 0.5, "episodes_per_rule": 1}, "server.mean"
    ),
}


def _setup_of(cls: type) -> Setup:
    return next((SETUPS[c.__name__] for c in cls.__mro__ if c.__name__ in SETUPS), Setup())


@pytest.fixture(scope="module")
def movielens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resume-logged")
    write_synthetic("ml-100k", root / "ml-100k")
    return root


# --------------------------------------------------------------------------- comparing states
def _plain(value: Any) -> Any:
    """A state as comparable data: tensors and arrays as NumPy arrays, tuples as lists."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _same(a: Any, b: Any) -> bool:
    """Exact equality of two states (NaN equals NaN, dtypes and shapes must match)."""
    a, b = _plain(a), _plain(b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _at(state: Mapping[str, Any], path: str) -> Any:
    for key in path.split("."):
        state = state[key]
    return state


# --------------------------------------------------------------------------- runs
@dataclasses.dataclass
class Trained:
    """The agent a run trained, and its state when it was built."""

    agent: Any
    built_state: dict[str, Any]


Run = Callable[..., Trained]


def _recording(build: Callable[[Any], Any], into: list[Trained]) -> Callable[[Any], Any]:
    def factory(env: Any) -> Any:
        agent = build(env)
        into.append(Trained(agent, copy.deepcopy(agent.state_dict())))
        return agent

    return factory


def _import_or_skip(resolve: Callable[[str], Any], name: str) -> Any:
    try:
        return resolve(name)
    except ImportError as error:  # an optional dependency of the agent is not installed
        pytest.skip(f"{name}: cannot import the agent ({error})")


def _single_run(name: str, request: pytest.FixtureRequest) -> tuple[Run, Setup]:
    cls = _import_or_skip(resolve_agent, name)
    setup = _setup_of(cls)
    agent_config = make_config(cls, setup.overrides)
    env_id, env_kwargs = "fedrec/ChocKaleLongTerm-v0", CHOC_KALE
    if setup.logged_data:
        data_dir = request.getfixturevalue("movielens")
        env_id, env_kwargs = "fedrec/MovieLens100K-v0", {**SLATES, "data_dir": str(data_dir)}

    def run(out: Path, *, resume: bool = False) -> Trained:
        trained: list[Trained] = []
        config = TrainConfig(
            env_id=env_id, episodes=EPISODES, num_envs=USERS, seed=SEED, env_kwargs=env_kwargs,
            checkpoint_every=4, eval_episodes=4, references=False, progress=False,
        )  # fmt: skip
        build = _recording(lambda env: cls.from_env(env, config=agent_config, seed=SEED), trained)
        train(build, config=config, out_dir=out, resume=resume, run_info={"agent": name})
        return trained[-1]

    return run, setup


def _per_platform_setup(presets: Mapping[str, Any]) -> Setup:
    """A per-platform wrapper learns with its inner agent's tiny setup, on platform A."""
    inner = resolve_agent(presets.get("agent", PerPlatformConfig.agent))
    setup = _setup_of(inner)
    options = tuple(f"{key}={value!r}" for key, value in setup.overrides.items())
    learned = None if setup.learned is None else f"agents.platform_a.{setup.learned}"
    return Setup({"agent_options": options}, learned)


def _multi_run(name: str) -> tuple[Run, Setup]:
    cls, presets = _import_or_skip(resolve_multi_platform_agent, name)
    setup = _per_platform_setup(presets) if cls is PerPlatformAgent else _setup_of(cls)

    def run(out: Path, *, resume: bool = False) -> Trained:
        trained: list[Trained] = []
        config = MultiPlatformTrainConfig(
            method=name, episodes=EPISODES, num_users=USERS, seed=SEED,
            env_kwargs=env_for(name, CHOC_KALE), agent_kwargs=setup.overrides, checkpoint_every=4,
            eval_episodes=4, planner=False, progress=False,
        )  # fmt: skip
        build = _recording(
            lambda env: build_multi_platform_agent(name, env, seed=SEED, **setup.overrides),
            trained,
        )
        train_multi_platform(config, out_dir=out, resume=resume, agent=build)
        return trained[-1]

    return run, setup


def _check_exact_resume(
    run: Run, setup: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = run(tmp_path / "whole")
    killed = tmp_path / "killed"
    die_after_checkpoint(monkeypatch, lambda: run(killed))
    assert not (killed / "final_eval.json").exists()
    checkpoint = load_checkpoint(killed / "checkpoint.pt")
    assert 0 < checkpoint["rows"] < EPISODES  # it died mid-run
    if setup.learned is not None:  # it learned before it died: a restart from scratch would show
        assert not _same(
            _at(checkpoint["agent"], setup.learned), _at(whole.built_state, setup.learned)
        )
    resumed = run(killed, resume=True)
    assert (tmp_path / "whole" / "episodes.csv").read_bytes() == (
        killed / "episodes.csv"
    ).read_bytes()
    assert final_eval_without_clock(tmp_path / "whole") == final_eval_without_clock(killed)
    assert _same(resumed.agent.state_dict(), whole.agent.state_dict())


@pytest.mark.parametrize("name", list(AGENTS))
def test_every_single_platform_agent_resumes_exactly(name, request, tmp_path, monkeypatch):
    _check_exact_resume(*_single_run(name, request), tmp_path, monkeypatch)


@pytest.mark.parametrize("name", list(MULTI_PLATFORM_AGENTS))
def test_every_multi_platform_agent_resumes_exactly(name, tmp_path, monkeypatch):
    _check_exact_resume(*_multi_run(name), tmp_path, monkeypatch)


def test_a_checkpoint_gives_back_numpy_values_as_saved(tmp_path):
    """Agents' states hold 0-d arrays (e.g. PPO's running variance of the return) and NumPy
    floats: a 0-d array came back 1-d, a np.float64 made the checkpoint unloadable."""
    state = {"var": np.array(2.5), "scale": np.float64(0.5), "t": np.arange(6).reshape(2, 3).T}
    save_checkpoint(tmp_path / "checkpoint.pt", state)
    loaded = load_checkpoint(tmp_path / "checkpoint.pt")
    assert loaded["var"].shape == () and loaded["var"].dtype == np.float64 and loaded["var"] == 2.5
    assert type(loaded["scale"]) is float and loaded["scale"] == 0.5
    assert np.array_equal(loaded["t"], state["t"])
