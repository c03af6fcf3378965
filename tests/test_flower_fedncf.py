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
from fedrec.federation.flower_secagg import mf_fedavg_from_sums, secure_vector
from fedrec.train.fedncf import FedNCFConfig, train_federated
from fedrec.train.fedncf.flower import (
    _combine,
    node_of,
    run_deployment,
    run_simulation,
    upload_arrays,
)

CONFIG = FedNCFConfig(
    client_optimizer="fresh", global_rounds=3, clients_per_round=10, eval_every=0, seed=0
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("flower-ml100k")
    write_ml100k(root / "ml-100k", seed=0)
    return str(root)


# One node is the in-process run (the same HR@10 and NDCG@10): the example of docs/flower.md
# asserts it, and tests/test_docs.py runs it (one Ray start, not two).


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
            data_dir=data_dir,
            config=FedNCFConfig(client_optimizer="fresh", aggregator="mf-secavg", global_rounds=1),
        )
    with pytest.raises(ValueError, match="num_nodes"):
        run_simulation(data_dir=data_dir, config=CONFIG, num_nodes=0)
    with pytest.raises(ValueError, match="SecAgg\\+ is implemented for MF-FedAvg only"):
        run_deployment(
            data_dir=data_dir,
            config=FedNCFConfig(client_optimizer="fresh", aggregator="fedavg"),
            secure=True,
        )


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
    config = FedNCFConfig(
        client_optimizer="fresh", global_rounds=1, clients_per_round=38, eval_every=0, seed=0
    )
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
    return _combine([upload_arrays(u) for u in parts], num_items=parts[0].num_items)


def test_three_nodes_with_secagg_plus_give_the_plain_aggregate(data_dir: str) -> None:
    config = FedNCFConfig(
        client_optimizer="fresh", aggregation_rounds=1, clients_per_round=10, eval_every=0, seed=0
    )
    secure = run_simulation(
        data_dir=data_dir, config=config, num_nodes=3, secure=True, return_model=True
    )
    assert secure["users"] == 38  # federated evaluation covers every user once
    assert secure["secure"] and secure["dropped_nodes"] == 0
    items, network = _plain_first_round(data_dir, config, num_nodes=3)
    changed = np.abs(items.numpy() - _initial_items(data_dir)).max()
    error = np.abs(items.numpy() - secure["items"]).max()
    # SecAgg+ quantises each scaled value to 2 * 8 / 2^30 with 3 nodes: errors below 1e-6 after
    # unscaling, far below the round's own change of the table
    assert 0 < error < 1e-5 < changed
    assert np.abs(network.numpy() - secure["network"]).max() < 1e-5


def _plain_first_round(data_dir: str, config: FedNCFConfig, *, num_nodes: int):
    """MF-FedAvg's (items, network) after the first aggregation round, each node's users trained
    as its ClientApp trains them (its own stream), summed in the clear."""
    from fedrec.envs.datasets.catalog import load_prepared
    from fedrec.train.fedncf import ClientData, sample_round, train_round_batched
    from fedrec.train.fedncf.flower import _initial_model

    data = load_prepared("ml-100k", data_dir)
    clients = ClientData.of(data)
    model = _initial_model(config, data.num_users, data.num_items)
    items, network, table = model.item_table(), model.network_vector(), model.user_table()
    order = np.random.default_rng([config.seed, 1]).permutation(data.num_users)
    users = np.sort(np.array_split(order, config.rounds_per_global(data.num_users))[0])
    parts = []
    for pid in np.unique(node_of(users, num_nodes)).tolist():
        mine = users[node_of(users, num_nodes) == pid]
        samples = sample_round(
            clients,
            mine,
            np.random.default_rng([config.seed, 3, 0, pid]),
            num_negatives=config.num_negatives,
            local_epochs=config.local_epochs,
        )
        updates, _ = train_round_batched(
            config.model,
            round_samples=samples,
            user_rows=table[torch.from_numpy(mine)],
            items=items,
            network=network,
            lr=config.lr,
            batch_size=config.batch_size,
        )
        parts.append(upload_arrays(updates))
    return MFFedAvg().aggregate(
        items=items, network=network, updates=_combine(parts, data.num_items)
    )


def _initial_items(data_dir: str) -> np.ndarray:
    from fedrec.envs.datasets.catalog import load_prepared
    from fedrec.train.fedncf.flower import _initial_model

    data = load_prepared("ml-100k", data_dir)
    return (
        _initial_model(
            FedNCFConfig(client_optimizer="fresh", seed=0), data.num_users, data.num_items
        )
        .item_table()
        .numpy()
    )
