"""What fedrec's Flower apps share: how a job reaches them, quiet settings, the server's helpers.

A fedrec Flower app (:mod:`fedrec.federation.flower_fedncf`, :mod:`fedrec.federation.flower_fel`)
is a module with a ``server_app`` and a ``client_app``. Both read the job they run (data set,
configuration, number of nodes, where the server writes its result) from one JSON value of the
run configuration, :data:`JOB_KEY`: Flower's run configuration holds only flat TOML scalars,
and a JSON string keeps a nested dataclass configuration exact. On the simulation engine the
apps are built with the job directly (``make_server_app(job)``); in a deployment ``flwr run``
imports the module-level apps and they read the job from ``context.run_config``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

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


def simulate(server_app: Any, client_app: Any, *, num_nodes: int, verbose: bool = False) -> None:
    """Run the two apps on Flower's simulation engine (Ray) with ``num_nodes`` SuperNodes, one
    CPU each."""
    quiet()
    from flwr.simulation import run_simulation as flower_run_simulation

    flower_run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=num_nodes,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0}},
        verbose_logging=verbose,
    )
