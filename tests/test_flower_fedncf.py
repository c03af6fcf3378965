"""FedNCF on Flower: on the simulation engine and on a real loopback deployment, with one node it
is the in-process run exactly; with several, each node trains only the users it hosts and the
result stays within noise; what a node sends is what a FedNCF client uploads (no user embedding);
Flower's SecAgg+ gives MF-FedAvg's aggregate up to its quantisation; a deployment leaves no
process behind."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from fedrec.envs.datasets.synthetic import write_ml100k
from fedrec.federation.aggregators import ClientUpdates, MFFedAvg
from fedrec.federation.flower_deploy import deploy
from fedrec.federation.flower_fedncf import _combine, node_of, run_deployment, run_simulation
from fedrec.federation.flower_secagg import mf_fedavg_from_sums, secure_vector
from fedrec.train.fedncf import FedNCFConfig, train_federated

CONFIG = FedNCFConfig(global_rounds=3, clients_per_round=10, eval_every=0, seed=0)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("flower-ml100k")
    write_ml100k(root / "ml-100k", seed=0)
    return str(root)


def test_one_node_is_the_in_process_run(data_dir: str) -> None:
    local = train_federated(dataset="ml-100k", data_dir=data_dir, config=CONFIG, progress=False)
    one = run_simulation(dataset="ml-100k", data_dir=data_dir, config=CONFIG, num_nodes=1)
    assert one["users"] == 38 and one["aggregation_rounds"] == 12
    # the same samples, the same batched arithmetic, the same aggregation: the same numbers
    assert one["hit_rate"] == local.final.hit_rate
    assert one["ndcg"] == pytest.approx(local.final.ndcg, abs=1e-12)


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
    with pytest.raises(ValueError, match="SecAgg\\+ is implemented for MF-FedAvg only"):
        run_deployment(data_dir=data_dir, config=FedNCFConfig(aggregator="fedavg"), secure=True)


def _processes_in(folder: Path) -> list[int]:
    """Pids of the processes whose working directory is ``folder`` (what deploy started)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(proc / "cwd")) == folder.resolve():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs Linux /proc")
def test_loopback_deployment_is_the_in_process_run_and_stops_its_processes(
    data_dir: str, tmp_path: Path
) -> None:
    # every user in one aggregation round: a deployment pays seconds per message
    config = FedNCFConfig(global_rounds=1, clients_per_round=38, eval_every=0, seed=0)
    local = train_federated(dataset="ml-100k", data_dir=data_dir, config=config, progress=False)
    logs = tmp_path / "deploy"
    result = run_deployment(
        data_dir=data_dir, config=config, num_nodes=1, timeout=240, log_dir=logs
    )
    assert result["users"] == 38 and result["aggregation_rounds"] == 1
    assert result["hit_rate"] == local.final.hit_rate
    assert result["ndcg"] == pytest.approx(local.final.ndcg, abs=1e-12)
    # a SuperLink, a SuperNode and `flwr run` really ran as processes, and all are gone
    assert {"superlink.log", "supernode0.log", "flwr-run.log"} <= {p.name for p in logs.iterdir()}
    assert _processes_in(logs) == []


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs Linux /proc")
def test_a_failed_deployment_raises_and_leaves_nothing_behind(tmp_path: Path) -> None:
    logs = tmp_path / "failed"
    with pytest.raises(RuntimeError, match="without a result"):
        deploy(
            app="fedrec.federation.no_such_app",
            job=lambda result_path: "{}",
            num_nodes=1,
            timeout=120,
            log_dir=logs,
        )
    assert _processes_in(logs) == []


def _updates(rng: np.random.Generator, clients: int, items: int, width: int) -> ClientUpdates:
    pairs = [(c, i) for c in range(clients) for i in rng.choice(items, 4, replace=False)]
    row_client, row_item = (torch.tensor(column) for column in zip(*pairs, strict=True))
    return ClientUpdates(
        clients=np.arange(clients),
        num_samples=rng.integers(5, 50, clients),
        network=torch.randn(clients, 7),
        row_client=row_client,
        row_item=row_item,
        item_rows=torch.randn(len(pairs), width),
        num_items=items,
    )


def test_secagg_sums_rebuild_mf_fedavg_and_out_of_range_values_are_refused() -> None:
    rng = np.random.default_rng(0)
    nodes = [_updates(rng, clients, 12, 3) for clients in (3, 2)]
    items = torch.randn(12, 3)
    scales = {"net_scale": 1 / (5 * 50), "item_scale": 1 / 5}
    vectors = [secure_vector(u, num_items=12, clip=8.0, **scales) for u in nodes]
    sums = [a + b for a, b in zip(*vectors, strict=True)]
    got_items, got_net = mf_fedavg_from_sums(sums, items=items, **scales)
    want_items, want_net = MFFedAvg().aggregate(
        items=items, network=torch.zeros(7), updates=_combine_updates(nodes)
    )
    assert torch.allclose(got_items, want_items, atol=1e-6)
    assert torch.allclose(got_net, want_net, atol=1e-6)
    with pytest.raises(ValueError, match="clipping range"):
        secure_vector(nodes[0], num_items=12, clip=0.01, **scales)


def _combine_updates(parts: list[ClientUpdates]) -> ClientUpdates:
    return _combine(
        [
            [u.clients, u.num_samples, u.network.numpy(), u.row_client.numpy(),
             u.row_item.numpy(), u.item_rows.numpy()]
            for u in parts
        ],
        num_items=parts[0].num_items,
    )  # fmt: skip


def test_three_nodes_and_secagg_plus_give_the_plain_aggregate(data_dir: str) -> None:
    one_round = FedNCFConfig(aggregation_rounds=1, clients_per_round=10, eval_every=0, seed=0)
    first = run_simulation(data_dir=data_dir, config=one_round, num_nodes=3, return_model=True)
    assert first["users"] == 38  # federated evaluation covers every user once
    secure = run_simulation(
        data_dir=data_dir, config=one_round, num_nodes=3, secure=True, return_model=True
    )
    assert secure["secure"] and secure["dropped_nodes"] == 0
    changed = np.abs(first["items"] - _initial_items(data_dir)).max()
    error = np.abs(first["items"] - secure["items"]).max()
    # SecAgg+ quantises each scaled value to 2 * 8 / 2^30 with 3 nodes: errors below 1e-6 after
    # unscaling, far below the round's own change of the table
    assert 0 < error < 1e-5 < changed
    assert np.abs(first["network"] - secure["network"]).max() < 1e-5


def _initial_items(data_dir: str) -> np.ndarray:
    from fedrec.envs.datasets.catalog import load_prepared
    from fedrec.federation.flower_fedncf import _initial_model

    data = load_prepared("ml-100k", data_dir)
    return _initial_model(FedNCFConfig(seed=0), data.num_users, data.num_items).item_table().numpy()
