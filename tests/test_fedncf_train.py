"""FedNCF training: local sampling, batched == per-client reference, units, learning, the bench."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrec.agents.logged_baselines import RandomAgent
from fedrec.agents.ncf import NCF, NCFConfig
from fedrec.cli import main
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.envs.datasets.synthetic import synthetic_log, write_ml100k, write_synthetic
from fedrec.eval.ranking_metrics import evaluate_ranking_agent
from fedrec.train.fedncf import (
    CentralConfig,
    ClientData,
    FedNCFConfig,
    round_rng,
    sample_round,
    train_centralised,
    train_federated,
    train_round_batched,
    train_round_reference,
)


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 users x 300 items (2 of them too sparse and filtered)."""
    root = tmp_path_factory.mktemp("fedncf-small")
    write_synthetic("ml-100k", root / "ml-100k")
    return root


@pytest.fixture(scope="module")
def medium_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 users x 300 items with Zipf-like popularity: enough users for stable HR@10."""
    root = tmp_path_factory.mktemp("fedncf-medium")
    write_ml100k(root / "ml-100k", synthetic_log(num_users=200, num_items=300, seed=0))
    return root


def test_local_samples_follow_the_protocol(small_dir: Path) -> None:
    data = load_prepared("ml-100k", small_dir)
    clients = ClientData.of(data)
    users = np.array([0, 4, 9, 17])
    samples = sample_round(clients, users, round_rng(0, 5), num_negatives=4, local_epochs=2)
    for k, user in enumerate(users):
        train = np.sort(clients.train_of(user))
        positives = set(data.positives(user).tolist())  # includes the held-out item
        epochs = samples.client_epochs(k)
        assert len(epochs) == 2
        for items, labels in epochs:
            assert len(items) == 5 * len(train) == samples.samples[k]
            np.testing.assert_array_equal(np.sort(items[labels == 1]), train)
            assert not positives & set(items[labels == 0].tolist())
        assert not np.array_equal(epochs[0][0], epochs[1][0])  # fresh negatives and order
    again = sample_round(clients, users, round_rng(0, 5), num_negatives=4, local_epochs=2)
    np.testing.assert_array_equal(samples.items, again.items)


@pytest.mark.parametrize("model", ["gmf", "mlp", "neumf"])
def test_batched_round_equals_per_client_reference(model: str, small_dir: Path) -> None:
    data = load_prepared("ml-100k", small_dir)
    clients = ClientData.of(data)
    config = NCFConfig(model=model)
    net = NCF(
        config,
        num_users=data.num_users,
        num_items=data.num_items,
        generator=torch.Generator().manual_seed(1),
    )
    users = np.array([1, 2, 6, 11, 23, 30])  # different sizes: clients finish at different steps
    samples = sample_round(clients, users, round_rng(2, 0), num_negatives=4, local_epochs=2)
    kwargs = {
        "round_samples": samples,
        "user_rows": net.user_table()[torch.from_numpy(users)],
        "items": net.item_table(),
        "network": net.network_vector(),
        "lr": 1e-2,  # large steps make any divergence visible
        "batch_size": 8,
    }
    batched, batched_rows = train_round_batched(config, **kwargs)
    reference, reference_rows = train_round_reference(config, **kwargs)
    position = {int(u): k for k, u in enumerate(reference.clients)}
    perm = torch.tensor([position[int(u)] for u in batched.clients])
    np.testing.assert_array_equal(batched.num_samples, reference.num_samples[perm.numpy()])
    assert torch.equal(batched.touched(), reference.touched()[perm])
    torch.testing.assert_close(batched.network, reference.network[perm], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(
        batched.item_tables(kwargs["items"]),
        reference.item_tables(kwargs["items"])[perm],
        atol=2e-5,
        rtol=1e-4,
    )
    torch.testing.assert_close(batched_rows, reference_rows, atol=2e-5, rtol=1e-4)
    moved = (batched.network - kwargs["network"]).abs().max()
    assert moved > 1e-2  # training really happened


def test_units_and_participation(small_dir: Path) -> None:
    data = load_prepared("ml-100k", small_dir)
    config = FedNCFConfig(global_rounds=2, clients_per_round=15, eval_every=1)
    assert config.rounds_per_global(data.num_users) == 3  # 38 users / 15 per round
    result = train_federated(dataset="ml-100k", data_dir=small_dir, config=config, progress=False)
    assert [p.global_round for p in result.history] == [1.0, 2.0]
    assert [p.aggregation_round for p in result.history] == [3, 6]
    assert len(result.client_samples) == 2 * data.num_users  # every user once per global round
    by_rounds = FedNCFConfig(aggregation_rounds=4, clients_per_round=15, eval_every=1)
    result = train_federated(
        dataset="ml-100k", data_dir=small_dir, config=by_rounds, progress=False
    )
    assert [p.aggregation_round for p in result.history] == [3, 4]
    assert result.history[-1].global_round == pytest.approx(4 / 3)


def test_training_is_reproducible(small_dir: Path) -> None:
    def run(seed: int) -> list[float]:
        config = FedNCFConfig(
            global_rounds=2, clients_per_round=10, eval_every=1, seed=seed, lr=1e-2
        )
        result = train_federated(
            dataset="ml-100k", data_dir=small_dir, config=config, progress=False
        )
        return [v for p in result.history for v in (p.hit_rate, p.ndcg)] + [
            float(result.model.network_vector().sum())
        ]

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_batched_and_reference_simulations_train_the_same_model(small_dir: Path) -> None:
    results = {}
    for simulation in ("batched", "reference"):
        config = FedNCFConfig(
            model=NCFConfig(model="neumf"),
            global_rounds=1,
            clients_per_round=10,
            lr=1e-2,
            simulation=simulation,
        )
        results[simulation] = train_federated(
            dataset="ml-100k", data_dir=small_dir, config=config, progress=False
        )
    a, b = results["batched"].model, results["reference"].model
    torch.testing.assert_close(a.network_vector(), b.network_vector(), atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(a.item_table(), b.item_table(), atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(a.user_table(), b.user_table(), atol=1e-4, rtol=1e-3)


def test_federated_and_centralised_beat_random(medium_dir: Path) -> None:
    random = evaluate_ranking_agent(
        "fedrec/MovieLens100K-v0", RandomAgent(slate_size=10, seed=0), data_dir=medium_dir
    ).hit_rate
    fed = train_federated(
        dataset="ml-100k",
        data_dir=medium_dir,
        config=FedNCFConfig(global_rounds=8, clients_per_round=20, lr=1e-2, eval_every=0),
        progress=False,
    )
    central = train_centralised(
        dataset="ml-100k",
        data_dir=medium_dir,
        config=CentralConfig(epochs=2, lr=1e-2, eval_every=0),
        progress=False,
    )
    assert fed.final.hit_rate > random + 0.15
    assert central.final.hit_rate > random + 0.15


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"aggregator": "median"}, "aggregator must be"),
        ({"clients_per_round": 0}, "clients_per_round"),
        ({"global_rounds": 0}, "global_rounds"),
        ({"aggregation_rounds": 0}, "aggregation_rounds"),
        ({"lr": 0.0}, "lr must be"),
        ({"simulation": "loop"}, "simulation must be"),
    ],
)
def test_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FedNCFConfig(**kwargs)


def test_bench_quick_run_prints_tables_and_caches(
    small_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench"
    argv = ["bench", "fedncf", "--quick", "--data-dir", str(small_dir), "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for title in ("table 5", "table 6", "table 7", "table 8", "MF-FedAvg"):
        assert title in text
    summary = json.loads((out / "results.json").read_text())
    assert set(summary["models"]["gmf"]["federated"]) == {"simpleavg", "fedavg", "mf-fedavg"}
    assert summary["secagg"]["gmf"]["max_abs_deviation"] < 1e-5
    assert (out / "fedncf_gmf_convergence.png").stat().st_size > 0
    assert main(argv) == 0
    assert "cached" in capsys.readouterr().out
