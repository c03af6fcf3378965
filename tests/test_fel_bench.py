"""``fedrec bench fel`` end to end in quick mode, and FEL's private leaf."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from fedrec.envs.datasets.click_data import click_data_from_taobao
from fedrec.envs.datasets.synthetic import write_ml100k
from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups
from fedrec.experiments.fel import FL_OVER_ARCH, BenchFELConfig, run_bench
from fedrec.federation.privacy import GaussianMechanism, epsilon, epsilon_of
from fedrec.train.fel import DPConfig, FedConfig, train_baseline, train_federated
from fedrec.train.fel.clusters import cluster_clients
from fedrec.train.fel.private import (
    FELServer,
    run_private_fel,
    split_private,
    train_private_leaf,
)


def _quick(tmp_path: Path, **kwargs: object) -> BenchFELConfig:
    base = dict(
        users=300,
        ads=100,
        clusters=(1, 2, 4),
        target_epsilons=(2.0,),
        rounds=4,
        sample_rate=0.2,
        over_arch_iterations=20,
        over_arch_rounds=3,
        seeds=2,
        out=str(tmp_path / "out"),
        progress=False,
    )
    base.update(kwargs)
    return BenchFELConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def taobao_bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[BenchFELConfig, dict]:
    tmp = tmp_path_factory.mktemp("fel_bench")
    data_dir = write_taobao_groups(tmp / "data", num_users=300, num_ads=100, ctr=0.1, seed=0)
    config = _quick(tmp, data_dir=str(data_dir), private_leaf=True)
    return config, run_bench(config, log=lambda _: None)


def test_bench_writes_its_tables(taobao_bench: tuple[BenchFELConfig, dict]) -> None:
    config, _ = taobao_bench
    out = Path(config.out) / "taobao-synthetic"
    for name in ("table.md", "table.csv", "auc_vs_clusters.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    text = (out / "table.md").read_text()
    assert "## Clusterings (no DP)" in text and "## DP-FedAvg" in text
    assert "not comparable with the paper" in text
    assert "## Private leaf" in text
    with (out / "table.csv").open() as f:
        rows = list(csv.DictReader(f))
    methods = {(r["section"], r["method"]) for r in rows}
    assert {("clusters", "random"), ("clusters", "kmeans"), ("clusters", "feature")} <= methods
    assert {r["rule"] for r in rows} >= {"route", "over-arch", "mean", "median", "max", "baseline"}
    for r in rows:
        assert 0.0 <= float(r["auc"]) <= 1.0
        assert int(r["seeds"]) == 2
        assert math.isfinite(float(r["auc_ci95"]))  # a t-interval across the 2 seeds
    ks = {int(r["clusters"]) for r in rows if r["method"] == "random"}
    assert ks == {2, 4}


def test_fel_and_plain_fl_do_the_same_client_updates(
    taobao_bench: tuple[BenchFELConfig, dict],
) -> None:
    _, result = taobao_bench
    records = result["records"]
    for r in records:
        base = next(
            b
            for b in records
            if b["section"] == "baseline"
            and b["seed"] == r["seed"]
            and b["target_epsilon"] == r["target_epsilon"]
        )
        assert r["client_updates"] == base["client_updates"] > 0


def test_dp_table_epsilons_match_the_accountant(
    taobao_bench: tuple[BenchFELConfig, dict],
) -> None:
    config, result = taobao_bench
    dp = [r for r in result["records"] if math.isfinite(r["target_epsilon"])]
    assert {r["section"] for r in dp} == {"baseline", "dp", "private"}
    for r in dp:
        if r["section"] == "private":  # the public leaf and the private leaf, sequentially
            mech = GaussianMechanism(r["noise_multiplier"], config.sample_rate, config.rounds)
            assert r["epsilon"] == pytest.approx(epsilon_of([mech, mech], config.delta))
            assert r["epsilon"] > 1.2 * r["target_epsilon"]
            continue
        expected = epsilon(r["noise_multiplier"], config.sample_rate, config.rounds, config.delta)
        assert r["epsilon"] == pytest.approx(expected, rel=1e-9)
        assert r["epsilon"] == pytest.approx(r["target_epsilon"], rel=0.02)
        if r["section"] == "dp":  # the over-arch trained by DP-FedAvg on the same users' data
            leaf = GaussianMechanism(r["noise_multiplier"], config.sample_rate, config.rounds)
            arch = GaussianMechanism(
                r["noise_multiplier"], config.sample_rate, config.over_arch_rounds
            )
            assert r["epsilon_over_arch_fl"] == pytest.approx(
                epsilon_of([leaf, arch], config.delta)
            )
            assert r["epsilon_over_arch_fl"] > r["epsilon"]
            assert 0.0 <= r["auc"][FL_OVER_ARCH] <= 1.0
    for r in result["rows"]:
        if r["section"] == "dp" and math.isfinite(r["target_epsilon"]):
            if r["rule"] == FL_OVER_ARCH:
                assert r["epsilon"] > 1.05 * r["target_epsilon"]
            else:
                assert r["epsilon"] == pytest.approx(r["target_epsilon"], rel=0.02)
    table = (Path(config.out) / "taobao-synthetic" / "table.md").read_text()
    assert "| FEL over-arch FL | ε with over-arch FL |" in table


def test_bench_on_ml100k(tmp_path: Path) -> None:
    write_ml100k(tmp_path / "ml")
    config = _quick(
        tmp_path,
        data="ml-100k",
        data_dir=str(tmp_path / "ml"),
        methods=("random", "feature"),
        target_epsilons=(),
        seeds=1,
    )
    result = run_bench(config, log=lambda _: None)
    assert (tmp_path / "out" / "ml-100k" / "table.md").is_file()
    assert all(0.0 <= r["auc"] <= 1.0 or math.isnan(r["auc"]) for r in result["rows"])


def test_bad_arguments_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--data must be one of"):
        _quick(tmp_path, data="criteo")
    with pytest.raises(ValueError, match="--clusters"):
        _quick(tmp_path, clusters=(0, 2))
    with pytest.raises(ValueError, match="--data taobao needs --data-dir"):
        _quick(tmp_path, data="taobao")
    with pytest.raises(ValueError, match="--target-epsilon"):
        _quick(tmp_path, target_epsilons=(-1.0,))
    with pytest.raises(ValueError, match="--private-leaf needs Taobao"):
        _quick(tmp_path, data="ml-100k", private_leaf=True)
    write_ml100k(tmp_path / "ml")
    config = _quick(tmp_path, data="ml-100k", data_dir=str(tmp_path / "ml"), cross=("zip",))
    with pytest.raises(ValueError, match="--cross: no public feature"):
        run_bench(config, log=lambda _: None)


def test_cli_quick_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fedrec.cli import main

    data_dir = write_taobao_groups(tmp_path / "data", num_users=200, num_ads=50, ctr=0.1)
    code = main(
        [
            "bench",
            "fel",
            "--quick",
            "--data-dir",
            str(data_dir),
            "--methods",
            "random",
            "--clusters",
            "2",
            "--target-epsilon",
            "--rounds",
            "2",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0
    assert "FEL against plain FL" in capsys.readouterr().out
    assert main(["bench", "fel", "--quick", "--users", "3", "--no-progress"]) == 2


# ------------------------------------------------------------------------------------------------
# The private leaf


PRIVATE = ("pvalue_level", "shopping_level")


@pytest.fixture(scope="module")
def taobao(tmp_path_factory: pytest.TempPathFactory):
    folder = write_taobao_groups(tmp_path_factory.mktemp("fel_private"), num_users=400, num_ads=80)
    return click_data_from_taobao(folder)


def test_private_features_stay_on_the_device(taobao) -> None:
    public, device = split_private(taobao, fields=PRIVATE, history_field="cate_id")
    assert not set(PRIVATE) & set(public.field_names) and not set(PRIVATE) & set(
        public.public_names
    )
    assert set(PRIVATE) <= set(device.field_names)
    assert device.field_names[-1] == "private:cate_id_history"
    a = cluster_clients(public.public, public.public_names, "random", num_clusters=3)
    dp = DPConfig(clip_norm=0.5, noise_multiplier=1.0)
    config = FedConfig(rounds=3, sample_rate=0.3, dp=dp)
    server = FELServer(train_federated(public, a, config))
    # the server's leaves take public inputs only
    assert server.leaves.params["wide"].shape[1] == public.vocab_size < device.vocab_size
    rows = np.arange(len(public.label))
    served = server.scores(public, rows)
    private = train_private_leaf(device, served, FedConfig(rounds=3, sample_rate=0.3, dp=dp))
    final = private.device_scores(served, device, rows)
    # changing the private features changes the device's scores, never the server's
    other = device.sparse.copy()
    other[:, -1] = (other[:, -1] + 1) % 5
    for name in PRIVATE:
        column = device.field_names.index(name)
        other[:, column] = (other[:, column] + 1) % device.field_sizes[column]
    changed = type(device)(**{**device.__dict__, "sparse": other})
    assert np.array_equal(server.scores(public, rows), served)
    assert not np.allclose(private.device_scores(served, changed, rows), final)
    # the server-side object holds nothing of the private leaf
    held = [v for v in vars(server).values()] + list(vars(server.leaves).values())
    assert all(v is not private and v is not private.leaf for v in held)


def test_private_history_is_leave_one_out(taobao) -> None:
    from fedrec.train.fel.private import history_codes

    codes = history_codes(taobao, "cate_id")
    assert codes.min() >= 0 and codes.max() <= 4
    # a user's only training row on a category has no history for it
    u = taobao.client
    cate = taobao.sparse[:, taobao.field_names.index("cate_id")]
    train = ~taobao.is_test
    keys = u[train] * 10_000 + cate[train]
    unique, counts = np.unique(keys, return_counts=True)
    single = np.isin(u * 10_000 + cate, unique[counts == 1]) & train
    assert single.any() and (codes[single] == 0).all()


def test_private_leaf_composes_sequentially(taobao) -> None:
    a = cluster_clients(
        taobao.public, taobao.public_names, "feature", features=("final_gender_code",)
    )
    pub = FedConfig(rounds=4, sample_rate=0.25, dp=DPConfig(clip_norm=0.5, noise_multiplier=1.2))
    priv = FedConfig(
        rounds=3, sample_rate=0.25, dp=DPConfig(clip_norm=0.5, noise_multiplier=1.5), seed=1
    )
    result = run_private_fel(taobao, a, pub, priv, fields=PRIVATE, history_field="cate_id")
    both = epsilon_of(
        [GaussianMechanism(1.2, 0.25, 4), GaussianMechanism(1.5, 0.25, 3)], pub.dp.delta
    )
    alone = epsilon(1.2, 0.25, 4, pub.dp.delta)
    assert result.privacy.epsilon == pytest.approx(both)
    assert result.privacy.epsilon > alone
    assert set(result.privacy.per_cluster) == set(range(int(a.max()) + 1))
    assert 0.0 <= result.auc_public <= 1.0 and 0.0 <= result.auc_device <= 1.0
    with pytest.raises(ValueError, match="DP-FedAvg"):
        train_private_leaf(taobao, np.zeros(len(taobao.label)), FedConfig(rounds=1))


def test_baseline_without_fill_samples_like_fel(taobao) -> None:
    a = cluster_clients(taobao.public, taobao.public_names, "random", num_clusters=7)
    config = FedConfig(rounds=3, sample_rate=0.05, fill_empty_clusters=False)
    assert (
        train_federated(taobao, a, config).client_updates
        == train_baseline(taobao, config).client_updates
    )


# ------------------------------------------------------------------------------------------------
# FEL models as agents


def test_fel_and_plain_fl_act_in_the_taobao_env(tmp_path: Path) -> None:
    import gymnasium as gym

    from fedrec.agents.fel_agent import FELTaobaoAgent, TaobaoFeatureMap, fel_model
    from fedrec.eval.ranking_metrics import auc, collect_scores
    from fedrec.train.fel import combine, predict

    folder = write_taobao_groups(tmp_path, num_users=200, num_ads=60, ctr=0.1)
    data = click_data_from_taobao(folder)
    a = cluster_clients(
        data.public, data.public_names, "feature", features=("final_gender_code", "age_level")
    )
    config = FedConfig(rounds=3, sample_rate=0.3)
    test = np.flatnonzero(data.is_test)
    mapping = TaobaoFeatureMap(folder, "test")
    for leaves in (train_federated(data, a, config), train_baseline(data, config)):
        direct = combine(
            predict(leaves.params, data, test), "route", leaves.assignment[data.client[test]]
        )
        env = gym.make("fedrec/TaobaoAds-v0", data_dir=folder, split="test")
        agent = FELTaobaoAgent(fel_model(leaves, data), mapping)
        obs, _ = env.reset(seed=0)
        action = agent.act(obs)
        assert action.shape == (1,) and action.dtype == np.float32
        assert env.action_space.contains(action)
        scores, clicks = collect_scores(env, agent.score, episodes=env.unwrapped.data.num_users)
        assert ((scores >= 0) & (scores <= 1)).all()
        # the env's per-split ids map back onto the training data: the same test AUC
        assert auc(scores, clicks) == pytest.approx(auc(direct, data.label[test]), abs=1e-9)


def test_fel_ranks_movielens_candidates(tmp_path: Path) -> None:
    import gymnasium as gym

    from fedrec.agents.fel_agent import FELRankingAgent, MovieLensFeatureMap, fel_model
    from fedrec.envs.datasets.click_data import click_data_from_ml100k
    from fedrec.eval.ranking_metrics import evaluate_ranking_agent

    write_ml100k(tmp_path)
    data = click_data_from_ml100k(tmp_path)
    a = cluster_clients(data.public, data.public_names, "feature", features=("gender",))
    leaves = train_federated(data, a, FedConfig(rounds=3, sample_rate=0.3))
    env = gym.make("fedrec/MovieLens100K-v0", data_dir=tmp_path, mode="evaluation")
    agent = FELRankingAgent(
        fel_model(leaves, data), MovieLensFeatureMap(env, tmp_path), data.public
    )
    obs, _ = env.reset(seed=0)
    slate = agent.act(obs)
    assert env.action_space.contains(slate) and len(set(slate.tolist())) == 10
    result = evaluate_ranking_agent("fedrec/MovieLens100K-v0", agent, data_dir=tmp_path)
    assert 0.0 <= result.ndcg <= result.hit_rate <= 1.0


def test_a_rerun_reads_finished_seeds_and_refuses_a_broken_file(
    taobao_bench: tuple[BenchFELConfig, dict],
) -> None:
    config, first = taobao_bench
    messages: list[str] = []
    again = run_bench(config, log=messages.append)
    assert sum("finished records read" in m for m in messages) == config.seeds
    assert again["rows"] == first["rows"]
    seed_path = Path(config.out) / "taobao-synthetic" / "seeds" / f"seed{config.first_seed}.json"
    text = seed_path.read_text()
    try:
        seed_path.write_text(text[: len(text) // 2])  # a torn write
        with pytest.raises(ValueError, match="not a valid fedrec bench fel seed file"):
            run_bench(config, log=lambda _: None)
    finally:
        seed_path.write_text(text)
