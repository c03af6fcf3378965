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
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.experiments import harness
from fedrec.experiments.harness import option

MODELS = ("gmf", "mlp", "neumf")
CLIENT_OPTIMIZERS = ("federated", "persistent", "fresh")


#: The fields of :class:`BenchFedNCFConfig` that are :class:`~fedrec.train.fedncf.FedNCFConfig`'s
#: (besides the aggregator): validated there.
FED_FIELDS = (
    "global_rounds",
    "aggregation_rounds",
    "clients_per_round",
    "batch_size",
    "eval_every",
    "client_optimizer",
    "selection",
    "simulation",
    "validation",
)


def _plain_aggregators() -> tuple[str, ...]:
    """The plain rules of the aggregator registry (imported when needed: it loads torch)."""
    from fedrec.federation.registry import PLAIN_AGGREGATOR_NAMES

    return PLAIN_AGGREGATOR_NAMES


def _label(name: str) -> str:
    from fedrec.federation.registry import aggregator_label

    return aggregator_label(name)


@dataclass(frozen=True)
class BenchFedNCFConfig:
    """What ``fedrec bench fedncf`` runs."""

    dataset: str = "ml-100k"
    """logged data set (fetched with ``fedrec data fetch``)."""
    data_dir: str | None = None
    """data directory (default: the fedrec cache)."""
    models: tuple[str, ...] = option(
        ("gmf",), flag="--model", choices=MODELS, cli_choices=(*MODELS, "all")
    )
    """NCF model(s) to train (all: every one)."""
    aggregators: tuple[str, ...] | None = option(None, choices=_plain_aggregators)
    """aggregation rules compared in table 5 (default: every plain rule of the registry)."""
    global_rounds: int = 400
    """passes over all clients (FedNCF's "epochs"); ignored when aggregation_rounds is set."""
    aggregation_rounds: int | None = None
    """train this many aggregation rounds instead."""
    clients_per_round: int = 20
    """clients per aggregation round (FedNCF: 20 for ML-100K)."""
    seeds: int = option(3, min=1)
    """seeds per configuration."""
    first_seed: int = option(0, min=0)
    """the seeds are first_seed, first_seed + 1, ..."""
    eval_every: int = 10
    """evaluate every this many global rounds."""
    batch_size: int = 64
    """local mini-batch size."""
    client_optimizer: str = option("federated", choices=CLIENT_OPTIMIZERS)
    """federated: the Adam state of items and network is aggregated like the weights (default);
    persistent: clients keep their own Adam state; fresh: a new Adam every participation."""
    simulation: str = option("batched", choices=("batched", "compiled"))
    """client simulation of the federated runs: "batched" (NumPy) or "compiled" (Numba kernel,
    about 2-3x faster; its runs differ from batched ones in float32 rounding)."""
    selection: str = option("permutation", choices=("permutation", "cohorts"))
    """client selection of the federated runs (``FedNCFConfig.selection``): "permutation" or
    "cohorts" (fixed groups in a new order every global round)."""
    central_epochs: int = option(20, min=1)
    """epochs of the centralised upper bound."""
    validation: bool = False
    """hold out a validation item per user in every run (federated and centralised) and report
    the test metrics at each run's best validation point next to the last point's."""
    secagg_rounds: int = option(3, min=0)
    """aggregation rounds timed with MF-SecAvg per model (0: skip table 8)."""
    jobs: int = option(1, min=1)
    """training runs in parallel (one process each)."""
    out: str | None = None
    """folder for the run cache, plots and results.json (default runs/bench/fedncf/HASH)."""

    def __post_init__(self) -> None:
        if self.aggregators is None:
            object.__setattr__(self, "aggregators", _plain_aggregators())
        harness.check_fields(self)
        from fedrec.agents.ncf import NCFConfig
        from fedrec.train.fedncf import FedNCFConfig

        for aggregator in self.aggregators:  # the training settings: FedNCFConfig's own checks
            FedNCFConfig(model=NCFConfig(model=self.models[0]), **self._fed_fields(aggregator))

    def _fed_fields(self, aggregator: str) -> dict[str, Any]:
        """The fields shared with :class:`fedrec.train.fedncf.FedNCFConfig`."""
        return {
            "aggregator": aggregator,
            **{name: getattr(self, name) for name in FED_FIELDS},
        }

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))


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
# Reference lines, costs, MF-SecAvg timing


def reference_lines(config: BenchFedNCFConfig) -> dict[str, dict[str, float]]:
    """HR@10 / NDCG@10 of popularity and random rankings (mean over the bench's seeds)."""
    from fedrec.agents.logged_baselines import PopularityAgent, RandomAgent
    from fedrec.envs.datasets.catalog import load_prepared
    from fedrec.eval.ranking_metrics import evaluate_ranking_agent
    from fedrec.train.fedncf import env_id_of

    data = load_prepared(config.dataset, config.data_dir)
    lines = {}
    for name, make in (
        ("popularity", lambda s: PopularityAgent(data.item_popularity(), slate_size=10, seed=s)),
        ("random", lambda s: RandomAgent(slate_size=10, seed=s)),
    ):
        runs = [
            evaluate_ranking_agent(env_id_of(config.dataset), make(s), data_dir=config.data_dir)
            for s in config.seed_list
        ]
        lines[name] = {
            "hit_rate": statistics.fmean(r.hit_rate for r in runs),
            "ndcg": statistics.fmean(r.ndcg for r in runs),
        }
    return lines


def client_costs(config: BenchFedNCFConfig, results: dict) -> dict[str, dict[str, float]]:
    """Per model: parameters, FLOPs per client per round and KB each way (float32 weights)."""
    from fedrec.agents.ncf import NCFConfig
    from fedrec.envs.datasets.catalog import load_prepared

    data = load_prepared(config.dataset, config.data_dir)
    num_items = data.num_items
    costs = {}
    for model in config.models:
        ncf = NCFConfig(model=model)
        records = [r for key, rs in results.items() if key[:2] == ("federated", model) for r in rs]
        samples = (
            statistics.fmean(r["mean_client_samples"] for r in records) if records else float("nan")
        )
        item_words = num_items * ncf.item_width
        # forward + backward ≈ 3 forward passes per example, for local_epochs (2) epochs
        flops = 3 * ncf.forward_flops() * 2 * samples
        # the federated Adam state travels with the weights: m and v of the items and network
        moments = (
            2 * (item_words + ncf.network_size) if config.client_optimizer == "federated" else 0
        )
        costs[model] = {
            "network_weights": ncf.network_size,
            "item_weights": item_words,
            "user_weights": ncf.item_width,
            "mean_examples_per_epoch": samples,
            "mflops_per_round": flops / 1e6,
            "download_kb": (item_words + ncf.network_size + moments) * 4 / 1024,
            "upload_kb": (item_words + ncf.network_size + 1 + moments) * 4 / 1024
            + num_items / 8 / 1024,
            "secagg_upload_kb": (item_words + ncf.network_size + 1 + num_items + moments)
            * 8
            / 1024,
        }
    return costs


def secagg_timing(config: BenchFedNCFConfig) -> dict[str, dict[str, float]]:
    """Per model: plain MF-FedAvg vs MF-SecAvg aggregation time on ``secagg_rounds`` real rounds."""
    import torch

    from fedrec.agents.ncf import NCF, NCFConfig
    from fedrec.envs.datasets.catalog import load_prepared
    from fedrec.federation.aggregators import MFFedAvg
    from fedrec.federation.secagg import MFSecAvg
    from fedrec.train.fedncf import ClientData, round_rng, sample_round, train_round_batched

    data = load_prepared(config.dataset, config.data_dir)
    clients = ClientData.of(data)
    timings = {}
    for model_name in config.models:
        ncf = NCFConfig(model=model_name)
        model = NCF(
            ncf,
            num_users=data.num_users,
            num_items=data.num_items,
            generator=torch.Generator().manual_seed(config.first_seed),
        )
        items, network = model.item_table(), model.network_vector()
        rng = np.random.default_rng([config.first_seed, 9])
        plain_s, secure_s, client_s, server_s, upload, deviation = [], [], [], [], [], 0.0
        secure = MFSecAvg()
        for r in range(config.secagg_rounds):
            users = np.sort(
                rng.choice(
                    data.num_users, min(config.clients_per_round, data.num_users), replace=False
                )
            )
            samples = sample_round(
                clients, users, round_rng(config.first_seed, r), num_negatives=4, local_epochs=2
            )
            updates, _ = train_round_batched(
                ncf,
                round_samples=samples,
                user_rows=model.user_table()[torch.from_numpy(users)],
                items=items,
                network=network,
                lr=1e-3,
                batch_size=config.batch_size,
            )
            start = time.perf_counter()
            plain = MFFedAvg().aggregate(items=items, network=network, updates=updates)
            plain_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            masked = secure.aggregate(items=items, network=network, updates=updates)
            secure_s.append(time.perf_counter() - start)
            assert secure.last is not None
            client_s.append(secure.last.client_seconds / len(users))
            server_s.append(secure.last.server_seconds)
            upload.append(secure.last.upload_bytes_per_client)
            deviation = max(
                deviation,
                float((plain[0] - masked[0]).abs().max()),
                float((plain[1] - masked[1]).abs().max()),
            )
            items, network = plain
        per_global = math.ceil(data.num_users / min(config.clients_per_round, data.num_users))
        added = statistics.median(secure_s) - statistics.median(plain_s)
        timings[model_name] = {
            "plain_ms": 1e3 * statistics.median(plain_s),
            "secure_ms": 1e3 * statistics.median(secure_s),
            "client_ms": 1e3 * statistics.median(client_s),
            "server_ms": 1e3 * statistics.median(server_s),
            "added_ms_per_round": 1e3 * added,
            "added_s_per_global_round": added * per_global,
            "upload_kb": statistics.median(upload) / 1024,
            "max_abs_deviation": deviation,
            "rounds": config.secagg_rounds,
        }
    return timings


# ------------------------------------------------------------------------------------------------
# Summaries, tables and plots


#: Mean and 95% t-interval half-width (NaN for one seed: such a cell prints the mean alone).
mean_ci = harness.mean_ci


def summarise(
    config: BenchFedNCFConfig, results: dict, lines: dict, costs: dict, secagg: dict
) -> dict:
    """A JSON-ready summary of everything measured."""
    summary: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "machine": f"{platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs".strip(),
        "reference": lines,
        "costs": costs,
        "secagg": secagg,
        "models": {},
    }
    for model in config.models:
        entry: dict[str, Any] = {"federated": {}, "central": None}
        for aggregator in config.aggregators:
            records = results.get(("federated", model, aggregator), [])
            if not records:
                continue
            entry["federated"][aggregator] = {
                "seeds": [r["spec"]["seed"] for r in records],
                "hit_rate": mean_ci([r["hit_rate"] for r in records]),
                "ndcg": mean_ci([r["ndcg"] for r in records]),
                "train_seconds": mean_ci([r["train_seconds"] for r in records]),
                "hit_rates": [r["hit_rate"] for r in records],
                **_selected(records),
            }
        central = results.get(("central", model, ""), [])
        if central:
            entry["central"] = {
                "hit_rate": mean_ci([r["hit_rate"] for r in central]),
                "ndcg": mean_ci([r["ndcg"] for r in central]),
                "best_hit_rate": mean_ci([r["best_hit_rate"] for r in central]),
                "train_seconds": mean_ci([r["train_seconds"] for r in central]),
                **_selected(central),
            }
        summary["models"][model] = entry
    return summary


def _selected(records: list[dict[str, Any]]) -> dict[str, Any]:
    """With a validation split: mean and CI of the test metrics at each run's best validation
    point, and the points (global round or epoch) chosen."""
    chosen = [r.get("selected") for r in records]
    if not chosen or any(c is None for c in chosen):
        return {}
    return {
        "selected_hit_rate": mean_ci([c["hit_rate"] for c in chosen]),
        "selected_ndcg": mean_ci([c["ndcg"] for c in chosen]),
        "selected_at": [c["global_round"] for c in chosen],
        "selected_hit_rates": [c["hit_rate"] for c in chosen],
    }


def _fmt(pair: tuple[float, float] | list[float] | None, digits: int = 4) -> str:
    if pair is None:
        return "–"
    mean, half = pair
    if not half or math.isnan(half):  # one seed: no interval (results.json of old runs has 0)
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def render(summary: dict, console: Any | None = None) -> None:
    """Print tables 5-8 with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    config = summary["config"]
    units = (
        f"{config['aggregation_rounds']} aggregation rounds"
        if config["aggregation_rounds"]
        else f"{config['global_rounds']} global rounds"
    )
    seeds = f"{config['seeds']} seed(s)"
    ref = summary["reference"]

    table = Table(
        title=f"Aggregators (FedNCF table 5): HR@10 on {config['dataset']}",
        caption=f"{units}, {config['clients_per_round']} clients per aggregation round; mean ± 95% "
        f"t-interval over {seeds}. Popularity {ref['popularity']['hit_rate']:.4f}, random "
        f"{ref['random']['hit_rate']:.4f}.",
    )
    table.add_column("model")
    for aggregator in config["aggregators"]:
        table.add_column(_label(aggregator), justify="right")
    for model, entry in summary["models"].items():
        table.add_row(
            f"Fed{model.upper()}",
            *(_fmt(entry["federated"].get(a, {}).get("hit_rate")) for a in config["aggregators"]),
        )
    console.print(table)

    from fedrec.federation.registry import DEFAULT_AGGREGATOR

    fed_rule = (
        DEFAULT_AGGREGATOR
        if DEFAULT_AGGREGATOR in config["aggregators"]
        else config["aggregators"][-1]
    )
    table = Table(
        title=f"Federated ({_label(fed_rule)}) vs centralised (FedNCF table 6)",
        caption=f"centralised: {config['central_epochs']} epochs, batch 256, final epoch (best "
        "epoch in brackets, optimistic: there is no validation split); gap = 1 − fed/central.",
    )
    for column in (
        "model",
        "central HR@10",
        "central NDCG@10",
        "fed HR@10",
        "fed NDCG@10",
        "HR gap",
    ):
        table.add_column(column, justify="right" if column != "model" else "left")
    for model, entry in summary["models"].items():
        central, fed = entry["central"], entry["federated"].get(fed_rule)
        gap = "–"
        if central and fed:
            gap = f"{100 * (1 - fed['hit_rate'][0] / central['hit_rate'][0]):.1f}%"
        table.add_row(
            model.upper(),
            f"{_fmt(central['hit_rate'])} [{central['best_hit_rate'][0]:.4f}]" if central else "–",
            _fmt(central["ndcg"]) if central else "–",
            _fmt(fed["hit_rate"]) if fed else "–",
            _fmt(fed["ndcg"]) if fed else "–",
            gap,
        )
    console.print(table)
    if config.get("validation"):
        _render_selected(summary, fed_rule, console)

    table = Table(
        title="Client cost per aggregation round (FedNCF table 7)",
        caption="FLOPs: 3 × forward multiply-adds × 2 per example, 2 local epochs, mean examples "
        "per client measured; KB of float32 weights (upload adds the MP bitmap and n_k; "
        "MF-SecAvg sends 64-bit words incl. the per-item counts, plus keys and shares)"
        + (
            "; with the federated Adam state the weights travel with their moments m and v."
            if config.get("client_optimizer") == "federated"
            else "."
        ),
    )
    for column in (
        "model",
        "network",
        "item table",
        "examples/epoch",
        "MFLOPs",
        "down KB",
        "up KB",
        "SecAvg up KB",
    ):
        table.add_column(column, justify="right" if column != "model" else "left")
    for model, cost in summary["costs"].items():
        secure_kb = summary["secagg"].get(model, {}).get("upload_kb", cost["secagg_upload_kb"])
        table.add_row(
            model.upper(),
            f"{cost['network_weights']:,}",
            f"{cost['item_weights']:,}",
            f"{cost['mean_examples_per_epoch']:.0f}",
            f"{cost['mflops_per_round']:.2f}",
            f"{cost['download_kb']:.1f}",
            f"{cost['upload_kb']:.1f}",
            f"{secure_kb:.1f}",
        )
    console.print(table)

    if summary["secagg"]:
        table = Table(
            title="MF-SecAvg added time per aggregation round (FedNCF table 8)",
            caption=f"median of {config['secagg_rounds']} real rounds of {config['clients_per_round']} "
            "clients, simulated in one process: client = one client's keys, shares, encoding and "
            "masking; server = unmasking. Added = secure − plain aggregation (all clients' work "
            "counted sequentially).",
        )
        for column in (
            "model",
            "plain ms",
            "secure ms",
            "client ms",
            "server ms",
            "added ms/round",
            "added s/global round",
            "max |Δ|",
        ):
            table.add_column(column, justify="right" if column != "model" else "left")
        for model, row in summary["secagg"].items():
            table.add_row(
                model.upper(),
                f"{row['plain_ms']:.2f}",
                f"{row['secure_ms']:.1f}",
                f"{row['client_ms']:.1f}",
                f"{row['server_ms']:.1f}",
                f"{row['added_ms_per_round']:.1f}",
                f"{row['added_s_per_global_round']:.1f}",
                f"{row['max_abs_deviation']:.1e}",
            )
        console.print(table)
    times = [
        f"Fed{model.upper()} {_label(a)} {v['train_seconds'][0]:.0f} s"
        for model, entry in summary["models"].items()
        for a, v in entry["federated"].items()
    ]
    console.print(f"Mean training time per run: {'; '.join(times)}. Machine: {summary['machine']}.")


def _render_selected(summary: dict, fed_rule: str, console: Any) -> None:
    """Federated vs centralised, each run at its best validation point."""
    from rich.table import Table

    config = summary["config"]
    table = Table(
        title=f"Federated ({_label(fed_rule)}) vs centralised, selected on validation",
        caption="test HR@10 / NDCG@10 of each run at its best validation HR@10 (one validation "
        "item per user, held out of training in both; federated evaluated every "
        f"{config['eval_every']} global rounds, centralised every epoch of "
        f"{config['central_epochs']}); chosen rounds/epochs per seed; gap = 1 − fed/central.",
    )
    for column in ("model", "central HR@10", "central NDCG@10", "at epoch", "fed HR@10",
                   "fed NDCG@10", "at round", "HR gap"):  # fmt: skip
        table.add_column(column, justify="right" if column != "model" else "left")
    for model, entry in summary["models"].items():
        central, fed = entry["central"] or {}, entry["federated"].get(fed_rule) or {}
        gap = "–"
        if "selected_hit_rate" in central and "selected_hit_rate" in fed:
            ratio = fed["selected_hit_rate"][0] / central["selected_hit_rate"][0]
            gap = f"{100 * (1 - ratio):.1f}%"
        table.add_row(
            model.upper(),
            _fmt(central.get("selected_hit_rate")),
            _fmt(central.get("selected_ndcg")),
            ", ".join(f"{a:g}" for a in central.get("selected_at", [])) or "–",
            _fmt(fed.get("selected_hit_rate")),
            _fmt(fed.get("selected_ndcg")),
            ", ".join(f"{a:g}" for a in fed.get("selected_at", [])) or "–",
            gap,
        )
    console.print(table)


def plot(summary: dict, results: dict, out: Path) -> list[Path]:
    """HR@10 per global round per aggregator (mean over seeds, min-max band) for each model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = summary["config"]
    paths = []
    for model, entry in summary["models"].items():
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for aggregator in config["aggregators"]:
            records = results.get(("federated", model, aggregator), [])
            if not records:
                continue
            rounds = np.array([p["global_round"] for p in records[0]["history"]])
            curves = np.array([[p["hit_rate"] for p in r["history"]] for r in records])
            ax.plot(rounds, curves.mean(0), label=_label(aggregator))
            ax.fill_between(rounds, curves.min(0), curves.max(0), alpha=0.2)
        if entry["central"]:
            ax.axhline(entry["central"]["hit_rate"][0], color="k", ls="--", label="centralised")
        ax.axhline(
            summary["reference"]["popularity"]["hit_rate"],
            color="tab:gray",
            ls=":",
            label="popularity",
        )
        ax.axhline(
            summary["reference"]["random"]["hit_rate"], color="tab:red", ls=":", label="random"
        )
        ax.set_xlabel("global round (one pass over all clients)")
        ax.set_ylabel("HR@10")
        ax.set_title(
            f"Fed{model.upper()} on {config['dataset']}, {config['clients_per_round']} clients/round"
        )
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(alpha=0.3)
        path = out / f"fedncf_{model}_convergence.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


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
    parser = subparsers.add_parser(
        "fedncf",
        help="FedNCF: aggregators, federated vs centralised, client cost, MF-SecAvg",
        description="Federated GMF/MLP/NeuMF (FedNCF) with SimpleAvg, FedAvg and MF-FedAvg over "
        "several seeds, the centralised upper bound, popularity and random; prints FedNCF's "
        "tables 5-8 and writes convergence plots. Runs are cached in --out.",
    )
    harness.add_options(parser, BenchFedNCFConfig)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 global rounds, 1 seed, 1 centralised epoch",
    )
    parser.set_defaults(handler=run)


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

    console = Console()
    # a bad option raises ValueError: cli.main prints one line on stderr and exits 2
    config = config_from_args(args)
    summary = run_bench(config, log=console.print)
    render(summary, console)
    console.print(
        f"Plots: {', '.join(summary['plots'])}; summary: {out_of(config) / 'results.json'}"
    )
    return 0
