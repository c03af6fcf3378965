"""The README's code runs as printed: the quick start, the "Plug in your own agent" example (which
learns), and the federated plug-in walk-through of docs/training.md."""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
TRAINING = README.parent / "docs" / "training.md"


def _block_after(heading: str) -> str:
    text = README.read_text()
    start = text.index(heading)
    match = re.search(r"```python\n(.*?)```", text[start:], flags=re.DOTALL)
    assert match is not None, f"no python block after {heading!r}"
    return match.group(1)


def test_plug_in_your_own_agent_example_runs_and_beats_random(tmp_path, capsys):
    script = tmp_path / "example.py"
    script.write_text(_block_after("### Plug in your own agent"))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        namespace = runpy.run_path(str(script))
    finally:
        os.chdir(cwd)
    policies = namespace["result"].final_eval["policies"]
    assert policies["agent"]["mean"] > policies["random"]["mean"] + 100
    assert policies["agent"]["mean"] > 0.97 * policies["planner"]["mean"]
    assert (tmp_path / "runs" / "binned-bandit" / "episodes.csv").is_file()
    assert "planner" in capsys.readouterr().out


def _blocks_after(heading: str, language: str, page: Path = README) -> list[str]:
    text = page.read_text()
    start = text.index(heading)
    level = heading.split(" ")[0]
    end = text.find(f"\n{level} ", start + len(heading))
    section = text[start : end if end != -1 else None]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def test_plug_in_your_own_federated_agent_section_runs_as_printed(tmp_path):
    """The section's agent is the file in examples/, and its commands train it, resume it and put
    it in the `fedrec bench fedslate` and `fedrec eval` tables beside the built-in methods."""
    heading = "## Plug in your own federated agent"
    (code,) = _blocks_after(heading, "python", TRAINING)
    example = README.parent / "examples" / "my_federated_agent.py"
    assert code == example.read_text(), "README block and examples/my_federated_agent.py differ"
    (commands,) = _blocks_after(heading, "bash", TRAINING)
    (tmp_path / "examples").mkdir()
    shutil.copy(example, tmp_path / "examples" / example.name)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "250",
    }
    done = subprocess.run(
        ["bash", "-ec", commands], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "score-relay"
    assert len((run / "episodes.csv").read_text().splitlines()) == 1 + 600  # extended on resume
    policies = json.loads((run / "final_eval.json").read_text())["policies"]
    # B never sees feedback, yet serves far better than random through the relayed scores.
    assert policies["agent"]["platform_b"]["mean"] > policies["random"]["platform_b"]["mean"] + 50
    bench = tmp_path / "runs" / "bench-relay"
    assert {p.name for p in bench.iterdir() if p.is_dir()} >= {"fedslate", "random", "ScoreRelay"}
    assert "ScoreRelay" in done.stdout and "fedslate" in done.stdout


def test_quick_start_block_runs(tmp_path):
    """The README's quick start (make, make_vec with 4,096 users, step, PettingZoo) runs as printed."""
    script = tmp_path / "quick_start.py"
    script.write_text(_block_after("### Quick start"))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_readme_is_a_front_door():
    """About 300 lines at most, with a table of contents, and the plug-in command on the first
    screen's contents (a newcomer finds `fedrec train file.py:Class` without scrolling far)."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    assert any(line.startswith("**Contents:**") for line in lines[:30])
    first = next(i for i, line in enumerate(lines) if ".py:" in line and "fedrec train" in line)
    assert first < 100
