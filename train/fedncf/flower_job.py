"""A FedNCF Flower job and what both of its apps need: the job (:class:`FedNCFJob`: data, the
configuration, nodes, where the result goes), the settings a Flower run refuses
(:func:`check_supported`), which node hosts which user (:func:`node_of`), the seeded initial
model and a node process's data (:func:`_shard`). The apps are in :mod:`fedrec.train.fedncf.flower`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.agents.ncf import NCF, NCFConfig
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.envs.datasets.synthetic_clients import synthetic_clients
from fedrec.federation.aggregators import MFFedAvg
from fedrec.federation.flower_common import job_of
from fedrec.federation.registry import PLAIN_AGGREGATOR_NAMES
from fedrec.train.fedncf.config import FedNCFConfig
from fedrec.train.fedncf.sampling import ClientData

#: The aggregators a Flower run supports: the registry's plain rules (MF-SecAvg simulates its
#: masking in one process; Flower's own SecAgg+ workflow is the secure option there).
FLOWER_AGGREGATORS = PLAIN_AGGREGATOR_NAMES


@dataclass(frozen=True)
class FedNCFJob:
    """What a FedNCF Flower run trains: the data, the configuration, the number of nodes, and
    where the server writes its result (JSON)."""

    dataset: str
    data_dir: str | None
    config: FedNCFConfig
    num_nodes: int
    result_path: str
    secure: bool = False
    """aggregate with Flower's SecAgg+ workflow (MF-FedAvg only;
    :mod:`fedrec.federation.flower_secagg`)."""
    secagg_clip: float = 8.0
    """SecAgg+'s clipping range for the scaled sums (Flower's default)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, job: dict[str, Any]) -> FedNCFJob:
        values = dict(job["config"])
        model = dict(values.pop("model"))
        model["hidden"] = tuple(model["hidden"])
        config = FedNCFConfig(model=NCFConfig(**model), **values)
        return cls(
            dataset=str(job["dataset"]),
            data_dir=job["data_dir"],
            config=config,
            num_nodes=int(job["num_nodes"]),
            result_path=str(job["result_path"]),
            secure=bool(job.get("secure", False)),
            secagg_clip=float(job.get("secagg_clip", 8.0)),
        )

    @classmethod
    def of(cls, context: Any) -> FedNCFJob:
        """The job in a deployment's run configuration."""
        return cls.from_dict(job_of(context))


#: What a Flower run trains when no configuration is given: FedNCF's defaults with what Flower
#: runs (fresh client optimisers, one federated evaluation at the end).
FLOWER_DEFAULTS = FedNCFConfig(client_optimizer="fresh", eval_every=0)


def check_supported(config: FedNCFConfig, num_nodes: int, secure: bool = False) -> None:
    """Refuse, naming the field, every configuration a Flower run does not run as the
    in-process trainer does, before any process starts. Every other field is honoured
    (tests/test_flower_rounds.py checks each one against the in-process trainer)."""
    if secure and config.aggregator.lower() != MFFedAvg.name:
        raise ValueError(
            f"Flower's SecAgg+ is implemented for {MFFedAvg.label} only, not {config.aggregator!r}"
        )
    if config.aggregator.lower() not in FLOWER_AGGREGATORS:
        raise ValueError(
            f"aggregator {config.aggregator!r} is not available on Flower; use one of "
            f"{', '.join(FLOWER_AGGREGATORS)}"
        )
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    if config.client_optimizer != "fresh":
        raise ValueError(
            f"client_optimizer {config.client_optimizer!r} is not available on Flower (its nodes "
            "train fresh client optimisers); pass client_optimizer='fresh'"
        )
    if config.eval_every != 0:
        raise ValueError(
            f"eval_every={config.eval_every} is not available on Flower (it evaluates once, at "
            "the end); pass eval_every=0"
        )
    if config.validation:
        raise ValueError(
            "validation=True is not available on Flower (no validation split or model selection "
            "on the nodes); pass validation=False"
        )


def node_of(users: np.ndarray, num_nodes: int) -> np.ndarray:
    """The partition id of the node hosting each user."""
    return np.asarray(users, dtype=np.int64) % num_nodes


def _initial_model(config: FedNCFConfig, num_users: int, num_items: int):
    """The seeded initial NCF, exactly as the in-process trainer builds it."""
    generator = torch.Generator().manual_seed(config.seed)
    return NCF(config.model, num_users=num_users, num_items=num_items, generator=generator)


#: ``synthetic-<U>``: U synthetic users shaped like ML-100K, built in memory in every process
#: (:func:`fedrec.envs.datasets.synthetic_clients.synthetic_clients`, seed 0); no evaluation.
SYNTHETIC_PREFIX = "synthetic-"


class _Shard:
    """The data a node trains from (the users' private rows live in ``Context.state``)."""

    def __init__(self, dataset: str, data_dir: str | None) -> None:
        if dataset.startswith(SYNTHETIC_PREFIX):
            self.clients = synthetic_clients(_synthetic_users(dataset), seed=0)
            self.num_users = len(self.clients.train_indptr) - 1
        else:
            data = load_prepared(dataset, data_dir)
            self.clients = ClientData.of(data)
            self.num_users = data.num_users
        self.num_items = self.clients.num_items


def _synthetic_users(dataset: str) -> int:
    users = dataset.removeprefix(SYNTHETIC_PREFIX)
    if not users.isdigit() or int(users) < 1:
        raise ValueError(f"a synthetic population is named synthetic-<users>, got {dataset!r}")
    return int(users)


def peak_rss_mib() -> float:
    """This process's peak resident set size (``VmHWM``; 0 where ``/proc`` is missing)."""
    status = Path("/proc/self/status")
    if not status.is_file():
        return 0.0
    for line in status.read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@functools.cache
def _shard(dataset: str, data_dir: str | None) -> _Shard:
    """The node process's loaded data, loaded once per process."""
    return _Shard(dataset, data_dir)
