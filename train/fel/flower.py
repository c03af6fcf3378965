"""FEL on Flower: the federated training of FEL's leaves with its parties as Flower apps.

The in-process trainer (:func:`fedrec.train.fel.train_federated`) trains one leaf per user
cluster by (DP-)FedAvg inside each cluster, every party in one Python process. Here the same
training runs on Flower's Message API (:mod:`fedrec.train.fedncf.flower` is the template),
with the same round (:mod:`fedrec.train.fel.rounds`):

- **Nodes.** Flower node ``p`` of ``N`` (its partition id) hosts the users ``u`` with
  ``u % N == p``. Per round it receives its chosen users, the leaf of each user's cluster (only
  the leaves of those clusters) and builds its users' mini-batch schedules from a random stream
  of its own (``[seed, 5, phase, round, p]``); it trains them together with fedrec's batched
  :func:`~fedrec.train.fel.rounds.local_train` (no per-client Python loop) and replies with each
  client's update (trained copy minus the leaf it started from), its number of training rows
  ``n_k`` and the clients' mean first-batch loss.
- **Server.** The ``ServerApp`` runs :func:`~fedrec.train.fel.train_federated`'s loop: the same
  seeded Poisson selection (and, without DP, the same fill of empty clusters), one ``train``
  message per node with chosen users, and the same aggregation on the uploads put back in user
  order: FedAvg with weights n_k / N inside each cluster, or with DP
  :func:`~fedrec.federation.privacy.dp_aggregate`, which clips each client's update **on the
  server** as the in-process trainer does (a deployment that does not trust the server would
  clip on the device; the sum is the same) and adds noise from the server's generator. Then the
  server scores the final leaves (every ensemble rule, the central over-arch of opt-in users and,
  with ``baseline=True``, plain FL trained the same way) with the in-process evaluation
  (:func:`~fedrec.train.fel.ensemble_aucs`), on the held-out rows it loads itself.
- **Parity.** With one node, the node draws the schedules from the server's own generator: the
  server sends its generator's state after the selection and continues from the state the node
  returns, which is exactly the in-process stream (train_federated draws selection and
  schedules from one generator), so a one-node run is the in-process run bit for bit. With
  several nodes, each node's schedules come from its own stream, so results agree within noise.

The server knows which users have training rows (the in-process selection skips the others; in a
deployment such a device would not check in) and reads the held-out rows for the evaluation.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.agents.fel_model import (
    FederatedResult,
    LeafConfig,
    flatten,
    init_params,
    unflatten,
)
from fedrec.envs.datasets.click_data import click_data_from_ml100k, click_data_from_taobao
from fedrec.federation.flower_common import (
    add_partition_query,
    job_of,
    partition_nodes,
    replies,
    report_round,
    simulate,
    tune_grid,
    watch_rounds,
)
from fedrec.federation.privacy import GaussianMechanism, fel_epsilon, validate_dp_arguments
from fedrec.train.fel.clusters import cluster_clients
from fedrec.train.fel.config import DPConfig, FedConfig
from fedrec.train.fel.ensemble import baseline_auc, ensemble_aucs
from fedrec.train.fel.rounds import (
    aggregate_leaves,
    client_schedules,
    local_train,
    noise_multiplier_of,
    select_clients,
    train_rows_of,
)
from fedrec.train.fel.trainer import train_federated

#: The click data sets a FEL Flower run reads (as ``fedrec bench fel --data``).
DATASETS = ("taobao-synthetic", "taobao", "ml-100k")
#: The clustering methods (:func:`fedrec.train.fel.clusters.cluster_clients`).
CLUSTERINGS = ("random", "feature", "kmeans")
#: The feature cross of a ``feature`` clustering without ``features``, per data set.
DEFAULT_CROSS = {
    "taobao-synthetic": ("final_gender_code", "age_level"),
    "taobao": ("final_gender_code", "age_level"),
    "ml-100k": ("gender", "age_band"),
}
#: The tag of the nodes' own schedule streams, ``[seed, STREAM_TAG, phase, round, partition]``.
STREAM_TAG = 5
#: The two federations a run may train: the leaves, then plain FL (one leaf over every user).
PHASES = ("leaves", "baseline")


@dataclass(frozen=True)
class FELClustering:
    """The rule that assigns users to clusters from their public features (deterministic)."""

    method: str = "feature"
    num_clusters: int | None = None
    """K for ``random`` and ``kmeans`` (1 = plain FL)."""
    features: tuple[str, ...] = ()
    """the public features of ``feature`` (a cross) or ``kmeans`` (default: all)."""
    seed: int = 0

    def assign(self, data: Any) -> np.ndarray:
        """(U,) the cluster of every client of ``data`` (a :class:`ClickData`)."""
        return cluster_clients(
            data.public,
            data.public_names,
            self.method,
            num_clusters=self.num_clusters,
            features=self.features,
            seed=self.seed,
        )


@dataclass(frozen=True)
class FELJob:
    """What a FEL Flower run trains: the click data (``data`` as ``fedrec bench fel --data``;
    ``data_dir`` its folder, for ``taobao-synthetic`` the generated files), the clustering, the
    federated configuration, the number of nodes, whether plain FL is trained too, the central
    over-arch's settings, and where the server writes its result (JSON)."""

    data: str
    data_dir: str | None
    clustering: FELClustering
    config: FedConfig
    num_nodes: int
    result_path: str
    baseline: bool = False
    opt_in_fraction: float = 0.1
    over_arch_iterations: int = 100

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, job: dict[str, Any]) -> FELJob:
        values = dict(job["config"])
        leaf = LeafConfig(**values.pop("leaf"))
        dp = values.pop("dp")
        config = FedConfig(leaf=leaf, dp=None if dp is None else DPConfig(**dp), **values)
        clustering = dict(job["clustering"])
        clustering["features"] = tuple(clustering["features"])
        return cls(
            data=str(job["data"]),
            data_dir=job["data_dir"],
            clustering=FELClustering(**clustering),
            config=config,
            num_nodes=int(job["num_nodes"]),
            result_path=str(job["result_path"]),
            baseline=bool(job["baseline"]),
            opt_in_fraction=float(job["opt_in_fraction"]),
            over_arch_iterations=int(job["over_arch_iterations"]),
        )

    @classmethod
    def of(cls, context: Any) -> FELJob:
        """The job in a deployment's run configuration."""
        return cls.from_dict(job_of(context))


def check_supported(
    *,
    data: str,
    data_dir: str | None,
    clustering: FELClustering,
    config: FedConfig,
    num_nodes: int,
    opt_in_fraction: float = 0.1,
) -> None:
    """Refuse what a FEL Flower run cannot do, before any process starts."""
    problems = []
    if data not in DATASETS:
        problems.append(f"data must be one of {', '.join(DATASETS)}, got {data!r}")
    if data == "taobao" and not data_dir:
        problems.append("data 'taobao' needs data_dir with the real Taobao files")
    if num_nodes < 1:
        problems.append(f"num_nodes must be >= 1, got {num_nodes}")
    if clustering.method not in CLUSTERINGS:
        problems.append(
            f"clustering method must be one of {', '.join(CLUSTERINGS)}, got {clustering.method!r}"
        )
    if clustering.method in ("random", "kmeans") and not (clustering.num_clusters or 0) >= 1:
        problems.append(f"clustering {clustering.method!r} needs num_clusters >= 1")
    c = config
    if not 0.0 < c.sample_rate <= 1.0:
        problems.append(f"sample_rate must be in (0, 1], got {c.sample_rate}")
    if c.rounds < 1 or c.batch_size < 1 or c.local_epochs < 1:
        problems.append("rounds, batch_size and local_epochs must be >= 1")
    if c.dp is not None:
        if (c.dp.noise_multiplier is None) == (c.dp.target_epsilon is None):
            problems.append("DPConfig needs exactly one of noise_multiplier and target_epsilon")
        try:
            validate_dp_arguments(
                clip_norm=c.dp.clip_norm,
                noise_multiplier=c.dp.noise_multiplier,
                target_epsilon=c.dp.target_epsilon,
                delta=c.dp.delta,
            )
        except ValueError as error:
            problems.append(str(error))
    if not 0 <= opt_in_fraction <= 1:
        problems.append(f"opt_in_fraction must be in [0, 1], got {opt_in_fraction}")
    if problems:
        raise ValueError("FEL on Flower: " + "; ".join(problems))


def node_of(users: np.ndarray, num_nodes: int) -> np.ndarray:
    """The partition id of the node hosting each user."""
    return np.asarray(users, dtype=np.int64) % num_nodes


def digest(flat: torch.Tensor) -> str:
    """SHA-256 of stacked leaves' float32 bytes (bit-for-bit comparisons of two runs)."""
    return hashlib.sha256(flat.detach().contiguous().numpy().tobytes()).hexdigest()


# ------------------------------------------------------------------------------------------------
# One round's pieces, without Flower: a node's local training and combining the nodes' uploads
# (selection, training rows and the server step are fedrec.train.fel.rounds's, shared with
# the in-process trainer)


@dataclass(frozen=True)
class Uploads:
    """A round's client uploads: user ids, their training rows n_k, their (C, P) updates, and
    their mean loss on the first local batch (one node's, or the round's once combined)."""

    clients: np.ndarray
    num_samples: np.ndarray
    deltas: torch.Tensor
    first_loss: float


def local_round(
    data: Any,
    *,
    train_rows: Sequence[np.ndarray],
    users: np.ndarray,
    leaves: np.ndarray,
    which: np.ndarray,
    index: np.ndarray,
    mask: np.ndarray,
    config: FedConfig,
) -> Uploads:
    """Train a node's chosen ``users`` from ``leaves[which[i]]`` (user i's cluster's leaf) on
    their schedules (``index``, ``mask`` of :func:`~fedrec.train.fel.rounds.client_schedules`) with the
    batched :func:`~fedrec.train.fel.rounds.local_train`; returns their uploads."""
    like = init_params(data, config.leaf, 1, 0)
    start = {
        name: t.contiguous()
        for name, t in unflatten(
            torch.from_numpy(np.asarray(leaves))[torch.from_numpy(which)], like
        ).items()
    }
    trained, first_loss = local_train(start, data, index, mask, config.client_lr)
    return Uploads(
        clients=np.asarray(users, np.int64),
        num_samples=np.array([len(train_rows[u]) for u in users], np.int64),
        deltas=flatten(trained) - flatten(start),
        first_loss=first_loss,
    )


def combine_uploads(parts: Sequence[Uploads]) -> Uploads:
    """The nodes' uploads of a round as one, in user order (the in-process trainer's order, so
    that the aggregation sums in the same order); the first-batch loss is the clients' mean."""
    clients = np.concatenate([p.clients for p in parts])
    order = np.argsort(clients, kind="stable")
    if len(parts) == 1:
        first_loss = parts[0].first_loss
    else:
        first_loss = sum(p.first_loss * len(p.clients) for p in parts) / max(len(clients), 1)
    return Uploads(
        clients=clients[order],
        num_samples=np.concatenate([p.num_samples for p in parts])[order],
        deltas=torch.cat([p.deltas for p in parts])[torch.from_numpy(order)],
        first_loss=first_loss,
    )


# ------------------------------------------------------------------------------------------------
# The node (ClientApp)


class _Shard:
    """The click data a node (or the server) works from, loaded once per process."""

    def __init__(self, data: str, data_dir: str | None) -> None:
        self.data = load_click_data(data, data_dir)
        self.train_rows = train_rows_of(self.data)
        self.has_train = np.array([len(rows) > 0 for rows in self.train_rows])


@functools.cache
def _shard(data: str, data_dir: str | None) -> _Shard:
    return _Shard(data, data_dir)


def load_click_data(data: str, data_dir: str | None) -> Any:
    """The :class:`~fedrec.envs.datasets.click_data.ClickData` of a job (the synthetic set must exist)."""
    if data == "ml-100k":
        return click_data_from_ml100k(data_dir)
    return click_data_from_taobao(data_dir)


def synthetic_folder(*, data_dir: str | None, users: int, ads: int) -> str:
    """The synthetic Taobao folder of ``fedrec bench fel`` (``data_dir``, or the cache's
    ``taobao-synthetic/users<U>-ads<A>-seed0``), written if it has no files yet."""
    from fedrec.envs.datasets.catalog import data_root
    from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups

    folder = (
        Path(data_dir)
        if data_dir
        else data_root() / "taobao-synthetic" / f"users{users}-ads{ads}-seed0"
    )
    if not (folder / "raw_sample.csv").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        write_taobao_groups(folder, num_users=users, num_ads=ads, seed=0)
    return str(folder.resolve())


def _stream_state(rng: np.random.Generator) -> str:
    return json.dumps(rng.bit_generator.state)


def _generator_of(state: str) -> np.random.Generator:
    rng = np.random.default_rng()
    rng.bit_generator.state = json.loads(state)
    return rng


def make_client_app(job: FELJob | None = None):
    """The FEL ``ClientApp``: ``train`` trains the node's chosen users of a round from their
    clusters' leaves and replies with their updates and n_k. Without ``job`` it reads the job
    from the run configuration (a deployment)."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Any) -> Message:
        this = job or FELJob.of(context)
        shard, c = _shard(this.data, this.data_dir), this.config
        users, which, leaves = msg.content["arrays"].to_numpy_ndarrays()
        settings = msg.content["config"]
        pid = int(context.node_config["partition-id"])
        if np.any(node_of(users, this.num_nodes) != pid):
            raise ValueError(f"node {pid} was sent users it does not host")
        if "stream" in settings:  # one node: the server's own generator (the in-process stream)
            rng = _generator_of(str(settings["stream"]))
        else:
            phase, r = int(settings["phase"]), int(settings["round"])
            rng = np.random.default_rng([c.seed, STREAM_TAG, phase, r, pid])
        index, mask = client_schedules(shard.data, users, shard.train_rows, c, rng)
        uploads = local_round(
            shard.data,
            train_rows=shard.train_rows,
            users=users,
            leaves=leaves,
            which=which,
            index=index,
            mask=mask,
            config=c,
        )
        content = {
            "arrays": ArrayRecord([uploads.clients, uploads.num_samples, uploads.deltas.numpy()]),
            "metrics": MetricRecord({"first_loss": uploads.first_loss}),
        }
        if "stream" in settings:
            content["config"] = ConfigRecord({"stream": _stream_state(rng)})
        return Message(RecordDict(content), reply_to=msg)

    add_partition_query(app)
    return app


# ------------------------------------------------------------------------------------------------
# The server (ServerApp)


def _train_on_nodes(
    grid: Any,
    nodes: dict[int, int],
    shard: _Shard,
    assignment: np.ndarray,
    config: FedConfig,
    *,
    num_nodes: int,
    phase: int,
    progress: tuple[str, int, int] | None = None,
) -> tuple[Any, list[float]]:
    """:func:`~fedrec.train.fel.train_federated` with the clients' local training on the nodes;
    returns its :class:`~fedrec.agents.fel_model.FederatedResult` and the seconds of every round.
    ``progress``: (result path, rounds done before, total rounds) for the command's bar."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    data = shard.data
    assignment = np.asarray(assignment, np.int64)
    k = int(assignment.max()) + 1
    rng = np.random.default_rng(config.seed)
    gen = torch.Generator().manual_seed(config.seed + 1)
    z = noise_multiplier_of(config)
    like = init_params(data, config.leaf, k, config.seed)
    flat = flatten(like)
    sizes = np.bincount(assignment, minlength=k)
    denominator = torch.as_tensor(config.sample_rate * sizes, dtype=torch.float32)
    updates, history, seconds = 0, [], []
    for r in range(config.rounds):
        began = time.perf_counter()
        clients = select_clients(rng, assignment, shard.has_train, config)
        owner = node_of(clients, num_nodes)
        messages = []
        for pid in np.unique(owner).tolist():
            users = clients[owner == pid]
            needed, which = np.unique(assignment[users], return_inverse=True)
            settings: dict[str, Any] = {"round": r, "phase": phase}
            if num_nodes == 1:
                settings["stream"] = _stream_state(rng)
            messages.append(
                Message(
                    RecordDict(
                        {
                            "arrays": ArrayRecord(
                                [
                                    users,
                                    which.astype(np.int64),
                                    flat[torch.from_numpy(needed)].numpy(),
                                ]
                            ),
                            "config": ConfigRecord(settings),
                        }
                    ),
                    dst_node_id=nodes[pid],
                    message_type="train",
                )
            )
        answers = replies(grid, messages) if messages else []
        parts = []
        for reply in answers:
            users, num_samples, deltas = reply.content["arrays"].to_numpy_ndarrays()
            first_loss = float(reply.content["metrics"]["first_loss"])
            parts.append(Uploads(users, num_samples, torch.from_numpy(deltas), first_loss))
            if num_nodes == 1:
                rng = _generator_of(str(reply.content["config"]["stream"]))
        uploads = (
            combine_uploads(parts)
            if parts
            else Uploads(np.zeros(0, np.int64), np.zeros(0, np.int64), torch.zeros(0, 0), 0.0)
        )
        if parts:
            updates += len(uploads.clients)
            history.append(uploads.first_loss)
        flat = aggregate_leaves(
            flat,
            uploads.clients,
            uploads.num_samples,
            uploads.deltas,
            assignment,
            config,
            noise_multiplier=z,
            denominator=denominator,
            generator=gen,
        )
        seconds.append(time.perf_counter() - began)
        if progress is not None:
            report_round(progress[0], progress[1] + r + 1, progress[2])
    privacy = None
    if config.dp is not None:
        mechanism = GaussianMechanism(float(z), config.sample_rate, config.rounds)
        privacy = fel_epsilon({c: [mechanism] for c in range(k)}, config.dp.delta)
    result = FederatedResult(unflatten(flat, like), assignment, updates, z, privacy, history)
    return result, seconds


def make_server_app(job: FELJob | None = None):
    """The FEL ``ServerApp``: the leaves' (DP-)FedAvg loop over Flower messages, then (with
    ``baseline``) plain FL the same way, then the test AUC of every ensemble rule and of plain
    FL, written with the timings as JSON to the job's ``result_path``. Without ``job`` it reads
    the job from the run configuration (a deployment)."""
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        this = job or FELJob.of(context)
        shard = _shard(this.data, this.data_dir)
        data, config = shard.data, this.config
        assignment = this.clustering.assign(data)
        tune_grid(grid)
        nodes = partition_nodes(grid, this.num_nodes)
        total = config.rounds * (2 if this.baseline else 1)
        report_round(this.result_path, 0, total)  # the command's bar starts with the training
        start = time.perf_counter()
        fel, seconds = _train_on_nodes(
            grid,
            nodes,
            shard,
            assignment,
            config,
            num_nodes=this.num_nodes,
            phase=0,
            progress=(this.result_path, 0, total),
        )
        train_seconds = time.perf_counter() - start
        scores, opt_in = ensemble_aucs(
            data,
            fel,
            opt_in_fraction=this.opt_in_fraction,
            over_arch_iterations=this.over_arch_iterations,
            seed=config.seed,
        )
        result: dict[str, Any] = {
            "auc": scores,
            "num_clusters": int(assignment.max()) + 1,
            "client_updates": fel.client_updates,
            "noise_multiplier": fel.noise_multiplier,
            "epsilon": fel.privacy.epsilon if fel.privacy else None,
            "loss_history": fel.loss_history,
            "leaves_sha256": digest(flatten(fel.params)),
            "opt_in_users": opt_in,
            "rounds": config.rounds,
            "train_seconds": train_seconds,
            "median_round_seconds": float(np.median(seconds)),
            "nodes": this.num_nodes,
        }
        if this.baseline:
            zeros = np.zeros(data.num_clients, np.int64)
            began = time.perf_counter()
            base, base_seconds = _train_on_nodes(
                grid,
                nodes,
                shard,
                zeros,
                config,
                num_nodes=this.num_nodes,
                phase=1,
                progress=(this.result_path, config.rounds, total),
            )
            result["auc"]["baseline"] = baseline_auc(data, base)
            result["baseline_client_updates"] = base.client_updates
            result["baseline_sha256"] = digest(flatten(base.params))
            result["baseline_train_seconds"] = time.perf_counter() - began
            result["baseline_median_round_seconds"] = float(np.median(base_seconds))
        Path(this.result_path).write_text(json.dumps(result, indent=1))

    return app


#: The apps ``flwr run`` deploys (they read the job from the run configuration).
server_app = make_server_app()
client_app = make_client_app()


# ------------------------------------------------------------------------------------------------
# Running it


def _job(
    *,
    data: str,
    data_dir: str | None,
    users: int,
    ads: int,
    clustering: FELClustering | None,
    config: FedConfig | None,
    num_nodes: int,
    baseline: bool,
    opt_in_fraction: float,
    over_arch_iterations: int,
) -> FELJob:
    """Check the settings (before any process starts), write the synthetic data if needed, and
    return the job with an empty result path (filled in by the runner)."""
    config = config or FedConfig()
    if clustering is None:
        clustering = FELClustering("feature", features=DEFAULT_CROSS.get(data, ()))
    elif clustering.method == "feature" and not clustering.features:
        clustering = dataclasses.replace(clustering, features=DEFAULT_CROSS.get(data, ()))
    check_supported(
        data=data,
        data_dir=data_dir,
        clustering=clustering,
        config=config,
        num_nodes=num_nodes,
        opt_in_fraction=opt_in_fraction,
    )
    if data == "taobao-synthetic":
        data_dir = synthetic_folder(data_dir=data_dir, users=users, ads=ads)
    elif data_dir is not None:
        data_dir = str(Path(data_dir).resolve())  # the node processes run elsewhere
    job = FELJob(
        data=data,
        data_dir=data_dir,
        clustering=clustering,
        config=config,
        num_nodes=num_nodes,
        result_path="",
        baseline=baseline,
        opt_in_fraction=opt_in_fraction,
        over_arch_iterations=over_arch_iterations,
    )
    loaded = _shard(job.data, job.data_dir).data
    unknown = [f for f in clustering.features if f not in loaded.public_names]
    if unknown:
        raise ValueError(
            f"FEL on Flower: clustering features {unknown} are not public features of {data!r}; "
            f"known: {', '.join(loaded.public_names)}"
        )
    clustering.assign(loaded)  # any other bad clustering (e.g. K > distinct profiles) fails here
    return job


# run_simulation, run_deployment and run_in_process list the job's settings again and pass them
# to _job, which checks them once: their keyword signatures are public (the CLI, tests and
# benchmarks call them), and taking ``**settings`` instead would hide them.
def run_simulation(
    *,
    data: str = "taobao-synthetic",
    data_dir: str | None = None,
    users: int = 2000,
    ads: int = 400,
    clustering: FELClustering | None = None,
    config: FedConfig | None = None,
    num_nodes: int = 2,
    baseline: bool = False,
    opt_in_fraction: float = 0.1,
    over_arch_iterations: int = 100,
    verbose: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Train FEL's leaves (and with ``baseline`` plain FL) on Flower's simulation engine (Ray)
    with ``num_nodes`` SuperNodes; returns the test AUC of every ensemble rule, the client
    updates, ε, and the training time. ``users`` and ``ads`` size the synthetic data set
    (``data="taobao-synthetic"``, written once into ``data_dir`` or the cache);
    ``clustering`` defaults to the data set's feature cross; ``progress``: a bar of the finished
    rounds (FEL's, then the baseline's) with the ETA on stderr."""
    job = _job(
        data=data,
        data_dir=data_dir,
        users=users,
        ads=ads,
        clustering=clustering,
        config=config,
        num_nodes=num_nodes,
        baseline=baseline,
        opt_in_fraction=opt_in_fraction,
        over_arch_iterations=over_arch_iterations,
    )
    with tempfile.TemporaryDirectory() as tmp:
        job = dataclasses.replace(job, result_path=str(Path(tmp) / "result.json"))
        with watch_rounds(job.result_path, enabled=progress):
            simulate(__name__, job.to_json(), num_nodes=num_nodes, verbose=verbose)
        if not Path(job.result_path).is_file():
            raise RuntimeError("the Flower run ended without a result (see its log above)")
        return json.loads(Path(job.result_path).read_text())


def simulation_apps(job: dict[str, Any]) -> tuple[Any, Any]:
    """The (ServerApp, ClientApp) of a job for the simulation engine
    (:func:`fedrec.federation.flower_common.simulate` builds them in its own process)."""
    this = FELJob.from_dict(job)
    return make_server_app(this), make_client_app(this)


def run_deployment(
    *,
    data: str = "taobao-synthetic",
    data_dir: str | None = None,
    users: int = 2000,
    ads: int = 400,
    clustering: FELClustering | None = None,
    config: FedConfig | None = None,
    num_nodes: int = 2,
    baseline: bool = False,
    opt_in_fraction: float = 0.1,
    over_arch_iterations: int = 100,
    timeout: float = 3600.0,
    log_dir: str | Path | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Train FEL on a real Flower deployment on loopback: a SuperLink and ``num_nodes``
    SuperNodes as separate processes (:func:`fedrec.federation.flower_deploy.deploy`), stopped
    at the end; returns what :func:`run_simulation` returns."""
    from fedrec.federation.flower_deploy import deploy

    job = _job(
        data=data,
        data_dir=data_dir,
        users=users,
        ads=ads,
        clustering=clustering,
        config=config,
        num_nodes=num_nodes,
        baseline=baseline,
        opt_in_fraction=opt_in_fraction,
        over_arch_iterations=over_arch_iterations,
    )
    return deploy(
        app="fedrec.train.fel.flower",
        job=lambda result_path: dataclasses.replace(job, result_path=result_path).to_json(),
        num_nodes=num_nodes,
        timeout=timeout,
        log_dir=log_dir,
        progress=progress,
    )


def run_in_process(
    *,
    data: str = "taobao-synthetic",
    data_dir: str | None = None,
    users: int = 2000,
    ads: int = 400,
    clustering: FELClustering | None = None,
    config: FedConfig | None = None,
    opt_in_fraction: float = 0.1,
    over_arch_iterations: int = 100,
) -> dict[str, Any]:
    """The same job with the in-process trainer (:func:`fedrec.train.fel.train_federated`), for
    comparison: the test AUC of every ensemble rule and the leaves' digest."""
    job = _job(
        data=data,
        data_dir=data_dir,
        users=users,
        ads=ads,
        clustering=clustering,
        config=config,
        num_nodes=1,
        baseline=False,
        opt_in_fraction=opt_in_fraction,
        over_arch_iterations=over_arch_iterations,
    )
    loaded = _shard(job.data, job.data_dir).data
    began = time.perf_counter()
    fel = train_federated(loaded, job.clustering.assign(loaded), job.config)
    train_seconds = time.perf_counter() - began
    scores, _ = ensemble_aucs(
        loaded,
        fel,
        opt_in_fraction=opt_in_fraction,
        over_arch_iterations=over_arch_iterations,
        seed=job.config.seed,
    )
    return {
        "auc": scores,
        "leaves_sha256": digest(flatten(fel.params)),
        "train_seconds": train_seconds,
    }
