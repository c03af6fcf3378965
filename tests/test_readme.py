"""The README's "Plug in your own agent" example runs as printed and learns."""

from __future__ import annotations

import os
import re
import runpy
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


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
