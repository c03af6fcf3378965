"""FedNCF training: local sampling, batched == per-client reference, units, learning, the bench."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedrec.agents.logged_baselines import RandomAgent
from fedrec.agents.ncf import NCF, NCFConfig, make_optimizers
from fedrec.cli import main
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.envs.datasets.synthetic import synthetic_log, write_ml100k, write_synthetic
from fedrec.eval.ranking_metrics import evaluate_ranking_agent
from fedrec.federation.aggregators import ClientUpdates
from fedrec.federation.registry import make_aggregator
from fedrec.train.fedncf import (
    CentralConfig,
    ClientData,
    ClientOptimizerStore,
    FedNCFConfig,
    TrainResult,
    round_rng,
    sample_round,
    train_centralised,
    train_federated,
    train_round_batched,
    train_round_compiled,
    train_round_reference,
)
from fedrec.train.fedncf.sampling import _shuffle_order
from fedrec.train.fedncf.simulate_batched import _BatchedNetwork


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


def _seeded_net(config: NCFConfig, data) -> NCF:
    return NCF(
        config,
        num_users=data.num_users,
        num_items=data.num_items,
        generator=torch.Generator().manual_seed(1),
    )


@pytest.mark.parametrize(
    "simulate", [train_round_batched, train_round_compiled], ids=["batched", "compiled"]
)
@pytest.mark.parametrize("model", ["gmf", "mlp", "neumf"])
def test_batched_round_equals_per_client_reference(
    model: str, simulate: Callable, small_dir: Path
) -> None:
    data = load_prepared("ml-100k", small_dir)
    clients = ClientData.of(data)
    config = NCFConfig(model=model)
    net = _seeded_net(config, data)
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
    batched, batched_rows = simulate(config, **kwargs)
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


def test_shuffle_order_is_the_argsort_of_the_keys() -> None:
    """sample_round's shuffle sorts each client's keys apart: the same permutation as one
    np.argsort of all keys, and np.argsort itself when keys tie."""
    rng = np.random.default_rng(0)
    sizes = np.array([5, 1, 9, 3])
    # positives of every client, then negatives of every client (sample_round's pool)
    owner = np.concatenate([np.repeat(np.arange(4), sizes), np.repeat(np.arange(4), 2 * sizes)])
    by_owner = np.argsort(owner, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(3 * sizes)]).tolist()
    for _ in range(20):
        keys = owner + rng.random(len(owner))
        np.testing.assert_array_equal(_shuffle_order(keys, by_owner, bounds), np.argsort(keys))
        tied = owner + np.floor(rng.random(len(owner)) * 3) / 3  # equal keys: the fallback
        np.testing.assert_array_equal(_shuffle_order(tied, by_owner, bounds), np.argsort(tied))


@pytest.mark.parametrize(
    "simulate", [train_round_batched, train_round_compiled], ids=["batched", "compiled"]
)
def test_batched_round_with_single_columns_equals_reference(
    simulate: Callable, small_dir: Path
) -> None:
    """Embeddings and a last layer 1 wide (their batch sums are taken apart), and one engine
    reused by a later, smaller round (its arrays are kept)."""
    data = load_prepared("ml-100k", small_dir)
    clients = ClientData.of(data)
    config = NCFConfig(model="neumf", latent_dim=1, hidden=(4, 1))
    net = _seeded_net(config, data)
    engine = _BatchedNetwork(config)
    for r, users in enumerate([np.array([1, 2, 6, 11, 23, 30]), np.array([3, 5])]):
        kwargs = {
            "round_samples": sample_round(
                clients, users, round_rng(2, r), num_negatives=4, local_epochs=2
            ),
            "user_rows": net.user_table()[torch.from_numpy(users)],
            "items": net.item_table(),
            "network": net.network_vector(),
            "lr": 1e-2,
            "batch_size": 8,
        }
        extra = {"engine": engine} if simulate is train_round_batched else {}
        batched = simulate(config, **kwargs, **extra)
        _assert_same_round(batched, train_round_reference(config, **kwargs), kwargs["items"])
        assert (batched[0].network - kwargs["network"]).abs().max() > 1e-3


def _assert_close_up_to_relu_ties(a: Any, b: Any, *, per_client: bool = False) -> None:
    """Weights (or their Adam moments) agree to float32 rounding, except that a ReLU unit whose
    pre-activation rounds to the other side of 0 in one implementation (BLAS's sgemm against
    torch's matmul; seen with OpenBLAS's Haswell kernel, one client of the MLP test) sends that
    client's network and item rows other steps from then on: at most 1% of the entries may then
    differ, by at most a few Adam steps (lr 1e-3). A wrong equation moves most entries, and far
    more."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    off = np.abs(a - b) > 2e-5 + 1e-4 * np.abs(b)
    if per_client:  # (clients, ...): the tie is one client's, so is what it changes
        clients = off.reshape(len(off), -1).any(axis=1)
        assert clients.sum() <= 1, f"{clients.sum()} clients' uploads differ"
    else:
        assert off.mean() <= 0.01, f"{off.sum()} of {off.size} entries differ"
    np.testing.assert_allclose(a, b, atol=5e-3)


def _assert_same_round(
    batched: tuple[ClientUpdates, torch.Tensor],
    reference: tuple[ClientUpdates, torch.Tensor],
    items: torch.Tensor,
) -> None:
    """The uploads and new private rows of one round agree (clients in either order)."""
    (b, b_rows), (r, r_rows) = batched, reference
    position = {int(u): k for k, u in enumerate(r.clients)}
    perm = torch.tensor([position[int(u)] for u in b.clients])
    np.testing.assert_array_equal(b.num_samples, r.num_samples[perm.numpy()])
    assert torch.equal(b.touched(), r.touched()[perm])
    _assert_close_up_to_relu_ties(b.network, r.network[perm], per_client=True)
    _assert_close_up_to_relu_ties(b.item_tables(items), r.item_tables(items)[perm], per_client=True)
    _assert_close_up_to_relu_ties(b_rows, r_rows, per_client=True)


def _round_kwargs(
    clients: ClientData,
    users: np.ndarray,
    r: int,
    *,
    user_store: torch.Tensor,
    items: torch.Tensor,
    network: torch.Tensor,
) -> dict:
    """One round's arguments for both simulations (large steps make any divergence visible)."""
    return {
        "round_samples": sample_round(
            clients, users, round_rng(2, r), num_negatives=4, local_epochs=2
        ),
        "user_rows": user_store[torch.from_numpy(users)],
        "items": items,
        "network": network,
        "lr": 1e-2,
        "batch_size": 8,
    }


@pytest.mark.parametrize(
    "simulate", [train_round_batched, train_round_compiled], ids=["batched", "compiled"]
)
@pytest.mark.parametrize("model", ["gmf", "mlp", "neumf"])
def test_persistent_client_optimizers_batched_equals_reference(
    model: str, simulate: Callable, small_dir: Path
) -> None:
    data = load_prepared("ml-100k", small_dir)
    clients = ClientData.of(data)
    config = NCFConfig(model=model)
    net = _seeded_net(config, data)
    user_store, items, network = net.user_table(), net.item_table(), net.network_vector()
    shape = {"num_users": data.num_users, "num_items": data.num_items}
    batched_store = ClientOptimizerStore(config, **shape)
    reference_store = ClientOptimizerStore(config, **shape)
    aggregator = make_aggregator("mf-fedavg")
    # 2 and 11 train in every round, 1, 23 and 30 twice: step counts differ between clients
    rounds = [[1, 2, 6, 11, 23, 30], [2, 5, 11, 17, 30], [1, 2, 11, 19, 23]]
    local_steps = np.zeros(data.num_users, np.int64)  # each client's steps so far
    for r, round_users in enumerate(rounds):
        users = np.array(round_users)
        kwargs = _round_kwargs(
            clients, users, r, user_store=user_store, items=items, network=network
        )
        local_steps[users] += 2 * -(-kwargs["round_samples"].samples // 8)  # 2 epochs of 8
        batched = simulate(config, **kwargs, optimizer_store=batched_store)
        reference = train_round_reference(config, **kwargs, optimizer_store=reference_store)
        _assert_same_round(batched, reference, items)
        user_store[torch.from_numpy(users)] = batched[1]  # both go on from the same parameters
        items, network = aggregator.aggregate(items=items, network=network, updates=batched[0])
    # the stored state itself: step counts and moments (SparseAdam's tables alternate user, item)
    assert set(reference_store.torch_states) == {u for users in rounds for u in users}
    for user, (sparse, adam) in reference_store.torch_states.items():
        steps = {
            int(state["step"]) for state in [*sparse["state"].values(), *adam["state"].values()]
        }
        assert steps == {int(batched_store.steps[user])}
        tables = [sparse["state"][i] for i in range(len(sparse["state"]))]
        for moment, lo in (("exp_avg", 0), ("exp_avg_sq", config.item_width)):
            item_moments = torch.cat([t[moment] for t in tables[1::2]], 1)
            user_moments = torch.cat([t[moment] for t in tables[0::2]], 1)[0]
            network_moments = torch.cat([s[moment].reshape(-1) for s in adam["state"].values()])
            dense = batched_store.dense_m if moment == "exp_avg" else batched_store.dense_v
            hi = lo + config.item_width
            torch.testing.assert_close(
                torch.from_numpy(batched_store.item_moments[user, :, lo:hi]),
                item_moments,
                atol=2e-5,
                rtol=1e-4,
            )
            torch.testing.assert_close(
                torch.from_numpy(dense[user]),
                torch.cat([user_moments, network_moments]),
                atol=2e-5,
                rtol=1e-4,
            )
    np.testing.assert_array_equal(batched_store.steps, local_steps)


def test_persistent_client_optimizer_changes_only_later_participations(small_dir: Path) -> None:
    def run(client_optimizer: str, global_rounds: int, simulation: str = "batched") -> torch.Tensor:
        config = FedNCFConfig(
            global_rounds=global_rounds,
            clients_per_round=10,
            lr=1e-2,
            eval_every=0,
            simulation=simulation,
            client_optimizer=client_optimizer,
        )
        model = train_federated(
            dataset="ml-100k", data_dir=small_dir, config=config, progress=False
        ).model
        return torch.cat(
            [model.item_table().ravel(), model.user_table().ravel(), model.network_vector()]
        )

    # one global round: every client's first participation, where nothing is stored yet
    assert torch.equal(run("fresh", 1), run("persistent", 1))
    fresh, persistent = run("fresh", 2), run("persistent", 2)
    assert (fresh - persistent).abs().max() > 1e-3  # the second participations differ
    # and the reference simulation carries the state across rounds the same way
    torch.testing.assert_close(
        run("persistent", 2, simulation="reference"), persistent, atol=1e-4, rtol=1e-3
    )


def _bench_config(tmp_path: Path, *flags: str) -> Any:
    """The bench configuration of ``fedrec bench fedncf`` (one GMF seed, MF-FedAvg) + ``flags``."""
    import argparse

    from fedrec.experiments import fedncf as bench_fedncf

    parser = argparse.ArgumentParser()
    bench_fedncf.add_parser(parser.add_subparsers())
    args = ["fedncf", "--model", "gmf", "--aggregators", "mf-fedavg", "--seeds", "1"]
    args += ["--out", str(tmp_path), *flags]
    return bench_fedncf.config_from_args(parser.parse_args(args))


def _record_jobs(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Replace the bench's training jobs by a recorder: the specs it would have run."""
    from fedrec.experiments import fedncf as bench_fedncf

    jobs: list[dict] = []

    def fake_job(spec: dict) -> dict:
        jobs.append(spec)
        return {"spec": spec, "history": [], "hit_rate": 0.0, "ndcg": 0.0, "selected": None,
                "train_seconds": 0.0, "aggregation_seconds": 0.0, "mean_client_samples": 0.0,
                "participations": 0, "best_hit_rate": 0.0}  # fmt: skip

    monkeypatch.setattr(bench_fedncf, "_run_job", fake_job)
    return jobs


def test_bench_client_optimizer_flag_and_run_cache_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedrec.experiments import fedncf as bench_fedncf

    assert _bench_config(tmp_path).client_optimizer == "federated"
    config = _bench_config(tmp_path, "--client-optimizer", "persistent")
    assert config.client_optimizer == "persistent"
    with pytest.raises(ValueError, match="client_optimizer"):
        bench_fedncf.BenchFedNCFConfig(client_optimizer="shared")
    jobs = _record_jobs(monkeypatch)
    bench_fedncf.run_all(dataclasses.replace(config, client_optimizer="fresh"), log=lambda _: None)
    assert "client_optimizer" not in jobs[-1]  # "fresh" runs keep their earlier cache keys
    bench_fedncf.run_all(config, log=lambda _: None)
    assert [spec["kind"] for spec in jobs] == ["central", "federated", "federated"]
    assert jobs[-1]["client_optimizer"] == "persistent"  # the centralised run is shared
    assert len(list((tmp_path / "runs").glob("federated-*"))) == 2


def test_bench_simulation_flag_keys_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedrec.experiments import fedncf as bench_fedncf
    from fedrec.train.fedncf import resolve_simulation

    # the default is "auto", recorded resolved: compiled where Numba imports (the committed results)
    assert _bench_config(tmp_path).simulation == resolve_simulation("auto")
    assert bench_fedncf.BenchFedNCFConfig(simulation="auto").simulation in ("compiled", "batched")
    config = _bench_config(tmp_path, "--simulation", "compiled")
    with pytest.raises(ValueError, match="simulation"):
        bench_fedncf.BenchFedNCFConfig(simulation="reference")
    jobs = _record_jobs(monkeypatch)
    bench_fedncf.run_all(dataclasses.replace(config, simulation="batched"), log=lambda _: None)
    assert "simulation" not in jobs[-1]  # batched runs keep their earlier cache keys
    bench_fedncf.run_all(config, log=lambda _: None)
    assert jobs[-1]["simulation"] == "compiled"
    names = sorted(p.name for p in (tmp_path / "runs").glob("federated-*"))
    assert len(names) == 2 and "-compiled-" in names[1]


def test_units_and_participation(small_dir: Path) -> None:
    data = load_prepared("ml-100k", small_dir)
    config = FedNCFConfig(global_rounds=2, clients_per_round=15, eval_every=1)
    assert config.rounds_per_global(data.num_users) == 3  # 38 users / 15 per round
    result = train_federated(dataset="ml-100k", data_dir=small_dir, config=config, progress=False)
    assert [p.global_round for p in result.history] == [1.0, 2.0]
    assert [p.aggregation_round for p in result.history] == [3, 6]
    assert result.participations == 2 * data.num_users  # every user once per global round
    assert result.client_samples > 5 * result.participations  # n_k: 4 negatives per positive
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
    for simulation in ("batched", "compiled", "reference"):
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
    b = results["reference"].model
    for simulation in ("batched", "compiled"):
        a = results[simulation].model
        torch.testing.assert_close(a.network_vector(), b.network_vector(), atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(a.item_table(), b.item_table(), atol=1e-4, rtol=1e-3)
        torch.testing.assert_close(a.user_table(), b.user_table(), atol=1e-4, rtol=1e-3)


def test_compiled_round_rejects_inconsistent_inputs(small_dir: Path) -> None:
    """The kernel indexes without checks, so bad inputs are refused first, naming the problem."""
    data = load_prepared("ml-100k", small_dir)
    config = NCFConfig(model="neumf")
    net = _seeded_net(config, data)
    users = np.array([1, 2, 6])
    good = _round_kwargs(
        ClientData.of(data),
        users,
        0,
        user_store=net.user_table(),
        items=net.item_table(),
        network=net.network_vector(),
    )
    samples = good["round_samples"]
    items = samples.items.copy()
    items[3] = data.num_items
    positions = samples.position.copy()
    positions[1] = positions[0]  # two examples in one place
    bad = [
        ({"round_samples": dataclasses.replace(samples, items=items)}, "example items"),
        ({"round_samples": dataclasses.replace(samples, position=positions)}, "distinct"),
        ({"user_rows": good["user_rows"][:2]}, "user_rows must be"),
        ({"network": good["network"][:-1]}, "network must be"),
        ({"items": good["items"].double()}, "items must be float32"),
        ({"batch_size": 0}, "batch_size"),
    ]
    before = [t.clone() for t in (good["user_rows"], good["items"], good["network"])]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            train_round_compiled(config, **{**good, **change})
    after = (good["user_rows"], good["items"], good["network"])
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_compiled_simulation_is_reproducible_with_any_thread_count(small_dir: Path) -> None:
    """A client's steps stay on one thread, so 1 and 2 Numba threads give the same bits."""
    import numba

    config = FedNCFConfig(
        model=NCFConfig(model="neumf"),
        global_rounds=2,
        clients_per_round=10,
        lr=1e-2,
        eval_every=1,
        simulation="compiled",
    )
    runs = []
    before = numba.get_num_threads()
    try:
        for threads in (1, 2, 2):
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            result = train_federated(
                dataset="ml-100k", data_dir=small_dir, config=config, progress=False
            )
            metrics = [(p.hit_rate, p.ndcg) for p in result.history]
            runs.append((metrics, result.model.network_vector(), result.model.item_table()))
    finally:
        numba.set_num_threads(before)
    for metrics, network, items in runs[1:]:
        assert metrics == runs[0][0]
        assert torch.equal(network, runs[0][1]) and torch.equal(items, runs[0][2])


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
        ({"client_optimizer": "shared"}, "client_optimizer must be"),
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


def test_cohort_selection_keeps_the_groups_and_resumes_exactly(small_dir: Path) -> None:
    from fedrec.train.fedncf import FedNCFTrainer

    def trainer(selection: str) -> FedNCFTrainer:
        config = FedNCFConfig(
            global_rounds=4,
            clients_per_round=10,
            eval_every=0,
            selection=selection,  # type: ignore[arg-type]
        )
        return FedNCFTrainer(dataset="ml-100k", data_dir=small_dir, config=config, progress=False)

    def users_of_steps(run: FedNCFTrainer, steps: int) -> list[tuple[int, ...]]:
        out = []
        for _ in range(steps):
            run.step()
            group = run.groups[(run.rounds_done - 1) % run.per_global]
            out.append(tuple(np.sort(group).tolist()))
        return out

    cohorts = trainer("cohorts")
    per_global = cohorts.per_global
    assert per_global >= 3
    seen = users_of_steps(cohorts, 2 * per_global + 1)
    state = cohorts.loop_state()
    later = users_of_steps(cohorts, per_global + 2)
    by_global = [set(seen[i : i + per_global]) for i in (0, per_global)]
    third = seen[2 * per_global :] + later[: per_global - 1]
    assert by_global[0] == by_global[1] == set(third)  # the same cohorts every global round
    assert seen[:per_global] != seen[per_global : 2 * per_global]  # in a new order
    resumed = trainer("cohorts")
    resumed.load_loop_state(state)
    assert users_of_steps(resumed, per_global + 2) == later  # an exact resume
    permutation = users_of_steps(trainer("permutation"), 2 * per_global)
    assert set(permutation[:per_global]) != set(permutation[per_global:])
    with pytest.raises(ValueError, match="selection must be"):
        FedNCFConfig(selection="fixed")  # type: ignore[arg-type]

    # the bench flag: part of the run's cache key only when it is not the default
    import argparse

    from fedrec.experiments import fedncf as bench_fedncf

    parser = argparse.ArgumentParser()
    bench_fedncf.add_parser(parser.add_subparsers())
    args = ["fedncf", "--model", "gmf", "--aggregators", "mf-fedavg", "--seeds", "1"]
    assert bench_fedncf.config_from_args(parser.parse_args(args)).selection == "permutation"
    bench = bench_fedncf.config_from_args(parser.parse_args([*args, "--selection", "cohorts"]))
    assert bench.selection == "cohorts"
    with pytest.raises(ValueError, match=r"--selection \(selection\) must be one of"):
        bench_fedncf.BenchFedNCFConfig(selection="fixed")


@pytest.mark.parametrize(
    "simulate", [train_round_batched, train_round_compiled], ids=["batched", "compiled"]
)
@pytest.mark.parametrize("model", ["mlp", "neumf"])
def test_federated_optimizer_state_batched_equals_reference(
    model: str, simulate: Callable, small_dir: Path
) -> None:
    from fedrec.train.fedncf import FederatedOptimizerState

    data = load_prepared("ml-100k", small_dir)
    clients = ClientData.of(data)
    config = NCFConfig(model=model)
    net = _seeded_net(config, data)
    user_store, items, network = net.user_table(), net.item_table(), net.network_vector()
    shape = {"num_users": data.num_users, "num_items": data.num_items}
    stores = [FederatedOptimizerState(config, **shape) for _ in range(2)]
    aggregator = make_aggregator("mf-fedavg")
    for r, round_users in enumerate([[1, 2, 6, 11, 23, 30], [2, 5, 11, 17, 30], [1, 2, 11, 19]]):
        users = np.array(round_users)
        kwargs = _round_kwargs(
            clients, users, r, user_store=user_store, items=items, network=network
        )
        batched = simulate(config, **kwargs, optimizer_store=stores[0])
        reference = train_round_reference(config, **kwargs, optimizer_store=stores[1])
        _assert_same_round(batched, reference, items)
        user_store[torch.from_numpy(users)] = batched[1]
        new = [
            store.aggregate(aggregator, items=items, network=network, updates=result[0])
            for store, result in zip(stores, (batched, reference), strict=True)
        ]
        (new_items, new_network), (ref_items, ref_network) = new
        _assert_close_up_to_relu_ties(new_items, ref_items)
        _assert_close_up_to_relu_ties(new_network, ref_network)
        items, network = new[0]
    assert stores[0].step_count == stores[1].step_count > 0
    for name in ("user_moments", "network_moments", "item_moments"):
        a, b = getattr(stores[0], name), getattr(stores[1], name)
        _assert_close_up_to_relu_ties(a, b)
        assert np.abs(a).max() > 0
    untouched = np.setdiff1d(np.arange(data.num_users), [1, 2, 5, 6, 11, 17, 19, 23, 30])
    assert not stores[0].user_moments[untouched].any()  # a user row's state stays on its client


def test_federated_optimizer_with_one_client_per_round_is_one_shared_adam(small_dir: Path) -> None:
    """With one client per round, federating the Adam state is exactly one Adam (SparseAdam on
    the tables, Adam on the network) stepping through the clients' batches in turn."""
    from fedrec.train.fedncf.simulate_reference import _batches

    seed, rounds, batch_size, lr = 4, 7, 8, 1e-2
    config = FedNCFConfig(
        model=NCFConfig(model="neumf"), clients_per_round=1, aggregation_rounds=rounds,
        batch_size=batch_size, lr=lr, eval_every=0, seed=seed, client_optimizer="federated",
    )  # fmt: skip
    federated = train_federated(
        dataset="ml-100k", data_dir=small_dir, config=config, progress=False
    ).model
    data = load_prepared("ml-100k", small_dir)
    clients = ClientData.of(data)
    model = NCF(
        config.model,
        num_users=data.num_users,
        num_items=data.num_items,
        generator=torch.Generator().manual_seed(seed),
    )
    optimizers = make_optimizers(model, lr=lr)
    order = np.random.default_rng([seed, 1]).permutation(data.num_users)  # the trainer's selection
    for r in range(rounds):
        user = order[r]
        samples = sample_round(clients, np.array([user]), round_rng(seed, r), num_negatives=4, local_epochs=2)  # fmt: skip
        for items, labels in _batches(samples.client_epochs(0), batch_size):
            logits = model(torch.full((len(items),), int(user)), torch.from_numpy(items))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, torch.from_numpy(labels)
            )
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
    for part in ("item_table", "user_table", "network_vector"):
        torch.testing.assert_close(
            getattr(federated, part)(), getattr(model, part)(), atol=1e-5, rtol=1e-4
        )
    fresh = train_federated(
        dataset="ml-100k",
        data_dir=small_dir,
        config=dataclasses.replace(config, client_optimizer="fresh"),
        progress=False,
    ).model
    assert (fresh.item_table() - model.item_table()).abs().max() > 1e-3  # the check can fail


def test_federated_optimizer_state_under_mf_secavg_matches_the_plain_round(small_dir: Path) -> None:
    """MF-SecAvg carries the weights and, in the same protocol run and a finer fixed point, the
    Adam moments."""
    from fedrec.train.fedncf import FedNCFTrainer

    def trainer(aggregator: str) -> FedNCFTrainer:
        config = FedNCFConfig(
            model=NCFConfig(model="mlp"), aggregator=aggregator, aggregation_rounds=3,
            clients_per_round=12, lr=1e-2, eval_every=0,
        )  # fmt: skip
        run = FedNCFTrainer(dataset="ml-100k", data_dir=small_dir, config=config, progress=False)
        run.run()
        return run

    plain, secure = trainer("mf-fedavg"), trainer("mf-secavg")
    assert secure.aborted == 0 and secure.aggregator.rounds == 3
    # one run per round: the weights' two segments, then the moments' (64-bit item words)
    layout = [len(part) for part in secure.aggregator.last.parts]
    assert len(layout) == 4 and layout[2] == 2 * secure.network.numel() + 1
    # fixed-point rounding (~1e-7 per value), amplified a little by three rounds of Adam at lr 1e-2
    torch.testing.assert_close(secure.items, plain.items, atol=2e-4, rtol=0)
    torch.testing.assert_close(secure.network, plain.network, atol=2e-4, rtol=0)
    assert (secure.items - plain.items).abs().mean() < 1e-6
    for name in ("item_moments", "network_moments"):
        a, b = getattr(secure.optimizer_store, name), getattr(plain.optimizer_store, name)
        np.testing.assert_allclose(a, b, atol=1e-8, rtol=1e-3)
        assert np.abs(b).max() > 1e-6


def test_validation_split_holds_out_the_second_to_last_positive(small_dir: Path) -> None:
    data = load_prepared("ml-100k", small_dir)
    split = data.with_validation()
    last_two = np.stack([data.items[data.indptr[1:] - 2], data.test_items], 1)
    np.testing.assert_array_equal(split.validation_items, last_two[:, 0])
    # training loses exactly the validation item of every user; test data is unchanged
    users, items = split.train()
    kept = set(zip(users.tolist(), items.tolist(), strict=True))
    assert len(kept) == len(data.train()[0]) - data.num_users
    assert not kept & set(enumerate(last_two[:, 0].tolist()))
    np.testing.assert_array_equal(split.eval_candidates, data.eval_candidates)
    clients = ClientData.of(split)
    assert np.diff(clients.train_indptr).tolist() == (np.diff(data.indptr) - 2).tolist()
    # the validation item sits at its target column among negatives none of which is a positive
    rows = np.arange(data.num_users)
    candidates = split.validation_candidates
    np.testing.assert_array_equal(candidates[rows, split.validation_target], last_two[:, 0])
    negatives = np.ones_like(candidates, dtype=bool)
    negatives[rows, split.validation_target] = False
    owner = np.repeat(rows, candidates.shape[1]).reshape(candidates.shape)
    assert not split.is_positive(owner[negatives], candidates[negatives]).any()
    assert (np.sort(candidates, 1)[:, 1:] != np.sort(candidates, 1)[:, :-1]).all()  # distinct
    with pytest.raises(ValueError, match="already has a validation split"):
        split.with_validation()
    with pytest.raises(ValueError, match="no validation split"):
        _ = data.validation_items


def test_validation_selects_the_reported_round(small_dir: Path) -> None:
    """With validation=True every evaluation also ranks the validation items (the same metric
    as the environments' test evaluation), the log gets two columns, and ``selected`` is the
    point with the best validation HR@10, whose test numbers are the run's result."""
    from fedrec.train.fedncf import evaluate_candidates, evaluate_model, select_by_validation

    config = FedNCFConfig(global_rounds=4, clients_per_round=10, eval_every=1, lr=1e-2)
    plain = train_federated(dataset="ml-100k", data_dir=small_dir, config=config, progress=False)
    assert plain.selected is None and plain.history[0].validation_hit_rate is None
    held = dataclasses.replace(config, validation=True)
    result = train_federated(dataset="ml-100k", data_dir=small_dir, config=held, progress=False)
    assert all(p.validation_hit_rate is not None for p in result.history)
    assert result.history != plain.history  # one positive fewer per user to train on
    best = max(p.validation_hit_rate for p in result.history)
    assert result.selected is not None and result.selected.validation_hit_rate == best
    points = [
        dataclasses.replace(p, validation_hit_rate=h, validation_ndcg=n)
        for p, h, n in zip(result.history, [0.2, 0.5, 0.5, 0.5], [0.1, 0.3, 0.3, 0.2], strict=True)
    ]
    assert select_by_validation(points) is points[1]  # NDCG breaks ties, then the earliest
    # the candidate evaluation reproduces the environment's on the test candidates
    data = load_prepared("ml-100k", small_dir)
    direct = evaluate_candidates(
        result.model, candidates=data.eval_candidates, target=data.eval_target
    )
    env = evaluate_model(result.model, dataset="ml-100k", data_dir=small_dir)
    assert direct.hit_rate == env.hit_rate and direct.ndcg == pytest.approx(env.ndcg, rel=1e-12)
    central = train_centralised(
        dataset="ml-100k",
        data_dir=small_dir,
        config=CentralConfig(epochs=2, lr=1e-2, validation=True),
        progress=False,
    )
    assert [p.validation_hit_rate is not None for p in central.history] == [True, True]
    assert central.selected is not None


def test_validation_run_logs_and_resumes(small_dir: Path, tmp_path: Path) -> None:
    config = FedNCFConfig(global_rounds=2, clients_per_round=10, eval_every=1, validation=True)
    out = tmp_path / "run"
    train_federated(dataset="ml-100k", data_dir=small_dir, config=config, progress=False,
                    out_dir=out)  # fmt: skip
    header = (out / "eval.csv").read_text().splitlines()[0]
    assert header.endswith("hit_rate,ndcg,validation_hit_rate,validation_ndcg")
    longer = dataclasses.replace(config, global_rounds=3)
    resumed = train_federated(dataset="ml-100k", data_dir=small_dir, config=longer,
                              progress=False, out_dir=out, resume=True)  # fmt: skip
    straight = train_federated(dataset="ml-100k", data_dir=small_dir, config=longer,
                               progress=False)  # fmt: skip

    def metrics(result: TrainResult) -> list[tuple]:
        return [dataclasses.astuple(dataclasses.replace(p, seconds=0.0)) for p in result.history]

    assert metrics(resumed) == metrics(straight) and resumed.selected is not None
    with pytest.raises(ValueError, match="validation"):
        train_federated(dataset="ml-100k", data_dir=small_dir, progress=False, out_dir=out,
                        config=dataclasses.replace(longer, validation=False), resume=True)  # fmt: skip
