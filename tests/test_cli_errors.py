"""Every user error of the ``fedrec`` command line exits with status 2 and one line on stderr,
``fedrec COMMAND: error: ...``, without a traceback; ``fedrec --debug`` shows the traceback; a
genuine bug keeps its traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from fedrec.cli import main

SLATE_ENV = "fedrec/ChocKaleSlate-v0"
STATELESS_ENV = "fedrec_test/StatelessSlate-v0"
QUICK = ["--episodes", "8", "--num-envs", "2", "--eval-episodes", "0", "--no-progress"]


def _train(*options: str, agent: str = "random", env: str = SLATE_ENV) -> list[str]:
    return ["train", agent, "--env", env, *QUICK, *options]


def _one_line_error(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"fedrec {command}: error: "), lines[0]
    return lines[0]


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    return _one_line_error(capsys, argv[0])


class StatelessSlateEnv(gym.Env):
    """A slate env without ``state_dict()`` and without a native batched version (it trains
    through Gymnasium's SyncVectorEnv, but cannot be checkpointed)."""

    observation_space = spaces.Dict({"candidates": spaces.Box(0.0, 1.0, (4, 1), np.float32)})
    action_space = spaces.MultiDiscrete([4, 4])

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple:
        self.t += 1
        return self._obs(), 1.0, self.t >= 3, False, {}

    def _obs(self) -> dict[str, np.ndarray]:
        return {"candidates": self.np_random.random((4, 1), dtype=np.float32)}


@pytest.fixture
def stateless_env() -> Iterator[None]:
    """Registers the env for one test only (other tests list the registry)."""
    gym.register(STATELESS_ENV, entry_point=StatelessSlateEnv)
    yield
    del gym.registry[STATELESS_ENV]


# ------------------------------------------------------------------------------------------------
# fedrec train


def test_out_is_a_file_or_lies_under_one(tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    assert "is a file, not a directory" in _fails(_train("--out", str(afile)), capsys)
    line = _fails(_train("--out", str(afile / "run")), capsys)
    assert f"lies under {afile}" in line


def test_out_cannot_be_written(tmp_path: Path, capsys) -> None:
    if os.geteuid() == 0:  # root writes anywhere: use a path no one can create
        if not Path("/proc/self").exists():
            pytest.skip("needs /proc or a non-root user")
        out = Path("/proc/fedrec-no-such-dir/run")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        out = locked / "run"
    assert "cannot write the run directory" in _fails(_train("--out", str(out)), capsys)


def test_an_agent_module_that_cannot_be_imported(capsys) -> None:
    line = _fails(["train", "no.such.module:Cls", "--env", SLATE_ENV], capsys)
    assert "cannot import agent 'no.such.module:Cls'" in line and "No module named" in line


def test_a_bad_env_argument(tmp_path: Path, capsys) -> None:
    argv = _train("--out", str(tmp_path / "r"), "--env-kwarg", "sensitivity=abc")
    line = _fails(argv, capsys)
    assert "sensitivity" in line and SLATE_ENV in line
    assert _fails(_train("--env-kwarg", "no-equals-sign"), capsys).endswith("--help)")
    assert not (tmp_path / "r").exists()  # refused before the run directory is made


def test_a_gymnasium_env_without_slates_is_refused_clearly(tmp_path: Path, capsys) -> None:
    """CartPole-v1 now builds (SyncVectorEnv: its own vector env has no same-step autoreset),
    and the slate agent refuses its action space in one line."""
    line = _fails(_train("--out", str(tmp_path / "cp"), env="CartPole-v1"), capsys)
    assert "slate size" in line and "Discrete(2)" in line


@pytest.mark.usefixtures("stateless_env")
def test_an_env_that_cannot_save_its_state(tmp_path: Path, capsys) -> None:
    out = tmp_path / "stateless"
    line = _fails(_train("--out", str(out), env=STATELESS_ENV), capsys)
    assert "cannot be checkpointed" in line and "--checkpoint-every 0" in line
    assert not (out / "config.json").exists()  # refused at the start, not after training
    assert main(_train("--out", str(out), "--checkpoint-every", "0", env=STATELESS_ENV)) == 0
    capsys.readouterr()
    assert (out / "episodes.csv").is_file() and not (out / "checkpoint.pt").exists()
    line = _fails(_train("--out", str(out), "--resume", env=STATELESS_ENV), capsys)
    assert "cannot be resumed" in line


def test_a_run_file_that_is_a_directory(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(_train("--out", str(out))) == 0
    capsys.readouterr()
    (out / "checkpoint.pt").unlink()
    (out / "checkpoint.pt").mkdir()  # `runs/x/checkpoint.pt/` is a folder
    before = (out / "episodes.csv").read_text()
    for extra in ((), ("--resume",)):
        line = _fails(_train("--out", str(out), *extra), capsys)
        assert "checkpoint.pt is not a file" in line
    assert (out / "episodes.csv").read_text() == before  # nothing restarted


def test_a_malformed_config_on_resume(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    out.mkdir()
    for text in ("[1, 2]", "{not json"):
        (out / "config.json").write_text(text)
        assert "config.json is not" in _fails(_train("--out", str(out), "--resume"), capsys)
    (out / "config.json").write_bytes(b"\xff\xfe\x00")
    assert "not valid JSON" in _fails(_train("--out", str(out), "--resume"), capsys)


def test_usage_errors_are_one_line_too(capsys) -> None:
    line = _fails(["train", "random"], capsys)
    assert "--env" in line and "fedrec train random --help" in line
    assert "invalid choice" in _fails(["bench", "fedslate", "--setting", "nope"], capsys)
    assert main(["nonsense"]) == 2
    assert capsys.readouterr().err.startswith("fedrec: error: argument COMMAND: invalid choice")


# ------------------------------------------------------------------------------------------------
# fedrec eval, bench, demo


def _run_dir(root: Path, **files: str | bytes) -> Path:
    root.mkdir(parents=True)
    defaults = {
        "config.json": json.dumps({"agent": "random", "env_id": "fedrec/ChocKale-v0"}),
        "episodes.csv": "episode,step,return,length\n1,61,900.0,61\n",
    }
    for name, content in {**defaults, **files}.items():
        path = root / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"config.json": "{not json"}, "config.json: not valid JSON"),
        ({"config.json": "[1]"}, "config.json: expected a JSON object"),
        ({"config.json": b"\xff\xfe\x00"}, "not UTF-8 text"),
        ({"episodes.csv": "episode,step,return,length\n1,x,1.0,1\n"}, "episodes.csv"),
        ({"final_eval.json": "{oops"}, "final_eval.json: not valid JSON"),
        ({"final_eval.json": "[1]"}, "final_eval.json"),
    ],
    ids=["config-json", "config-list", "config-binary", "csv", "final-json", "final-list"],
)
def test_eval_of_malformed_run_files(tmp_path: Path, capsys, files: dict, expected: str) -> None:
    run = _run_dir(tmp_path / "run", **files)
    assert expected in _fails(["eval", "--no-plot", str(run)], capsys)


def test_eval_of_missing_or_empty_directories(tmp_path: Path, capsys) -> None:
    assert "does not exist" in _fails(["eval", str(tmp_path / "missing")], capsys)
    (tmp_path / "empty").mkdir()
    assert "not a training run" in _fails(["eval", str(tmp_path / "empty")], capsys)


def test_eval_outputs_under_a_file(tmp_path: Path, capsys) -> None:
    run = _run_dir(tmp_path / "run")
    afile = tmp_path / "afile"
    afile.write_text("")
    for option in ("--out", "--csv"):
        line = _fails(["eval", option, str(afile / "x"), str(run)], capsys)
        assert f"{afile} is a file, not a directory" in line


def test_bench_and_demo_errors(capsys) -> None:
    assert "nonsense" in _fails(["bench", "fedslate", "--methods", "nonsense"], capsys)
    assert ">= 1" in _fails(["demo", "--episodes", "-1"], capsys)
    assert "clients_per_round" in _fails(["bench", "fedncf", "--clients-per-round", "0"], capsys)
    with pytest.raises(SystemExit) as exit_info:  # a command that stops with SystemExit(message)
        main(["demo", "--episodes", "2", "--fedslate", "--fedslate-episodes", "0"])
    assert exit_info.value.code == 2
    assert "--fedslate-episodes must be >= 1" in _one_line_error(capsys, "demo")


# ------------------------------------------------------------------------------------------------
# bugs keep their traceback; --debug shows it for user errors


def test_a_genuine_bug_is_not_swallowed(monkeypatch) -> None:
    import fedrec.cli_demo

    def broken(args: object) -> int:
        raise TypeError("a bug in fedrec, not the user's fault")

    monkeypatch.setattr(fedrec.cli_demo, "run", broken)
    with pytest.raises(TypeError, match="a bug in fedrec"):
        main(["demo"])


def test_debug_shows_the_traceback() -> None:
    argv = ["train", "no.such.module:Cls", "--env", SLATE_ENV]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def fedrec(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "fedrec.cli", *args]
        return subprocess.run(command, capture_output=True, text=True, check=False, env=env)

    plain = fedrec(*argv)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("fedrec train: error: cannot import agent")
    debug = fedrec("--debug", *argv)
    assert debug.returncode == 1
    assert "Traceback (most recent call last)" in debug.stderr
    assert "ModuleNotFoundError: No module named 'no'" in debug.stderr
