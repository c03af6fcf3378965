"""Offline agents (bc, cql_slateq) trained from a dataset of `fedrec data collect`: BC recovers
a deterministic logger, CQL's regulariser lowers the values of items the logger never showed,
`fedrec train NAME --dataset` runs end to end, a killed run resumes exactly, and bad datasets
are refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from resume_helpers import die_after_checkpoint, final_eval_without_clock

from fedrec.agents.offline import observations_of
from fedrec.agents.offline_bc import BCConfig, BehaviourCloningAgent
from fedrec.agents.offline_cql import CQLSlateQAgent, CQLSlateQConfig
from fedrec.agents.reference import HighestFeaturePolicy
from fedrec.cli import main
from fedrec.train.checkpoint import load_checkpoint
from fedrec.train.collect import collect, save_minari
from fedrec.train.offline import OfflineTrainConfig, load_offline_dataset, train_offline

pytest.importorskip("minari")

ENV = "fedrec/ChocKaleSlate-v0"  # 10 candidates, slates of 3
SHORT = {"time_budget": 20}


def _dataset(root: Path, policy: str, epsilon: float, episodes: int = 8) -> Path:
    data = collect(ENV, policy, episodes=episodes, seed=0, epsilon=epsilon, env_kwargs=SHORT,
                   num_envs=8, progress=False)  # fmt: skip
    return save_minari(data, root).parent


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """0.5 · bottom_x + 0.5 · random, 8 episodes of 20 steps."""
    return _dataset(tmp_path_factory.mktemp("offline"), "bottom_x", 0.5)


def _train(
    cls, config, path: Path, *, steps: int, out: Path | None = None, resume=False, **options
):
    return train_offline(
        lambda env: cls.from_env(env, config=config, seed=1),
        config=OfflineTrainConfig(dataset=str(path), steps=steps, seed=1, progress=False,
                                  **{"eval_episodes": 0, **options}),
        out_dir=out,
        resume=resume,
    )  # fmt: skip


def test_bc_recovers_a_deterministic_logger(tmp_path) -> None:
    path = _dataset(tmp_path, "top_x", 0.0)
    bc_config = BCConfig(hidden_sizes=(16,), batch_size=64, learning_rate=1e-2)
    env = gym.make_vec(ENV, num_envs=200, **SHORT)
    agent = BehaviourCloningAgent.from_env(env, config=bc_config, seed=1)
    config = OfflineTrainConfig(dataset=str(path), steps=300, seed=1, eval_episodes=0,
                                progress=False)  # fmt: skip
    result = train_offline(agent, config=config)
    assert result.losses[-1] < 0.5 * result.losses[0]
    again = train_offline(lambda env: BehaviourCloningAgent.from_env(env, config=bc_config, seed=1),
                          config=config)  # fmt: skip
    assert np.array_equal(again.losses, result.losses)  # seeded: the same run twice
    # Fresh users and candidates: the cloned slates are the logger's, in its order.
    observations, _ = env.reset(seed=123)
    logger = HighestFeaturePolicy(slate_size=3).act_batch(observations)
    agree = (agent.act_batch(observations) == logger).all(axis=1).mean()
    assert agree >= 0.95


def test_cql_lowers_the_values_of_items_the_logger_never_showed(tmp_path) -> None:
    path = _dataset(tmp_path, "bottom_x", 0.0)  # only the 3 lowest-feature items are ever shown
    data = load_offline_dataset(path).data
    values, gaps = {}, {}
    for alpha in (0.0, 1.0):
        config = CQLSlateQConfig(alpha=alpha, hidden_sizes=(16,), batch_size=64)
        agent = CQLSlateQAgent.from_env(gym.make_vec(ENV, num_envs=1, **SHORT), config=config,
                                        seed=1)  # fmt: skip
        train_offline(agent, config=OfflineTrainConfig(dataset=str(path), steps=200, seed=1,
                                                       eval_episodes=0, progress=False))  # fmt: skip
        q = agent.item_values(observations_of(data))
        logged = np.zeros_like(q, dtype=bool)
        np.put_along_axis(logged, data["slate"], True, axis=1)
        values[alpha] = q[~logged].mean()
        gaps[alpha] = q[~logged].mean() - q[logged].mean()
    assert values[1.0] < values[0.0]
    assert gaps[1.0] < gaps[0.0] and gaps[1.0] < 0


def test_cli_train_bc_from_a_collected_dataset(tmp_path, capsys) -> None:
    root = tmp_path / "datasets"
    code = main(["data", "collect", "--env", ENV, "--policy", "top_x", "--epsilon", "0.2",
                 "--episodes", "4", "--env-kwarg", "time_budget=10", "--out", str(root),
                 "--no-progress"])  # fmt: skip
    assert code == 0
    dataset = root / "fedrec/ChocKaleSlate/top_x-eps0p2-random-v0"
    out = tmp_path / "run"
    code = main(["train", "bc", "--dataset", str(dataset), "--steps", "30", "--eval-episodes",
                 "6", "--out", str(out), "--no-progress", "--hidden-sizes", "8"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "30 gradient steps on 40 logged transitions" in printed and "logger" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["env_id"] == ENV and config["env_kwargs"] == {"time_budget": 10}
    assert config["agent"] == "bc" and config["agent_config"]["hidden_sizes"] == [8]
    final = json.loads((out / "final_eval.json").read_text())
    assert {"agent", "logger", "random", "top_x", "planner"} <= set(final["policies"])
    assert len(final["policies"]["agent"]["returns"]) == 6
    assert (out / "updates.csv").read_text().splitlines()[0] == "step,loss"
    # --resume extends a finished run; another dataset's run directory is refused
    code = main(["train", "bc", "--dataset", str(dataset), "--steps", "40", "--eval-episodes",
                 "0", "--out", str(out), "--no-progress", "--resume"])  # fmt: skip
    assert code == 0
    assert (out / "updates.csv").read_text().splitlines()[-1].startswith("40,")
    code = main(["train", "cql_slateq", "--dataset", str(dataset), "--steps", "10",
                 "--eval-episodes", "0", "--out", str(tmp_path / "cql"), "--no-progress",
                 "--alpha", "0.5"])  # fmt: skip
    assert code == 0


@pytest.mark.parametrize(
    ("cls", "config"),
    [
        (BehaviourCloningAgent, BCConfig(hidden_sizes=(16,), batch_size=32)),
        (
            CQLSlateQAgent,
            CQLSlateQConfig(hidden_sizes=(16,), batch_size=32, target_update_interval=7),
        ),
    ],
    ids=["bc", "cql_slateq"],
)
def test_a_killed_offline_run_resumes_exactly(cls, config, mixed, tmp_path, monkeypatch) -> None:
    options = {"log_every": 5, "checkpoint_every": 10, "eval_episodes": 4}
    whole = _train(cls, config, mixed, steps=40, out=tmp_path / "whole", **options)
    killed = tmp_path / "killed"
    die_after_checkpoint(
        monkeypatch, lambda: _train(cls, config, mixed, steps=40, out=killed, **options)
    )
    checkpoint = load_checkpoint(killed / "checkpoint.pt")
    assert checkpoint["loop"]["steps_done"] == 20 and checkpoint["agent"]["gradient_steps"] == 20
    resumed = _train(cls, config, mixed, steps=40, out=killed, resume=True, **options)
    assert (tmp_path / "whole/updates.csv").read_bytes() == (killed / "updates.csv").read_bytes()
    assert final_eval_without_clock(tmp_path / "whole") == final_eval_without_clock(killed)
    assert np.array_equal(whole.losses, resumed.losses) and len(whole.losses) == 8
    # a resume on another dataset is refused
    other = _dataset(tmp_path / "other", "top_x", 0.5, episodes=2)
    with pytest.raises(ValueError, match="dataset_sha256"):
        _train(cls, config, other, steps=40, out=killed, resume=True, **options)


def _copy(path: Path, where: Path) -> Path:
    target = where / "copy"
    shutil.copytree(path, target)
    return target


def test_bad_datasets_are_refused_in_one_line(mixed, tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_offline_dataset(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is not a Minari dataset"):
        load_offline_dataset(tmp_path / "empty")
    with pytest.raises(ValueError, match="collected on fedrec/ChocKaleSlate-v0, not fedrec/ChocKale-v0"):  # fmt: skip
        load_offline_dataset(mixed, env_id="fedrec/ChocKale-v0")
    with pytest.raises(ValueError, match="env kwargs"):
        load_offline_dataset(mixed, env_kwargs={"time_budget": 30})
    # no fedrec metadata: not written by fedrec data collect
    foreign = _copy(mixed, tmp_path / "foreign")
    meta_path = foreign / "data/metadata.json"
    meta = json.loads(meta_path.read_text())
    meta.pop("fedrec")
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="no 'fedrec' metadata"):
        load_offline_dataset(foreign)
    # a malformed file
    broken = _copy(mixed, tmp_path / "broken")
    part = next((broken / "data").glob("*/part-0.arrow"))
    part.write_bytes(part.read_bytes()[:100])
    with pytest.raises(ValueError, match="cannot be read as a Minari dataset"):
        load_offline_dataset(broken)
    garbled = _copy(mixed, tmp_path / "garbled")
    (garbled / "data/metadata.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read as a Minari dataset"):
        load_offline_dataset(garbled)
    # the command line: one line, exit status 2
    for args, message in [
        (["train", "bc", "--dataset", str(tmp_path / "nowhere")], "does not exist"),
        (["train", "bc", "--dataset", str(mixed), "--env", "fedrec/ChocKale-v0"], "collected on"),
        (["train", "bc", "--dataset", str(broken)], "cannot be read"),
        (["train", "bc", "--env", ENV], "offline agent: give --dataset"),
        (["train", "slateq", "--dataset", str(mixed)], "learns online"),
        (["train", "bc", "--dataset", str(mixed), "--episodes", "3"], "gradient steps"),
    ]:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_offline_agents_refuse_online_learning(mixed) -> None:
    env = gym.make_vec(ENV, num_envs=1, **SHORT)
    agent = BehaviourCloningAgent.from_env(env, seed=0)
    with pytest.raises(ValueError, match="offline agent"):
        agent.learn(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="offline agent"):
        CQLSlateQAgent.from_env(env, seed=0).learn(None)  # type: ignore[arg-type]
