"""The runs of ``fedrec bench fel`` (:mod:`fedrec.experiments.fel`): its configuration, the
click data, and every model trained for one seed (plain FL, FEL per clustering and privacy level,
the private leaf), each record as the seed file keeps it. Every name here is also importable from
:mod:`fedrec.experiments.fel`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.experiments.harness import option

DATASETS = ("taobao-synthetic", "taobao", "ml-100k")
METHODS = ("random", "feature", "kmeans")
#: The over-arch trained by (DP-)FedAvg over every user (the DP table's FEL runs).
FL_OVER_ARCH = "over-arch FL"
#: The feature cross of the ``feature`` clustering, per data set.
DEFAULT_CROSS = {
    "taobao-synthetic": ("final_gender_code", "age_level"),
    "taobao": ("final_gender_code", "age_level"),
    "ml-100k": ("gender", "age_band"),
}


def _epsilon(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"epsilon must be > 0 (inf for no DP), got {text}")
    return value


@dataclasses.dataclass(frozen=True)
class BenchFELConfig:
    """Everything ``fedrec bench fel`` runs (its fields are the command's options)."""

    data: str = option("taobao-synthetic", choices=DATASETS)
    """the click data set"""
    data_dir: str | None = None
    """taobao: the real files; ml-100k: its folder (default: the fedrec cache);
    taobao-synthetic: where the generated files are kept (default: the cache)"""
    users: int = 100_000
    """synthetic Taobao users"""
    ads: int = 2000
    """synthetic Taobao ads"""
    clusters: tuple[int, ...] = option((1, 2, 4, 8, 16), metavar="K")
    """the numbers of clusters K of the random and kmeans clusterings"""
    methods: tuple[str, ...] = option(METHODS, choices=METHODS)
    """the clustering methods"""
    cross: tuple[str, ...] = option((), metavar="FEATURE")
    """public features of the feature clustering (default: the data set's own cross)"""
    target_epsilons: tuple[float, ...] = option(
        (8.0, 2.0), flag="--target-epsilon", parse=_epsilon, nargs="*", metavar="EPS"
    )
    """finite ε of the DP table (default 8 2; none: no DP rows)"""
    dp_method: str = option("feature", choices=METHODS)
    """the clustering of the DP table's FEL runs"""
    dp_clusters: int = 8
    """K of a random/kmeans DP run"""
    delta: float = 1e-5
    """δ of DP-FedAvg"""
    clip_norm: float = 0.5
    """the clipping norm of DP-FedAvg"""
    rounds: int = 50
    """federated rounds"""
    sample_rate: float | None = None
    """q (default 0.01 with 10,000 clients or more, else 0.1, set when the data is loaded;
    --quick: 0.2)"""
    local_epochs: int = 1
    """local epochs per round"""
    batch_size: int = 16
    """local mini-batch size"""
    client_lr: float = 0.5
    """the clients' SGD step"""
    hidden: int = 0
    """MLP width of the leaves (0: LR)"""
    opt_in_fraction: float = 0.1
    """share of users whose data trains the central over-arch"""
    over_arch_iterations: int = option(100, cli=False)
    over_arch_rounds: int = 50
    """rounds of the over-arch trained by (DP-)FedAvg over every user, in the DP table
    (default 50, --quick 5; 0: none)"""
    over_arch_client_lr: float = option(5.0, cli=False)
    """its clients' SGD step (its inputs are bounded logits: larger steps than the leaves')"""
    over_arch_local_epochs: int = option(3, cli=False)
    private_leaf: bool = False
    """Taobao: also train FEL with the private leaf at each finite epsilon"""
    private_fields: tuple[str, ...] = option(("pvalue_level", "shopping_level"), cli=False)
    history_field: str = option("cate_id", cli=False)
    seeds: int = 3
    """seeds"""
    first_seed: int = 0
    """the seeds are FIRST, FIRST + 1, ..."""
    out: str | None = None
    """output folder (default runs/bench/fel/HASH of the configuration; a folder of another
    configuration is refused)"""
    progress: bool = True
    """the progress bar"""

    def __post_init__(self) -> None:
        problems = []
        if self.data not in DATASETS:
            problems.append(f"--data must be one of {', '.join(DATASETS)}, got {self.data!r}")
        if self.data == "taobao" and not self.data_dir:
            problems.append("--data taobao needs --data-dir with the real Taobao files")
        if self.users < 10:
            problems.append(f"--users must be >= 10, got {self.users}")
        if self.ads < 2:
            problems.append(f"--ads must be >= 2, got {self.ads}")
        if not self.clusters or min(self.clusters) < 1:
            problems.append(f"--clusters must be positive integers, got {list(self.clusters)}")
        bad = [m for m in (*self.methods, self.dp_method) if m not in METHODS]
        if bad or not self.methods:
            problems.append(f"clustering methods must be among {', '.join(METHODS)}, got {bad}")
        if any(not (e > 0) for e in self.target_epsilons):
            problems.append(
                f"--target-epsilon values must be > 0, got {list(self.target_epsilons)}"
            )
        if not 0 < self.delta < 1 or self.clip_norm <= 0:
            problems.append("need 0 < --delta < 1 and --clip-norm > 0")
        if self.rounds < 1 or self.seeds < 1 or self.batch_size < 1 or self.local_epochs < 1:
            problems.append("--rounds, --seeds, --batch-size and --local-epochs must be >= 1")
        if self.sample_rate is not None and not 0 < self.sample_rate <= 1:
            problems.append(f"--sample-rate must be in (0, 1], got {self.sample_rate}")
        if not 0 <= self.opt_in_fraction <= 1:
            problems.append(f"--opt-in-fraction must be in [0, 1], got {self.opt_in_fraction}")
        if self.private_leaf and self.data == "ml-100k":
            problems.append("--private-leaf needs Taobao data (its ad category history)")
        if self.private_leaf and not self.target_epsilons:
            problems.append("--private-leaf needs at least one --target-epsilon")
        if self.over_arch_client_lr <= 0 or self.over_arch_local_epochs < 1:
            problems.append("the over-arch's client lr must be > 0 and its local epochs >= 1")
        if self.over_arch_rounds < 0:
            problems.append(f"--over-arch-rounds must be >= 0, got {self.over_arch_rounds}")
        if self.dp_clusters < 1:
            problems.append(f"--dp-clusters must be >= 1, got {self.dp_clusters}")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def cross_features(self) -> tuple[str, ...]:
        return self.cross or DEFAULT_CROSS[self.data]

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))


# ------------------------------------------------------------------------------------------------
# Data


def load_data(config: BenchFELConfig, *, log: Callable[[str], None] = print):
    """The :class:`~fedrec.envs.datasets.click_data.ClickData` of ``config.data``. The synthetic Taobao set
    is written once per (users, ads) into ``--data-dir`` or ``<cache>/taobao-synthetic/...``."""
    from fedrec.envs.datasets.click_data import click_data_from_ml100k, click_data_from_taobao

    if config.data == "ml-100k":
        return click_data_from_ml100k(config.data_dir)
    if config.data == "taobao":
        return click_data_from_taobao(config.data_dir)
    from fedrec.envs.datasets.catalog import data_root
    from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups

    folder = (
        Path(config.data_dir)
        if config.data_dir
        else data_root() / "taobao-synthetic" / f"users{config.users}-ads{config.ads}-seed0"
    )
    if not (folder / "raw_sample.csv").is_file():
        log(f"writing synthetic Taobao ({config.users} users) to {folder}")
        folder.mkdir(parents=True, exist_ok=True)
        write_taobao_groups(folder, num_users=config.users, num_ads=config.ads, seed=0)
    return click_data_from_taobao(folder)


# ------------------------------------------------------------------------------------------------
# Runs


@dataclasses.dataclass(frozen=True)
class Setting:
    """One trained model family of a seed: a clustering (``method``, K) under a privacy level."""

    section: str  # "clusters" or "dp"
    method: str  # "plain FL" for the baseline
    num_clusters: int
    target_epsilon: float  # inf = no DP


def fed_config(config: BenchFELConfig, seed: int, target_epsilon: float):
    from fedrec.train.fel import DPConfig, FedConfig, LeafConfig

    dp = None
    if math.isfinite(target_epsilon):
        dp = DPConfig(clip_norm=config.clip_norm, target_epsilon=target_epsilon, delta=config.delta)
    return FedConfig(
        leaf=LeafConfig(hidden=config.hidden),
        rounds=config.rounds,
        sample_rate=config.sample_rate,
        local_epochs=config.local_epochs,
        batch_size=config.batch_size,
        client_lr=config.client_lr,
        dp=dp,
        seed=seed,
        fill_empty_clusters=False,
    )


def assignment_for(data, config: BenchFELConfig, method: str, k: int, seed: int) -> np.ndarray:
    from fedrec.train.fel.clusters import cluster_clients

    if method == "feature":
        return cluster_clients(
            data.public, data.public_names, "feature", features=config.cross_features
        )
    if method == "kmeans":
        distinct = len(np.unique(data.public, axis=0))
        k = min(k, distinct)
    return cluster_clients(data.public, data.public_names, method, num_clusters=k, seed=seed)


def settings_of(config: BenchFELConfig) -> list[Setting]:
    """Every FEL setting of one seed (plain FL is trained once per privacy level besides)."""
    out = []
    for method in config.methods:
        ks = [0] if method == "feature" else [k for k in config.clusters if k > 1]
        out += [Setting("clusters", method, k, math.inf) for k in ks]
    dp_k = 0 if config.dp_method == "feature" else config.dp_clusters
    if config.target_epsilons and Setting("clusters", config.dp_method, dp_k, math.inf) not in out:
        out.append(Setting("dp", config.dp_method, dp_k, math.inf))
    out += [Setting("dp", config.dp_method, dp_k, e) for e in config.target_epsilons]
    return out


def run_seed(
    data, config: BenchFELConfig, seed: int, progress: Callable[[int], None] | None = None
) -> list[dict[str, Any]]:
    """All runs of one seed: one record per trained model (plain FL or FEL)."""
    from fedrec.train.fel import baseline_auc, ensemble_aucs, train_baseline, train_federated

    records = []
    dp_setting = (config.dp_method, 0 if config.dp_method == "feature" else config.dp_clusters)
    baselines: dict[float, dict[str, Any]] = {}
    for eps in (math.inf, *config.target_epsilons):
        fed = fed_config(config, seed, eps)
        start = time.perf_counter()
        base = train_baseline(data, fed, progress=progress)
        seconds = time.perf_counter() - start
        record = {
            "seed": seed,
            "section": "baseline",
            "method": "plain FL",
            "num_clusters": 1,
            "target_epsilon": eps,
            "epsilon": base.privacy.epsilon if base.privacy else math.inf,
            "noise_multiplier": base.noise_multiplier,
            "client_updates": base.client_updates,
            "train_seconds": seconds,
            "auc": {"baseline": baseline_auc(data, base)},
        }
        baselines[eps] = record
        records.append(record)
    for setting in settings_of(config):
        assignment = assignment_for(data, config, setting.method, setting.num_clusters, seed)
        fed = fed_config(config, seed, setting.target_epsilon)
        start = time.perf_counter()
        fel = train_federated(data, assignment, fed, progress=progress)
        seconds = time.perf_counter() - start
        scores, _ = ensemble_aucs(
            data,
            fel,
            opt_in_fraction=config.opt_in_fraction,
            over_arch_iterations=config.over_arch_iterations,
            seed=seed,
        )
        epsilon_fl = math.inf
        if config.over_arch_rounds and (setting.method, setting.num_clusters) == dp_setting:
            scores[FL_OVER_ARCH], epsilon_fl = federated_over_arch(data, fel, fed, config)
            if progress is not None:
                progress(config.over_arch_rounds)
        base = baselines[setting.target_epsilon]
        if fel.client_updates != base["client_updates"]:
            raise RuntimeError(
                f"FEL did {fel.client_updates} client updates, plain FL {base['client_updates']}"
            )
        records.append(
            {
                "seed": seed,
                "section": setting.section,
                "method": setting.method,
                "num_clusters": int(assignment.max()) + 1,
                "target_epsilon": setting.target_epsilon,
                "epsilon": fel.privacy.epsilon if fel.privacy else math.inf,
                "noise_multiplier": fel.noise_multiplier,
                "client_updates": fel.client_updates,
                "train_seconds": seconds,
                "auc": scores,
                "baseline_auc": base["auc"]["baseline"],
                "epsilon_over_arch_fl": epsilon_fl,
            }
        )
    if config.private_leaf:
        records += run_private(data, config, seed, baselines, progress)
    return records


def federated_over_arch(data, fel, fed, config: BenchFELConfig) -> tuple[float, float]:
    """Test AUC of an over-arch trained by (DP-)FedAvg over every user on top of ``fel``'s leaves
    (with the leaves' noise multiplier), and the ε of leaves and over-arch composed (inf: no DP)."""
    from fedrec.eval.ranking_metrics import auc
    from fedrec.federation.privacy import GaussianMechanism, fel_epsilon
    from fedrec.train.fel import over_arch_logits, predict
    from fedrec.train.fel.overarch import train_over_arch_federated

    dp = None
    if fed.dp is not None:
        dp = dataclasses.replace(fed.dp, noise_multiplier=fel.noise_multiplier, target_epsilon=None)
    result = train_over_arch_federated(
        data,
        fel.params,
        fel.assignment,
        dataclasses.replace(
            fed,
            dp=dp,
            client_lr=config.over_arch_client_lr,
            local_epochs=config.over_arch_local_epochs,
        ),
        rounds=config.over_arch_rounds,
    )
    test = np.flatnonzero(data.is_test)
    cluster = fel.assignment[data.client[test]]
    logits = over_arch_logits(result.arch, predict(fel.params, data, test), cluster)
    score = auc(logits, data.label[test])
    if result.mechanism is None:
        return score, math.inf
    leaf = GaussianMechanism(float(fel.noise_multiplier), fed.sample_rate, fed.rounds)
    k = int(fel.assignment.max()) + 1
    privacy = fel_epsilon({c: [leaf] for c in range(k)}, fed.dp.delta, shared=[result.mechanism])
    return score, privacy.epsilon


def run_private(
    data,
    config: BenchFELConfig,
    seed: int,
    baselines: dict[float, dict[str, Any]],
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """FEL with the private leaf at each finite ε: the public leaves (clustering ``dp_method``)
    see the data without the private fields; the private leaf (the same target ε, composed
    sequentially) adds its output on the device."""
    from fedrec.train.fel.private import run_private_fel, split_private

    public, _ = split_private(data, fields=config.private_fields)
    dp_k = 0 if config.dp_method == "feature" else config.dp_clusters
    assignment = assignment_for(public, config, config.dp_method, dp_k, seed)
    records = []
    for eps in config.target_epsilons:
        fed = fed_config(config, seed, eps)
        start = time.perf_counter()
        result = run_private_fel(
            data,
            assignment,
            fed,
            dataclasses.replace(fed, seed=seed + 1000),
            fields=config.private_fields,
            history_field=config.history_field,
        )
        seconds = time.perf_counter() - start
        if progress is not None:
            progress(2 * config.rounds)
        leaves = result.server.leaves
        if leaves.client_updates != baselines[eps]["client_updates"]:
            raise RuntimeError("the public leaves and plain FL did different client updates")
        records.append(
            {
                "seed": seed,
                "section": "private",
                "method": config.dp_method,
                "num_clusters": int(assignment.max()) + 1,
                "target_epsilon": eps,
                "epsilon": result.privacy.epsilon,
                "noise_multiplier": leaves.noise_multiplier,
                "client_updates": leaves.client_updates,  # the public leaves (as plain FL's)
                "private_client_updates": result.private.leaf.client_updates,
                "train_seconds": seconds,
                "auc": {"route": result.auc_public, "device": result.auc_device},
                "baseline_auc": baselines[eps]["auc"]["baseline"],
            }
        )
    return records


def rounds_per_seed(config: BenchFELConfig) -> int:
    runs = 1 + len(config.target_epsilons) + len(settings_of(config))
    if config.private_leaf:
        runs += 2 * len(config.target_epsilons)
    over_arch = config.over_arch_rounds * (1 + len(config.target_epsilons))
    return config.rounds * runs + over_arch
