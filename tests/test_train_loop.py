"""The training loop: resume gives exactly the uninterrupted run, atomic files, CLI, plug-in agents."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fedrec  # noqa: F401
from fedrec.agents.registry import resolve_agent
from fedrec.agents.slateq import SlateQAgent, SlateQConfig
from fedrec.cli import main
from fedrec.train.loop import TrainConfig, read_episodes_csv, train

ROOT = Path(__file__).resolve().parents[1]
TINY = SlateQConfig(hidden_sizes=(16,), learning_starts=300, epsilon_decay=1000, buffer_size=2000)


class _Killed(SlateQAgent):
    """Dies (like a killed process) in its 200th vector step, after the checkpoint at 12 episodes."""

    calls = 0

    def learn(self, transitions):
        type(self).calls += 1
        if type(self).calls == 200:
            raise KeyboardInterrupt
        return super().learn(transitions)


def _run(cls, episodes, out: Path | None, *, resume: bool = False, seed: int = 3, **overrides):
    config = TrainConfig(
        env_id="fedrec/ChocKaleSlate-v0", episodes=episodes, num_envs=4, seed=seed,
        eval_episodes=0, checkpoint_every=10, progress=False, **overrides,
    )  # fmt: skip
    return train(
        lambda env: cls.from_env(env, config=TINY, seed=seed),
        config=config,
        out_dir=out,
        resume=resume,
        run_info={"agent": "slateq"},
    )


def test_resume_after_a_kill_equals_the_uninterrupted_run(tmp_path):
    reference = _run(SlateQAgent, 13, tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        _run(_Killed, 13, tmp_path / "b")
    killed_rows = read_episodes_csv(tmp_path / "b" / "episodes.csv")
    assert 0 < len(killed_rows) < 13  # it really died mid-run, after a checkpoint
    resumed = _run(SlateQAgent, 13, tmp_path / "b", resume=True)
    np.testing.assert_array_equal(resumed.returns, reference.returns)
    assert (tmp_path / "a" / "episodes.csv").read_text() == (
        tmp_path / "b" / "episodes.csv"
    ).read_text()
    assert not list((tmp_path / "b").glob(".*.tmp"))  # atomic writes leave no temporaries


def test_extending_a_finished_run_equals_one_longer_run(tmp_path):
    longer = _run(SlateQAgent, 13, None)
    _run(SlateQAgent, 7, tmp_path / "c")
    extended = _run(SlateQAgent, 13, tmp_path / "c", resume=True)
    np.testing.assert_array_equal(extended.returns, longer.returns)


def test_same_seed_same_numbers_other_seed_other_numbers():
    a = _run(SlateQAgent, 8, None)
    b = _run(SlateQAgent, 8, None)
    c = _run(SlateQAgent, 8, None, seed=4)
    np.testing.assert_array_equal(a.returns, b.returns)
    assert not np.array_equal(a.returns, c.returns)


def test_resume_refuses_a_different_setup(tmp_path):
    _run(SlateQAgent, 4, tmp_path / "d")
    with pytest.raises(ValueError, match=r"different setup.*seed"):
        _run(SlateQAgent, 8, tmp_path / "d", resume=True, seed=9)


def test_steps_budget_and_bad_config():
    config = TrainConfig(
        env_id="fedrec/ChocKaleSlate-v0",
        episodes=None,
        steps=200,
        num_envs=4,
        eval_episodes=0,
        progress=False,
    )
    result = train(lambda env: SlateQAgent.from_env(env, config=TINY, seed=0), config=config)
    assert result.steps == 200
    with pytest.raises(ValueError, match="exactly one of episodes or steps"):
        TrainConfig(env_id="x", episodes=5, steps=5)
    with pytest.raises(ValueError, match="cannot build"):
        train(lambda env: None, config=TrainConfig(env_id="fedrec/NoSuchEnv-v0", episodes=1))


def test_cli_trains_writes_a_run_and_eval_reads_it(tmp_path, capsys):
    out = tmp_path / "run"
    code = main([
        "train", "slateq", "--env", "fedrec/ChocKaleSlate-v0", "--episodes", "24",
        "--num-envs", "8", "--out", str(out), "--eval-episodes", "16", "--no-progress",
        "--hidden-sizes", "16", "--learning-starts", "200", "--gamma", "0",
    ])  # fmt: skip
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["agent"] == "slateq" and config["agent_config"]["gamma"] == 0.0
    assert config["agent_config"]["hidden_sizes"] == [16]
    assert len(read_episodes_csv(out / "episodes.csv")) == 24
    final = json.loads((out / "final_eval.json").read_text())
    assert set(final["policies"]) == {
        "agent", "random", "top_x", "bottom_x", "best_open_loop", "myopic", "planner"
    }  # fmt: skip
    assert len(final["policies"]["agent"]["returns"]) == 16
    assert main(["eval", str(out), "--out", str(tmp_path / "curves.png")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 0
    # --resume of a finished run with the saved hyperparameters is a no-op that succeeds.
    assert (
        main(
            [
                "train",
                "slateq",
                "--env",
                "fedrec/ChocKaleSlate-v0",
                "--episodes",
                "24",
                "--num-envs",
                "8",
                "--out",
                str(out),
                "--resume",
                "--eval-episodes",
                "0",
                "--no-progress",
            ]
        )
        == 0
    )
    capsys.readouterr()


def test_cli_help_lists_the_agents_hyperparameters():
    result = subprocess.run(
        [sys.executable, "-m", "fedrec.cli", "train", "slateq", "--help"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    for option in ("--gamma", "--target", "--selection", "--choice-model", "--epsilon-decay"):
        assert option in result.stdout


def test_cli_errors_are_clear(capsys):
    assert main(["train", "nonsense", "--env", "fedrec/ChocKale-v0"]) == 2
    assert "unknown agent 'nonsense'" in capsys.readouterr().err
    assert (
        main(["train", "slateq", "--env", "fedrec/ChocKale-v0", "--gamma", "2", "--episodes", "1"])
        == 2
    )
    assert "gamma=2.0" in capsys.readouterr().err


def test_plug_in_agent_from_its_own_file(tmp_path):
    """The README's "Plug in your own agent" example: a file outside the package, trained by the
    same loop and CLI, beats the random policy (ChocKale-v0: random ~947, optimum ~1113)."""
    cls = resolve_agent(str(ROOT / "examples" / "my_agent.py") + ":EngagementBandit")
    config = TrainConfig(
        env_id="fedrec/ChocKale-v0", episodes=64, num_envs=16, eval_episodes=200, progress=False
    )
    result = train(
        lambda env: cls.from_env(env, seed=0), config=config, out_dir=tmp_path / "bandit"
    )
    policies = result.final_eval["policies"]
    assert policies["agent"]["mean"] > policies["random"]["mean"] + 100
    # It resumes like any agent (its state_dict holds the regression's statistics).
    again = train(
        lambda env: cls.from_env(env, seed=0),
        config=dataclasses.replace(config, episodes=80, eval_episodes=0),
        out_dir=tmp_path / "bandit",
        resume=True,
        run_info=None,
    )
    assert len(again.returns) == 80


def test_cli_defaults_to_5000_episodes(tmp_path, capsys):
    out = tmp_path / "random"
    args = ["train", "random", "--env", "fedrec/ChocKale-v0", "--num-envs", "500"]
    assert main([*args, "--out", str(out), "--eval-episodes", "0", "--no-progress"]) == 0
    assert len(read_episodes_csv(out / "episodes.csv")) == 5000
    assert json.loads((out / "config.json").read_text())["episodes"] == 5000
    capsys.readouterr()


def test_scalars_go_to_tensorboard_when_it_is_installed(tmp_path, monkeypatch):
    import fedrec.train.core as core

    logged: list[tuple[str, float, int]] = []

    class FakeWriter:  # stands in for torch.utils.tensorboard.SummaryWriter
        def add_scalar(self, tag, value, step):
            logged.append((tag, float(value), step))

        def close(self):
            logged.append(("closed", 0.0, 0))

    monkeypatch.setattr(core, "tensorboard_writer", lambda out: FakeWriter())
    result = _run(SlateQAgent, 8, tmp_path / "tb")
    returns = [(value, step) for tag, value, step in logged if tag == "episode/return"]
    assert [value for value, _ in returns] == list(result.returns)
    assert [step for _, step in returns] == list(range(1, 9))
    assert any(tag == "train/loss" for tag, _, _ in logged) and logged[-1][0] == "closed"


def test_an_env_without_a_native_batched_version_trains_through_sync_vector_env():
    import gymnasium as gym

    from fedrec.agents.reference import RandomPolicy

    env_id = "test/ChocKaleSingleOnly-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point="fedrec.envs.choc_kale:ChocKaleEnv")
    ends = []

    class Recording(RandomPolicy):
        def learn(self, transitions):
            done = transitions.terminated | transitions.truncated
            ends.append(transitions.next_observations["response_click"][done, -1].sum(axis=-1))
            return {}

    config = TrainConfig(env_id=env_id, episodes=6, num_envs=3, eval_episodes=0, progress=False)
    result = train(lambda env: Recording.from_env(env, seed=0), config=config)
    assert len(result.returns) == 6 and (result.returns > 0).all()
    # s' of a finished episode is its final observation (the user clicked slot 0), not the reset one.
    final_clicks = np.concatenate(ends)
    assert len(final_clicks) == 6 and (final_clicks == 1).all()
    assert result.steps == 2 * 3 * 60  # two rounds of 60-step episodes for 3 users


def test_resume_accepts_a_run_saved_before_a_hyperparameter_existed(tmp_path):
    _run(SlateQAgent, 4, tmp_path / "old")
    config_path = tmp_path / "old" / "config.json"
    saved = json.loads(config_path.read_text())
    del saved["agent_config"]["memory_decay"]  # as written by a fedrec without that option
    config_path.write_text(json.dumps(saved))
    resumed = _run(SlateQAgent, 8, tmp_path / "old", resume=True)
    np.testing.assert_array_equal(resumed.returns, _run(SlateQAgent, 8, None).returns)
