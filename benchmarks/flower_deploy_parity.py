"""Parity of a real Flower deployment (loopback) with the in-process FedNCF run.

Usage: ``python benchmarks/flower_deploy_parity.py [--seeds 0 1 2] [--nodes 2]
[--clients-per-round 943] [--global-rounds 8] [--out PATH] [--overwrite]``: writes the JSON to
``--out`` (default ``runs/benchmarks/flower_deploy_parity/deploy_parity.json``; the committed one
is ``results/flower/deploy_parity.json``; an earlier run's file is replaced only with
``--overwrite``).

FedGMF with MF-FedAvg on MovieLens-100K (the fedrec cache), every user in every aggregation round
by default (a deployment pays seconds per message, so few large rounds): per seed the deployment
with ``--nodes`` SuperNodes (``fedrec flower deploy``) and the in-process run of the same
configuration, plus one deployment with a single node for seed ``--seeds[0]`` (which must equal
the in-process run bit for bit). Writes every result and the paired difference of HR@10 with its
95% confidence interval.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from fedrec.agents.ncf import NCFConfig
from fedrec.eval.stats import mean_ci
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.train.fedncf import FedNCFConfig, train_federated
from fedrec.train.fedncf.flower import run_deployment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--clients-per-round", type=int, default=943)
    parser.add_argument("--global-rounds", type=int, default=8)
    add_out_arguments(parser, "flower_deploy_parity", name="deploy_parity.json", what="the JSON")
    args = parser.parse_args()
    args.out = script_out("flower_deploy_parity", args.out, "deploy_parity.json")
    claim_outputs([args.out], overwrite=args.overwrite)
    runs = {}
    for seed in args.seeds:
        config = FedNCFConfig(
            client_optimizer="fresh",
            model=NCFConfig(model="gmf"),
            global_rounds=args.global_rounds,
            clients_per_round=args.clients_per_round,
            eval_every=0,
            seed=seed,
        )
        local = train_federated(dataset="ml-100k", config=config, progress=False)
        node_counts = [args.nodes] + ([1] if seed == args.seeds[0] else [])
        for nodes in node_counts:
            began = time.perf_counter()
            result = run_deployment(dataset="ml-100k", config=config, num_nodes=nodes)
            result.pop("round_seconds")
            result["wall_seconds"] = time.perf_counter() - began
            result["in_process"] = {
                "hit_rate": local.final.hit_rate,
                "ndcg": local.final.ndcg,
                "train_seconds": local.train_seconds,
            }
            runs[f"gmf_n{nodes}_s{seed}"] = result
            print(json.dumps({f"gmf_n{nodes}_s{seed}": result}), flush=True)
    paired = [
        runs[f"gmf_n{args.nodes}_s{s}"]["hit_rate"]
        - runs[f"gmf_n{args.nodes}_s{s}"]["in_process"]["hit_rate"]
        for s in args.seeds
    ]
    mean, half = mean_ci(paired)
    summary = {
        "command": "python benchmarks/flower_deploy_parity.py "
        f"--seeds {' '.join(map(str, args.seeds))} --nodes {args.nodes} "
        f"--clients-per-round {args.clients_per_round} --global-rounds {args.global_rounds}",
        "runs": runs,
        "paired_hit_rate_difference": {"mean": mean, "ci95": half},
        "measured": time.strftime("%Y-%m-%d"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["paired_hit_rate_difference"]))


if __name__ == "__main__":
    run_script(main)
