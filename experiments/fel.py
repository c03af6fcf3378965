"""``fedrec bench fel``: FEL (Federated Ensemble Learning) against plain FL on click data.

For every seed it trains, on the same data and with the same federated settings:

- **plain FL**: one global leaf over all clients;
- **FEL** for every clustering in the sweep: ``random`` and ``kmeans`` clusters with each K of
  ``--clusters`` (K = 1 is plain FL itself), and the ``feature`` cross of ``--cross`` (its K is
  the number of distinct values of the cross);
- the **DP table**: plain FL and FEL (clustering ``--dp-method``) with DP-FedAvg at each
  ``--target-epsilon``, next to the non-private runs (ε = inf);
- with ``--private-leaf`` (Taobao): FEL whose public leaves lack the private fields, plus the
  private leaf on the device (:mod:`fedrec.train.fel.private`), at each finite ε, with the
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.experiments import harness
from fedrec.experiments.fel_runs import (  # noqa: F401  (the runs: importable from here too)
    DATASETS,
    DEFAULT_CROSS,
    FL_OVER_ARCH,
    METHODS,
    BenchFELConfig,
    Setting,
    assignment_for,
    fed_config,
    federated_over_arch,
    load_data,
    rounds_per_seed,
    run_private,
    run_seed,
    settings_of,
)

#: The paper's reported gain of FEL over on-device FL (relative, %).
PAPER_GAIN = (0.43, 2.31)
RULE_COLUMNS = ("route", "over-arch", "mean", "median", "max")


# ------------------------------------------------------------------------------------------------
# Summary


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
            auc_mean, auc_ci = harness.mean_ci(aucs)
            base_mean, base_ci = harness.mean_ci(base)
            rel_mean, rel_ci = harness.mean_ci(rel)
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


#: ``mean ± half`` (the mean alone without an interval, "–" for a NaN mean).
_pm = harness.plus_minus


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


#: ``--quick``: the defaults it shortens (options given on the command line win); it also keeps
#: the smallest ε only.
QUICK = {
    "users": 500,
    "ads": 200,
    "clusters": (1, 2, 4),
    "rounds": 5,
    "sample_rate": 0.2,
    "over_arch_rounds": 5,
    "over_arch_iterations": 20,
    "seeds": 1,
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``fel`` under ``fedrec bench``."""
    harness.add_bench_parser(
        subparsers,
        "fel",
        BenchFELConfig,
        help="FEL: per-cluster leaves and ensembles against plain FL, with DP",
        description="FEL (Federated Ensemble Learning) against plain FL with the same clients and "
        "client updates: sweeps of the number of clusters, the clustering method and the "
        "ensemble rule, and a DP-FedAvg table; writes OUT/DATA/table.md, table.csv and a plot. "
        "A default run (100,000 synthetic Taobao users, 3 seeds) takes under 15 minutes on a "
        "2-core machine (13.4 min with --private-leaf; --data ml-100k 2.2 min; --quick seconds).",
        handler=run,
        quick="smoke run: 500 users, 5 rounds, 1 seed, K in (1, 2, 4), the smallest ε only",
    )


def config_from_args(args: argparse.Namespace) -> BenchFELConfig:
    """The bench configuration of parsed options (``--quick`` shortens the defaults)."""
    if not args.quick:
        return harness.config_from_args(BenchFELConfig, args)
    config = harness.config_from_args(BenchFELConfig, args, **QUICK)
    return dataclasses.replace(config, target_epsilons=tuple(sorted(config.target_epsilons)[:1]))


#: The compact view's columns of the Markdown tables (full header -> short one).
COMPACT = {
    "method": "method",
    "K": "K",
    "plain FL": "plain FL",
    "route": "route",
    "over-arch": "over-arch",
    "Δ % route": "Δ% route",
    "Δ % over-arch": "Δ% over-arch",
    "target ε": "target ε",
    "ε FEL": "ε FEL",
    "FEL route": "FEL route",
    "FEL over-arch": "FEL over-arch",
    "ε composed": "ε",
    "FEL public (route)": "public",
    "FEL + private leaf": "+ private",
    "Δ % public": "Δ% public",
    "Δ % with private leaf": "Δ% private",
}
LEGEND = {
    "Δ% route": "relative AUC change of FEL over plain FL, paired per seed (Δ% over-arch, ...: "
    "the same for that rule)",
    "ε": "ε composed",
    "public": "FEL public (route)",
    "+ private": "FEL + private leaf",
}


def text_tables(markdown: str) -> list[Any]:
    """The tables of :func:`render_markdown` for :func:`fedrec.experiments.harness.show_tables`:
    the compact view keeps the AUC of plain FL, route and over-arch and their Δ %; the
    paragraph under the title becomes the first table's note."""
    from fedrec.eval.tables import tables_from_markdown

    tables, loose = tables_from_markdown(markdown)
    for n, table in enumerate(tables):
        table.compact = {c: COMPACT[c] for c in table.columns if c in COMPACT}
        table.legend = LEGEND
        table.key = ("clusters", "dp", "private")[min(n, 2)]
        if "method" in table.columns:  # "feature (a × b)" as "feature", named in the legend
            k = table.columns.index("method")
            long = {row[k] for row in table.rows if "(" in row[k]}
            table.short_cells = {"method": [row[k].split(" (")[0] for row in table.rows]}
            table.legend = {**{m.split(" (")[0]: m for m in sorted(long)}, **LEGEND}
    if tables and loose:  # the title and the paragraph under it
        tables[0].title = f"{loose[0]}: {tables[0].title}"
        tables[0].notes = [*loose[1:], *tables[0].notes]
    return tables


def run(args: argparse.Namespace) -> int:
    """``fedrec bench fel``: run, print the tables and where the files went."""
    # a bad option raises ValueError: cli.main prints one line on stderr and exits 2
    config = config_from_args(args)
    result = run_bench(config, log=harness.log)
    harness.show_tables(text_tables(result["markdown"]), wide=lambda: print(result["markdown"]))
    harness.log(
        f"wrote {result['table']}, {result['csv']}, {result['plot']} in {result['seconds']:.1f} s "
        f"({result['client_updates']} client updates, "
        f"{1e3 * result['seconds_per_client_update']:.3f} ms each)"
    )
    return 0
