"""FedNCF on Flower: the server and the clients as a Flower ``ServerApp`` and ``ClientApp``.

Everything federated in fedrec otherwise runs in one Python process. Here the same FedNCF
training runs on Flower's Message API, so the parties can live in separate processes (today on
Flower's simulation engine, :func:`run_simulation`; the same apps are what ``flwr run`` deploys):

- **Nodes.** Each Flower node (SuperNode) hosts a shard of the users: user ``u`` lives on the node
  with partition id ``u % num_nodes``. A node keeps its users' private embeddings in its
  ``Context.state``; they never leave it. It trains the round's users of its shard together with
  fedrec's batched engine (:func:`fedrec.train.fedncf.train_round_batched`), so per-client Python
  overhead does not come back, and replies with their uploads: each client's network weights,
  sample count and touched item rows (:class:`fedrec.federation.aggregators.ClientUpdates`).
- **Server.** The ``ServerApp`` runs FedNCF's loop: the same seeded client selection as the
  in-process trainer (a permutation of all users per global round, split into aggregation
  rounds), one ``train`` message per node with users in the round (the global item table, the
  network and that node's users), and fedrec's own aggregators on the concatenated uploads
  (SimpleAvg, FedAvg, MF-FedAvg). Evaluation is federated too: every node scores HR@K / NDCG@K of
  its own users with the global model and its private rows and returns only the sums.
- **Parity.** With one node the run is the in-process run (the same samples, the same batched
  arithmetic). With several, each node draws its own users' negatives from its own stream
  (``[seed, 3, round, node]``), so numbers agree within noise, not bit for bit.

What the messages carry is what FedNCF's clients send anyway: no user embedding, no rating.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.federation.aggregators import ClientUpdates, make_aggregator
from fedrec.train.fedncf import FedNCFConfig

#: The aggregators a Flower run supports (MF-SecAvg simulates its masking in one process; Flower's
#: own SecAgg+ workflow is the secure option there).
FLOWER_AGGREGATORS = ("simpleavg", "fedavg", "mf-fedavg")
#: Seconds between the server's polls for replies (Flower's default: 0.1).
PULL_INTERVAL = 0.01
#: Environment variables that keep Flower and Ray from reporting usage over the network.
QUIET_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    # keep the current behaviour without Ray's FutureWarning about it (no GPUs are used)
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


def node_of(users: np.ndarray, num_nodes: int) -> np.ndarray:
    """The partition id of the node hosting each user."""
    return np.asarray(users, dtype=np.int64) % num_nodes


def _initial_model(config: FedNCFConfig, num_users: int, num_items: int):
    """The seeded initial NCF, exactly as the in-process trainer builds it."""
    from fedrec.agents.ncf import NCF

    generator = torch.Generator().manual_seed(config.seed)
    return NCF(config.model, num_users=num_users, num_items=num_items, generator=generator)


# ------------------------------------------------------------------------------------------------
# The node (ClientApp)


class _Shard:
    """The data a node trains from (the users' private rows live in ``Context.state``)."""

    def __init__(self, dataset: str, data_dir: str | None) -> None:
        from fedrec.envs.datasets.catalog import load_prepared
        from fedrec.train.fedncf import ClientData

        self.data = load_prepared(dataset, data_dir)
        self.clients = ClientData.of(self.data)


@functools.cache
def _shard(dataset: str, data_dir: str | None) -> _Shard:
    """The node process's loaded data, loaded once per process."""
    return _Shard(dataset, data_dir)


def make_client_app(*, dataset: str, data_dir: str | None, config: FedNCFConfig, num_nodes: int):
    """The FedNCF ``ClientApp``: ``train`` trains the node's users of a round, ``evaluate``
    scores the node's users (HR@K, NDCG@K sums)."""
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def rows_of(context: Any, shard: _Shard) -> tuple[np.ndarray, np.ndarray]:
        """(the node's users, their private rows), initialised from the seeded model."""
        pid = int(context.node_config["partition-id"])
        if "users" not in context.state:
            num_users, num_items = shard.data.num_users, shard.data.num_items
            own = np.flatnonzero(node_of(np.arange(num_users), num_nodes) == pid)
            table = _initial_model(config, num_users, num_items).user_table()
            context.state["users"] = ArrayRecord([own, table[torch.from_numpy(own)].numpy()])
        own, rows = context.state["users"].to_numpy_ndarrays()
        return own, rows

    @app.train()
    def train(msg: Message, context: Any) -> Message:
        from fedrec.train.fedncf import sample_round, train_round_batched

        shard, c = _shard(dataset, data_dir), config
        items, network, users = msg.content["arrays"].to_numpy_ndarrays()
        r = int(msg.content["config"]["round"])
        own, rows = rows_of(context, shard)
        pid = int(context.node_config["partition-id"])
        position = np.searchsorted(own, users)
        if np.any(position >= len(own)) or np.any(own[np.minimum(position, len(own) - 1)] != users):
            raise ValueError(f"node {pid} was sent users it does not host")
        # One node: the in-process stream; several: a stream of the node's own.
        stream = [c.seed, 3, r] if num_nodes == 1 else [c.seed, 3, r, pid]
        samples = sample_round(
            shard.clients,
            users,
            np.random.default_rng(stream),
            num_negatives=c.num_negatives,
            local_epochs=c.local_epochs,
        )
        updates, new_rows = train_round_batched(
            c.model,
            round_samples=samples,
            user_rows=torch.from_numpy(rows[position]),
            items=torch.from_numpy(items),
            network=torch.from_numpy(network),
            lr=c.lr,
            batch_size=c.batch_size,
        )
        rows = rows.copy()
        rows[position] = new_rows.numpy()
        context.state["users"] = ArrayRecord([own, rows])
        arrays = ArrayRecord(
            [
                np.asarray(updates.clients, np.int64),
                np.asarray(updates.num_samples, np.int64),
                updates.network.numpy(),
                updates.row_client.numpy(),
                updates.row_item.numpy(),
                updates.item_rows.numpy(),
            ]
        )
        metrics = MetricRecord({"clients": len(users), "examples": len(samples.items)})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Any) -> Message:
        shard = _shard(dataset, data_dir)
        items, network = msg.content["arrays"].to_numpy_ndarrays()
        own, rows = rows_of(context, shard)
        hits, ndcg = _score_users(
            shard, config, dataset=dataset, data_dir=data_dir, own=own, rows=rows,
            items=items, network=network,
        )  # fmt: skip
        metrics = MetricRecord({"hits": hits, "ndcg": ndcg, "users": len(own)})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    @app.query()
    def query(msg: Message, context: Any) -> Message:
        """The node's partition id (the server maps users to nodes with it)."""
        pid = int(context.node_config["partition-id"])
        return Message(RecordDict({"metrics": MetricRecord({"partition-id": pid})}), reply_to=msg)

    return app


def _score_users(
    shard: _Shard,
    c: FedNCFConfig,
    *,
    dataset: str,
    data_dir: str | None,
    own: np.ndarray,
    rows: np.ndarray,
    items: np.ndarray,
    network: np.ndarray,
) -> tuple[float, float]:
    """(hits, NDCG sum) of the node's users in the evaluation mode; the other users' rows are
    zeros here and their results are dropped."""
    import gymnasium as gym

    import fedrec  # noqa: F401  (registers the env ids)
    from fedrec.agents.fedncf_agent import NCFRankingAgent
    from fedrec.train.fedncf import env_id_of

    num_users, num_items = shard.data.num_users, shard.data.num_items
    model = _initial_model(c, num_users, num_items)
    table = torch.zeros_like(model.user_table())
    table[torch.from_numpy(own)] = torch.from_numpy(rows)
    model.load_federated(
        user_table=table, item_table=torch.from_numpy(items), network=torch.from_numpy(network)
    )
    agent = NCFRankingAgent(model, slate_size=c.top_k)
    envs = gym.make_vec(
        env_id_of(dataset), num_envs=num_users, mode="evaluation", data_dir=data_dir, top_k=c.top_k
    )
    obs, _ = envs.reset(seed=0)
    _, rewards, _, _, info = envs.step(agent.act_batch(obs))
    envs.close()
    mine = np.isin(obs["user_id"][:, 0], own)
    return float(rewards[mine].sum()), float(info["ndcg"][mine].sum())


# ------------------------------------------------------------------------------------------------
# The server (ServerApp)


def make_server_app(
    *, dataset: str, data_dir: str | None, config: FedNCFConfig, num_nodes: int, result_path: str
):
    """The FedNCF ``ServerApp``: FedNCF's loop over Flower messages; writes the final HR@K and
    NDCG@K (federated evaluation) and timings as JSON to ``result_path``."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        from fedrec.envs.datasets.catalog import load_prepared

        data = load_prepared(dataset, data_dir)
        num_users, num_items = data.num_users, data.num_items
        model = _initial_model(config, num_users, num_items)
        items, network = model.item_table(), model.network_vector()
        aggregator = make_aggregator(config.aggregator)
        selection = np.random.default_rng([config.seed, 1])
        per_global = config.rounds_per_global(num_users)
        total = config.total_aggregation_rounds(num_users)
        # The simulation engine's in-memory grid polls for replies every 0.1 s, tuned for rounds
        # that take seconds; a FedNCF aggregation round takes milliseconds.
        if hasattr(grid, "pull_interval"):
            grid.pull_interval = PULL_INTERVAL
        nodes = _partition_nodes(grid, num_nodes)
        start = time.perf_counter()
        groups: list[np.ndarray] = []
        for r in range(total):
            if r % per_global == 0:
                groups = np.array_split(selection.permutation(num_users), per_global)
            users = np.sort(groups[r % per_global])
            owner = node_of(users, num_nodes)
            messages = [
                Message(
                    RecordDict(
                        {
                            "arrays": ArrayRecord(
                                [items.numpy(), network.numpy(), users[owner == pid]]
                            ),
                            "config": ConfigRecord({"round": r}),
                        }
                    ),
                    dst_node_id=nodes[pid],
                    message_type="train",
                )
                for pid in np.unique(owner).tolist()
            ]
            replies = _replies(grid, messages)
            updates = _combine(
                [reply.content["arrays"].to_numpy_ndarrays() for reply in replies], num_items
            )
            items, network = aggregator.aggregate(items=items, network=network, updates=updates)
        train_seconds = time.perf_counter() - start
        messages = [
            Message(
                RecordDict({"arrays": ArrayRecord([items.numpy(), network.numpy()])}),
                dst_node_id=node,
                message_type="evaluate",
            )
            for node in nodes.values()
        ]
        metrics = [reply.content["metrics"] for reply in _replies(grid, messages)]
        users_scored = sum(int(m["users"]) for m in metrics)
        result = {
            "hit_rate": sum(float(m["hits"]) for m in metrics) / users_scored,
            "ndcg": sum(float(m["ndcg"]) for m in metrics) / users_scored,
            "users": users_scored,
            "aggregation_rounds": total,
            "train_seconds": train_seconds,
            "nodes": num_nodes,
        }
        Path(result_path).write_text(json.dumps(result, indent=1))

    return app


def _partition_nodes(grid: Any, num_nodes: int, timeout: float = 120.0) -> dict[int, int]:
    """{partition id: node id}, asking every node for its partition id once all have joined."""
    from flwr.app import Message, RecordDict

    deadline = time.monotonic() + timeout
    while len(grid.get_node_ids()) < num_nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(grid.get_node_ids())} of {num_nodes} nodes joined")
        time.sleep(0.05)
    ids = sorted(grid.get_node_ids())
    probes = [Message(RecordDict(), dst_node_id=node, message_type="query") for node in ids]
    mapping = {}
    for reply in _replies(grid, probes):
        mapping[int(reply.content["metrics"]["partition-id"])] = reply.metadata.src_node_id
    if sorted(mapping) != list(range(num_nodes)):
        raise RuntimeError(
            f"nodes reported partition ids {sorted(mapping)}, not 0..{num_nodes - 1}"
        )
    return mapping


def _replies(grid: Any, messages: Sequence[Any]) -> list[Any]:
    replies = list(grid.send_and_receive(messages))
    failed = [reply for reply in replies if reply.has_error()]
    if failed:
        raise RuntimeError(f"a node failed: {failed[0].error.reason}")
    if len(replies) != len(messages):
        raise RuntimeError(f"{len(messages) - len(replies)} node(s) did not answer")
    return replies


def _combine(parts: Sequence[Sequence[np.ndarray]], num_items: int) -> ClientUpdates:
    """The round's uploads of every node as one :class:`ClientUpdates` (clients by user id)."""
    offset, pieces = 0, []
    for clients, samples, network, row_client, row_item, item_rows in parts:
        pieces.append((clients, samples, network, row_client + offset, row_item, item_rows))
        offset += len(clients)
    clients, samples, network, row_client, row_item, item_rows = (
        np.concatenate(column) for column in zip(*pieces, strict=True)
    )
    return ClientUpdates(
        clients=clients,
        num_samples=samples,
        network=torch.from_numpy(network),
        row_client=torch.from_numpy(row_client),
        row_item=torch.from_numpy(row_item),
        item_rows=torch.from_numpy(item_rows),
        num_items=num_items,
    )


# ------------------------------------------------------------------------------------------------
# Running it


def run_simulation(
    *,
    dataset: str = "ml-100k",
    data_dir: str | None = None,
    config: FedNCFConfig | None = None,
    num_nodes: int = 2,
    verbose: bool = False,
) -> dict[str, Any]:
    """Train FedNCF on Flower's simulation engine (Ray) with ``num_nodes`` SuperNodes; returns
    the final HR@K / NDCG@K (federated evaluation), the rounds and the training time."""
    config = config or FedNCFConfig()
    if config.aggregator.lower() not in FLOWER_AGGREGATORS:
        raise ValueError(
            f"aggregator {config.aggregator!r} is not available on Flower; use one of "
            f"{', '.join(FLOWER_AGGREGATORS)}"
        )
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    os.environ.update(QUIET_ENV)
    from flwr.simulation import run_simulation as flower_run_simulation

    with tempfile.TemporaryDirectory() as tmp:
        result_path = str(Path(tmp) / "result.json")
        server = make_server_app(
            dataset=dataset,
            data_dir=data_dir,
            config=config,
            num_nodes=num_nodes,
            result_path=result_path,
        )
        client = make_client_app(
            dataset=dataset, data_dir=data_dir, config=config, num_nodes=num_nodes
        )
        flower_run_simulation(
            server_app=server,
            client_app=client,
            num_supernodes=num_nodes,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0}},
            verbose_logging=verbose,
        )
        if not Path(result_path).is_file():
            raise RuntimeError("the Flower run ended without a result (see its log above)")
        return json.loads(Path(result_path).read_text())
