"""SIGINT and SIGTERM stop `fedrec train` at a step boundary with a checkpoint: one line, no
traceback, exit 128 + signal, and `--resume` finishes the run exactly as an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ARGS = ["train", "random", "--env", "fedrec/ChocKale-v0", "--episodes", "1500", "--num-envs", "4"]
ARGS += ["--checkpoint-every", "50", "--eval-episodes", "10", "--no-progress", "--seed", "3"]


def _fedrec(*args: str, **kwargs: object) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "fedrec.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kwargs,
    )


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    _, err = process.communicate(timeout=240)
    return process.returncode, err


def _policies(run: Path) -> dict:
    return json.loads((run / "final_eval.json").read_text())["policies"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    code, err = _finish(_fedrec(*ARGS, "--out", str(out)))
    assert code == 0, err
    return out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_checkpoints_and_resume_finishes_exactly(
    signum: int, uninterrupted: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    process = _fedrec(*ARGS, "--out", str(out))
    deadline = time.monotonic() + 120
    while not (out / "checkpoint.pt").exists():  # training has started
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint after 120 s"
        time.sleep(0.05)
    process.send_signal(signum)
    code, err = _finish(process)
    assert code == 128 + signum, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("interrupted; checkpoint written")
    assert not (out / "final_eval.json").exists()  # it stopped before the end
    code, err = _finish(_fedrec(*ARGS, "--out", str(out), "--resume"))
    assert code == 0, err
    assert (out / "episodes.csv").read_bytes() == (uninterrupted / "episodes.csv").read_bytes()
    assert _policies(out) == _policies(uninterrupted)
