"""What fedrec's Flower apps share: how a job reaches them, quiet settings, the server's helpers.

A fedrec Flower app (:mod:`fedrec.train.fedncf.flower`, :mod:`fedrec.train.fel.flower`)
is a module with a ``server_app`` and a ``client_app``. Both read the job they run (data set,
configuration, number of nodes, where the server writes its result) from one JSON value of the
run configuration, :data:`JOB_KEY`: Flower's run configuration holds only flat TOML scalars,
and a JSON string keeps a nested dataclass configuration exact. On the simulation engine the
apps are built with the job directly (``make_server_app(job)``); in a deployment ``flwr run``
imports the module-level apps and they read the job from ``context.run_config``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fedrec.federation.supervisor import Watchdog, spawn

#: The run-configuration key holding the job as a JSON string.
JOB_KEY = "fedrec-job"
#: Seconds between the server's polls for replies (Flower's default: 0.1).
PULL_INTERVAL = 0.01
#: Environment variables that keep Flower and Ray from reporting usage over the network.
QUIET_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # keep the current behaviour without Ray's FutureWarning about it (no GPUs are used)
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


def job_of(context: Any) -> dict[str, Any]:
    """The job in a Flower ``Context``'s run configuration (a clear error if there is none)."""
    raw = context.run_config.get(JOB_KEY)
    if not isinstance(raw, str):
        raise ValueError(
            f"the Flower run configuration has no {JOB_KEY!r} string: start fedrec's apps with "
            "`fedrec flower simulate` or `fedrec flower deploy`"
        )
    job = json.loads(raw)
    if not isinstance(job, dict):
        raise ValueError(f"{JOB_KEY!r} must hold a JSON object, got {type(job).__name__}")
    return job


#: The server's per-round progress file, beside its result: one line per finished aggregation
#: round, ``ROUND TOTAL``; the command that started the run reads it (:func:`watch_rounds`).
PROGRESS_SUFFIX = ".progress"
#: Seconds between two reads of the progress file.
PROGRESS_POLL = 0.2


def report_round(result_path: str | Path, done: int, total: int) -> None:
    """Record, from the server, that aggregation round ``done`` of ``total`` has finished (one
    appended line; read by :func:`watch_rounds` in the process that started the run). Without
    a result path (a job run in memory) nothing is written."""
    if not str(result_path):
        return
    with open(f"{result_path}{PROGRESS_SUFFIX}", "a", encoding="ascii") as file:
        file.write(f"{int(done)} {int(total)}\n")


def progress_wanted(flag: bool | None) -> bool:
    """Whether to show per-round progress: ``flag`` when given (``--progress`` /
    ``--no-progress``), else only when stderr is a terminal (a log file stays quiet)."""
    return bool(flag) if flag is not None else sys.stderr.isatty()


@contextlib.contextmanager
def watch_rounds(
    result_path: str | Path, *, enabled: bool, desc: str = "Flower rounds"
) -> Iterator[None]:
    """While inside, show the server's finished aggregation rounds (:func:`report_round`) as a
    tqdm bar with the elapsed time and the ETA on stderr, from a background thread; nothing at
    all when not ``enabled``. On a terminal it redraws at most every 0.1 s; elsewhere (forced on
    with ``--progress``) it writes every round it reads."""
    if not enabled:
        yield
        return
    from tqdm.auto import tqdm

    path = Path(f"{result_path}{PROGRESS_SUFFIX}")
    terminal = sys.stderr.isatty()
    stop = threading.Event()
    state: dict[str, Any] = {"bar": None, "done": 0, "offset": 0}

    def poll() -> None:
        try:
            with open(path, encoding="ascii") as file:
                file.seek(state["offset"])
                text = file.read()
        except OSError:  # not written yet
            return
        complete = text[: text.rfind("\n") + 1]  # a line being written is read next time
        state["offset"] += len(complete)
        for line in complete.splitlines():
            try:
                done, total = (int(word) for word in line.split())
            except ValueError:
                continue
            if state["bar"] is None:
                state["bar"] = tqdm(
                    total=total,
                    desc=desc,
                    unit="round",
                    dynamic_ncols=terminal,
                    mininterval=0.1 if terminal else 0.0,
                    smoothing=0.1,
                    file=sys.stderr,
                )
            if done > state["done"]:
                state["bar"].update(done - state["done"])
                state["done"] = done

    def loop() -> None:
        while not stop.wait(PROGRESS_POLL):
            poll()

    thread = threading.Thread(target=loop, name="fedrec-flower-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        poll()  # the last rounds
        if state["bar"] is not None:
            state["bar"].close()


#: The start of the one deprecation notice fedrec's simulation gets from Flower (its
#: ``DEPRECATED FEATURE`` log record's argument): :func:`flwr.simulation.run_simulation` is
#: deprecated in favour of ``flwr run`` with a simulation federation, which needs an installed app
#: project and a running SuperLink. fedrec calls ``run_simulation`` on purpose, in a child process
#: it can stop with every Ray process (:func:`simulate`); ``fedrec flower deploy`` is the
#: ``flwr run`` path. Flower still supports it (1.x), and the notice, several lines in the middle
#: of the run's output, tells the user of ``fedrec`` nothing they can act on.
RUN_SIMULATION_NOTICE = "The `run_simulation` function is deprecated"


class _DropRunSimulationNotice:
    """A ``logging`` filter that drops Flower's ``run_simulation`` deprecation notice (exactly
    that record; every other Flower message, deprecation notices included, passes)."""

    def filter(self, record: Any) -> bool:
        return not any(
            isinstance(arg, str) and arg.startswith(RUN_SIMULATION_NOTICE)
            for arg in (record.args if isinstance(record.args, tuple) else ())
        )


def hide_run_simulation_notice() -> None:
    """Keep Flower's deprecation notice of ``run_simulation`` (:data:`RUN_SIMULATION_NOTICE`)
    out of a simulation's output; idempotent."""
    import logging

    logger = logging.getLogger("flwr")
    if not any(isinstance(f, _DropRunSimulationNotice) for f in logger.filters):
        logger.addFilter(_DropRunSimulationNotice())


def quiet() -> None:
    """Turn off Flower's and Ray's usage reporting in this process (and its children)."""
    os.environ.update(QUIET_ENV)


def tune_grid(grid: Any) -> None:
    """Poll for replies every :data:`PULL_INTERVAL` s: the simulation engine's in-memory grid
    polls every 0.1 s, tuned for rounds that take seconds; a FedNCF round takes milliseconds."""
    if hasattr(grid, "pull_interval"):
        grid.pull_interval = PULL_INTERVAL


def partition_nodes(grid: Any, num_nodes: int, timeout: float = 120.0) -> dict[int, int]:
    """{partition id: node id}, asking every node for its partition id once all have joined."""
    from flwr.app import Message, RecordDict

    deadline = time.monotonic() + timeout
    while len(grid.get_node_ids()) < num_nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(grid.get_node_ids())} of {num_nodes} nodes joined")
        time.sleep(0.05)
    ids = sorted(grid.get_node_ids())
    if num_nodes == 1 and len(ids) == 1:  # nothing to map (a deployment saves a message round)
        return {0: ids[0]}
    probes = [Message(RecordDict(), dst_node_id=node, message_type="query") for node in ids]
    mapping = {}
    for reply in replies(grid, probes):
        mapping[int(reply.content["metrics"]["partition-id"])] = reply.metadata.src_node_id
    if sorted(mapping) != list(range(num_nodes)):
        raise RuntimeError(
            f"nodes reported partition ids {sorted(mapping)}, not 0..{num_nodes - 1}"
        )
    return mapping


def replies(grid: Any, messages: Sequence[Any]) -> list[Any]:
    """Send ``messages`` and wait for every reply; a node's error is raised here."""
    answers = list(grid.send_and_receive(messages))
    failed = [reply for reply in answers if reply.has_error()]
    if failed:
        raise RuntimeError(f"a node failed: {failed[0].error.reason}")
    if len(answers) != len(messages):
        raise RuntimeError(f"{len(messages) - len(answers)} node(s) did not answer")
    return answers


def add_partition_query(app: Any) -> None:
    """Register the ``query`` handler that tells the server a node's partition id."""
    from flwr.app import Message, MetricRecord, RecordDict

    @app.query()
    def query(msg: Message, context: Any) -> Message:
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=msg)


class Interrupted(KeyboardInterrupt):
    """A simulation stopped by SIGINT or SIGTERM (``signum``); the Ray processes are gone."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: Seconds to wait for a killed simulation's processes to be gone.
STOP_GRACE = 10.0


def ray_init_args(temp_dir: str) -> dict[str, Any]:
    """``ray.init`` arguments of a simulation: no dashboard, every service on 127.0.0.1, and the
    session folder under ``temp_dir`` (removed after the run) instead of the system temp dir.

    Ray's services (GCS, raylet, workers) have no authentication. ``_node_ip_address`` alone does
    not pin them: Ray on Linux replaces 127.0.0.1 by the machine's routable address unless
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (:data:`LOOPBACK_ENV`), and its gRPC servers bind to
    127.0.0.1 only when the node's address is 127.0.0.1 (else to every interface)."""
    return {
        "include_dashboard": False,
        "_node_ip_address": "127.0.0.1",
        "_temp_dir": temp_dir,
    }


#: Environment of a simulation's process: quiet (:data:`QUIET_ENV`) and Ray on loopback.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: The environment variable that marks every process of one simulation (a random token): the
#: watchdog finds Ray's processes by it if ``fedrec`` dies without stopping them.
SIMULATION_MARK = "FEDREC_FLOWER_SIMULATION"


def simulate(
    app: str,
    job: str,
    *,
    num_nodes: int,
    verbose: bool = False,
    remove_if_killed: Sequence[str | Path] = (),
) -> None:
    """Run the apps of module ``app`` (its ``simulation_apps(job)``) for the JSON ``job`` on
    Flower's simulation engine (Ray) with ``num_nodes`` SuperNodes, one CPU each.

    Why a child process: Ray's processes must all stop on Ctrl-C or SIGTERM, which Flower's
    engine does not do (it hangs or prints a traceback). The child runs in its own session (so
    its process group holds every Ray process it starts) and in a fresh temp dir (also its
    working directory: a ``fedrec`` folder in the caller's one cannot shadow the package in
    Ray's workers); on SIGINT/SIGTERM this process kills that group and raises
    :class:`Interrupted`; the temp dir, with Ray's session folder, is removed in every case.

    If this process dies without stopping them (SIGKILL), nothing is left either
    (:mod:`fedrec.federation.supervisor`): the child is started with a parent-death signal
    (SIGKILL), and a :class:`~fedrec.federation.supervisor.Watchdog` process, which notices the
    death when its pipe from here closes, SIGKILLs the child's process group and every process
    carrying the run's :data:`SIMULATION_MARK` in its environment (Ray's GCS, raylet and workers
    inherit it), then removes the temp dir and the folders in ``remove_if_killed`` (the caller's
    own temp dirs, which its ``finally`` cannot remove then)."""
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    folder = Path(tempfile.mkdtemp(prefix="fedrec-flower-"))
    try:
        (folder / "job.json").write_text(job)
        command = [sys.executable, "-m", "fedrec.federation.flower_common", app, str(num_nodes)]
        env = {**os.environ, **QUIET_ENV, **LOOPBACK_ENV}
        if verbose:
            env["FEDREC_FLOWER_VERBOSE"] = "1"
        env[SIMULATION_MARK] = secrets.token_hex(8)
        with _signals_raise():
            # SIGKILL at once, the group too: Ray's processes keep nothing worth saving
            watchdog = Watchdog(SIMULATION_MARK, env[SIMULATION_MARK], grace_s=0.0)
            try:
                for path in [folder, *remove_if_killed]:
                    watchdog.remove(path)
                child = spawn(
                    command,
                    death_signal=signal.SIGKILL,
                    cwd=folder,
                    env=env,
                    start_new_session=True,  # its process group holds every Ray process
                )
                watchdog.watch(child.pid)
                watchdog.watch_group(child.pid)
                try:
                    code = child.wait()
                finally:
                    _stop_group(child)
            finally:
                with _signals_ignored():
                    watchdog.close()
        if code != 0:
            error = folder / "error.txt"
            reason = error.read_text().strip() if error.is_file() else f"exit status {code}"
            raise RuntimeError(f"the Flower simulation failed: {reason}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` here (main thread only; elsewhere Python
    does not deliver signals to the thread, and nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _stop_group(child: subprocess.Popen) -> None:
    """Kill what is left of the child's process group (after a run: Ray stragglers; after a
    signal: the simulation and every Ray process) and wait up to :data:`STOP_GRACE` seconds for
    it to go. SIGKILL, not SIGTERM: Ray's driver answers SIGTERM with a traceback, and the
    group's processes keep no state worth saving (the temp dir is removed next)."""
    with _signals_ignored():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_GRACE
        while _group_alive(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        child.wait()


def _group_alive(child: subprocess.Popen) -> bool:
    child.poll()  # reap the leader, else it stays a zombie member of the group
    try:
        os.killpg(child.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - a member that changed its user
        return True
    return True


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _run_child(app: str, num_nodes: int) -> int:
    """The simulation process (``python -m fedrec.federation.flower_common APP NODES``, in the
    run's temp dir holding ``job.json``): runs the apps on Ray pinned to loopback; on failure
    writes the reason to ``error.txt`` and returns 1."""
    import importlib

    folder = Path.cwd()
    try:
        module = importlib.import_module(app)
        server_app, client_app = module.simulation_apps(
            json.loads((folder / "job.json").read_text())
        )
        from flwr.simulation import run_simulation as flower_run_simulation

        hide_run_simulation_notice()
        flower_run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=num_nodes,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0},
                "init_args": ray_init_args(str(folder / "r")),
            },
            verbose_logging=os.environ.get("FEDREC_FLOWER_VERBOSE") == "1",
        )
    except Exception as error:  # the reason goes to the parent as one line
        import traceback

        traceback.print_exc()
        root = error
        while root.__cause__ is not None or (
            root.__context__ is not None and not root.__suppress_context__
        ):
            root = root.__cause__ or root.__context__  # type: ignore[assignment]
        (folder / "error.txt").write_text(" ".join(f"{type(root).__name__}: {root}".split()))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_run_child(sys.argv[1], int(sys.argv[2])))
