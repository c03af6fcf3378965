"""No hidden state on any path: every env declares the info keys a real recommender could not know,
and no learner receives one of them -- at any depth of ``infos`` (a vector env's ``final_info``,
per-platform dicts, ``_key`` masks) -- on any entry path: the training loop and its evaluation,
``fedrec train`` with a built-in and a plug-in agent, the Stable-Baselines3 adapters, the
multi-platform loop with per-platform agents, and ``fedrec bench``. Oracles still get everything.

The spies (``tests/info_spy.py``) walk every nested key of every ``infos`` they are handed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from info_spy import (
    ALL_HIDDEN,
    CASCADE_HIDDEN,
    CHOC_KALE_HIDDEN,
    INTEREST_EVOLUTION_HIDDEN,
    LOGGED_EVALUATION_HIDDEN,
    LOGGED_INTERACTION_HIDDEN,
    RECORDS,
    SARDINE_HIDDEN,
    InfoSpy,
    OracleSpy,
    hidden_values,
    reset_records,
)

from fedrec.agents.base import visible_infos
from fedrec.agents.per_platform import PerPlatformAgent, PerPlatformConfig
from fedrec.agents.reference import RandomPolicy
from fedrec.cli import main
from fedrec.envs.datasets.registry import LOGGED_DATA_ENVIRONMENTS
from fedrec.envs.datasets.synthetic import write_synthetic
from fedrec.envs.hidden import hidden_info_keys
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv, ChocKaleMultiPlatformEnv
from fedrec.eval.rollout import evaluate_policy
from fedrec.registration import (
    CHOC_KALE_ENVIRONMENTS,
    SARDINE_ENVIRONMENTS,
    USER_MODEL_ENVIRONMENTS,
    environment_ids,
)
from fedrec.train.loop import TrainConfig, train
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

USER_TYPES = "fedrec/ChocKaleUserTypes-v0"  # every hidden key, the user's sensitivity included
MULTI = "fedrec/ChocKaleMultiPlatform-v0"
MULTI_IDS = [e.id for e in CHOC_KALE_ENVIRONMENTS if e.api == "pettingzoo"]
TAOBAO = "fedrec/TaobaoAds-v0"
#: Short episodes, so that several end (and a vector env reports ``final_info``) in a few steps.
TINY = {"num_candidates": 10, "slate_size": 3, "time_budget": 8}
CHOC_IDS = [e.id for e in CHOC_KALE_ENVIRONMENTS if e.api == "gymnasium"]
MODEL_HIDDEN = {
    "fedrec/InterestEvolution-v0": INTEREST_EVOLUTION_HIDDEN,
    "fedrec/ChocKaleCascade-v0": CASCADE_HIDDEN,
}
MODEL_IDS = [e.id for e in USER_MODEL_ENVIRONMENTS]
LOGGED_IDS = [e.id for e in LOGGED_DATA_ENVIRONMENTS if "dataset" in e.kwargs]
#: SARDINE's envs, registered when the ``sardine`` extra is installed (none otherwise).
SARDINE_IDS = [e.id for e in SARDINE_ENVIRONMENTS]
#: (env id, mode) of every registered Gymnasium env; mode None: the env has one.
CASES = [
    *[(env_id, None) for env_id in CHOC_IDS],
    *[(env_id, None) for env_id in MODEL_IDS],
    *[(env_id, None) for env_id in SARDINE_IDS],
    *[(env_id, mode) for env_id in LOGGED_IDS for mode in ("interaction", "evaluation")],
    (TAOBAO, None),
]
SLATE_CASES = [case for case in CASES if case[0] != TAOBAO]  # SB3's adapters map slates


def declared(env_id: str, mode: str | None) -> frozenset[str]:
    """What each env must declare hidden (pinned; the spies look for all of these everywhere)."""
    if env_id in CHOC_IDS or env_id in MULTI_IDS:
        return CHOC_KALE_HIDDEN
    if env_id in MODEL_HIDDEN:
        return MODEL_HIDDEN[env_id]
    if env_id in SARDINE_IDS:
        return SARDINE_HIDDEN
    if env_id == TAOBAO:
        return frozenset()
    return LOGGED_EVALUATION_HIDDEN if mode == "evaluation" else LOGGED_INTERACTION_HIDDEN


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("logged")
    for name in ("ml-100k", "ml-1m", "lastfm-2k", "foursquare-nyc", "taobao-ads"):
        write_synthetic(name, root / name)
    return root


def env_kwargs(env_id: str, mode: str | None, data_dir: Path) -> dict:
    if env_id in CHOC_IDS or env_id in MODEL_IDS:
        return dict(TINY)
    if env_id in SARDINE_IDS:  # SARDINE's catalogue and slate size; short episodes
        return {"episode_length": TINY["time_budget"]}
    if env_id == TAOBAO:
        return {"data_dir": str(data_dir)}
    short = {"max_steps": 3} if mode == "interaction" else {}
    return {"data_dir": str(data_dir), "mode": mode, **short}


def _assert_clean(record_name: str) -> None:
    record = RECORDS[record_name]
    assert record.calls, f"the {record_name} spy was never asked to act"
    assert not record.hidden, f"the {record_name} spy saw {record.report()}"


def test_every_registered_env_is_covered() -> None:
    assert {env_id for env_id, _ in CASES} | set(MULTI_IDS) == set(environment_ids())


@pytest.mark.parametrize(("env_id", "mode"), CASES)
def test_every_env_declares_its_hidden_keys_readable_through_wrappers(
    env_id: str, mode: str | None, data_dir: Path
) -> None:
    kwargs = env_kwargs(env_id, mode, data_dir)
    single = gym.make(env_id, **kwargs)  # under gym.make's wrappers
    native = gym.make_vec(env_id, num_envs=2, **kwargs)
    sync = gym.make_vec(env_id, num_envs=1, vectorization_mode="sync", **kwargs)
    for env in (single, single.unwrapped, native, sync):
        assert hidden_info_keys(env) == declared(env_id, mode), env
        env.close()
    # the env's card ("## Info") says what is hidden and names every hidden key
    card = type(single.unwrapped).__doc__.split("## Info", 1)[1].split("\n    ## ", 1)[0]
    assert "hidden" in card and all(f"``{key}``" in card for key in declared(env_id, mode))


def test_the_multi_platform_envs_declare_the_hidden_user_state() -> None:
    for env in (ChocKaleMultiPlatformEnv(), ChocKaleMultiPlatformBatchEnv(2)):
        assert hidden_info_keys(env) == CHOC_KALE_HIDDEN
        assert set(env.oracle_state()) <= CHOC_KALE_HIDDEN  # the oracles' channel holds only them


def test_visible_infos_filters_every_depth_and_leaves_the_oracles_everything() -> None:
    mask = np.array([True, False])
    step = {"clicked_slot": np.array([0, -1]), "user_exposure": np.zeros(2), "budget_left": [3, 3]}
    infos = {
        **step,
        **{f"_{key}": mask for key in step},
        "final_obs": {"candidates": np.zeros((2, 10, 1))},
        "_final_obs": mask,
        "final_info": {**step, **{f"_{key}": mask for key in step}},
        "_final_info": mask,
        "platform_a": {"feedback": True, "user_satisfaction": 0.5},
    }
    visible = visible_infos(InfoSpy.__new__(InfoSpy), infos, CHOC_KALE_HIDDEN)
    assert hidden_values(visible) == {}
    assert set(visible) == {
        "clicked_slot", "_clicked_slot", "final_obs", "_final_obs", "final_info", "_final_info",
        "platform_a",
    }  # fmt: skip
    assert set(visible["final_info"]) == {"clicked_slot", "_clicked_slot"}
    assert visible["platform_a"] == {"feedback": True}
    assert visible["final_info"]["clicked_slot"] is step["clicked_slot"]  # values are not copied
    assert "user_exposure" in infos["final_info"]  # the env's own dict is left as it was
    assert visible_infos(OracleSpy.__new__(OracleSpy), infos, CHOC_KALE_HIDDEN) is infos
    assert visible_infos(InfoSpy.__new__(InfoSpy), None, CHOC_KALE_HIDDEN) is None


@pytest.mark.parametrize(("env_id", "mode"), CASES)
def test_the_training_loop_and_evaluation_hand_a_learner_no_hidden_key(
    env_id: str, mode: str | None, data_dir: Path
) -> None:
    reset_records()
    kwargs = env_kwargs(env_id, mode, data_dir)
    config = TrainConfig(
        env_id=env_id, episodes=6, num_envs=2, seed=0, env_kwargs=kwargs, eval_episodes=2,
        references=False, checkpoint_every=0, progress=False,
    )  # fmt: skip
    train(lambda env: InfoSpy.from_env(env, seed=0), config=config, out_dir=None)
    probe = gym.make_vec(env_id, num_envs=2, **kwargs)
    evaluate_policy(env_id, InfoSpy.from_env(probe), episodes=3, num_envs=2, env_kwargs=kwargs)
    probe.close()
    _assert_clean("learner")
    # the spy did walk the autoreset's nested final info
    assert any(key.startswith("final_info/") for key in RECORDS["learner"].keys)


def test_an_oracle_still_receives_the_whole_hidden_state() -> None:
    reset_records()
    config = TrainConfig(
        env_id=USER_TYPES, episodes=6, num_envs=2, seed=0, env_kwargs=TINY, eval_episodes=2,
        references=True, checkpoint_every=0, progress=False,
    )  # fmt: skip
    result = train(lambda env: OracleSpy.from_env(env, seed=0), config=config, out_dir=None)
    assert {"myopic", "planner"} <= set(result.final_eval["policies"])
    keys = RECORDS["oracle"].keys
    assert CHOC_KALE_HIDDEN <= keys
    assert {f"final_info/{key}" for key in CHOC_KALE_HIDDEN} <= keys


PLUGIN = textwrap.dedent(
    """
    from info_spy import InfoSpy

    class PluginSpy(InfoSpy):
        record_as = "plug-in"
    """
)


@pytest.fixture
def plugin(tmp_path: Path) -> str:
    path = tmp_path / "plugin_spy.py"
    path.write_text(PLUGIN)
    return f"{path}:PluginSpy"


def test_fedrec_train_hands_no_hidden_key_to_a_built_in_or_plug_in_agent(
    tmp_path: Path, plugin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reset_records()
    act_batch = RandomPolicy.act_batch

    def spied(self, observations, *, infos=None):
        RECORDS["built-in"].add(infos)
        return act_batch(self, observations, infos=infos)

    monkeypatch.setattr(RandomPolicy, "act_batch", spied)
    kwargs = [f"--env-kwarg={key}={value}" for key, value in TINY.items()]
    for name, agent in (("built-in", "random"), ("plug-in", plugin)):
        argv = ["train", agent, "--env", USER_TYPES, "--episodes", "6", "--num-envs", "2",
                "--eval-episodes", "2", *kwargs, "--no-progress", "--out", str(tmp_path / name)]  # fmt: skip
        assert main(argv) == 0
        _assert_clean(name)
        assert any(key.startswith("final_info/") for key in RECORDS[name].keys)


def test_fedrec_bench_hands_no_hidden_key_to_a_contender(
    tmp_path: Path, plugin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedrec.experiments import longterm

    reset_records()
    monkeypatch.setitem(longterm.SETTINGS, "spy", longterm.Setting(USER_TYPES, TINY, "spy"))
    monkeypatch.setitem(longterm.CONTENDERS, "spy", longterm.Contender(plugin, 32))
    argv = ["bench", "longterm", "--settings", "spy", "--agents", "spy", "--seeds", "1",
            "--eval-episodes", "2", "--no-progress", "--no-plot", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    _assert_clean("plug-in")
    assert any(key.startswith("final_info/") for key in RECORDS["plug-in"].keys)


@pytest.mark.parametrize(("env_id", "mode"), SLATE_CASES)
def test_stable_baselines3_receives_no_hidden_key(
    env_id: str, mode: str | None, data_dir: Path
) -> None:
    from fedrec.agents.sb3_adapter import SB3SlateWrapper, make_sb3_env

    kwargs = env_kwargs(env_id, mode, data_dir)
    rng = np.random.default_rng(0)
    venv = make_sb3_env(env_id, num_envs=2, seed=0, monitor=False, **kwargs)
    venv.reset()
    handed, ended = [venv.reset_infos], 0
    for _ in range(10):
        _, _, dones, infos = venv.step(rng.uniform(-1, 1, (2, *venv.action_space.shape)))
        handed += [infos, list(venv.reset_infos)]
        ended += int(dones.sum())
    env = SB3SlateWrapper(gym.make(env_id, **kwargs))
    _, info = env.reset(seed=0)
    handed.append(info)
    for _ in range(10):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        handed.append(info)
        if terminated or truncated:
            ended += 1
            handed.append(env.reset()[1])
    assert ended and hidden_values(handed) == {}


class JointSpy(PerPlatformAgent):
    """A per-platform method (an InfoSpy on each feedback platform) that records the oracle
    argument of every evaluation step."""

    handed: list[object] = []

    def act_joint(self, observations, oracle=None):
        type(self).handed.append(oracle)
        return super().act_joint(observations, oracle)


@pytest.mark.parametrize("env_id", MULTI_IDS)
def test_the_multi_platform_loop_and_per_platform_hand_no_hidden_state(
    env_id: str, tmp_path: Path
) -> None:
    reset_records()
    JointSpy.handed = []
    config = MultiPlatformTrainConfig(
        method="per_platform", env_id=env_id, episodes=4, num_users=2, seed=0,
        env_kwargs={**TINY, "time_budget": 16}, eval_episodes=2, planner=True,
        checkpoint_every=0, progress=False,
    )  # fmt: skip
    spy_config = PerPlatformConfig(agent="info_spy:InfoSpy")
    spy = lambda env: JointSpy.from_env(env, config=spy_config, seed=0)  # noqa: E731
    result = train_multi_platform(config, agent=spy, out_dir=tmp_path / "run")
    _assert_clean("learner")
    assert JointSpy.handed and all(oracle is None for oracle in JointSpy.handed)
    assert "planner" in result.final_eval["policies"]  # the joint planner still plans


def test_the_spies_see_every_hidden_key_they_are_handed() -> None:
    """The walker finds hidden keys and masks at any depth (the spies are not blind)."""
    infos = {"a": 1, "final_info": {"positives_left": np.arange(3), "_positives_left": [1, 0, 1]}}
    assert hidden_values(infos) == {"infos['final_info']['positives_left']": 2,
                                    "infos['final_info']['_positives_left']": 0}  # fmt: skip
    assert hidden_values([{"x": {"test_item": 4}}]) == {"infos[0]['x']['test_item']": 1}
    assert ALL_HIDDEN >= CHOC_KALE_HIDDEN | LOGGED_EVALUATION_HIDDEN | LOGGED_INTERACTION_HIDDEN
