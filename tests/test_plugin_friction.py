"""Plugging in one's own work (issue 33, item 6): a user's agent file imports its siblings, a
trained run's agent comes back with its weights (``fedrec.train.load_trained_agent``,
``per_platform --from-run RUN``, ``fedrec evaluate RUN --env ID``), ``fedrec bench fedslate``
takes per-method hyperparameters (``--method-options METHOD:KEY=VALUE``), and a method that
needs something of the env (``REQUIRES``) is refused before training without it. Also the
per-round progress of ``fedrec flower simulate`` / ``deploy``. Budgets are tiny: seconds each."""

from __future__ import annotations

import io
import json
import sys
import textwrap
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from fedrec.agents.multi_platform import check_requirements
from fedrec.agents.per_platform import PerPlatformAgent, PerPlatformConfig
from fedrec.agents.registry import resolve_agent, resolve_multi_platform_agent
from fedrec.cli import main
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.experiments import fedslate
from fedrec.train import TrainConfig, load_trained_agent, train
from fedrec.train.checkpoint import load_checkpoint
from fedrec.train.multi_platform import (
    MultiPlatformTrainConfig,
    MultiPlatformTrainer,
    train_multi_platform,
)

ROOT = Path(__file__).resolve().parents[1]
RELAY = f"{ROOT / 'examples' / 'my_federated_agent.py'}:ScoreRelay"
SLATE_ENV = "fedrec/ChocKaleSlate-v0"
MULTI_ENV = "fedrec/ChocKaleMultiPlatform-v0"


def _same(a, b) -> bool:
    """Deep equality of two state dicts (arrays and tensors by value)."""
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "numpy") or isinstance(a, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b


@pytest.fixture(scope="module")
def slate_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished single-platform run of rule_search on ChocKaleSlate-v0 (seconds)."""
    out = tmp_path_factory.mktemp("runs") / "rule_search"
    config = TrainConfig(SLATE_ENV, episodes=48, num_envs=16, eval_episodes=0, progress=False)
    train(
        lambda env: resolve_agent("rule_search").from_env(env, seed=0),
        config=config,
        out_dir=out,
        run_info={"agent": "rule_search"},
    )
    return out


# ------------------------------------------------------------------ sibling imports


def test_an_agent_file_imports_the_modules_beside_it_without_leaking_sys_path(tmp_path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "my_helpers_33.py").write_text("SLATE = 'from a sibling'\n")
    (folder / "sibling_agent.py").write_text(
        textwrap.dedent(
            """
            from my_helpers_33 import SLATE
            from fedrec.agents.reference import RandomPolicy

            class Sibling(RandomPolicy):
                source = SLATE
            """
        )
    )
    before = list(sys.path)
    try:
        cls = resolve_agent(f"{folder / 'sibling_agent.py'}:Sibling")
    finally:
        sys.modules.pop("my_helpers_33", None)
    assert cls.source == "from a sibling"
    assert sys.path == before


def test_a_failing_agent_file_leaves_neither_a_module_nor_a_path_behind(tmp_path) -> None:
    path = tmp_path / "broken_agent_33.py"
    path.write_text("import no_such_module_33\n")
    before = list(sys.path)
    with pytest.raises(ImportError):
        resolve_agent(f"{path}:Broken")
    assert sys.path == before
    assert "fedrec_user_agent_broken_agent_33" not in sys.modules


# ------------------------------------------------------------------ load_trained_agent


def test_load_trained_agent_gives_the_agent_with_its_trained_weights(slate_run) -> None:
    agent = load_trained_agent(slate_run)
    assert type(agent).__name__ == "RuleSearchAgent"
    saved = load_checkpoint(slate_run / "checkpoint.pt")["agent"]
    assert _same(agent.state_dict(), saved)
    fresh = resolve_agent("rule_search").from_env(
        __import__("gymnasium").make_vec(SLATE_ENV, num_envs=16), seed=0
    )
    assert not _same(fresh.state_dict(), saved)  # the run did learn something


def test_load_trained_agent_refuses_what_is_not_a_run_with_one_line(tmp_path, slate_run) -> None:
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        load_trained_agent(tmp_path)
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "config.json").write_text((slate_run / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"no checkpoint\.pt"):
        load_trained_agent(copy)
    # a checkpoint of another run (another seed) next to this config.json
    config = json.loads((slate_run / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "seed": 7}))
    (copy / "checkpoint.pt").write_bytes((slate_run / "checkpoint.pt").read_bytes())
    with pytest.raises(ValueError, match="belongs to another run") as error:
        load_trained_agent(copy)
    assert "\n" not in str(error.value)


def test_a_run_of_an_agent_file_loads_only_when_the_user_names_the_file(tmp_path, capsys) -> None:
    out = tmp_path / "relay"
    config = MultiPlatformTrainConfig(
        method=RELAY,
        episodes=4,
        num_users=4,
        env_kwargs={"shared_catalogue": True},
        eval_episodes=0,
        progress=False,
    )
    train_multi_platform(config, out_dir=out)
    with pytest.raises(ValueError, match="name that file yourself"):
        load_trained_agent(out)  # the run's config.json alone never picks a file to execute
    agent = load_trained_agent(out, agent_files=[RELAY])
    assert type(agent).__name__ == "ScoreRelay"
    assert main(["evaluate", str(out), "--episodes", "4", "--no-references"]) == 2
    assert "--agent-file" in capsys.readouterr().err
    argv = ["evaluate", str(out), "--agent-file", RELAY, "--episodes", "4", "--no-references"]
    assert main(argv) == 0
    assert "ScoreRelay" in capsys.readouterr().out.splitlines()[0]


# ------------------------------------------------------------------ per_platform --from-run


def test_per_platform_from_run_starts_every_feedback_copy_from_the_trained_weights(
    slate_run, tmp_path
) -> None:
    saved = load_checkpoint(slate_run / "checkpoint.pt")["agent"]
    config = MultiPlatformTrainConfig(
        method="per_platform",
        episodes=4,
        num_users=4,
        agent_kwargs={"from_run": str(slate_run)},
        eval_episodes=0,
        progress=False,
    )
    trainer = MultiPlatformTrainer(config)
    agent = trainer.agent
    assert isinstance(agent, PerPlatformAgent) and agent.pending_run is None
    assert type(agent.agents["platform_a"]).__name__ == "RuleSearchAgent"
    assert _same(agent.agents["platform_a"].state_dict(), saved)
    assert type(agent.agents["platform_b"]).__name__ == "RandomPolicy"  # no feedback
    # and through the command line
    out = tmp_path / "mp"
    argv = ["train", "per_platform", "--env", MULTI_ENV, "--from-run", str(slate_run),
            "--episodes", "4", "--num-envs", "4", "--eval-episodes", "0", "--no-progress",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((out / "config.json").read_text())["agent_config"]["from_run"] == str(
        slate_run
    )


def test_per_platform_from_run_refuses_what_cannot_start_it(slate_run, tmp_path) -> None:
    env = ChocKaleMultiPlatformBatchEnv(num_users=2)
    with pytest.raises(ValueError, match="leave out agent and agent_options"):
        PerPlatformAgent.from_env(
            env, config=PerPlatformConfig(from_run=str(slate_run), agent_options=("x=1",))
        )
    built = PerPlatformAgent.from_env(env, config=PerPlatformConfig(from_run=str(slate_run)))
    obs, _ = env.reset(seed=0)
    with pytest.raises(ValueError, match="weights were not loaded"):
        built.act(obs)  # built by hand: the loop loads the weights, not the constructor
    wide = ChocKaleMultiPlatformBatchEnv(num_users=2, num_candidates=20)
    with pytest.raises(ValueError, match="observation space") as error:
        PerPlatformAgent.from_env(wide, config=PerPlatformConfig(from_run=str(slate_run)))
    assert "\n" not in str(error.value)
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        PerPlatformAgent.from_env(env, config=PerPlatformConfig(from_run=str(tmp_path)))


# ------------------------------------------------------------------ fedrec evaluate


def test_fedrec_evaluate_prints_the_agent_and_references_with_cis(slate_run, capsys) -> None:
    assert main(["evaluate", str(slate_run), "--episodes", "20"]) == 0
    out = capsys.readouterr().out
    assert f"on {SLATE_ENV}" in out and "20 held-out episodes" in out
    for policy in ("agent", "random", "planner"):
        assert any(line.split()[:1] == [policy] and "±" in line for line in out.splitlines())
    assert main(["evaluate", str(slate_run), "--env", SLATE_ENV, "--episodes", "10",
                 "--seed", "3", "--no-references", "--json"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert set(result["policies"]) == {"agent"} and result["episodes"] == 10


def test_fedrec_evaluate_refuses_an_env_that_does_not_fit_in_one_line(slate_run, capsys) -> None:
    argv = ["evaluate", str(slate_run), "--env-kwarg", "num_candidates=20", "--episodes", "5"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedrec evaluate: error:") and "does not fit" in err
    assert "\n" not in err
    assert main(["evaluate", str(slate_run), "--env", MULTI_ENV]) == 2
    assert "is not a single-platform env" in capsys.readouterr().err


# ------------------------------------------------------------------ --method-options


def test_method_options_are_checked_against_the_methods_config() -> None:
    methods = ("fedslate", RELAY)
    parsed = fedslate.parse_method_options(
        ["ScoreRelay:bins=20", "fedslate:learning_rate=0.001", f"{RELAY}:epsilon=0.2"], methods
    )
    assert parsed == {RELAY: {"bins": 20, "epsilon": 0.2}, "fedslate": {"learning_rate": 0.001}}
    with pytest.raises(ValueError, match="has no option 'binz'; its options: bins, epsilon"):
        fedslate.parse_method_options(["ScoreRelay:binz=3"], methods)
    with pytest.raises(ValueError, match="not among the methods run"):
        fedslate.parse_method_options(["fedq:learning_rate=0.1"], methods)
    with pytest.raises(ValueError, match="presets method='fedslate'"):
        fedslate.parse_method_options(["fedslate:method=fedq"], methods)
    with pytest.raises(ValueError, match="bins must be an int"):
        fedslate.parse_method_options(["ScoreRelay:bins=many"], methods)
    with pytest.raises(ValueError, match="expected METHOD:KEY=VALUE"):
        fedslate.parse_method_options(["bins=3"], methods)
    with pytest.raises(ValueError, match="has no option"):  # the bench config checks at once
        fedslate.BenchFedSlateConfig(methods=methods, method_options=("ScoreRelay:x=1",))


def test_bench_fedslate_trains_a_user_method_with_its_options(tmp_path, capsys) -> None:
    out = tmp_path / "bench"
    argv = ["bench", "fedslate", "--setting", "10x3", "--seeds", "1", "--episodes", "16",
            "--eval-episodes", "8", "--num-users", "8", "--no-planner", "--no-progress",
            "--methods", RELAY, "--method-options", "ScoreRelay:bins=3",
            "--env-kwarg", "shared_catalogue=True", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    saved = json.loads((out / "ScoreRelay" / "seed0" / "config.json").read_text())
    assert saved["agent_config"] == {"bins": 3, "epsilon": 0.1}


# ------------------------------------------------------------------ REQUIRES


def test_a_method_that_requires_a_shared_catalogue_is_refused_before_training(
    tmp_path, capsys
) -> None:
    cls, _ = resolve_multi_platform_agent(RELAY)
    assert cls.REQUIRES == {"shared_catalogue": True}
    check_requirements(cls, ChocKaleMultiPlatformBatchEnv(num_users=1, shared_catalogue=True))
    with pytest.raises(ValueError, match=r"shared_catalogue=True \(this env: False"):
        check_requirements(cls, ChocKaleMultiPlatformBatchEnv(num_users=1))
    out = tmp_path / "relay"
    config = MultiPlatformTrainConfig(method=RELAY, episodes=4, num_users=2, eval_episodes=0)
    with pytest.raises(ValueError, match="requires an env with shared_catalogue=True"):
        train_multi_platform(config, out_dir=out)
    assert not (out / "episodes.csv").exists()
    # the bench refuses before its first run (random comes first and is not trained)
    argv = ["bench", "fedslate", "--setting", "10x3", "--seeds", "1", "--episodes", "4",
            "--methods", "random", RELAY, "--no-progress", "--out", str(tmp_path / "b")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--env-kwarg shared_catalogue=True" in err and "\n" not in err
    assert not (tmp_path / "b" / "random").exists()


# ------------------------------------------------------------------ Flower progress


def test_flower_round_progress_is_shown_per_round_when_forced_and_quiet_otherwise(
    tmp_path, monkeypatch
) -> None:
    from fedrec.federation import flower_common

    monkeypatch.setattr(flower_common, "PROGRESS_POLL", 0.01)
    result = tmp_path / "result.json"
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert flower_common.progress_wanted(None) is False  # not a terminal: quiet
    assert flower_common.progress_wanted(True) is True

    def server(total: int) -> None:
        for done in range(total + 1):
            flower_common.report_round(result, done, total)

    with flower_common.watch_rounds(result, enabled=True):
        thread = threading.Thread(target=server, args=(5,))
        thread.start()
        thread.join()
    shown = stderr.getvalue()
    assert "Flower rounds" in shown and "5/5" in shown
    assert "round" in shown and "<" in shown  # tqdm's "[elapsed<remaining" ETA

    quiet_result = tmp_path / "quiet.json"
    stderr.truncate(0)
    with flower_common.watch_rounds(quiet_result, enabled=False):
        for done in range(3):
            flower_common.report_round(quiet_result, done, 2)
    assert stderr.getvalue() == ""


def test_flower_help_states_durations_and_the_progress_option(capsys) -> None:
    for command in ("simulate", "deploy"):
        with pytest.raises(SystemExit):
            main(["flower", command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "Duration:" in text and "per aggregation round" in text
        assert "--progress, --no-progress" in text and "default: shown when stderr is" in text


@pytest.mark.parametrize("engine", ["simulate", "deploy"])
def test_flower_commands_pass_progress_only_when_asked_or_on_a_terminal(
    engine, monkeypatch, capsys
) -> None:
    pytest.importorskip("flwr")
    from fedrec.train.fedncf import flower as flower_fedncf

    seen = []

    def fake(**job):
        seen.append(job["progress"])
        return {"hit_rate": 0.5, "ndcg": 0.25, "users": 2, "aggregation_rounds": 1,
                "train_seconds": 0.0}  # fmt: skip

    name = "run_simulation" if engine == "simulate" else "run_deployment"
    monkeypatch.setattr(flower_fedncf, name, fake)
    argv = ["flower", engine, "--global-rounds", "1"]
    assert main(argv) == 0  # stderr is not a terminal here: quiet
    assert main([*argv, "--progress"]) == 0
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert main(argv) == 0
    assert main([*argv, "--no-progress"]) == 0
    assert seen == [False, True, True, False]


def test_flower_simulate_reports_every_aggregation_round(tmp_path) -> None:
    """End to end on a tiny synthetic data set (one node; about a minute, most of it Ray)."""
    pytest.importorskip("flwr")
    import os
    import subprocess

    from fedrec.envs.datasets.synthetic import write_ml100k

    write_ml100k(tmp_path / "ml-100k", seed=0)
    command = [str(Path(sys.executable).with_name("fedrec")), "flower", "simulate",
               "--data-dir", str(tmp_path), "--nodes", "1", "--global-rounds", "2",
               "--clients-per-round", "20", "--progress"]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rounds = int(done.stdout.split(" aggregation rounds")[0].rsplit(maxsplit=1)[-1])
    shown = done.stderr.replace("\r", "\n")
    assert f"{rounds}/{rounds}" in shown and "Flower rounds" in shown
