"""FedNCF on Flower: the server and the clients as a Flower ``ServerApp`` and ``ClientApp``.

Everything federated in fedrec otherwise runs in one Python process. Here the same FedNCF
training runs on Flower's Message API, so the parties live in separate processes: on Flower's
simulation engine (:func:`run_simulation`) or on a real deployment of a SuperLink and SuperNodes
that :func:`run_deployment` starts on loopback (:mod:`fedrec.federation.flower_deploy`); the
module's ``server_app`` and ``client_app`` are what ``flwr run`` deploys, and they read the job
from the run configuration (:mod:`fedrec.federation.flower_common`, the generic Flower and Ray
plumbing). The apps live beside the trainer whose round functions they call
(:mod:`fedrec.train.fedncf.rounds`); the job and what both apps share are in
:mod:`fedrec.train.fedncf.flower_job`:

- **Nodes.** Each Flower node (SuperNode) hosts a shard of the users: user ``u`` lives on the node
  with partition id ``u % num_nodes``. A node keeps its users' private embeddings in its
  ``Context.state``; they never leave it. It trains the round's users of its shard together in
  the configured client simulation (:func:`fedrec.train.fedncf.rounds.train_clients`; compiled by
  default where Numba installs, else batched), so per-client Python overhead does not come back,
  and replies with their uploads: each client's network weights, sample count and touched item
  rows (:class:`fedrec.federation.aggregators.ClientUpdates`).
- **Server.** The ``ServerApp`` runs FedNCF's loop: the same seeded client selection as the
  in-process trainer (a permutation of all users per global round, split into aggregation
  rounds), one ``train`` message per node with users in the round (the global item table, the
  network and that node's users), and fedrec's own aggregators on the concatenated uploads (the
  plain rules of :mod:`fedrec.federation.registry`), or, with ``secure``, MF-FedAvg through
  Flower's SecAgg+ workflow (:mod:`fedrec.federation.flower_secagg`). Evaluation is federated
  too: every node scores HR@K / NDCG@K of its own users with the global model and its private
  rows and returns only the sums.
- **Parity.** With one node the run is the in-process run (the same samples, the same
  arithmetic). With several, each node draws its own users' negatives from its own stream
  (``[seed, 3, round, node]``), so numbers agree within noise, not bit for bit.

What the messages carry is what FedNCF's clients send anyway: no user embedding, no rating.
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.agents.fedncf_agent import NCFRankingAgent
from fedrec.federation.aggregators import ClientUpdates
from fedrec.federation.flower_common import (
    add_partition_query,
    partition_nodes,
    replies,
    report_round,
    simulate,
    tune_grid,
    watch_rounds,
)
from fedrec.federation.flower_deploy import deploy
from fedrec.federation.flower_secagg import SecureAggregation, secure_mod, secure_train_reply
from fedrec.federation.registry import make_aggregator
from fedrec.train.fedncf.config import FedNCFConfig
from fedrec.train.fedncf.evaluate import env_id_of
from fedrec.train.fedncf.flower_job import (
    FLOWER_DEFAULTS,
    SYNTHETIC_PREFIX,
    FedNCFJob,
    _initial_model,
    _Shard,
    _shard,
    check_supported,
    node_of,
    peak_rss_mib,
)
from fedrec.train.fedncf.rounds import (
    aggregate_round,
    round_extras,
    round_trainer,
    select_round,
    train_clients,
)

# ------------------------------------------------------------------------------------------------
# The node (ClientApp)


@functools.cache
def _round_engine(config: FedNCFConfig) -> tuple[Any, dict[str, Any]]:
    """The node process's round trainer for ``config.simulation`` and its workspace, built
    once per process (:func:`fedrec.train.fedncf.rounds.round_trainer`)."""
    return round_trainer(config.simulation), round_extras(config)


def make_client_app(job: FedNCFJob | None = None):
    """The FedNCF ``ClientApp``: ``train`` trains the node's users of a round, ``evaluate``
    scores the node's users (HR@K, NDCG@K sums). Without ``job`` it reads the job from the run
    configuration (a deployment)."""
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    def rows_of(context: Any, job: FedNCFJob, shard: _Shard) -> tuple[np.ndarray, np.ndarray]:
        """(the node's users, their private rows), initialised from the seeded model."""
        pid = int(context.node_config["partition-id"])
        if "users" not in context.state:
            num_users, num_items = shard.num_users, shard.num_items
            own = np.flatnonzero(node_of(np.arange(num_users), job.num_nodes) == pid)
            table = _initial_model(job.config, num_users, num_items).user_table()
            context.state["users"] = ArrayRecord([own, table[torch.from_numpy(own)].numpy()])
        own, rows = context.state["users"].to_numpy_ndarrays()
        return own, rows

    @app.train(mods=[secure_mod(lambda context: job or FedNCFJob.of(context))])
    def train(msg: Message, context: Any) -> Message:
        this = job or FedNCFJob.of(context)
        if this.secure:  # Flower's SecAgg+ workflow speaks the legacy FitIns / FitRes format
            return secure_train_reply(msg, context, this, train_shard)
        began = time.perf_counter()
        items, network, users = msg.content["arrays"].to_numpy_ndarrays()
        r = int(msg.content["config"]["round"])
        updates, examples = train_shard(context, this, items, network, users, r)
        arrays = ArrayRecord(upload_arrays(updates))
        metrics = MetricRecord(
            {
                "clients": len(users),
                "examples": examples,
                "train-seconds": time.perf_counter() - began,  # data loading included
                "peak-rss-mib": peak_rss_mib(),
            }
        )
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    def train_shard(
        context: Any,
        this: FedNCFJob,
        items: np.ndarray,
        network: np.ndarray,
        users: np.ndarray,
        r: int,
    ) -> tuple[ClientUpdates, int]:
        """Train the node's users of aggregation round ``r``; their new private rows stay in
        ``context.state``; returns their uploads and the round's local examples."""
        shard, c = _shard(this.dataset, this.data_dir), this.config
        own, rows = rows_of(context, this, shard)
        pid = int(context.node_config["partition-id"])
        position = np.searchsorted(own, users)
        if np.any(position >= len(own)) or np.any(own[np.minimum(position, len(own) - 1)] != users):
            raise ValueError(f"node {pid} was sent users it does not host")
        # One node: the in-process stream; several: a stream of the node's own.
        stream = [c.seed, 3, r] if this.num_nodes == 1 else [c.seed, 3, r, pid]
        train_round, extras = _round_engine(c)
        updates, new_rows = train_clients(
            c,
            shard.clients,
            users,
            np.random.default_rng(stream),
            user_rows=torch.from_numpy(rows[position]),
            items=torch.from_numpy(items),
            network=torch.from_numpy(network),
            train_round=train_round,
            extras=extras,
        )
        rows = rows.copy()
        rows[position] = new_rows.numpy()
        context.state["users"] = ArrayRecord([own, rows])
        # n_k examples per local epoch: the round's local examples
        return updates, int(np.sum(updates.num_samples)) * c.local_epochs

    @app.evaluate()
    def evaluate(msg: Message, context: Any) -> Message:
        this = job or FedNCFJob.of(context)
        shard = _shard(this.dataset, this.data_dir)
        items, network = msg.content["arrays"].to_numpy_ndarrays()
        own, rows = rows_of(context, this, shard)
        hits, ndcg = _score_users(shard, this, own=own, rows=rows, items=items, network=network)
        metrics = MetricRecord({"hits": hits, "ndcg": ndcg, "users": len(own)})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    add_partition_query(app)
    return app


def _score_users(
    shard: _Shard,
    job: FedNCFJob,
    *,
    own: np.ndarray,
    rows: np.ndarray,
    items: np.ndarray,
    network: np.ndarray,
) -> tuple[float, float]:
    """(hits, NDCG sum) of the node's users in the evaluation mode; the other users' rows are
    zeros here and their results are dropped."""
    import gymnasium as gym

    import fedrec  # noqa: F401  (registers the env ids)

    c, dataset, data_dir = job.config, job.dataset, job.data_dir
    num_users, num_items = shard.num_users, shard.num_items
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


def make_server_app(job: FedNCFJob | None = None):
    """The FedNCF ``ServerApp``: FedNCF's loop over Flower messages; writes the final HR@K and
    NDCG@K (federated evaluation) and timings as JSON to the job's ``result_path``. Without
    ``job`` it reads the job from the run configuration (a deployment)."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        this = job or FedNCFJob.of(context)
        config, num_nodes = this.config, this.num_nodes
        shard = _shard(this.dataset, this.data_dir)
        num_users, num_items = shard.num_users, shard.num_items
        model = _initial_model(config, num_users, num_items)
        items, network = model.item_table(), model.network_vector()
        aggregator = make_aggregator(config.aggregator)
        selection_rng = np.random.default_rng([config.seed, 1])
        per_global = config.rounds_per_global(num_users)
        total = config.total_aggregation_rounds(num_users)
        tune_grid(grid)
        nodes = partition_nodes(grid, num_nodes)
        secure = None
        if this.secure:
            clients = shard.clients
            secure = SecureAggregation(
                grid=grid,
                context=context,
                nodes=nodes,
                clients_per_round=config.clients_per_round,
                # n_k = (1 + negatives) x the client's training positives; the largest one
                max_samples=int(np.diff(clients.train_indptr).max()) * (1 + config.num_negatives),
                clip=this.secagg_clip,
            )
        start = time.perf_counter()
        groups: list[np.ndarray] = []
        round_seconds: list[float] = []
        node_seconds: list[float] = []  # per round: the slowest node's training time
        node_rss = 0.0
        report_round(this.result_path, 0, total)  # the bar starts with the training
        for r in range(total):
            began = time.perf_counter()
            groups, users = select_round(
                groups,
                selection_rng,
                aggregation_round=r,
                num_users=num_users,
                per_global=per_global,
                selection=config.selection,
            )
            owner = node_of(users, num_nodes)
            if secure is not None:
                users_of = {pid: users[owner == pid] for pid in np.unique(owner).tolist()}
                items, network = secure.round(r, users_of, items, network)
                round_seconds.append(time.perf_counter() - began)
                report_round(this.result_path, r + 1, total)
                continue
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
            answers = replies(grid, messages)
            node_metrics = [reply.content["metrics"] for reply in answers]
            node_seconds.append(max(float(m["train-seconds"]) for m in node_metrics))
            node_rss = max([node_rss, *(float(m["peak-rss-mib"]) for m in node_metrics)])
            updates = _combine(
                [reply.content["arrays"].to_numpy_ndarrays() for reply in answers], num_items
            )
            items, network = aggregate_round(
                aggregator, None, items=items, network=network, updates=updates
            )
            round_seconds.append(time.perf_counter() - began)
            report_round(this.result_path, r + 1, total)  # the command's progress bar
        train_seconds = time.perf_counter() - start
        result: dict[str, Any] = {"hit_rate": None, "ndcg": None, "users": 0}
        if not this.dataset.startswith(SYNTHETIC_PREFIX):  # synthetic users have no test data
            messages = [
                Message(
                    RecordDict({"arrays": ArrayRecord([items.numpy(), network.numpy()])}),
                    dst_node_id=node,
                    message_type="evaluate",
                )
                for node in nodes.values()
            ]
            metrics = [reply.content["metrics"] for reply in replies(grid, messages)]
            users_scored = sum(int(m["users"]) for m in metrics)
            result = {
                "hit_rate": sum(float(m["hits"]) for m in metrics) / users_scored,
                "ndcg": sum(float(m["ndcg"]) for m in metrics) / users_scored,
                "users": users_scored,
            }
        result |= {
            "aggregation_rounds": total,
            "train_seconds": train_seconds,
            "round_seconds": round_seconds,
            "median_round_seconds": float(np.median(round_seconds)) if round_seconds else 0.0,
            "median_node_seconds": float(np.median(node_seconds)) if node_seconds else 0.0,
            "node_peak_rss_mib": node_rss,
            "server_peak_rss_mib": peak_rss_mib(),
            "nodes": num_nodes,
            "secure": this.secure,
            "dropped_nodes": secure.dropped if secure is not None else 0,
        }
        # the final global model, for comparisons (e.g. SecAgg+ against the plain sum)
        np.savez(this.result_path + ".model.npz", items=items.numpy(), network=network.numpy())
        Path(this.result_path).write_text(json.dumps(result, indent=1))

    return app


#: The apps ``flwr run`` deploys (they read the job from the run configuration).
server_app = make_server_app()
client_app = make_client_app()


def upload_arrays(updates: ClientUpdates) -> list[np.ndarray]:
    """A node's uploads as the arrays of its reply (the inverse of :func:`_combine`'s input)."""
    return [
        np.asarray(updates.clients, np.int64),
        np.asarray(updates.num_samples, np.int64),
        updates.network.numpy(),
        updates.row_client.numpy(),
        updates.row_item.numpy(),
        updates.item_rows.numpy(),
    ]


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
    secure: bool = False,
    verbose: bool = False,
    return_model: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Train FedNCF on Flower's simulation engine (Ray) with ``num_nodes`` SuperNodes; returns
    the final HR@K / NDCG@K (federated evaluation), the rounds and the training time.
    ``secure``: aggregate with Flower's SecAgg+ (:mod:`fedrec.federation.flower_secagg`);
    ``return_model``: also return the final global ``items`` and ``network`` arrays;
    ``progress``: a bar of the finished aggregation rounds, with the ETA, on stderr."""
    config = config or FLOWER_DEFAULTS
    check_supported(config, num_nodes, secure)
    if data_dir is not None:
        data_dir = str(Path(data_dir).resolve())  # the simulation runs in a folder of its own
    with tempfile.TemporaryDirectory() as tmp:
        result = str(Path(tmp) / "result.json")
        job = FedNCFJob(dataset, data_dir, config, num_nodes, result, secure=secure)
        with watch_rounds(job.result_path, enabled=progress):
            simulate(__name__, job.to_json(), num_nodes=num_nodes, verbose=verbose)
        if not Path(job.result_path).is_file():
            raise RuntimeError("the Flower run ended without a result (see its log above)")
        answer = json.loads(Path(job.result_path).read_text())
        if return_model:
            with np.load(job.result_path + ".model.npz", allow_pickle=False) as model:
                answer |= {"items": model["items"], "network": model["network"]}
        return answer


def simulation_apps(job: dict[str, Any]) -> tuple[Any, Any]:
    """The (ServerApp, ClientApp) of a job for the simulation engine
    (:func:`fedrec.federation.flower_common.simulate` builds them in its own process)."""
    this = FedNCFJob.from_dict(job)
    return make_server_app(this), make_client_app(this)


def run_deployment(
    *,
    dataset: str = "ml-100k",
    data_dir: str | None = None,
    config: FedNCFConfig | None = None,
    num_nodes: int = 2,
    secure: bool = False,
    timeout: float = 3600.0,
    log_dir: str | Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Train FedNCF on a real Flower deployment on loopback: a SuperLink and ``num_nodes``
    SuperNodes as separate processes (:func:`fedrec.federation.flower_deploy.deploy`), stopped
    at the end; returns what :func:`run_simulation` returns (``progress``: a bar of the
    finished aggregation rounds on stderr)."""
    config = config or FLOWER_DEFAULTS
    check_supported(config, num_nodes, secure)
    if data_dir is not None:
        data_dir = str(Path(data_dir).resolve())  # the node processes run elsewhere
    return deploy(
        app=__name__,
        job=lambda result_path: FedNCFJob(
            dataset, data_dir, config, num_nodes, result_path, secure=secure
        ).to_json(),
        num_nodes=num_nodes,
        timeout=timeout,
        log_dir=log_dir,
        progress=progress,
    )
