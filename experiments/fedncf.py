"""``fedrec bench fedncf``: FedNCF's experiments (Perifanis & Efraimidis 2022, tables 5-8).

For each model (GMF, MLP, NeuMF), aggregator (SimpleAvg, FedAvg, MF-FedAvg) and seed it trains a
federated model (:func:`fedrec.train.fedncf.train_federated`), and for each model and seed the
centralised upper bound; popularity and random rankings are the reference lines. Every HR@10 /
NDCG@10 comes from the logged-data environment's evaluation mode. It prints, side by side:

- **Aggregators** (table 5): HR@10 per aggregator, mean and 95% t-interval over seeds.
- **Federated vs centralised** (table 6): HR@10 / NDCG@10 of MF-FedAvg and of centralised training.
- **Client cost** (table 7): FLOPs per client per aggregation round and the KB sent each way.
- **MF-SecAvg** (table 8): the time secure aggregation adds per round, measured on real rounds,
  and its largest deviation from plain MF-FedAvg.

It writes convergence plots (HR@10 per global round) and ``results.json`` into ``--out``. Every
run is cached there as JSON under ``runs/`` keyed by its configuration (and checked whole when
read), so an interrupted bench resumes; a later call into the same folder must keep its settings
and include the runs ``results.json`` summarises (it may add models, aggregators or seeds); the
default folder is ``runs/bench/fedncf/HASH`` of the configuration. A federated run
also checkpoints into its run directory beside the JSON, so a run killed midway resumes exactly
where it stopped.

This module holds the runs (each cached as JSON), the output folder checks and the command line
(registered with :func:`fedrec.experiments.harness.add_bench_parser`); the configuration is in
:mod:`fedrec.experiments.fedncf_config`, the tables, their extra measurements and the plots in
:mod:`fedrec.experiments.fedncf_tables`. Every name of those two is importable from here too.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedrec.experiments import harness
from fedrec.experiments.fedncf_config import (  # noqa: F401  (importable from here too)
    CLIENT_OPTIMIZERS,
    FED_FIELDS,
    MODELS,
    BenchFedNCFConfig,
    _plain_aggregators,
)
from fedrec.experiments.fedncf_tables import (  # noqa: F401  (importable from here too)
    _fmt,
    _label,
    _render_selected,
    _selected,
    client_costs,
    mean_ci,
    plot,
    reference_lines,
    render,
    secagg_timing,
    summarise,
)

# ------------------------------------------------------------------------------------------------
# Runs (each cached as JSON)


def _federated_job(spec: dict[str, Any]) -> dict[str, Any]:
    from fedrec.agents.ncf import NCFConfig
    from fedrec.train.fedncf import FedNCFConfig, train_federated

    config = FedNCFConfig(
        model=NCFConfig(model=spec["model"]),
        aggregator=spec["aggregator"],
        global_rounds=spec["global_rounds"],
        aggregation_rounds=spec["aggregation_rounds"],
        clients_per_round=spec["clients_per_round"],
        batch_size=spec["batch_size"],
        eval_every=spec["eval_every"],
        seed=spec["seed"],
        client_optimizer=spec.get("client_optimizer", "fresh"),
        selection=spec.get("selection", "permutation"),
        validation=spec.get("validation", False),
        simulation=spec.get("simulation", "batched"),
    )
    run_dir = spec.get("run_dir")
    result = train_federated(
        dataset=spec["dataset"],
        data_dir=spec["data_dir"],
        config=config,
        progress=spec["progress"],
        out_dir=run_dir,
        resume=run_dir is not None and (Path(run_dir) / "config.json").is_file(),
    )
    return {
        "spec": spec,
        "history": [dataclasses.asdict(p) for p in result.history],
        "hit_rate": result.final.hit_rate,
        "ndcg": result.final.ndcg,
        "selected": None if result.selected is None else dataclasses.asdict(result.selected),
        "train_seconds": result.train_seconds,
        "aggregation_seconds": result.aggregation_seconds,
        "mean_client_samples": result.client_samples / max(result.participations, 1),
        "participations": result.participations,
    }


def _central_job(spec: dict[str, Any]) -> dict[str, Any]:
    from fedrec.agents.ncf import NCFConfig
    from fedrec.train.fedncf import CentralConfig, train_centralised

    config = CentralConfig(
        model=NCFConfig(model=spec["model"]),
        epochs=spec["epochs"],
        seed=spec["seed"],
        validation=spec.get("validation", False),
    )
    result = train_centralised(
        dataset=spec["dataset"], data_dir=spec["data_dir"], config=config, progress=spec["progress"]
    )
    return {
        "spec": spec,
        "history": [dataclasses.asdict(p) for p in result.history],
        "hit_rate": result.final.hit_rate,
        "ndcg": result.final.ndcg,
        "selected": None if result.selected is None else dataclasses.asdict(result.selected),
        "best_hit_rate": max(p.hit_rate for p in result.history),
        "train_seconds": result.train_seconds,
    }


def _run_job(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    return (_federated_job if spec["kind"] == "federated" else _central_job)(spec)


def _cache_path(out: Path, spec: dict[str, Any]) -> Path:
    key = _spec_key(spec)
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    name = f"{spec['kind']}-{spec['model']}-{spec.get('aggregator', 'central')}-s{spec['seed']}"
    if "client_optimizer" in spec:
        name += f"-{spec['client_optimizer']}"
    if "selection" in spec:
        name += f"-{spec['selection']}"
    if "simulation" in spec:
        name += f"-{spec['simulation']}"
    return out / "runs" / f"{name}-{digest}.json"


def run_all(
    config: BenchFedNCFConfig, *, log: Callable[[str], None] = print
) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Every federated and centralised run of the bench (from the cache where present)."""
    out = out_of(config)
    check_out(config)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    specs = []
    for model in config.models:
        for seed in config.seed_list:
            base = {
                "dataset": config.dataset,
                "data_dir": config.data_dir,
                "model": model,
                "seed": seed,
            }
            if config.validation:  # part of the cache key only when set: old keys stay valid
                base["validation"] = True
            specs.append({**base, "kind": "central", "epochs": config.central_epochs})
            for aggregator in config.aggregators:
                spec = {
                    **base,
                    "kind": "federated",
                    "aggregator": aggregator,
                    "global_rounds": config.global_rounds,
                    "aggregation_rounds": config.aggregation_rounds,
                    "clients_per_round": config.clients_per_round,
                    "batch_size": config.batch_size,
                    "eval_every": config.eval_every,
                }
                # part of the cache key; left out for "fresh" so earlier cached runs stay valid
                if config.client_optimizer != "fresh":
                    spec["client_optimizer"] = config.client_optimizer
                if config.selection != "permutation":  # cache keys of earlier runs stay valid
                    spec["selection"] = config.selection
                if config.simulation != "batched":  # likewise
                    spec["simulation"] = config.simulation
                specs.append(spec)
    results: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    todo = []
    for spec in specs:
        spec["progress"] = config.jobs == 1
        path = _cache_path(out, spec)
        if path.exists():
            record = harness.read_cached(path, record_check(spec), "fedncf run cache file")
            log(f"cached: {path.name}")
            _add(results, record)
        else:
            if spec["kind"] == "federated":  # checkpointed: a killed bench resumes the run
                spec["run_dir"] = str(path.with_suffix(""))
            todo.append((spec, path))

    def finish(record: dict[str, Any], path: Path) -> None:
        harness.write_json(path, record)
        spec = record["spec"]
        log(
            f"done: {spec['kind']} {spec['model']} {spec.get('aggregator', '')} seed {spec['seed']}: "
            f"HR@10 {record['hit_rate']:.4f} NDCG@10 {record['ndcg']:.4f} "
            f"({record['train_seconds']:.0f} s training)"
        )
        _add(results, record)

    paths = {id(spec): path for spec, path in todo}
    for spec, record in harness.run_jobs(_run_job, [spec for spec, _ in todo], jobs=config.jobs):
        finish(record, paths[id(spec)])
    return results


def _spec_key(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in ("progress", "run_dir")}


_POINT = harness.record(
    {"global_round": harness.finite, "hit_rate": harness.unit, "ndcg": harness.unit}
)


def record_check(spec: dict[str, Any]) -> harness.Check:
    """The schema of a cached run's record (:func:`_federated_job`, :func:`_central_job`)."""
    expected = _spec_key(spec)

    def same_spec(saved: Any) -> str | None:
        if not isinstance(saved, dict):
            return "not an object"
        differ = harness.differences(_spec_key(saved), expected)
        return f"another run's ({', '.join(differ)} differ)" if differ else None

    keys = {
        "spec": same_spec,
        "history": harness.list_of(_POINT),
        "hit_rate": harness.unit,
        "ndcg": harness.unit,
        "selected": harness.optional(_POINT),
        "train_seconds": harness.non_negative,
    }
    if spec["kind"] == "federated":
        keys |= {
            "aggregation_seconds": harness.non_negative,
            "mean_client_samples": harness.non_negative,
            "participations": harness.integer,
        }
    else:
        keys["best_hit_rate"] = harness.unit
    return harness.record(keys)


#: Fields that choose which runs a call makes (a later call may add runs, not drop them), and
#: fields that do not change any number (parallelism, the folder).
_SELECTION = ("models", "aggregators", "seeds", "first_seed")
_NOT_RESULTS = ("jobs", "out")


def out_of(config: BenchFedNCFConfig) -> Path:
    """``--out``, or ``runs/bench/fedncf/HASH`` of the configuration."""
    if config.out is not None:
        return Path(config.out)
    key = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_RESULTS}
    return harness.default_out("fedncf", key)


def _runs_of(config: dict[str, Any]) -> set[str]:
    first, seeds = int(config.get("first_seed", 0)), int(config.get("seeds", 1))
    return {
        f"{model}/{aggregator}/seed{seed}"
        for model in config.get("models") or ()
        for aggregator in (*(config.get("aggregators") or ()), "central")
        for seed in range(first, first + seeds)
    }


def check_out(config: BenchFedNCFConfig) -> None:
    """Refuse a folder whose ``results.json`` summarises another configuration (other settings,
    or runs this call does not make), before anything runs."""
    path = out_of(config) / "results.json"
    if not path.exists():
        return
    saved = harness.read_cached(
        path, harness.record({"config": harness.record({})}), "fedncf bench summary"
    )["config"]
    now = json.loads(json.dumps(dataclasses.asdict(config)))
    # settings recorded by that summary (one written before a setting existed skips it)
    keys = [k for k in now if k in saved and k not in (*_SELECTION, *_NOT_RESULTS)]
    harness.check_same(
        path, {k: saved[k] for k in keys}, {k: now[k] for k in keys}, what="a summary"
    )
    harness.check_subset(path.parent, _runs_of(saved), _runs_of(now), what="a summary of runs")


def _add(results: dict[tuple[str, ...], list[dict[str, Any]]], record: dict[str, Any]) -> None:
    spec = record["spec"]
    key = (spec["kind"], spec["model"], spec.get("aggregator", ""))
    results.setdefault(key, []).append(record)


# ------------------------------------------------------------------------------------------------
# The bench


def run_bench(config: BenchFedNCFConfig, *, log: Callable[[str], None] = print) -> dict:
    """Run (or load) everything, write results.json and the plots; returns the summary."""
    results = run_all(config, log=log)
    lines = reference_lines(config)
    costs = client_costs(config, results)
    secagg = secagg_timing(config) if config.secagg_rounds else {}
    summary = summarise(config, results, lines, costs, secagg)
    out = out_of(config)
    summary["plots"] = [str(p) for p in plot(summary, results, out)]
    harness.write_json(out / "results.json", summary)
    return summary


# ------------------------------------------------------------------------------------------------
# Command line


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``fedncf`` under ``fedrec bench``."""
    harness.add_bench_parser(
        subparsers,
        "fedncf",
        BenchFedNCFConfig,
        help="FedNCF: aggregators, federated vs centralised, client cost, MF-SecAvg",
        description="Federated GMF/MLP/NeuMF (FedNCF) with SimpleAvg, FedAvg and MF-FedAvg over "
        "several seeds, the centralised upper bound, popularity and random; prints FedNCF's "
        "tables 5-8 and writes convergence plots. Runs are cached in --out. A default run (FedGMF "
        "with the 3 plain aggregators, 3 seeds, 400 global rounds: 9 federated runs of about 2 "
        "minutes each with the compiled simulation, 4-5 with the batched one) takes about 15 "
        "minutes with --jobs 2 on a 2-core machine (FedNeuMF runs take about 5 minutes each); "
        "--quick under a minute.",
        handler=run,
        quick="smoke run: 2 global rounds, 1 seed, 1 centralised epoch",
    )


#: ``--quick``: the defaults it shortens (options given on the command line win).
QUICK = {"global_rounds": 2, "seeds": 1, "eval_every": 1, "central_epochs": 1, "secagg_rounds": 1}


def config_from_args(args: argparse.Namespace) -> BenchFedNCFConfig:
    """The bench configuration of parsed options (``--quick`` shortens the defaults)."""
    if args.global_rounds is not None and args.aggregation_rounds is not None:
        raise ValueError("--global-rounds and --aggregation-rounds exclude each other")
    if args.models is not None and "all" in args.models:
        args.models = list(MODELS)
    return harness.config_from_args(BenchFedNCFConfig, args, **(QUICK if args.quick else {}))


def run(args: argparse.Namespace) -> int:
    """``fedrec bench fedncf``: train or load every run, print the tables, write plots."""
    from rich.console import Console

    from fedrec.eval.tables import current_view

    console = Console(stderr=current_view().csv_to_stdout)
    # a bad option raises ValueError: cli.main prints one line on stderr and exits 2
    config = config_from_args(args)
    summary = run_bench(config, log=console.print)
    harness.show_tables(text_tables(summary), wide=lambda: render(summary, console))
    console.print(
        f"Plots: {', '.join(summary['plots'])}; summary: {out_of(config) / 'results.json'}"
    )
    return 0


def text_tables(summary: dict) -> list[Any]:
    """FedNCF's tables 5-8 of :func:`render` as :class:`fedrec.eval.tables.TextTable` objects
    (the compact view shows every column, cut to 100 characters)."""
    from fedrec.eval.tables import tables_from_rich

    tables = tables_from_rich(lambda console: render(summary, console))
    keys = {
        "table 5": "aggregators",
        "table 6": "central",
        "selected on validation": "selected",
        "table 7": "cost",
        "table 8": "secagg",
    }
    for table in tables:
        table.key = next((key for text, key in keys.items() if text in table.title), "")
    return tables
