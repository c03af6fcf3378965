"""The tables of ``fedrec bench fedncf`` (:mod:`fedrec.experiments.fedncf`): what they measure
besides the training runs (popularity and random reference lines, the client cost, MF-SecAvg's
added time on real rounds), the JSON summary, FedNCF's tables 5-8 printed with rich, and the
convergence plots. Every name here is also importable from :mod:`fedrec.experiments.fedncf`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.experiments import harness
from fedrec.experiments.fedncf_config import BenchFedNCFConfig


def _label(name: str) -> str:
    """An aggregator's name in the tables (the registry's; imported when needed: it loads
    torch)."""
    from fedrec.federation.registry import aggregator_label

    return aggregator_label(name)


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
    """A table cell: mean ± half-width, the mean alone for one seed (a NaN half-width, or 0 in
    the results.json of old runs), "–" for no value."""
    if pair is None:
        return "–"
    return harness.plus_minus(*pair, digits, zero_is_none=True)


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
