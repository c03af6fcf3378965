"""FedNCF models, the ranking agent and the plain aggregators (SimpleAvg, FedAvg, MF-FedAvg)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrec.agents.fedncf_agent import NCFRankingAgent
from fedrec.agents.ncf import NCF, NCFConfig
from fedrec.envs.datasets.synthetic import write_synthetic
from fedrec.federation.aggregators import (
    ClientUpdates,
    FedAvg,
    MFFedAvg,
    SimpleAvg,
)
from fedrec.federation.registry import make_aggregator
from fedrec.train.fedncf import evaluate_model


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fedncf")
    write_synthetic("ml-100k", root / "ml-100k")
    return root


def test_layer_reading_a_sizes() -> None:
    mlp = NCFConfig(model="mlp")
    assert mlp.layer_shapes() == [(48, 24), (24, 48), (12, 24), (6, 12)]
    assert mlp.network_size == 2761  # docs/fedncf.md §7, reading A
    assert NCFConfig(model="gmf").network_size == 13
    neumf = NCFConfig(model="neumf")
    assert neumf.head_inputs == 18 and neumf.item_width == 24
    assert neumf.network_size == 2754 + 19
    ratio = mlp.forward_flops() / NCFConfig(model="gmf").forward_flops()
    assert ratio > 50  # the MLP tower dominates the client's compute


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"model": "ncf"}, "model must be"),
        ({"latent_dim": 0}, "latent_dim"),
        ({"model": "mlp", "hidden": ()}, "hidden"),
    ],
)
def test_config_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NCFConfig(**kwargs)


def test_xavier_initialisation_is_seeded() -> None:
    config = NCFConfig(model="neumf")
    a = NCF(config, num_users=50, num_items=80, generator=torch.Generator().manual_seed(3))
    b = NCF(config, num_users=50, num_items=80, generator=torch.Generator().manual_seed(3))
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    bound = math.sqrt(6 / (80 + 12))
    items = a.item_gmf.weight.detach()  # type: ignore[union-attr]
    assert float(items.abs().max()) <= bound and float(items.abs().max()) > 0.8 * bound
    assert all(not layer.bias.detach().any() for layer in [*a.mlp, a.head])


@pytest.mark.parametrize("model", ["gmf", "mlp", "neumf"])
def test_federated_layout_round_trip(model: str) -> None:
    config = NCFConfig(model=model)
    net = NCF(config, num_users=5, num_items=9)
    users, items = torch.randn(5, config.item_width), torch.randn(9, config.item_width)
    network = torch.randn(config.network_size)
    net.load_federated(user_table=users, item_table=items, network=network)
    assert torch.equal(net.user_table(), users)
    assert torch.equal(net.item_table(), items)
    assert torch.equal(net.network_vector(), network)
    with pytest.raises(ValueError, match="network has"):
        net.load_federated(network=torch.zeros(3))


def test_agent_ranks_candidates_by_score(data_dir: Path) -> None:
    config = NCFConfig(model="gmf")
    model = NCF(config, num_users=3, num_items=20, generator=torch.Generator().manual_seed(0))
    agent = NCFRankingAgent(model, slate_size=4, seed=0)
    obs = {
        "user_id": np.array([[0], [2]]),
        "candidate_ids": np.array([np.arange(10), np.arange(10, 20)]),
    }
    scores = agent.scores(obs)
    ranking = agent.act_batch(obs)
    assert ranking.shape == (2, 4) and ranking.dtype == np.int64
    np.testing.assert_array_equal(ranking, np.argsort(-scores, axis=1)[:, :4])
    with pytest.raises(ValueError, match="outside"):
        agent.act_batch({"user_id": np.array([[5]]), "candidate_ids": np.arange(10)[None]})


def test_untrained_model_evaluates_through_the_env(data_dir: Path) -> None:
    from fedrec.envs.datasets.catalog import load_prepared

    data = load_prepared("ml-100k", data_dir)
    model = NCF(NCFConfig(), num_users=data.num_users, num_items=data.num_items)
    result = evaluate_model(model, dataset="ml-100k", data_dir=data_dir)
    assert result.users == data.num_users and result.k == 10
    assert 0.0 <= result.ndcg <= result.hit_rate <= 1.0


# -- aggregators ----------------------------------------------------------------------------------


def _updates(
    rows: dict[int, dict[int, list[float]]], samples: list[int], network: torch.Tensor, items: int
) -> ClientUpdates:
    row_client, row_item, values = [], [], []
    for client, touched in rows.items():
        for item, value in touched.items():
            row_client.append(client)
            row_item.append(item)
            values.append(value)
    return ClientUpdates(
        clients=np.arange(len(samples)),
        num_samples=np.asarray(samples),
        network=network,
        row_client=torch.tensor(row_client, dtype=torch.int64),
        row_item=torch.tensor(row_item, dtype=torch.int64),
        item_rows=torch.tensor(values, dtype=torch.float64).reshape(len(values), -1),
        num_items=items,
    )


def test_paper_worked_example() -> None:
    """Global 0.04; one of two clients (47% of the samples) moves it to 0.047 (docs §3)."""
    items = torch.tensor([[0.04]], dtype=torch.float64)
    network = torch.zeros(2, 1, dtype=torch.float64)
    updates = _updates({0: {0: [0.047]}}, [47, 53], network, 1)
    results = {
        agg.name: float(agg.aggregate(items=items, network=network[0], updates=updates)[0])
        for agg in (SimpleAvg(), FedAvg(), MFFedAvg())
    }
    assert results["mf-fedavg"] == pytest.approx(0.047)
    assert results["simpleavg"] == pytest.approx(0.0435)
    assert results["fedavg"] == pytest.approx(0.0433, abs=1e-4)


def _random_updates(seed: int, clients: int = 5, items: int = 12, width: int = 3) -> ClientUpdates:
    rng = np.random.default_rng(seed)
    touched = rng.random((clients, items)) < 0.4
    touched[:, -1] = False  # an item nobody touched
    row_client, row_item = np.nonzero(touched)
    return ClientUpdates(
        clients=np.arange(clients) + 100,
        num_samples=rng.integers(5, 50, clients),
        network=torch.from_numpy(rng.standard_normal((clients, 7))),
        row_client=torch.from_numpy(row_client),
        row_item=torch.from_numpy(row_item),
        item_rows=torch.from_numpy(rng.standard_normal((len(row_client), width))),
        num_items=items,
    )


def test_aggregators_match_the_dense_formulas() -> None:
    updates = _random_updates(0)
    items = torch.from_numpy(np.random.default_rng(1).standard_normal((12, 3)))
    network = torch.zeros(7, dtype=torch.float64)
    tables = updates.item_tables(items)  # (C, I, E), global rows where untouched
    mask = updates.touched()
    n = torch.as_tensor(updates.num_samples, dtype=torch.float64)
    w = n / n.sum()

    got_items, got_net = SimpleAvg().aggregate(items=items, network=network, updates=updates)
    torch.testing.assert_close(got_items, tables.mean(0))
    torch.testing.assert_close(got_net, updates.network.mean(0))

    got_items, got_net = FedAvg().aggregate(items=items, network=network, updates=updates)
    torch.testing.assert_close(got_items, (w[:, None, None] * tables).sum(0))
    torch.testing.assert_close(got_net, (w[:, None] * updates.network).sum(0))

    got_items, got_net = MFFedAvg().aggregate(items=items, network=network, updates=updates)
    counts = mask.sum(0)
    expected = torch.where(
        counts[:, None] > 0,
        (mask[..., None] * tables).sum(0) / counts.clamp(min=1)[:, None],
        items,
    )
    torch.testing.assert_close(got_items, expected)
    torch.testing.assert_close(got_items[-1], items[-1])  # untouched row kept exactly
    torch.testing.assert_close(got_net, (w[:, None] * updates.network).sum(0))


def test_subset_keeps_the_chosen_clients() -> None:
    updates = _random_updates(2)
    part = updates.subset(np.array([1, 3]))
    assert list(part.clients) == [101, 103]
    full = updates.touched()
    assert torch.equal(part.touched(), full[[1, 3]])
    items = torch.zeros(12, 3, dtype=torch.float64)
    assert torch.equal(part.item_tables(items), updates.item_tables(items)[[1, 3]])


def test_update_validation_and_names() -> None:
    updates = _random_updates(3)
    with pytest.raises(ValueError, match="num_samples must be positive"):
        ClientUpdates(**{**updates.__dict__, "num_samples": np.zeros(5, int)})
    with pytest.raises(ValueError, match="one entry per client"):
        ClientUpdates(**{**updates.__dict__, "network": updates.network[:2]})
    with pytest.raises(ValueError, match="unknown aggregator"):
        make_aggregator("median")
    assert make_aggregator("MF-FedAvg").name == "mf-fedavg"
    assert make_aggregator("mf-secavg").name == "mf-secavg"
