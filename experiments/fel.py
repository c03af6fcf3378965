"""``fedrec bench fel``: FEL (Federated Ensemble Learning) against plain FL on click data.

For every seed it trains, on the same data and with the same federated settings:

- **plain FL**: one global leaf over all clients;
- **FEL** for every clustering in the sweep: ``random`` and ``kmeans`` clusters with each K of
  ``--clusters`` (K = 1 is plain FL itself), and the ``feature`` cross of ``--cross`` (its K is
  the number of distinct values of the cross);
- the **DP table**: plain FL and FEL (clustering ``--dp-method``) with DP-FedAvg at each
  ``--target-epsilon``, next to the non-private runs (ε = inf);
- with ``--private-leaf`` (Taobao): FEL whose public leaves lack the private fields, plus the
  private leaf on the device (:mod:`fedrec.train.fel_private`), at each finite ε, with the
  composed ε.

Client sampling is pure Poisson with rate ``--sample-rate`` from a seeded generator that does not
depend on the clustering, so FEL and plain FL of one seed train exactly the same clients in every
round: the same number of client updates (checked, and reported in the tables).

Each FEL run is scored with every ensemble rule (mean, median, max, route, over-arch); the tables
give the mean test AUC over seeds with its 95 % t-interval, and the relative AUC change of FEL
over plain FL (paired per seed), beside the paper's reported +0.43..2.31 %. Writes
``OUT/DATA/table.md``, ``table.csv`` (one row per setting and rule) and ``auc_vs_clusters.png``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.experiments import harness

#: The paper's reported gain of FEL over on-device FL (relative, %).
PAPER_GAIN = (0.43, 2.31)
DATASETS = ("taobao-synthetic", "taobao", "ml-100k")
METHODS = ("random", "feature", "kmeans")
RULE_COLUMNS = ("route", "over-arch", "mean", "median", "max")
#: The over-arch trained by (DP-)FedAvg over every user (the DP table's FEL runs).
FL_OVER_ARCH = "over-arch FL"
#: The feature cross of the ``feature`` clustering, per data set.
DEFAULT_CROSS = {
    "taobao-synthetic": ("final_gender_code", "age_level"),
    "taobao": ("final_gender_code", "age_level"),
    "ml-100k": ("gender", "age_band"),
}


@dataclasses.dataclass(frozen=True)
class BenchFELConfig:
    """Everything ``fedrec bench fel`` runs (see :func:`config_from_args`)."""

    data: str = "taobao-synthetic"
    data_dir: str | None = None
    users: int = 100_000
    ads: int = 2000
    clusters: tuple[int, ...] = (1, 2, 4, 8, 16)
    methods: tuple[str, ...] = METHODS
    cross: tuple[str, ...] = ()
    target_epsilons: tuple[float, ...] = (8.0, 2.0)
    dp_method: str = "feature"
    dp_clusters: int = 8
    delta: float = 1e-5
    clip_norm: float = 0.5
    rounds: int = 50
    sample_rate: float | None = None
    """q; None: 0.01 with 10,000 clients or more, else 0.1 (set when the data is loaded)."""
    local_epochs: int = 1
    batch_size: int = 16
    client_lr: float = 0.5
    hidden: int = 0
    opt_in_fraction: float = 0.1
    over_arch_iterations: int = 100
    over_arch_rounds: int = 50
    """rounds of the over-arch trained by FL over every user, for the DP table (0: none)"""
    over_arch_client_lr: float = 5.0
    """its clients' SGD step (its inputs are bounded logits: larger steps than the leaves')"""
    over_arch_local_epochs: int = 3
    private_leaf: bool = False
    """also train FEL with the private leaf at each finite ε (Taobao data only)"""
    private_fields: tuple[str, ...] = ("pvalue_level", "shopping_level")
    history_field: str = "cate_id"
    seeds: int = 3
    first_seed: int = 0
    out: str | None = None
    """output folder (None: ``runs/bench/fel/HASH``, see :func:`default_out`)"""
    progress: bool = True

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
    """The :class:`~fedrec.train.fel_data.ClickData` of ``config.data``. The synthetic Taobao set
    is written once per (users, ads) into ``--data-dir`` or ``<cache>/taobao-synthetic/...``."""
    from fedrec.train.fel_data import click_data_from_ml100k, click_data_from_taobao

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
    from fedrec.train.fel_clusters import cluster_clients

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
    from fedrec.train.fel import over_arch_logits, predict
    from fedrec.train.fel_overarch import train_over_arch_federated
    from fedrec.train.fel_privacy import GaussianMechanism, fel_epsilon

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
    from fedrec.train.fel_private import run_private_fel, split_private

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


# ------------------------------------------------------------------------------------------------
# Summary


def _ci(values: Sequence[float]) -> tuple[float, float]:
    from fedrec.eval.stats import mean_ci

    return mean_ci(values)


def summarise(records: list[dict[str, Any]], config: BenchFELConfig) -> list[dict[str, Any]]:
    """One row per (section, method, K, ε, rule): mean and 95 % t-interval over seeds of the AUC,
    of plain FL's AUC, and of the paired relative change (FEL / FL - 1, %)."""
    rows = []
    keys = []
    for r in records:
        key = (r["section"], r["method"], r["num_clusters"], r["target_epsilon"])
        if key not in keys:
            keys.append(key)
    for key in keys:
        group = [
            r
            for r in records
            if (r["section"], r["method"], r["num_clusters"], r["target_epsilon"]) == key
        ]
        rules = [
            rule
            for rule in (*RULE_COLUMNS, FL_OVER_ARCH, "device", "baseline")
            if rule in group[0]["auc"]
        ]
        for rule in rules:
            scored = [r for r in group if rule in r["auc"]]
            aucs = [r["auc"][rule] for r in scored]
            base = [r.get("baseline_auc", r["auc"].get("baseline")) for r in scored]
            rel = [100 * (a / b - 1) for a, b in zip(aucs, base, strict=True)]
            auc_mean, auc_ci = _ci(aucs)
            base_mean, base_ci = _ci(base)
            rel_mean, rel_ci = _ci(rel)
            rows.append(
                {
                    "data": config.data,
                    "section": key[0],
                    "method": key[1],
                    "clusters": key[2],
                    "target_epsilon": key[3],
                    # the FL over-arch's row: leaves and over-arch composed
                    "epsilon": float(
                        np.mean(
                            [
                                r["epsilon_over_arch_fl"] if rule == FL_OVER_ARCH else r["epsilon"]
                                for r in group
                            ]
                        )
                    ),
                    "noise_multiplier": group[0]["noise_multiplier"],
                    "rule": rule,
                    "seeds": len(aucs),
                    "auc": auc_mean,
                    "auc_ci95": auc_ci,
                    "fl_auc": base_mean,
                    "fl_auc_ci95": base_ci,
                    "rel_change_pct": rel_mean,
                    "rel_change_ci95": rel_ci,
                    "client_updates": int(np.mean([r["client_updates"] for r in group])),
                    "train_seconds": float(np.mean([r["train_seconds"] for r in group])),
                }
            )
    return rows


def _pm(mean: float, half: float, digits: int = 4) -> str:
    if not math.isfinite(mean):
        return "–"
    return (
        f"{mean:.{digits}f}"
        if not math.isfinite(half)
        else f"{mean:.{digits}f} ± {half:.{digits}f}"
    )


def _method_label(method: str, config: BenchFELConfig) -> str:
    return f"feature ({' × '.join(config.cross_features)})" if method == "feature" else method


def render_markdown(rows: list[dict[str, Any]], config: BenchFELConfig) -> str:
    """The two tables (clusterings, DP) as Markdown."""
    lo, hi = PAPER_GAIN
    lines = [
        f"# FEL against plain FL on {config.data}",
        "",
        f"{config.seeds} seed(s); {config.rounds} rounds, Poisson sampling q = {config.sample_rate}, "
        f"{config.local_epochs} local epoch(s) of batch {config.batch_size}, client lr "
        f"{config.client_lr}; AUC on the test rows, mean ± 95 % t-interval across seeds. Δ % is "
        f"the relative AUC change of FEL over plain FL (paired per seed); the paper reports "
        f"+{lo}..{hi} % on its data.",
        "",
        "## Clusterings (no DP)",
        "",
        "| method | K | updates | plain FL | "
        + " | ".join(RULE_COLUMNS)
        + " | Δ % route | Δ % over-arch |",
        "|---|---|---|---|" + "---|" * len(RULE_COLUMNS) + "---|---|",
    ]
    by_key: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in rows:
        key = (r["section"], r["method"], r["clusters"], r["target_epsilon"])
        by_key.setdefault(key, {})[r["rule"]] = r
    base_inf = by_key.get(("baseline", "plain FL", 1, math.inf), {}).get("baseline")
    if base_inf:
        lines.append(
            f"| plain FL | 1 | {base_inf['client_updates']} | "
            f"{_pm(base_inf['auc'], base_inf['auc_ci95'])} | "
            + " | ".join("–" for _ in RULE_COLUMNS)
            + " | 0 | 0 |"
        )
    for key, rules in by_key.items():
        if key[0] != "clusters":
            continue
        first = next(iter(rules.values()))
        cells = [
            _pm(rules[c]["auc"], rules[c]["auc_ci95"]) if c in rules else "–" for c in RULE_COLUMNS
        ]
        deltas = [
            _pm(rules[c]["rel_change_pct"], rules[c]["rel_change_ci95"], 2) if c in rules else "–"
            for c in ("route", "over-arch")
        ]
        lines.append(
            f"| {_method_label(key[1], config)} | {key[2]} | {first['client_updates']} | "
            f"{_pm(first['fl_auc'], first['fl_auc_ci95'])} | " + " | ".join(cells + deltas) + " |"
        )
    lines += [
        "",
        f"## DP-FedAvg (δ = {config.delta}, clip {config.clip_norm}; FEL clustering: "
        f"{_method_label(config.dp_method, config)})",
        "",
        "| target ε | ε plain FL | ε FEL | z | plain FL | FEL route | FEL over-arch | Δ % route "
        "| Δ % over-arch | FEL over-arch FL | ε with over-arch FL | Δ % over-arch FL |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    dp_k = {key[2] for key in by_key if key[0] == "dp"}
    for eps in (math.inf, *config.target_epsilons):
        base = by_key.get(("baseline", "plain FL", 1, eps), {}).get("baseline")
        fel = next(
            (
                rules
                for key, rules in by_key.items()
                if key[0] in ("clusters", "dp")
                and key[1] == config.dp_method
                and key[2] in dp_k
                and key[3] == eps
            ),
            None,
        )
        if not base or not fel:
            continue
        first = next(iter(fel.values()))
        z = first["noise_multiplier"]
        cells = [
            "inf" if not math.isfinite(eps) else f"{eps:g}",
            "inf" if not math.isfinite(base["epsilon"]) else f"{base['epsilon']:.3f}",
            "inf" if not math.isfinite(first["epsilon"]) else f"{first['epsilon']:.3f}",
            "–" if z is None else f"{z:.3f}",
            _pm(base["auc"], base["auc_ci95"]),
            *(
                _pm(fel[c]["auc"], fel[c]["auc_ci95"]) if c in fel else "–"
                for c in ("route", "over-arch")
            ),
            *(
                _pm(fel[c]["rel_change_pct"], fel[c]["rel_change_ci95"], 2) if c in fel else "–"
                for c in ("route", "over-arch")
            ),
        ]
        fl = fel.get(FL_OVER_ARCH)
        cells += (
            [
                _pm(fl["auc"], fl["auc_ci95"]),
                "inf" if not math.isfinite(fl["epsilon"]) else f"{fl['epsilon']:.3f}",
                _pm(fl["rel_change_pct"], fl["rel_change_ci95"], 2),
            ]
            if fl
            else ["–"] * 3
        )
        lines.append("| " + " | ".join(cells) + " |")
    private = [(key, rules) for key, rules in by_key.items() if key[0] == "private"]
    if private:
        lines += [
            "",
            f"## Private leaf (private fields: {', '.join(config.private_fields)}; private click "
            f"history on {config.history_field})",
            "",
            "| target ε | ε composed | plain FL | FEL public (route) | FEL + private leaf | "
            "Δ % public | Δ % with private leaf |",
            "|---|---|---|---|---|---|---|",
        ]
        for key, rules in private:
            pub, dev = rules["route"], rules["device"]
            lines.append(
                f"| {key[3]:g} | {pub['epsilon']:.3f} | {_pm(pub['fl_auc'], pub['fl_auc_ci95'])} | "
                f"{_pm(pub['auc'], pub['auc_ci95'])} | {_pm(dev['auc'], dev['auc_ci95'])} | "
                f"{_pm(pub['rel_change_pct'], pub['rel_change_ci95'], 2)} | "
                f"{_pm(dev['rel_change_pct'], dev['rel_change_ci95'], 2)} |"
            )
    if config.data == "taobao-synthetic":
        lines += [
            "",
            "The synthetic Taobao set's user groups have opposing click preferences by "
            "construction, so FEL's gains on it are not comparable with the paper's.",
        ]
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot(rows: list[dict[str, Any]], config: BenchFELConfig, path: Path) -> Path:
    """AUC against K for each clustering method (route and over-arch), plain FL as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    base = [
        r for r in rows if r["section"] == "baseline" and not math.isfinite(r["target_epsilon"])
    ]
    if base:
        ax.axhline(base[0]["auc"], color="black", linestyle="--", label="plain FL")
    ticks: set[int] = set()
    for method in config.methods:
        for rule, style in (("route", "-o"), ("over-arch", ":s")):
            pts = sorted(
                (r["clusters"], r["auc"], r["auc_ci95"])
                for r in rows
                if r["section"] == "clusters" and r["method"] == method and r["rule"] == rule
            )
            if base and method != "feature" and 1 in config.clusters:  # K = 1 is plain FL
                pts = [(1, base[0]["auc"], base[0]["auc_ci95"]), *pts]
            if pts:
                k, a, ci = zip(*pts, strict=True)
                ticks.update(k)
                ci = [0.0 if not math.isfinite(c) else c for c in ci]
                ax.errorbar(k, a, yerr=ci, fmt=style, capsize=3, label=f"{method}, {rule}")
    ax.set_xscale("log", base=2)
    labels, last = [], None
    for t in sorted(ticks):  # a label too close to the previous one (15 beside 16) is left out
        near = last is not None and math.log2(t / last) < 0.2
        labels.append("" if near else str(t))
        last = last if near else t
    if ticks:
        ax.set_xticks(sorted(ticks), labels)
    ax.set_xlabel("clusters K")
    ax.set_ylabel("test AUC")
    ax.set_title(f"FEL on {config.data}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------
# Finished seeds: an interrupted bench resumes at the first unfinished seed


def seed_file(out: Path, seed: int) -> Path:
    return out / "seeds" / f"seed{seed}.json"


def _run_key(config: BenchFELConfig) -> dict[str, Any]:
    """What a seed's records depend on (not the seed count, the output folder or the bar)."""
    fields = dataclasses.asdict(config)
    for name in ("seeds", "first_seed", "out", "progress"):
        fields.pop(name)
    return json.loads(json.dumps(fields))


def expected_records(config: BenchFELConfig) -> list[tuple[str, str, float]]:
    """(section, method, target ε) of every record of one seed, in the order :func:`run_seed`
    writes them."""
    out = [("baseline", "plain FL", eps) for eps in (math.inf, *config.target_epsilons)]
    out += [(s.section, s.method, s.target_epsilon) for s in settings_of(config)]
    if config.private_leaf:
        out += [("private", config.dp_method, eps) for eps in config.target_epsilons]
    return out


def _record_check(seed: int, section: str, method: str, eps: float) -> harness.Check:
    """The schema of one record of a seed file (see :func:`run_seed`)."""
    common = {
        "seed": harness.equal(seed),
        "section": harness.equal(section),
        "method": harness.equal(method),
        "num_clusters": harness.integer,
        "target_epsilon": harness.equal(eps),
        "epsilon": harness.number,
        "noise_multiplier": harness.optional(harness.finite),
        "client_updates": harness.integer,
        "train_seconds": harness.non_negative,
        "auc": harness.mapping_of(harness.unit, min_length=1),
    }
    if section != "baseline":
        common["baseline_auc"] = harness.unit
    if section in ("clusters", "dp"):
        common["epsilon_over_arch_fl"] = harness.number
    if section == "private":
        common["private_client_updates"] = harness.integer
    return harness.record(common)


def check_seed_file(saved: Any, seed: int, config: BenchFELConfig) -> str | None:
    """The problem with a seed file's content for this seed and configuration, or None."""
    problem = harness.record(
        {"config": harness.mapping_of(lambda _: None), "records": harness.list_of(lambda _: None)}
    )(saved)
    if problem:
        return problem
    expected = expected_records(config)
    records = saved["records"]
    if len(records) != len(expected):
        return f"{len(records)} records, expected {len(expected)}"
    for i, (r, (section, method, eps)) in enumerate(zip(records, expected, strict=True)):
        problem = _record_check(seed, section, method, eps)(r)
        if problem:
            return f"record {i}: {problem}"
    return None


def write_seed(out: Path, seed: int, config: BenchFELConfig, records: list[dict]) -> Path:
    """Save one seed's records as JSON, atomically (a crash leaves the old file or none)."""
    return harness.write_json(
        seed_file(out, seed), {"config": _run_key(config), "records": records}
    )


def read_seed(out: Path, seed: int, config: BenchFELConfig) -> list[dict] | None:
    """The records of a finished seed, else None (no file). A file of another configuration, or
    one that is malformed in any way (cut short, a missing key, a wrong type, a NaN AUC), is a
    one-line :class:`~fedrec.experiments.harness.BenchError`."""
    path = seed_file(out, seed)
    if not path.is_file():
        return None
    what = "fedrec bench fel seed file"
    saved = harness.read_json(path, what)
    if isinstance(saved, dict) and isinstance(saved.get("config"), dict):
        harness.check_same(path, saved["config"], _run_key(config), what="a seed")
    problem = check_seed_file(saved, seed, config)
    if problem:
        harness.validate(saved, lambda _: problem, path, what)
    return saved["records"]


def check_out(out: Path, config: BenchFELConfig) -> dict[int, list[dict]]:
    """Check the output folder before anything runs: every seed file in it belongs to this
    configuration and passes validation, and none lies outside its seeds (the table would drop
    it). Returns the finished seeds' records."""
    folder = out / "seeds"
    present = {p.stem for p in folder.glob("seed*.json")} if folder.is_dir() else set()
    harness.check_subset(folder, present, {f"seed{s}" for s in config.seed_list}, what="seed files")
    finished = {}
    for seed in config.seed_list:
        records = read_seed(out, seed, config)
        if records is not None:
            finished[seed] = records
    return finished


def default_out(config: BenchFELConfig) -> Path:
    """``runs/bench/fel/HASH`` of the configuration (the seeds included)."""
    key = {**_run_key(config), "seeds": config.seeds, "first_seed": config.first_seed}
    return harness.default_out("fel", key)


def run_bench(config: BenchFELConfig, *, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every seed, write the tables and the plot; returns paths, rows and raw records."""
    data = load_data(config, log=log)
    public_names = set(data.public_names) - set(
        config.private_fields if config.private_leaf else ()
    )
    unknown = [f for f in config.cross_features if f not in public_names]
    if unknown:
        raise ValueError(
            f"--cross: no public feature(s) {unknown}; known: {', '.join(sorted(public_names))}"
        )
    if config.sample_rate is None:
        q = 0.01 if data.num_clients >= 10_000 else 0.1
        config = dataclasses.replace(config, sample_rate=q)
    log(
        f"{config.data}: {data.num_clients} clients, {len(data.label)} samples "
        f"({int(data.is_test.sum())} test), CTR {data.label.mean():.3f}"
    )
    total = rounds_per_seed(config) * config.seeds
    bar = None
    if config.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="fel rounds", unit="round")
    records = []
    out = Path(config.out or default_out(config)) / config.data
    done = check_out(out, config)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # Opacus's note that a large ε's best RDP order is its largest one (ε stays valid)
            warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
            for seed in config.seed_list:
                finished = done.get(seed)
                if finished is not None:
                    log(f"seed {seed}: finished records read from {seed_file(out, seed)}")
                    if bar is not None:
                        bar.update(rounds_per_seed(config))
                else:
                    finished = run_seed(data, config, seed, bar.update if bar else None)
                    write_seed(out, seed, config, finished)
                records += finished
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    rows = summarise(records, config)
    out.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(rows, config)
    (out / "table.md").write_text(markdown)
    write_csv(rows, out / "table.csv")
    figure = plot(rows, config, out / "auc_vs_clusters.png")
    updates = sum(r["client_updates"] for r in records)
    train = sum(r["train_seconds"] for r in records)
    return {
        "table": out / "table.md",
        "csv": out / "table.csv",
        "plot": figure,
        "markdown": markdown,
        "rows": rows,
        "records": records,
        "seconds": seconds,
        "client_updates": updates,
        "seconds_per_client_update": train / max(updates, 1),
    }


# ------------------------------------------------------------------------------------------------
# Command line


def _epsilon(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"epsilon must be > 0 (inf for no DP), got {text}")
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``fel`` under ``fedrec bench``."""
    parser = subparsers.add_parser(
        "fel",
        help="FEL: per-cluster leaves and ensembles against plain FL, with DP",
        description="FEL (Federated Ensemble Learning) against plain FL with the same clients and "
        "client updates: sweeps of the number of clusters, the clustering method and the "
        "ensemble rule, and a DP-FedAvg table; writes OUT/DATA/table.md, table.csv and a plot.",
    )
    parser.add_argument("--data", default="taobao-synthetic", choices=DATASETS)
    parser.add_argument(
        "--data-dir",
        help="taobao: the real files; ml-100k: its folder (default: the fedrec cache); "
        "taobao-synthetic: where the generated files are kept (default: the cache)",
    )
    parser.add_argument("--users", type=int, default=100_000, help="synthetic Taobao users")
    parser.add_argument("--ads", type=int, default=2000, help="synthetic Taobao ads")
    parser.add_argument("--clusters", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--cross", nargs="+", help="public features of the feature clustering")
    parser.add_argument(
        "--target-epsilon",
        type=_epsilon,
        nargs="*",
        default=[8.0, 2.0],
        help="finite ε of the DP table (default 8 2; none: no DP rows)",
    )
    parser.add_argument("--dp-method", default="feature", choices=METHODS)
    parser.add_argument("--dp-clusters", type=int, default=8, help="K of a random/kmeans DP run")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--clip-norm", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument(
        "--sample-rate",
        type=float,
        help="q (default 0.01 with 10,000 clients or more, else 0.1; --quick: 0.2)",
    )
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--client-lr", type=float, default=0.5)
    parser.add_argument("--hidden", type=int, default=0, help="MLP width of the leaves (0: LR)")
    parser.add_argument(
        "--opt-in-fraction",
        type=float,
        default=0.1,
        help="share of users whose data trains the central over-arch (default 0.1)",
    )
    parser.add_argument(
        "--over-arch-rounds",
        type=int,
        default=None,
        help="rounds of the over-arch trained by (DP-)FedAvg over every user, in the DP table "
        "(default 50, --quick 5; 0: none)",
    )
    parser.add_argument(
        "--private-leaf",
        action="store_true",
        help="Taobao: also train FEL with the private leaf at each finite epsilon",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--out",
        help="output folder (default runs/bench/fel/HASH of the configuration; a folder of "
        "another configuration is refused)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 500 users, 5 rounds, 1 seed, K in (1, 2, 4), the smallest ε only",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run)


def config_from_args(args: argparse.Namespace) -> BenchFELConfig:
    """The bench configuration of parsed options (``--quick`` shortens the defaults)."""
    quick = args.quick
    users = 500 if quick and args.users == 100_000 else args.users
    sample_rate = 0.2 if quick and args.sample_rate is None else args.sample_rate
    return BenchFELConfig(
        data=args.data,
        data_dir=args.data_dir,
        users=users,
        ads=200 if quick and args.ads == 2000 else args.ads,
        clusters=(1, 2, 4) if quick and args.clusters == [1, 2, 4, 8, 16] else tuple(args.clusters),
        methods=tuple(dict.fromkeys(args.methods)),
        cross=tuple(args.cross or ()),
        target_epsilons=tuple(sorted(args.target_epsilon)[:1] if quick else args.target_epsilon),
        dp_method=args.dp_method,
        dp_clusters=args.dp_clusters,
        delta=args.delta,
        clip_norm=args.clip_norm,
        rounds=5 if quick and args.rounds == 50 else args.rounds,
        sample_rate=sample_rate,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        client_lr=args.client_lr,
        hidden=args.hidden,
        opt_in_fraction=args.opt_in_fraction,
        private_leaf=args.private_leaf,
        over_arch_rounds=(5 if quick else 50)
        if args.over_arch_rounds is None
        else args.over_arch_rounds,
        over_arch_iterations=20 if quick else 100,
        seeds=1 if quick and args.seeds == 3 else args.seeds,
        first_seed=args.first_seed,
        out=args.out,
        progress=not args.no_progress,
    )


def run(args: argparse.Namespace) -> int:
    """``fedrec bench fel``: run, print the Markdown table and where the files went."""
    # a bad option raises ValueError: cli.main prints one line on stderr and exits 2
    config = config_from_args(args)
    result = run_bench(config)
    print(result["markdown"])
    print(
        f"wrote {result['table']}, {result['csv']}, {result['plot']} in {result['seconds']:.1f} s "
        f"({result['client_updates']} client updates, "
        f"{1e3 * result['seconds_per_client_update']:.3f} ms each)"
    )
    return 0
