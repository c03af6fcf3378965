"""Signals and dead parents: SIGKILL of a FedSlate driver leaves no party process, and SIGTERM or
SIGKILL of ``fedrec flower deploy`` leaves no Flower process (the shared supervisor,
``federation/supervisor.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedrec.federation import supervisor

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/cwd").exists(), reason="reads the Linux process table"
)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in pids if supervisor.alive(pid)]
        if not left:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if supervisor.alive(pid)]


# ------------------------------------------------------------------ the supervisor itself
def test_alive_treats_a_zombie_as_dead_and_terminate_escalates() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while supervisor.alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)  # it exits, but nobody has reaped it: a zombie
    assert not supervisor.alive(child.pid)
    child.wait()
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN)"
         "; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    start = time.monotonic()
    assert supervisor.terminate([stubborn.pid], grace_s=0.5)  # ignores SIGTERM: gets SIGKILL
    assert time.monotonic() - start < 5 and not supervisor.alive(stubborn.pid)
    stubborn.wait(5)


def test_a_spawned_child_dies_with_its_parent() -> None:
    script = textwrap.dedent(
        """
        import subprocess, sys, time
        from fedrec.federation.supervisor import spawn
        child = spawn([sys.executable, "-c", "import time; time.sleep(60)"])
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert supervisor.alive(child)
    parent.kill()
    parent.wait()
    assert _wait_gone([child], 5.0) == []


# ------------------------------------------------------------------ FedSlate's parties
DRIVER = textwrap.dedent(
    """
    import json, os, sys, time
    from fedrec.agents.fedslate import FedSlateConfig
    from fedrec.agents.fedslate.remote import RemoteParties
    from fedrec.envs.choc_kale_model import ChocKaleParams

    parties = RemoteParties(
        platforms=["platform_a", "platform_b"],
        feedback={"platform_a": True, "platform_b": False},
        state_dims={"platform_a": 3, "platform_b": 3},
        params=ChocKaleParams(num_candidates=6, slate_size=2),
        config=FedSlateConfig(local_hidden=(8,), global_hidden=(8,)),
        seeds=[1, 2, 3],
    )
    # A forked helper (what a multiprocessing worker is) holds the launcher's stdin open, so the
    # launcher cannot rely on seeing the pipe close when this driver dies.
    helper = os.fork()
    if helper == 0:
        time.sleep(120)
        os._exit(0)
    pids = [parties.launcher_pid, *parties.pids.values()]
    print(json.dumps({"pids": pids, "helper": helper}), flush=True)
    time.sleep(120)
    """
)


def test_sigkill_of_the_driver_leaves_no_party_process() -> None:
    pytest.importorskip("grpc")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert driver.stdout is not None
    line = driver.stdout.readline()
    assert line, driver.stderr.read().decode() if driver.stderr else ""
    started = json.loads(line)
    pids, helper = started["pids"], started["helper"]
    try:
        assert len(pids) == 4 and all(supervisor.alive(pid) for pid in pids)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert _wait_gone(pids, 5.0) == [], "party processes outlived their driver"
    finally:
        supervisor.terminate([helper, *pids], grace_s=0.5)


# ------------------------------------------------------------------ a Flower deployment
def _processes_in(folder: Path) -> list[int]:
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")) == folder.resolve() and supervisor.alive(
                int(proc.name)
            ):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("flwr")
    from fedrec.envs.datasets.synthetic import write_ml100k

    root = tmp_path_factory.mktemp("signals-ml100k")
    write_ml100k(root / "ml-100k", seed=0)
    return str(root)


def _start_deploy(data_dir: str, logs: Path) -> subprocess.Popen:
    """``fedrec flower deploy`` in a process, once its SuperLink and SuperNode run."""
    command = [
        sys.executable, "-m", "fedrec.cli", "flower", "deploy", "--data-dir", data_dir,
        "--nodes", "1", "--global-rounds", "50", "--clients-per-round", "38",
        "--log-dir", str(logs), "--timeout", "600",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (logs / "flwr-run.log").is_file() or len(_processes_in(logs)) < 3:
        assert process.poll() is None, process.communicate()[1].decode()
        assert time.monotonic() < deadline, "the deployment did not start"
        time.sleep(0.2)
    time.sleep(1.0)  # let the SuperLink start its SuperExec (a grandchild)
    return process


def test_sigterm_of_flower_deploy_stops_every_process(data_dir: str, tmp_path: Path) -> None:
    logs = tmp_path / "term"
    process = _start_deploy(data_dir, logs)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert err.decode().strip() == "interrupted"  # one line, no traceback
    assert _processes_in(logs) == []


def test_sigkill_of_flower_deploy_leaves_no_flower_process(data_dir: str, tmp_path: Path) -> None:
    logs = tmp_path / "kill"
    process = _start_deploy(data_dir, logs)
    children = _processes_in(logs)
    process.send_signal(signal.SIGKILL)
    process.wait()
    left = _wait_gone(children, 30.0)
    assert left == [] and _processes_in(logs) == [], "Flower processes outlived fedrec"
