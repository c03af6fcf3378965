"""FedNCF on Flower's simulation engine: with one node it is the in-process run exactly; with
several, each node trains only the users it hosts and the result stays within noise; what a node
sends is what a FedNCF client uploads (no user embedding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from fedrec.envs.datasets.synthetic import write_ml100k
from fedrec.federation.flower_fedncf import _combine, node_of, run_simulation
from fedrec.train.fedncf import FedNCFConfig, train_federated

CONFIG = FedNCFConfig(global_rounds=3, clients_per_round=10, eval_every=0, seed=0)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("flower-ml100k")
    write_ml100k(root / "ml-100k", seed=0)
    return str(root)


def test_one_node_is_the_in_process_run_and_two_nodes_stay_close(data_dir: str) -> None:
    local = train_federated(dataset="ml-100k", data_dir=data_dir, config=CONFIG, progress=False)
    one = run_simulation(dataset="ml-100k", data_dir=data_dir, config=CONFIG, num_nodes=1)
    assert one["users"] == 38 and one["aggregation_rounds"] == 12
    # the same samples, the same batched arithmetic, the same aggregation: the same numbers
    assert one["hit_rate"] == local.final.hit_rate
    assert one["ndcg"] == pytest.approx(local.final.ndcg, abs=1e-12)
    two = run_simulation(dataset="ml-100k", data_dir=data_dir, config=CONFIG, num_nodes=2)
    assert two["users"] == 38  # federated evaluation covers every user once
    assert abs(two["hit_rate"] - local.final.hit_rate) <= 0.1
    assert abs(two["ndcg"] - local.final.ndcg) <= 0.05


def test_users_are_sharded_and_uploads_combine_in_order() -> None:
    users = np.arange(10)
    assert node_of(users, 3).tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    width, net = 4, 5
    part = lambda clients, rows: [  # noqa: E731
        np.asarray(clients),
        np.full(len(clients), 7),
        np.ones((len(clients), net), np.float32),
        np.repeat(np.arange(len(clients)), rows),
        np.arange(len(clients) * rows) % 6,
        np.ones((len(clients) * rows, width), np.float32),
    ]
    combined = _combine([part([0, 2], 2), part([1], 3)], num_items=6)
    assert combined.clients.tolist() == [0, 2, 1]
    # the second node's rows point at its clients' places in the combined round
    assert combined.row_client.tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert combined.network.shape == (3, net) and combined.item_rows.dtype == torch.float32


def test_unsupported_settings_are_refused(data_dir: str) -> None:
    with pytest.raises(ValueError, match="not available on Flower"):
        run_simulation(
            data_dir=data_dir, config=FedNCFConfig(aggregator="mf-secavg", global_rounds=1)
        )
    with pytest.raises(ValueError, match="num_nodes"):
        run_simulation(data_dir=data_dir, config=CONFIG, num_nodes=0)
