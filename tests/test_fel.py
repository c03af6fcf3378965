"""FEL: synthetic Taobao data, click data builders, clustering, (DP-)FedAvg leaves, accounting,
ensembles, and the claim that per-cluster leaves beat one global model where groups differ."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import fedrec  # noqa: F401  (registers the env ids)
from fedrec.envs.datasets.click_data import (
    ClickData,
    click_data_from_ml100k,
    click_data_from_taobao,
)
from fedrec.envs.datasets.formats import ML100K_GENRES, TAOBAO_PIDS, TAOBAO_USER_PROFILE_HEADER
from fedrec.envs.datasets.synthetic import write_atomic, write_ml100k
from fedrec.envs.datasets.taobao import TEST_DAY_START
from fedrec.envs.datasets.taobao_synthetic import group_of, write_taobao_groups
from fedrec.federation.privacy import (
    GaussianMechanism,
    clip_updates,
    dp_aggregate,
    epsilon,
    epsilon_of,
    fel_epsilon,
    noise_multiplier_for,
)
from fedrec.train.fel import (
    RULES,
    DPConfig,
    FedConfig,
    LeafConfig,
    client_schedules,
    combine,
    flatten,
    forward,
    init_params,
    local_train,
    predict,
    run_fel,
    train_federated,
)
from fedrec.train.fel.clusters import (
    cluster_clients,
    feature_clusters,
    kmeans_clusters,
    random_clusters,
)

GENDER_AGE = ("final_gender_code", "age_level")


@pytest.fixture(scope="module")
def taobao_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_taobao_groups(
        tmp_path_factory.mktemp("taobao"), num_users=600, num_ads=200, ctr=0.1, seed=0
    )


@pytest.fixture(scope="module")
def taobao(taobao_dir: Path) -> ClickData:
    return click_data_from_taobao(taobao_dir)


# ------------------------------------------------------------------------------------------------
# Data


def test_synthetic_taobao_is_schema_faithful_and_seeded(tmp_path: Path) -> None:
    a, truth = write_taobao_groups(tmp_path / "a", num_users=300, num_ads=80, return_truth=True)
    b = write_taobao_groups(tmp_path / "b", num_users=300, num_ads=80)
    c = write_taobao_groups(tmp_path / "c", num_users=300, num_ads=80, seed=1)
    for name in ("raw_sample.csv", "ad_feature.csv", "user_profile.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "raw_sample.csv").read_bytes() != (c / "raw_sample.csv").read_bytes()
    first = (a / "user_profile.csv").read_text().splitlines()[0]
    assert first == ",".join(TAOBAO_USER_PROFILE_HEADER) + " "  # the trailing space
    sample = pd.read_csv(a / "raw_sample.csv", dtype={"pid": str})
    assert set(sample["pid"]) == set(TAOBAO_PIDS)
    assert (sample["nonclk"] == 1 - sample["clk"]).all()
    assert abs(sample["clk"].mean() - 0.05) < 0.015 and truth.ctr == sample["clk"].mean()
    day = (sample["time_stamp"] - 1_494_000_000) // 86_400
    assert day.min() == 0 and day.max() == 7
    ads = pd.read_csv(a / "ad_feature.csv", dtype={"brand": str}, keep_default_na=False)
    assert 0.15 < (ads["brand"] == "NULL").mean() < 0.45
    profile = pd.read_csv(a / "user_profile.csv", dtype=str, keep_default_na=False)
    assert (profile["pvalue_level"] == "").mean() > 0.3
    # missing joins: the last user has no profile row, the last ad no feature row
    assert sample["user"].nunique() == len(profile) + 1
    assert sample["adgroup_id"].nunique() == len(ads) + 1
    # every group of the click model is present
    rows = sample.merge(profile.astype({"userid": int}), left_on="user", right_on="userid")
    g = group_of(rows["final_gender_code"].astype(int), rows["age_level"].astype(int))
    assert set(np.unique(g)) == set(range(6))
    assert set(np.unique(truth.group)) == set(range(6))


def test_synthetic_taobao_reads_as_env(taobao_dir: Path) -> None:
    env = gym.make("fedrec/TaobaoAds-v0", data_dir=taobao_dir, split="test")
    obs, _ = env.reset(seed=0)
    assert obs["user_features"].shape == (8,)
    _, reward, *_ = env.step(np.array([0.5], np.float32))
    assert reward in (0.0, 1.0)
    env.close()


def test_click_data_from_taobao(taobao: ClickData, taobao_dir: Path) -> None:
    d = taobao
    assert np.all(np.diff(d.client) >= 0)
    assert d.indptr[-1] == len(d.label) and np.array_equal(
        np.bincount(d.client, minlength=d.num_clients), np.diff(d.indptr)
    )
    assert d.sparse.shape[1] == len(d.field_names) == len(d.field_sizes) == 15
    assert (d.sparse >= 0).all() and (d.sparse < np.array(d.field_sizes)).all()
    assert d.public_names == tuple(TAOBAO_USER_PROFILE_HEADER[1:])
    # the public features are the first 8 sparse fields, constant within a client
    assert np.array_equal(d.public[d.client], d.sparse[:, :8])
    # the test split is the last day in Asia/Shanghai time
    raw = pd.read_csv(taobao_dir / "raw_sample.csv")
    assert d.is_test.sum() == (raw["time_stamp"] >= TEST_DAY_START).sum()
    assert set(np.unique(d.label)) == {0.0, 1.0}


def test_click_data_from_ml100k(tmp_path: Path) -> None:
    write_ml100k(tmp_path)
    d = click_data_from_ml100k(tmp_path)
    ratings = pd.read_csv(tmp_path / "u.data", sep="\t", header=None)
    assert len(d.label) == len(ratings)
    assert d.label.mean() == pytest.approx((ratings[2] >= 4).mean())
    assert d.public_names == ("gender", "age_band", "occupation")
    for u in range(d.num_clients):
        rows = slice(d.indptr[u], d.indptr[u + 1])
        test = d.is_test[rows]
        assert 1 <= test.sum() < len(test) or len(test) == 1
        assert test[-test.sum() :].all()  # the test rows are each user's latest (sorted by time)
    assert np.array_equal(d.public[d.client], d.sparse[:, :3])
    assert set(np.unique(d.public[:, 0])) <= {1, 2}


def test_click_data_from_recbole_ml100k_has_the_same_genre_flags(tmp_path: Path) -> None:
    """RecBole's bundled ML-100K (``fedrec data fetch ml-100k --source recbole``) keeps genres as
    ``class`` tokens: they become the same 19 dense flags as ``u.item``'s columns."""
    write_ml100k(tmp_path / "grouplens", seed=3)
    write_atomic(tmp_path / "recbole", seed=3)
    grouplens = click_data_from_ml100k(tmp_path / "grouplens")
    recbole = click_data_from_ml100k(tmp_path / "recbole")
    assert recbole.dense.shape == (len(recbole.label), len(ML100K_GENRES))
    assert set(np.unique(recbole.dense)) <= {0.0, 1.0} and recbole.dense.sum() > 0
    assert np.array_equal(recbole.label, grouplens.label)  # the same synthetic log


# ------------------------------------------------------------------------------------------------
# Clustering


def _is_partition(labels: np.ndarray, num_clients: int) -> bool:
    k = labels.max() + 1
    return labels.shape == (num_clients,) and set(np.unique(labels)) == set(range(k))


def test_clusterings_are_partitions_on_public_features_only(taobao: ClickData) -> None:
    pub, names = taobao.public, taobao.public_names
    u = taobao.num_clients
    rand = random_clusters(u, 6, seed=3)
    assert _is_partition(rand, u) and np.ptp(np.bincount(rand)) <= 1
    assert np.array_equal(rand, random_clusters(u, 6, seed=3))
    cross = cluster_clients(pub, names, "feature", features=GENDER_AGE)
    assert _is_partition(cross, u)
    key = pub[:, [names.index(f) for f in GENDER_AGE]]
    # same cluster <=> same (gender, age level)
    same_key = (key[:, None, :] == key[None, :, :]).all(-1)
    assert np.array_equal(same_key, cross[:, None] == cross[None, :])
    km = kmeans_clusters(pub, 5, seed=0)
    assert _is_partition(km, u) and km.max() == 4
    assert np.array_equal(km, kmeans_clusters(pub, 5, seed=0))
    # equal public features, equal cluster; and only the features matter, not client order
    _, profile = np.unique(pub, axis=0, return_inverse=True)
    for p in np.unique(profile):
        assert len(np.unique(km[profile == p])) == 1
    perm = np.random.default_rng(0).permutation(u)
    assert np.array_equal(kmeans_clusters(pub[perm], 5, seed=0), km[perm])
    assert np.array_equal(feature_clusters(pub[perm], [2, 3]), feature_clusters(pub, [2, 3])[perm])
    with pytest.raises(ValueError, match="unknown clustering"):
        cluster_clients(pub, names, "spectral")


# ------------------------------------------------------------------------------------------------
# Leaves and FedAvg


def test_fedavg_one_client_one_step_is_gradient_descent(taobao: ClickData) -> None:
    d = taobao
    client = 5
    keep = np.zeros(d.num_clients, bool)
    keep[client] = True
    rows = np.arange(d.indptr[client], d.indptr[client + 1])
    train = rows[~d.is_test[rows]]
    config = FedConfig(
        leaf=LeafConfig(hidden=4),
        rounds=1,
        sample_rate=1.0,
        batch_size=len(train),
        client_lr=0.3,
        seed=2,
    )
    # only `client` has training rows: blank the others' by marking them test
    only = ClickData(**{**d.__dict__, "is_test": d.is_test | ~keep[d.client]})
    result = train_federated(only, np.zeros(d.num_clients, np.int64), config)
    assert result.client_updates == 1
    p = {k: t.clone().requires_grad_(True) for k, t in init_params(d, config.leaf, 1, 2).items()}
    logits = forward(
        p,
        torch.as_tensor(d.sparse[train] + d.offsets)[None],
        torch.as_tensor(d.dense[train])[None],
    )
    loss = F.binary_cross_entropy_with_logits(logits[0], torch.as_tensor(d.label[train]))
    grads = torch.autograd.grad(loss, list(p.values()))
    expected = flatten({k: t - 0.3 * g for (k, t), g in zip(p.items(), grads, strict=True)})
    assert torch.allclose(flatten(result.params), expected.detach(), atol=1e-6)


def test_batched_local_training_equals_a_per_client_loop(taobao: ClickData) -> None:
    """Clients with different numbers of local steps, trained together, match one-by-one SGD."""
    d = taobao
    clients = np.array([3, 10, 42, 7])
    rows = [
        np.arange(d.indptr[c], d.indptr[c + 1])[:n]
        for c, n in zip(clients, (5, 40, 17, 1), strict=True)
    ]
    config = FedConfig(leaf=LeafConfig(hidden=4), batch_size=8, local_epochs=2)
    train_rows = {int(c): r for c, r in zip(clients, rows, strict=True)}
    index, mask = client_schedules(d, clients, train_rows, config, np.random.default_rng(0))
    start = init_params(d, config.leaf, len(clients), seed=1)
    start = {
        k: t + 0.01 * torch.randn(t.shape, generator=torch.Generator().manual_seed(2))
        for k, t in start.items()
    }
    trained, _ = local_train(start, d, index, mask, lr=0.2)
    for i in range(len(clients)):
        assert sorted(index[i][mask[i]].tolist()) == sorted(rows[i].tolist() * 2)  # 2 epochs
        p = {k: t[i : i + 1].clone().requires_grad_(True) for k, t in start.items()}
        for s in range(index.shape[1]):
            batch = index[i, s][mask[i, s]]
            if not len(batch):
                continue
            logits = forward(
                p,
                torch.as_tensor(d.sparse[batch] + d.offsets)[None],
                torch.as_tensor(d.dense[batch])[None],
            )
            loss = F.binary_cross_entropy_with_logits(logits[0], torch.as_tensor(d.label[batch]))
            grads = torch.autograd.grad(loss, list(p.values()))
            with torch.no_grad():
                for t, g in zip(p.values(), grads, strict=True):
                    t -= 0.2 * g
        mine = flatten({k: t[i : i + 1] for k, t in trained.items()})
        assert torch.allclose(mine, flatten({k: t.detach() for k, t in p.items()}), atol=1e-6)


def test_fedavg_reduces_loss_and_is_seeded(taobao: ClickData) -> None:
    config = FedConfig(rounds=15, sample_rate=0.3, seed=1)
    clusters = random_clusters(taobao.num_clients, 3, seed=0)
    a = train_federated(taobao, clusters, config)
    b = train_federated(taobao, clusters, config)
    assert np.mean(a.loss_history[-3:]) < np.mean(a.loss_history[:3]) - 0.05
    assert torch.equal(flatten(a.params), flatten(b.params))
    assert flatten(a.params).shape[0] == 3
    c = train_federated(taobao, clusters, FedConfig(rounds=15, sample_rate=0.3, seed=2))
    assert not torch.equal(flatten(a.params), flatten(c.params))


# ------------------------------------------------------------------------------------------------
# DP-FedAvg and accounting


def test_clipping_bounds_each_clients_contribution() -> None:
    gen = torch.Generator().manual_seed(0)
    deltas = torch.randn(6, 50, generator=gen) * torch.tensor([0.1, 1, 10, 100, 0.5, 3])[:, None]
    clipped = clip_updates(deltas, 1.0)
    norms = clipped.norm(dim=1)
    assert (norms <= 1.0 + 1e-6).all()
    small = deltas.norm(dim=1) <= 1.0
    assert torch.allclose(clipped[small], deltas[small])  # small updates untouched
    cluster = torch.tensor([0, 0, 0, 1, 1, 1])
    denom = torch.tensor([2.0, 4.0])
    kw = {"clip_norm": 1.0, "noise_multiplier": 0.0, "denominator": denom}
    base = dp_aggregate(deltas, cluster, 2, generator=gen, **kw)
    changed = deltas.clone()
    changed[3] = 1e6  # one client sends an enormous update
    out = dp_aggregate(changed, cluster, 2, generator=gen, **kw)
    assert torch.equal(out[0], base[0])  # other cluster untouched
    assert (out[1] - base[1]).norm() <= 2.0 / 4.0 + 1e-6  # sensitivity 2 S / denominator


def test_noise_scale_matches_the_multiplier() -> None:
    gen = torch.Generator().manual_seed(1)
    p = 200_000
    out = dp_aggregate(
        torch.zeros(3, p),
        torch.tensor([0, 0, 1]),
        2,
        clip_norm=0.5,
        noise_multiplier=1.3,
        denominator=torch.tensor([10.0, 5.0]),
        generator=gen,
    )
    assert out[0].std().item() == pytest.approx(1.3 * 0.5 / 10.0, rel=0.01)
    assert out[1].std().item() == pytest.approx(1.3 * 0.5 / 5.0, rel=0.01)
    assert abs(out.mean().item()) < 1e-3


@pytest.mark.parametrize(
    ("q", "sigma", "steps", "delta", "expected"),
    [
        (0.01, 1.1, 1000, 1e-5, 1.7118),
        (0.01, 4.0, 10000, 1e-5, 1.0355),
        (4096 / 1e6, 1.0, 2000, 1e-6, 1.5050),
    ],
)
def test_accountant_matches_library_values(q, sigma, steps, delta, expected) -> None:
    assert epsilon(sigma, q, steps, delta) == pytest.approx(expected, abs=1e-4)


def test_noise_calibration_and_fel_composition() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus notes the optimal order is its largest alpha
        z = noise_multiplier_for(2.0, 1e-5, 0.01, 1000)
    assert z == pytest.approx(1.0229, abs=1e-4)
    assert epsilon(z, 0.01, 1000, 1e-5) == pytest.approx(1.997, abs=1e-3)
    leaf = GaussianMechanism(1.0, 0.004, 2000)
    over = GaussianMechanism(1.0, 0.004, 500)
    assert epsilon_of([leaf], 1e-6) == pytest.approx(1.482, abs=1e-3)
    assert epsilon_of([leaf, over], 1e-6) == pytest.approx(1.566, abs=1e-3)  # sequential
    quieter = GaussianMechanism(2.0, 0.004, 2000)
    # parallel: disjoint clusters cost the max, not the sum
    fel = fel_epsilon({0: [leaf], 1: [quieter]}, 1e-6)
    assert fel.epsilon == pytest.approx(1.482, abs=1e-3) == fel.per_cluster[0]
    assert fel.per_cluster[1] < fel.per_cluster[0]
    # an over-arch on every user's protected labels composes sequentially with each leaf
    assert fel_epsilon({0: [leaf], 1: [quieter]}, 1e-6, shared=[over]).epsilon == pytest.approx(
        1.566, abs=1e-3
    )


def test_dp_training_reaches_its_target_epsilon(taobao: ClickData) -> None:
    clusters = random_clusters(taobao.num_clients, 2, seed=0)
    dp = DPConfig(clip_norm=0.5, target_epsilon=4.0, delta=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = train_federated(taobao, clusters, FedConfig(rounds=5, sample_rate=0.2, dp=dp))
    assert r.privacy is not None and r.noise_multiplier > 0
    assert 3.9 < r.privacy.epsilon <= 4.0
    assert set(r.privacy.per_cluster) == {0, 1}
    with pytest.raises(ValueError, match="none of them empty"):
        train_federated(taobao, clusters * 2, FedConfig(rounds=1))
    with pytest.raises(ValueError, match="exactly one"):
        train_federated(taobao, clusters, FedConfig(rounds=1, dp=DPConfig()))


# ------------------------------------------------------------------------------------------------
# Ensembles and the comparison with plain FL


def test_ensemble_rules() -> None:
    one = np.array([-1.0, 0.5, 2.0])
    same = np.repeat(one[:, None], 4, axis=1)
    for rule in RULES:
        assert np.allclose(combine(same, rule, np.array([0, 3, 1])), one)
    logits = np.array([[1.0, 5.0, 2.0], [0.0, -3.0, -1.0]])
    assert np.allclose(combine(logits, "mean"), [8 / 3, -4 / 3])
    assert np.allclose(combine(logits, "median"), [2.0, -1.0])
    assert np.allclose(combine(logits, "max"), [5.0, 0.0])
    assert np.allclose(combine(logits, "route", np.array([2, 1])), [2.0, -3.0])


def test_identical_leaves_predict_like_one(taobao: ClickData) -> None:
    params = init_params(taobao, LeafConfig(hidden=4), 3, seed=0)
    rows = np.arange(50)
    out = predict(params, taobao, rows)
    assert out.shape == (50, 3) and np.allclose(out, out[:, :1])
    single = predict({k: t[:1] for k, t in params.items()}, taobao, rows)[:, 0]
    assert np.allclose(combine(out, "mean"), single, atol=1e-6)


def test_cluster_leaves_beat_one_global_model_where_groups_differ(taobao: ClickData) -> None:
    clusters = cluster_clients(taobao.public, taobao.public_names, "feature", features=GENDER_AGE)
    config = FedConfig(rounds=30, sample_rate=0.2, seed=0)
    result = run_fel(taobao, clusters, config, opt_in_fraction=0.1)
    # the same clients and (up to one forced client per empty cluster-round) the same updates
    assert abs(result.client_updates - result.baseline_client_updates) <= 0.02 * (
        result.baseline_client_updates
    )
    assert result.auc["route"] > result.auc["baseline"] + 0.05
    assert result.auc["over-arch"] > result.auc["baseline"] + 0.04
    again = run_fel(taobao, clusters, config, opt_in_fraction=0.1)
    assert again.auc == result.auc  # same seed, same numbers
    # with random clusters there is nothing to gain
    rand = run_fel(taobao, random_clusters(taobao.num_clients, 6), config)
    assert rand.auc["route"] < result.auc["route"] - 0.05


def test_fel_runs_on_ml100k(tmp_path: Path) -> None:
    write_ml100k(tmp_path)
    d = click_data_from_ml100k(tmp_path)
    clusters = cluster_clients(d.public, d.public_names, "kmeans", num_clusters=2)
    result = run_fel(d, clusters, FedConfig(rounds=3, sample_rate=0.5), opt_in_fraction=0.5)
    assert set(result.auc) >= {*RULES, "baseline"}
    assert all(0.0 <= v <= 1.0 for v in result.auc.values())


# ------------------------------------------------------------------------------------------------
# The over-arch trained by federated learning (every user, DP composed sequentially)


def test_batched_over_arch_head_equals_the_module() -> None:
    from fedrec.train.fel import OverArch
    from fedrec.train.fel.overarch import _head, over_arch_features

    torch.manual_seed(0)
    arch = OverArch(3, 5)
    logits = np.random.default_rng(0).normal(size=(7, 3)).astype(np.float32)
    cluster = np.array([0, 1, 2, 2, 1, 0, 0])
    params = {n: p.detach()[None] for n, p in arch.named_parameters()}
    x = torch.as_tensor(over_arch_features(logits, cluster))[None]
    with torch.no_grad():
        expected = arch(torch.as_tensor(logits), torch.as_tensor(cluster))
    torch.testing.assert_close(_head(params, x)[0], expected)
    # A DP-noised leaf of a tiny cluster can output logits in the hundreds: they enter bounded.
    wild = over_arch_features(np.array([[900.0, -3.0, -1e4]], np.float32), np.array([0]))
    assert np.abs(wild).max() <= 1.0 and wild[0, 1] == pytest.approx(-0.3)


def test_federated_over_arch_learns_routing_and_composes_its_privacy(taobao: ClickData) -> None:
    from fedrec.train.fel import ensemble_aucs, over_arch_logits
    from fedrec.train.fel.overarch import train_over_arch_federated

    clusters = cluster_clients(taobao.public, taobao.public_names, "feature", features=GENDER_AGE)
    config = FedConfig(rounds=30, sample_rate=0.2, seed=0, fill_empty_clusters=False)
    leaves = train_federated(taobao, clusters, config)
    scores, _ = ensemble_aucs(taobao, leaves, opt_in_fraction=0.1)
    test = np.flatnonzero(taobao.is_test)
    cluster = clusters[taobao.client[test]]
    leaf_logits = predict(leaves.params, taobao, test)

    def fl_auc(result) -> float:
        from fedrec.eval.ranking_metrics import auc

        logits = over_arch_logits(result.arch, leaf_logits, cluster)
        return auc(logits, taobao.label[test])

    # Its inputs are bounded logits (LOGIT_BOUND): larger local steps than the leaves'.
    config = dataclasses.replace(config, client_lr=5.0, local_epochs=3)
    plain = train_over_arch_federated(taobao, leaves.params, clusters, config, rounds=30)
    # Trained on every user's rows, it learns what the leaves' mean cannot: whose leaf to trust.
    assert fl_auc(plain) > scores["mean"] + 0.03
    assert fl_auc(plain) > scores["route"] - 0.03
    assert plain.mechanism is None and plain.client_updates > 0
    again = train_over_arch_federated(taobao, leaves.params, clusters, config, rounds=30)
    assert fl_auc(again) == fl_auc(plain)  # seeded

    dp = DPConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5)
    private = train_over_arch_federated(
        taobao, leaves.params, clusters, dataclasses.replace(config, dp=dp), rounds=10
    )
    assert private.mechanism == GaussianMechanism(1.0, 0.2, 10)
    leaf = GaussianMechanism(1.0, 0.2, 30)
    k = int(clusters.max()) + 1
    composed = fel_epsilon({c: [leaf] for c in range(k)}, 1e-5, shared=[private.mechanism])
    assert composed.epsilon == pytest.approx(epsilon_of([leaf, private.mechanism], 1e-5))
    assert composed.epsilon > epsilon_of([leaf], 1e-5)
