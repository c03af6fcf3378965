"""FedNCF at scale on Flower: time and memory per aggregation round, in-process and on Flower.

Usage: ``python benchmarks/flower_scale.py [--users 100000] [--clients-per-round 1000] [--rounds 4]
[--nodes 2 4] [--engines in-process simulation deployment] [--out PATH] [--overwrite]``: writes the
JSON to ``--out`` (default ``runs/benchmarks/flower_scale/scale.json``; the committed one is
``results/flower/scale.json``; an earlier run's file is replaced only with ``--overwrite``).

A synthetic population of ``--users`` users shaped like MovieLens-100K
(:func:`fedrec.envs.datasets.synthetic_clients.synthetic_clients`, built in memory in every
process from the same seed), FedGMF with MF-FedAvg and ``--clients-per-round`` clients per
aggregation round, ``--rounds`` aggregation rounds (the first is reported apart: it includes each
node's start-up), run:

- **in-process**: the FedNCF round as the trainer runs it, in one process
  (``benchmarks/fedncf_scale.py``'s measurement in a fresh subprocess: one warm-up round, then
  the median of 3 repeats of the other rounds; peak RSS is its own);
- **simulation**: on Flower's simulation engine (Ray) with each of ``--nodes`` SuperNodes;
- **deployment**: on a real loopback deployment (SuperLink, SuperNodes, ``flwr run``) with each
  of ``--nodes`` SuperNodes.

Per run it reports the median seconds per aggregation round after the first (min-max), the
slowest node's median training time within a round (the work; the rest of a round is Flower's
messaging and, on a deployment, the start of a fresh ClientApp process per message), the peak RSS
of a node's ClientApp process and of the server process. Runs one after another; the numbers are
only as quiet as the machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from fedrec.agents.ncf import NCFConfig
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.train.fedncf import FedNCFConfig
from fedrec.train.fedncf.flower import SYNTHETIC_PREFIX, run_deployment, run_simulation


def _scale_module():
    path = Path(__file__).with_name("fedncf_scale.py")
    spec = importlib.util.spec_from_file_location("fedncf_scale", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fedncf_scale"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def in_process(users: int, clients_per_round: int, rounds: int) -> dict:
    scale = _scale_module()
    spec = scale.PointSpec(
        model="gmf",
        users=users,
        clients_per_round=clients_per_round,
        rounds=rounds - 1,
        warmup=1,
        repeats=3,
    )
    point = scale.measure_in_subprocess(spec)
    return {
        "engine": "in-process",
        "nodes": 1,
        "median_round_seconds": point.median,
        "round_seconds_range": [min(point.round_seconds), max(point.round_seconds)],
        "peak_rss_mib": point.peak_rss_mib,
    }


def on_flower(engine: str, users: int, clients_per_round: int, rounds: int, nodes: int) -> dict:
    config = FedNCFConfig(
        client_optimizer="fresh",
        model=NCFConfig(model="gmf"),
        aggregation_rounds=rounds,
        clients_per_round=clients_per_round,
        eval_every=0,
        seed=0,
    )
    job = {"dataset": f"{SYNTHETIC_PREFIX}{users}", "config": config, "num_nodes": nodes}
    began = time.perf_counter()
    if engine == "simulation":
        result = run_simulation(**job)
    else:
        result = run_deployment(**job, timeout=3600)
    wall = time.perf_counter() - began
    later = result["round_seconds"][1:] or result["round_seconds"]
    return {
        "engine": engine,
        "nodes": nodes,
        "first_round_seconds": result["round_seconds"][0],
        "median_round_seconds": statistics.median(later),
        "round_seconds_range": [min(later), max(later)],
        "median_node_seconds": result["median_node_seconds"],
        "node_peak_rss_mib": result["node_peak_rss_mib"],
        "server_peak_rss_mib": result["server_peak_rss_mib"],
        "wall_seconds": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--clients-per-round", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--engines", nargs="+", default=["in-process", "simulation", "deployment"])
    add_out_arguments(parser, "flower_scale", name="scale.json", what="the JSON")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (the first round is reported apart)")
    args.out = script_out("flower_scale", args.out, "scale.json")
    claim_outputs([args.out], overwrite=args.overwrite)
    rows = []
    for engine in args.engines:
        if engine == "in-process":
            rows.append(in_process(args.users, args.clients_per_round, args.rounds))
        else:
            for nodes in args.nodes:
                rows.append(
                    on_flower(engine, args.users, args.clients_per_round, args.rounds, nodes)
                )
        print(json.dumps(rows[-1]), flush=True)
    summary = {
        "users": args.users,
        "clients_per_round": args.clients_per_round,
        "aggregation_rounds": args.rounds,
        "model": "gmf",
        "aggregator": "mf-fedavg",
        "runs": rows,
        "measured": time.strftime("%Y-%m-%d"),
        "load_average": os.getloadavg(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    run_script(main)
