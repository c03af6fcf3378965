"""``fedrec flower simulate`` is safe to run: Ray listens on 127.0.0.1 only, its session folder
lives in a per-run temp dir that is removed, SIGINT and SIGTERM stop the run with one line and
status 130 / 143 and leave no Ray process, a SIGKILL of ``fedrec`` leaves none either (nor the
run's temp dir), and a ``fedrec`` folder in the working directory does not shadow the package."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedrec.envs.datasets.synthetic import write_ml100k

pytest.importorskip("flwr")
pytestmark = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="needs Linux /proc (process and socket tables)"
)

FEDREC = Path(sys.executable).with_name("fedrec")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("flower-simulate")
    write_ml100k(root / "ml-100k", seed=0)
    return str(root)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short TMPDIR for the command (Ray's socket paths must stay under 108 bytes); every
    process it starts carries it in its environment, which is how the test finds them."""
    folder = Path(tempfile.mkdtemp(prefix="fs", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _command(data_dir: str, rounds: int) -> list[str]:
    return [
        str(FEDREC),
        "flower",
        "simulate",
        "--data-dir",
        data_dir,
        "--nodes",
        "1",
        "--global-rounds",
        str(rounds),
        "--clients-per-round",
        "10",
    ]


def _start(data_dir: str, rounds: int, tmp: Path, cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        _command(data_dir, rounds),
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test's own group stays out of the command's signals
    )


def _processes_with(tmp: Path) -> dict[int, str]:
    """{pid: command line} of the live processes whose environment holds TMPDIR=``tmp``."""
    marker = f"TMPDIR={tmp}".encode()
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie: exited, only waiting to be reaped
            found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def _listening(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket the processes ``pids`` hold."""
    listening = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                listening[fields[9]] = fields[1]
    found = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            inode = target.removeprefix("socket:[").removesuffix("]")
            if target.startswith("socket:[") and inode in listening:
                found.append((pid, listening[inode]))
    return found


#: 127.0.0.1 in /proc/net/tcp, and as ::1 or ::ffff:127.0.0.1 in /proc/net/tcp6.
LOOPBACK = ("0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F")


def _wait_for_workers(command: subprocess.Popen, tmp: Path, timeout: float = 240) -> list[int]:
    """The command's processes once Flower's client actors run on Ray."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert command.poll() is None, command.communicate()
        found = _processes_with(tmp)
        if any("ClientAppActor" in line for line in found.values()):
            return list(found)
        time.sleep(0.5)
    raise AssertionError("no Ray client actor started")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_stops_the_simulation_and_every_ray_process(
    data_dir: str, short_tmp: Path, sig: signal.Signals
) -> None:
    command = _start(data_dir, 100000, short_tmp, cwd=short_tmp)
    try:
        pids = _wait_for_workers(command, short_tmp)
        sockets = _listening(pids)
        # Ray's GCS, raylet and workers do listen, and only on loopback
        assert len(sockets) >= 3
        assert [s for s in sockets if s[1].split(":")[0] not in LOOPBACK] == []
        # Ray's session folder is in the run's own temp dir, not in the system one
        runs = list(short_tmp.glob("fedrec-flower-*"))
        assert len(runs) == 1 and list(runs[0].glob("r/session_*"))
        command.send_signal(sig)
        _, stderr = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait()
    assert command.returncode == 128 + sig
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "interrupted"
    time.sleep(0.5)
    assert _processes_with(short_tmp) == {}  # no Ray process left
    assert list(short_tmp.iterdir()) == []  # the run's temp dir and Ray's session are gone


def test_sigkill_of_fedrec_leaves_no_flower_or_ray_process(data_dir: str, short_tmp: Path) -> None:
    """fedrec cannot stop anything when it is SIGKILLed: the simulation's parent-death signal
    and the watchdog stop the simulation and every Ray process, and remove the run's temp dir."""
    command = _start(data_dir, 100000, short_tmp, cwd=short_tmp)
    try:
        _wait_for_workers(command, short_tmp)
        os.kill(command.pid, signal.SIGKILL)
        command.wait(timeout=10)
        deadline = time.monotonic() + 30
        while _processes_with(short_tmp) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _processes_with(short_tmp)
        assert left == {}, f"processes of the run left 30 s after SIGKILL: {left}"
        # the run's temp dir, with Ray's session folder, is gone
        assert list(short_tmp.glob("fedrec-flower-*")) == []
    finally:
        for pid in [command.pid, *_processes_with(short_tmp)]:  # the run's leftovers, if any
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        command.wait()
        for stream in (command.stdout, command.stderr):
            if stream is not None:
                stream.close()


def test_a_fedrec_folder_in_the_working_directory_does_not_shadow_the_package(
    data_dir: str, short_tmp: Path
) -> None:
    cwd = short_tmp / "work"
    (cwd / "fedrec" / "federation").mkdir(parents=True)  # like the folder holding a clone
    command = _start(data_dir, 1, short_tmp, cwd=cwd)
    try:
        stdout, stderr = command.communicate(timeout=300)
    finally:
        if command.poll() is None:
            os.killpg(command.pid, signal.SIGKILL)
            command.wait()
    assert command.returncode == 0, stderr
    assert "Flower simulation, 1 node(s): HR@10" in stdout
    assert _processes_with(short_tmp) == {}
    assert sorted(p.name for p in short_tmp.iterdir()) == ["work"]  # no temp dir left behind
