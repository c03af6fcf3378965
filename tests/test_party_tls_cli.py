"""TLS for FedSlate's party processes from the API and the command line: ``FedSlateAgent(tls=...)``
and ``fedrec train ... --parties processes --tls-cert FILE --tls-key FILE``.

The flags are checked before anything starts (one-line errors naming the flag and the path); a
run over TLS gives the same results as the same run without it, also when it is resumed with a
new certificate (the files are not part of the run's setup).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tls_helpers import self_signed

from fedrec.agents.fedslate import FedSlateAgent, FedSlateConfig, remote
from fedrec.cli import main
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv

pytest.importorskip(
    "grpc", reason="parties in processes need grpcio (pip install 'fedrec[flower]')"
)

ENV = "fedrec/ChocKaleMultiPlatform-v0"
RUN = ["train", "fedslate", "--env", ENV, "--env-kwarg", "num_candidates=10",
       "--env-kwarg", "slate_size=3", "--learning-starts", "20", "--local-hidden", "8",
       "--global-hidden", "8", "--batch-size", "8", "--num-envs", "1", "--eval-episodes", "2",
       "--no-references", "--no-progress", "--checkpoint-every", "1"]  # fmt: skip


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``fedrec train: error: ...`` of a refused command (status 2)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith("fedrec train: error: "), line
    return line


def test_tls_flags_are_checked_before_anything_starts(tmp_path: Path, capsys) -> None:
    tls = self_signed(tmp_path)
    out = tmp_path / "run"
    run = [*RUN, "--episodes", "1", "--out", str(out)]
    line = _fails([*run, "--parties", "processes", "--tls-cert", tls.cert_file], capsys)
    assert "--tls-cert needs --tls-key" in line
    line = _fails([*run, "--parties", "processes", "--tls-key", tls.key_file], capsys)
    assert "--tls-key needs --tls-cert" in line
    line = _fails([*run, "--tls-cert", tls.cert_file, "--tls-key", tls.key_file], capsys)
    assert "add --parties processes" in line
    missing = tmp_path / "missing.pem"
    line = _fails(
        [*run, "--parties", "processes", "--tls-cert", tls.cert_file, "--tls-key", str(missing)],
        capsys,
    )
    assert f"--tls-key: {missing} does not exist" in line
    line = _fails(
        [*run, "--parties", "processes", "--tls-cert", str(tmp_path), "--tls-key", tls.key_file],
        capsys,
    )
    assert f"--tls-cert: {tmp_path} is not a file" in line
    assert not out.exists()


def test_offline_training_refuses_party_processes(tmp_path: Path, capsys) -> None:
    """--parties processes with an offline agent is refused, not silently ignored."""
    run = ["train", "bc", "--dataset", str(tmp_path / "none"), "--out", str(tmp_path / "run")]
    line = _fails([*run, "--parties", "processes"], capsys)
    assert "offline training" in line and "drop --parties" in line
    assert not (tmp_path / "run").exists()


def test_agent_refuses_tls_without_party_processes(tmp_path: Path) -> None:
    env = ChocKaleMultiPlatformBatchEnv(2, num_candidates=10, slate_size=3)
    for parties in ({}, {"parties": "in-process"}):
        with pytest.raises(ValueError, match="tls is for the party processes"):
            FedSlateAgent.from_env(
                env, config=FedSlateConfig(), tls=self_signed(tmp_path), **parties
            )


def test_train_over_tls_equals_the_run_without_and_resumes_with_new_files(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    used = []  # the TLS files each RemoteParties was built with
    build = remote.RemoteParties.__init__

    def spy(self, *args, tls=None, **kwargs) -> None:
        used.append(tls)
        build(self, *args, tls=tls, **kwargs)

    monkeypatch.setattr(remote.RemoteParties, "__init__", spy)
    plain, secure = tmp_path / "plain", tmp_path / "tls"
    assert main([*RUN, "--episodes", "2", "--parties", "processes", "--out", str(plain)]) == 0
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    for folder, episodes, resume in ((first, "1", []), (second, "2", ["--resume"])):
        tls = self_signed(folder)  # a new certificate and key for the resumed run
        argv = [*RUN, "--episodes", episodes, "--parties", "processes", "--out", str(secure),
                "--tls-cert", tls.cert_file, "--tls-key", tls.key_file, *resume]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
    assert used[0] is None and [(t.cert_file, t.key_file) for t in used[1:]] == [
        (str((f / "cert.pem").resolve()), str((f / "key.pem").resolve())) for f in (first, second)
    ]
    assert (secure / "episodes.csv").read_text() == (plain / "episodes.csv").read_text()
    evals = [json.loads((run / "final_eval.json").read_text()) for run in (plain, secure)]
    for final_eval in evals:
        final_eval.pop("train_wall_time_s")
    assert evals[0] == evals[1]
    config = (secure / "config.json").read_text()
    assert "tls" not in config and "pem" not in config  # not part of the run's setup
