"""FEL on Flower against the in-process trainer: test AUC parity over seeds, and time per round.

Usage: ``python benchmarks/flower_fel_parity.py [--users 5000] [--ads 400] [--rounds 50]
[--sample-rate 0.1] [--seeds 3] [--nodes 1 2] [--noise-multipliers 1.0] [--out PATH]
[--overwrite]``: writes the JSON to ``--out`` (default
``runs/benchmarks/flower_fel_parity/fel_parity.json``; the committed one is
``results/flower/fel_parity.json``; an earlier run's file is replaced only with ``--overwrite``).

For every seed and privacy level (no DP, then DP-FedAvg at each ``--noise-multipliers`` z with
clip norm 0.5) it trains FEL's leaves (the gender x age_level feature cross of the synthetic
Taobao set) and plain FL in-process (:func:`fedrec.train.fel.train_federated`), then the same on
Flower's simulation engine (:func:`fedrec.train.fel.flower.run_simulation`, ``baseline=True``)
with each ``--nodes`` count, and records every test AUC, the client updates, whether the final
leaves are bit-for-bit the in-process ones, and the median seconds of a training round. Client
sampling is pure Poisson (``fill_empty_clusters=False``), as in ``fedrec bench fel``. One Ray
simulation runs at a time; about 10 minutes on a loaded two-core machine with the defaults.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from fedrec.envs.datasets.click_data import click_data_from_taobao
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.train.fel import (
    DPConfig,
    FedConfig,
    baseline_auc,
    ensemble_aucs,
    flatten,
    train_baseline,
    train_federated,
)
from fedrec.train.fel.flower import FELClustering, digest, run_simulation

CLUSTERING = FELClustering("feature", features=("final_gender_code", "age_level"))
RULES = ("route", "over-arch", "mean", "baseline")


def in_process(data: Any, config: FedConfig) -> dict[str, Any]:
    """The in-process run: the leaves, plain FL, every AUC, and the seconds per round."""
    assignment = CLUSTERING.assign(data)
    stamps = [time.perf_counter()]
    fel = train_federated(
        data, assignment, config, progress=lambda _: stamps.append(time.perf_counter())
    )
    seconds = time.perf_counter() - stamps[0]
    base = train_baseline(data, config)
    scores, _ = ensemble_aucs(data, fel, seed=config.seed)
    scores["baseline"] = baseline_auc(data, base)
    return {
        "auc": scores,
        "client_updates": fel.client_updates,
        "baseline_client_updates": base.client_updates,
        "leaves_sha256": digest(flatten(fel.params)),
        "baseline_sha256": digest(flatten(base.params)),
        "train_seconds": seconds,
        "median_round_seconds": float(np.median(np.diff(stamps))),
    }


def _ci(values: list[float]) -> tuple[float, float | None]:
    """Mean and 95 % t half-width (None from one value): :func:`fedrec.eval.stats.mean_ci`."""
    from fedrec.eval.stats import mean_ci

    mean, half = mean_ci(values, 0.95)
    return mean, None if math.isnan(half) else half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--ads", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--sample-rate", type=float, default=0.1)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--noise-multipliers", type=float, nargs="*", default=[1.0])
    add_out_arguments(parser, "flower_fel_parity", name="fel_parity.json", what="the JSON")
    args = parser.parse_args()
    args.out = script_out("flower_fel_parity", args.out, "fel_parity.json")
    claim_outputs([args.out], overwrite=args.overwrite)
    warnings.simplefilter("ignore")  # Flower's deprecation note on run_simulation
    folder = tempfile.mkdtemp(prefix="fel-parity-")
    from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups

    write_taobao_groups(folder, num_users=args.users, num_ads=args.ads, seed=0)
    data = click_data_from_taobao(folder)
    runs: dict[str, Any] = {}
    for z in [None, *args.noise_multipliers]:
        privacy = "no-dp" if z is None else f"dp-z{z:g}"
        for seed in range(args.seeds):
            config = FedConfig(
                rounds=args.rounds,
                sample_rate=args.sample_rate,
                dp=None if z is None else DPConfig(clip_norm=0.5, noise_multiplier=z),
                seed=seed,
                fill_empty_clusters=False,
            )
            local = in_process(data, config)
            runs[f"{privacy}_in-process_s{seed}"] = local
            print(privacy, seed, "in-process", local["auc"], flush=True)
            for n in args.nodes:
                start = time.perf_counter()
                result = run_simulation(
                    data="taobao-synthetic",
                    data_dir=folder,
                    clustering=CLUSTERING,
                    config=config,
                    num_nodes=n,
                    baseline=True,
                )
                result["wall_seconds"] = time.perf_counter() - start
                result["identical_to_in_process"] = (
                    result["leaves_sha256"] == local["leaves_sha256"]
                    and result["baseline_sha256"] == local["baseline_sha256"]
                )
                result.pop("loss_history")
                runs[f"{privacy}_n{n}_s{seed}"] = result
                print(privacy, seed, f"{n} node(s)", result["auc"], flush=True)
    summary: dict[str, Any] = {}
    for z in [None, *args.noise_multipliers]:
        privacy = "no-dp" if z is None else f"dp-z{z:g}"
        for n in args.nodes:
            flower = [runs[f"{privacy}_n{n}_s{s}"] for s in range(args.seeds)]
            local = [runs[f"{privacy}_in-process_s{s}"] for s in range(args.seeds)]
            row: dict[str, Any] = {
                "identical_runs": sum(r["identical_to_in_process"] for r in flower),
                "median_round_seconds": float(
                    np.median([r["median_round_seconds"] for r in flower])
                ),
                "in_process_round_seconds": float(
                    np.median([r["median_round_seconds"] for r in local])
                ),
            }
            for rule in RULES:
                mean, half = _ci(
                    [f["auc"][rule] - x["auc"][rule] for f, x in zip(flower, local, strict=True)]
                )
                row[f"{rule}_difference"] = {"mean": mean, "ci95": half}
                row[f"{rule}_flower"] = [f["auc"][rule] for f in flower]
                row[f"{rule}_in_process"] = [x["auc"][rule] for x in local]
            summary[f"{privacy}_n{n}"] = row
    out = {
        "command": "python benchmarks/flower_fel_parity.py "
        + " ".join(
            [
                f"--users {args.users} --ads {args.ads} --rounds {args.rounds}",
                f"--sample-rate {args.sample_rate} --seeds {args.seeds}",
                "--nodes " + " ".join(map(str, args.nodes)),
                "--noise-multipliers " + " ".join(f"{z:g}" for z in args.noise_multipliers),
            ]
        ),
        "data": f"write_taobao_groups(num_users={args.users}, num_ads={args.ads}, seed=0): "
        f"{len(data.label)} impressions, {data.num_clients} clients",
        "clustering": "feature cross final_gender_code x age_level",
        "summary": summary,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    run_script(main)
