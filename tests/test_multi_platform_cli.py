"""One command path for every agent: `fedrec train` on the multi-platform env, with built-in and
user methods, resume, the per-platform evaluation; `fedrec train --help`; clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedrec.cli import main

ROOT = Path(__file__).resolve().parents[1]
ENV = "fedrec/ChocKaleMultiPlatform-v0"
SMALL = ["--env-kwarg", "num_candidates=10", "--env-kwarg", "slate_size=3"]
TINY = ["--learning-starts", "200", "--local-hidden", "16", "--global-hidden", "16"]


def test_train_help_without_an_agent_exits_0_and_names_both_kinds(capsys) -> None:
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--env" in out and "fedslate" in out and "slateq" in out
    assert main(["train"]) == 2  # no agent at all is a usage error


def test_help_of_a_built_in_method_lists_its_options_without_the_presets() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fedrec.cli", "train", "fedq", "--env", ENV, "--help"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "--global-network" in result.stdout and "--learning-starts" in result.stdout
    assert "--method " not in result.stdout  # fixed by the name fedq


def test_fedslate_trains_resumes_and_evaluates_from_the_command_line(tmp_path, capsys) -> None:
    out = tmp_path / "fedslate"
    common = ["train", "fedslate", "--env", ENV, *SMALL, *TINY, "--num-envs", "4",
              "--eval-episodes", "8", "--no-references", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main([*common, "--episodes", "8", "--checkpoint-every", "4"]) == 0
    assert "platform_b" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["agent"] == "fedslate" and config["agent_config"]["method"] == "fedslate"
    assert main([*common, "--episodes", "12", "--resume"]) == 0
    assert len((out / "episodes.csv").read_text().splitlines()) == 13
    traffic = json.loads((out / "final_eval.json").read_text())["traffic_bytes_per_episode"]
    assert traffic["server"]["sent_bytes"] > 0  # the channel's accounting reaches the run files
    assert main(["eval", str(out), "--no-plot", "--csv", str(tmp_path / "table.csv")]) == 0
    assert "return/platform_b" in capsys.readouterr().out
    header = (tmp_path / "table.csv").read_text().splitlines()[0]
    assert "top-x" in header and "vs top-x" in header  # every table has the heuristic beside random


def test_a_user_method_from_its_own_file_is_found_like_a_built_in(tmp_path, capsys) -> None:
    agent = f"{ROOT / 'examples' / 'my_federated_agent.py'}:ScoreRelay"
    out = tmp_path / "relay"
    argv = ["train", agent, "--env", ENV, *SMALL, "--env-kwarg", "shared_catalogue=True",
            "--episodes", "8", "--num-envs", "4", "--eval-episodes", "4", "--no-references",
            "--no-progress", "--out", str(out), "--bins", "5"]  # fmt: skip
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["agent_config"] == {"bins": 5, "epsilon": 0.1}


def test_the_wrong_kind_of_agent_for_the_env_is_a_clear_error(capsys) -> None:
    assert main(["train", "myopic", "--env", ENV, "--episodes", "1"]) == 2
    assert "unknown multi-platform agent 'myopic'" in capsys.readouterr().err
    slate_agent = f"{ROOT / 'examples' / 'my_agent.py'}:" + _single_agent_class()
    assert main(["train", slate_agent, "--env", ENV, "--episodes", "1"]) == 2
    assert "single-platform SlateAgent" in capsys.readouterr().err
    relay = f"{ROOT / 'examples' / 'my_federated_agent.py'}:ScoreRelay"
    assert main(["train", relay, "--env", "fedrec/ChocKaleSlate-v0", "--episodes", "1"]) == 2
    assert "multi-platform agent" in capsys.readouterr().err


def _single_agent_class() -> str:
    text = (ROOT / "examples" / "my_agent.py").read_text()
    for line in text.splitlines():
        if line.startswith("class ") and "SlateAgent" in line:
            return line.split()[1].split("(")[0]
    pytest.fail("examples/my_agent.py has no SlateAgent class")


def test_fedrec_eval_imports_neither_the_training_code_nor_the_cli() -> None:
    code = (
        "import pkgutil, importlib, sys, fedrec.eval as e\n"
        "for m in pkgutil.iter_modules(e.__path__): importlib.import_module(f'fedrec.eval.{m.name}')\n"
        "bad = [m for m in sys.modules if m.startswith(('fedrec.train', 'fedrec.cli', 'fedrec.experiments'))]\n"
        "print(bad); sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_train_prints_hit_rates_with_four_decimals_and_returns_with_one() -> None:
    from fedrec.cli_train import _mean_ci

    assert (
        _mean_ci({"mean": 0.41234, "half_width": 0.0123, "returns": [0.0, 1.0]})
        == "0.4123 ± 0.0123"
    )
    assert (
        _mean_ci({"mean": 947.26, "half_width": 7.14, "returns": [900.0, 1000.0]}) == "947.3 ± 7.1"
    )
