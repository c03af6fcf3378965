"""A real Flower deployment on loopback: SuperLink and SuperNodes as separate processes.

:func:`deploy` starts ``flower-superlink`` and N ``flower-supernode`` processes on 127.0.0.1 (free
ports), writes a Flower app folder whose components are a fedrec app module's ``server_app`` and
``client_app`` and whose run configuration carries the job, runs it with ``flwr run ... --stream``
and stops every process of the deployment, also when anything fails (SIGTERM, then SIGKILL after
a grace period): those it started and every process carrying the deployment's random token in its
environment, which Flower's own children inherit. Flower itself is unmodified: what runs
is what ``flwr run`` runs on a cluster, with the addresses on one machine.

The processes are supervised by :mod:`fedrec.federation.supervisor`: SIGINT, SIGTERM and SIGHUP
stop every one of them and raise :class:`~fedrec.federation.flower_common.Interrupted` (one line
from the command line, no traceback); each started process gets a parent-death signal, and a
watchdog process stops them all, Flower's own children included, if fedrec dies without
stopping them (SIGKILL). A process of the deployment that dies ends the run with
:class:`DeploymentError` (one line from the command line).

Flower 1.42 runs every message a SuperNode receives in a fresh ClientApp process (its default
``subprocess`` isolation; ``flwr-clientapp`` also handles one message and exits), an idle
SuperNode asks the SuperLink for work every 3 s, and replies are pushed in 0.5 s steps; a message
round therefore costs seconds whatever it holds (docs/flower.md measures it). A deployment is for
jobs with few, large rounds; the simulation engine and the in-process trainer for many small ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fedrec.federation.flower_common import (
    JOB_KEY,
    PROGRESS_SUFFIX,
    QUIET_ENV,
    Interrupted,
    watch_rounds,
)
from fedrec.federation.supervisor import (
    Stopped,
    Watchdog,
    marked,
    signals_ignored,
    spawn,
    stop_on_signals,
    terminate,
)

#: Seconds to wait for a started process to listen before giving up.
START_TIMEOUT = 60.0
#: Seconds a stopped process gets to exit after SIGTERM before SIGKILL.
STOP_GRACE = 10.0
#: The environment variable that marks every process of one deployment (a random token).
MARK = "FEDREC_FLOWER_DEPLOYMENT"

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fedrec-flower-job"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "fedrec"

[tool.flwr.app.components]
serverapp = "{app}:server_app"
clientapp = "{app}:client_app"

[tool.flwr.app.config]
{key} = {job}
"""

CONFIG_TOML = """\
[superlink]
default = "deploy"

[superlink.deploy]
address = "127.0.0.1:{port}"
insecure = true
"""


class DeploymentError(ChildProcessError, RuntimeError):
    """A process of the deployment exited early, or the run ended without a result (an
    ``OSError``, so ``fedrec flower deploy`` reports it in one line)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _executable(name: str) -> str:
    """A Flower command next to this interpreter (the environment fedrec is installed in)."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        found = shutil.which(name)
        if found is None:
            raise FileNotFoundError(
                f"{name} is not installed next to {sys.executable}: pip install 'fedrec[flower]'"
            )
        return found
    return str(path)


class _Processes:
    """The processes of one deployment; :meth:`stop` ends every one of them (and its children)."""

    def __init__(self, workdir: Path, env: dict[str, str], watchdog: Watchdog | None) -> None:
        self.workdir, self.env, self.watchdog = workdir, env, watchdog
        self.started: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, command: list[str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "wb") as log:
            process = spawn(
                command,
                cwd=self.workdir,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C reaches fedrec, which stops them in order
            )
        self.started.append((name, process))
        if self.watchdog is not None:
            self.watchdog.watch(process.pid)
        return process

    def check_alive(self, *, expected_to_end: subprocess.Popen | None = None) -> None:
        """Raise, with its log's end, if a started process (other than ``expected_to_end``)
        has exited."""
        for name, process in self.started:
            if process is not expected_to_end and process.poll() is not None:
                raise DeploymentError(
                    f"{name} exited with code {process.returncode}; its log ends: "
                    f"{self.tail(name, 5)}"
                )

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM every process of this deployment, then SIGKILL what is left after the grace
        period. A process belongs to it when it was started here or carries the deployment's
        :data:`MARK` in its environment (Flower's SuperLink starts ``flower-superexec`` in a
        process group of its own, which starts the apps; a child started while its parent is
        being stopped is reparented and no longer a descendant, but it keeps the mark)."""
        terminate(
            [process.pid for _, process in self.started],
            grace_s=STOP_GRACE,
            also=lambda: marked(MARK, self.env[MARK]),
        )
        for _, process in self.started:  # reaped already; this sets their return codes
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1.0)


def _wait_listening(processes: _Processes, name: str, port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not _listening(port):
        processes.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{name} did not listen on 127.0.0.1:{port} within {START_TIMEOUT} s"
            )
        time.sleep(0.1)


@contextlib.contextmanager
def _workdir(log_dir: str | Path | None) -> Iterator[Path]:
    if log_dir is not None:
        path = Path(log_dir)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="fedrec-flower-") as tmp:
        yield Path(tmp)


def deploy(
    *,
    app: str,
    job: Callable[[str], str],
    num_nodes: int,
    timeout: float = 3600.0,
    log_dir: str | Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run a fedrec Flower app on a loopback deployment and return its result.

    :param app: the module holding ``server_app`` and ``client_app``.
    :param job: given the path where the server must write its JSON result, the job as JSON
        (the apps read it from the run configuration key ``fedrec-job``).
    :param num_nodes: SuperNodes to start (partition ids 0..N-1).
    :param timeout: seconds the run may take before it is stopped (a ``TimeoutError``).
    :param log_dir: keep the processes' logs and the app folder there (default: a temporary
        folder, removed at the end).
    :param progress: show the rounds the server reports (``report_round`` with the result path
        it is given) as a bar with the ETA on stderr.
    """
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    superlink, flwr = _executable("flower-superlink"), _executable("flwr")
    supernode = _executable("flower-supernode")
    with _workdir(log_dir) as workdir:
        result_path = workdir / "result.json"
        result_path.unlink(missing_ok=True)
        Path(f"{result_path}{PROGRESS_SUFFIX}").unlink(missing_ok=True)  # a kept --log-dir's
        app_dir, home = workdir / "app", workdir / "flwr-home"
        app_dir.mkdir(exist_ok=True)
        home.mkdir(exist_ok=True)
        port = free_port()
        (app_dir / "pyproject.toml").write_text(
            PYPROJECT.format(app=app, key=JOB_KEY, job=json.dumps(job(str(result_path))))
        )
        (home / "config.toml").write_text(CONFIG_TOML.format(port=port))
        env = dict(os.environ) | QUIET_ENV | {"FLWR_HOME": str(home), MARK: secrets.token_hex(8)}
        # Flower starts its helper commands (flower-superexec, flwr-clientapp) from PATH.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        try:
            with stop_on_signals():  # SIGINT / SIGTERM / SIGHUP raise Stopped in here
                watchdog = Watchdog(MARK, env[MARK], grace_s=STOP_GRACE)
                processes = _Processes(workdir, env, watchdog)
                try:
                    processes.start(
                        "superlink",
                        [superlink, "--insecure", "--host", "127.0.0.1", "--port", str(port),
                         "--disable-runtime-dependency-installation"],
                    )  # fmt: skip
                    _wait_listening(processes, "flower-superlink", port)
                    for pid in range(num_nodes):
                        node_port = free_port()
                        processes.start(
                            f"supernode{pid}",
                            [supernode, "--insecure", "--superlink", f"127.0.0.1:{port}",
                             "--node-config", f"partition-id={pid} num-partitions={num_nodes}",
                             "--host", "127.0.0.1", "--port", str(node_port)],
                        )  # fmt: skip
                    run = processes.start(
                        "flwr-run", [flwr, "run", str(app_dir), "deploy", "--stream"]
                    )
                    deadline = time.monotonic() + timeout
                    with watch_rounds(result_path, enabled=progress):
                        while run.poll() is None:
                            if time.monotonic() > deadline:
                                raise TimeoutError(f"the Flower run took longer than {timeout} s")
                            processes.check_alive(expected_to_end=run)
                            time.sleep(0.2)
                    if not result_path.is_file():
                        raise DeploymentError(
                            "the Flower run ended without a result; its log ends:\n"
                            f"{processes.tail('flwr-run')}"
                        )
                    return json.loads(result_path.read_text())
                finally:
                    with signals_ignored():  # a second signal must not cut the stop short
                        processes.stop()
                        watchdog.close()
        except Stopped as stop:  # every process was stopped above
            raise Interrupted(stop.signum) from None
