"""One round per federated method: every field of FedNCFConfig and of FEL's FedConfig is either
honoured by the Flower apps (a one-node run is the in-process trainer's run: same final model)
or refused with an error naming the field. The apps run here on an in-memory grid (each node's
ClientApp called in this process), so every field costs a second, not a Ray start."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedrec.agents.ncf import NCFConfig
from fedrec.envs.datasets.synthetic import write_ml100k
from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups
from fedrec.train.fedncf import FedNCFConfig, train_federated
from fedrec.train.fel import DPConfig, FedConfig, LeafConfig

pytest.importorskip("flwr")

from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedrec.train.fedncf import flower as flower_fedncf
from fedrec.train.fel import flower as flower_fel


class LocalGrid:
    """Flower's ``Grid`` in one process: node ``p`` is the ClientApp called with its own
    ``Context`` (partition id ``p``, state kept between messages)."""

    pull_interval = 0.0

    def __init__(self, client_app: Any, num_nodes: int) -> None:
        self.app = client_app
        self.contexts = {
            100 + p: Context(
                run_id=1,
                node_id=100 + p,
                node_config={"partition-id": p, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config={},
            )
            for p in range(num_nodes)
        }

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: list[Message], timeout: float | None = None) -> list:
        return [self.app(m, self.contexts[m.metadata.dst_node_id]) for m in messages]


@pytest.fixture(autouse=True)
def task_identity() -> Iterator[None]:
    """What Flower's engine sets before a ServerApp builds messages (restored after)."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _serve(module: Any, job: Any, num_nodes: int) -> dict[str, Any]:
    server, client = module.make_server_app(job), module.make_client_app(job)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    server(LocalGrid(client, num_nodes), context)
    return json.loads(Path(job.result_path).read_text())


# ------------------------------------------------------------------------------------------------
# FedNCF

BASE = FedNCFConfig(
    client_optimizer="fresh", eval_every=0, global_rounds=1, clients_per_round=10, seed=0
)

#: Every FedNCFConfig field: a value other than BASE's that Flower honours, or refuses.
FEDNCF_HONOURED: dict[str, Any] = {
    "model": NCFConfig(model="mlp"),
    "aggregator": "fedavg",
    "global_rounds": 2,
    "aggregation_rounds": 3,
    "clients_per_round": 19,
    "local_epochs": 1,
    "batch_size": 16,
    "lr": 5e-3,
    "num_negatives": 2,
    "top_k": 5,
    "seed": 3,
    "simulation": "reference",
    "selection": "cohorts",
}
FEDNCF_REFUSED: dict[str, Any] = {
    "client_optimizer": "federated",
    "eval_every": 1,
    "validation": True,
}


@pytest.fixture(scope="module")
def ml_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("rounds-ml100k")
    write_ml100k(root / "ml-100k", seed=0)
    return str(root)


def test_every_fedncf_field_is_listed() -> None:
    fields = {f.name for f in dataclasses.fields(FedNCFConfig)}
    assert set(FEDNCF_HONOURED) | set(FEDNCF_REFUSED) == fields
    assert not set(FEDNCF_HONOURED) & set(FEDNCF_REFUSED)


@pytest.mark.parametrize("field", sorted(FEDNCF_HONOURED))
def test_a_fedncf_field_flower_honours_gives_the_in_process_run(
    field: str, ml_dir: str, tmp_path: Path
) -> None:
    extra = {"global_rounds": 2} if field == "selection" else {}  # cohorts differ from round 2
    config = dataclasses.replace(BASE, **{field: FEDNCF_HONOURED[field]}, **extra)
    flower_fedncf.check_supported(config, 1)
    job = flower_fedncf.FedNCFJob("ml-100k", ml_dir, config, 1, str(tmp_path / "r.json"))
    result = _serve(flower_fedncf, job, 1)
    local = train_federated(dataset="ml-100k", data_dir=ml_dir, config=config, progress=False)
    with np.load(job.result_path + ".model.npz") as model:  # one node: bit for bit
        np.testing.assert_array_equal(model["items"], local.model.item_table().numpy())
        np.testing.assert_array_equal(model["network"], local.model.network_vector().numpy())
    assert result["hit_rate"] == pytest.approx(local.final.hit_rate, abs=1e-12)
    assert result["ndcg"] == pytest.approx(local.final.ndcg, abs=1e-9)


def test_two_nodes_with_cohorts_and_reference_clients_train_each_user_once(
    ml_dir: str, tmp_path: Path
) -> None:
    config = dataclasses.replace(BASE, selection="cohorts", simulation="reference")
    job = flower_fedncf.FedNCFJob("ml-100k", ml_dir, config, 2, str(tmp_path / "r.json"))
    result = _serve(flower_fedncf, job, 2)
    local = train_federated(dataset="ml-100k", data_dir=ml_dir, config=config, progress=False)
    assert result["users"] == 38 and result["aggregation_rounds"] == 4
    # each node draws its own users' negatives: the same model up to that noise
    with np.load(job.result_path + ".model.npz") as model:
        assert np.abs(model["items"] - local.model.item_table().numpy()).max() < 0.05


@pytest.mark.parametrize("field", sorted(FEDNCF_REFUSED))
def test_a_fedncf_field_flower_does_not_run_is_refused_by_name(field: str, ml_dir: str) -> None:
    config = dataclasses.replace(BASE, **{field: FEDNCF_REFUSED[field]})
    with pytest.raises(ValueError, match=f"^{field}.*not available on Flower"):
        flower_fedncf.run_simulation(data_dir=ml_dir, config=config, num_nodes=1)


def test_flower_runs_without_a_configuration() -> None:
    flower_fedncf.check_supported(flower_fedncf.FLOWER_DEFAULTS, 1)


# ------------------------------------------------------------------------------------------------
# FEL

FEL_BASE = FedConfig(rounds=2, sample_rate=0.2, seed=0)

#: Every field of FedConfig, LeafConfig and DPConfig (``dp.*``): a value Flower honours.
FEL_HONOURED: dict[str, dict[str, Any]] = {
    "leaf": {"leaf": LeafConfig(embedding_dim=4, hidden=3, init_std=0.1)},
    "rounds": {"rounds": 3},
    "sample_rate": {"sample_rate": 0.35},
    "local_epochs": {"local_epochs": 2},
    "batch_size": {"batch_size": 5},
    "client_lr": {"client_lr": 0.2},
    "server_lr": {"server_lr": 0.7},
    "dp": {"dp": DPConfig(clip_norm=0.5, noise_multiplier=1.0)},
    "seed": {"seed": 4},
    "fill_empty_clusters": {"fill_empty_clusters": False, "sample_rate": 0.02},
    "leaf.embedding_dim": {"leaf": LeafConfig(embedding_dim=3, hidden=2)},
    "leaf.hidden": {"leaf": LeafConfig(hidden=5)},
    "leaf.init_std": {"leaf": LeafConfig(hidden=2, init_std=0.3)},
    "dp.clip_norm": {"dp": DPConfig(clip_norm=0.1, noise_multiplier=0.5)},
    "dp.noise_multiplier": {"dp": DPConfig(noise_multiplier=2.0)},
    "dp.target_epsilon": {"dp": DPConfig(target_epsilon=8.0)},
    "dp.delta": {"dp": DPConfig(target_epsilon=8.0, delta=1e-3)},
}


@pytest.fixture(scope="module")
def fel_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("rounds-fel")
    return str(write_taobao_groups(path, num_users=200, num_ads=60, ctr=0.1, seed=0))


def test_every_fel_field_is_listed() -> None:
    fields = {f.name for f in dataclasses.fields(FedConfig)}
    fields |= {f"leaf.{f.name}" for f in dataclasses.fields(LeafConfig)}
    fields |= {f"dp.{f.name}" for f in dataclasses.fields(DPConfig)}
    assert set(FEL_HONOURED) == fields


@pytest.mark.parametrize("field", sorted(FEL_HONOURED))
def test_a_fel_field_flower_honours_gives_the_in_process_leaves(
    field: str, fel_dir: str, tmp_path: Path
) -> None:
    config = dataclasses.replace(FEL_BASE, **FEL_HONOURED[field])
    clustering = flower_fel.FELClustering("feature", features=("final_gender_code", "age_level"))
    job = flower_fel.FELJob(
        "taobao-synthetic", fel_dir, clustering, config, 1, str(tmp_path / "r.json"),
        over_arch_iterations=2,
    )  # fmt: skip
    result = _serve(flower_fel, job, 1)
    local = flower_fel.run_in_process(
        data_dir=fel_dir, clustering=clustering, config=config, over_arch_iterations=2
    )
    assert result["leaves_sha256"] == local["leaves_sha256"]  # bit for bit
