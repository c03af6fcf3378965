"""Flower's SecAgg+ against the plain sum and against fedrec's in-process MF-SecAvg.

Usage: ``python benchmarks/flower_secagg.py [--nodes 3] [--seeds 0 1 2] [--global-rounds 2]
[--out PATH] [--overwrite]``: writes the JSON to ``--out`` (default
``runs/benchmarks/flower_secagg/secagg.json``; the committed one is ``results/flower/secagg.json``;
an earlier run's file is replaced only with ``--overwrite``).

FedGMF on MovieLens-100K (the fedrec cache; a synthetic set of its shape otherwise, and it says
so), MF-FedAvg, 20 clients per aggregation round, on Flower's simulation engine:

- **Exactness.** One aggregation round with the plain sum and with SecAgg+ from the same seed
  (the same uploads): the largest absolute difference of the new global item table and network.
- **Quality.** ``--global-rounds`` global rounds with each, per seed: HR@10 and NDCG@10.
- **Cost.** The median time of an aggregation round, plain and SecAgg+, on the engine; and in
  one process, FedGMF's median per round with MF-FedAvg and with fedrec's MF-SecAvg.

Takes about two minutes per seed on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from fedrec.agents.ncf import NCFConfig
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.train.fedncf import FedNCFConfig, train_federated
from fedrec.train.fedncf.flower import run_simulation


def _data() -> tuple[str | None, str]:
    from fedrec.envs.datasets.catalog import load_prepared

    try:
        load_prepared("ml-100k", None)
        return None, "ml-100k"
    except (FileNotFoundError, ValueError):
        from fedrec.envs.datasets.synthetic import write_ml100k

        folder = tempfile.mkdtemp()
        write_ml100k(Path(folder) / "ml-100k", seed=0)
        return folder, "synthetic data of ML-100K's format"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--global-rounds", type=int, default=2)
    add_out_arguments(parser, "flower_secagg", name="secagg.json", what="the JSON")
    args = parser.parse_args()
    args.out = script_out("flower_secagg", args.out, "secagg.json")
    claim_outputs([args.out], overwrite=args.overwrite)
    data_dir, data_name = _data()
    common = {"dataset": "ml-100k", "data_dir": data_dir, "num_nodes": args.nodes}
    model = NCFConfig(model="gmf")

    one = FedNCFConfig(
        client_optimizer="fresh",
        model=model,
        aggregation_rounds=1,
        eval_every=0,
        seed=args.seeds[0],
    )
    plain = run_simulation(**common, config=one, return_model=True)
    secure = run_simulation(**common, config=one, secure=True, return_model=True)
    again = run_simulation(**common, config=one, secure=True, return_model=True)
    exact = {
        "secure_run_reproduced": bool(
            np.array_equal(secure["items"], again["items"])
            and np.array_equal(secure["network"], again["network"])
        ),
        "items_max_abs_diff": float(np.abs(plain["items"] - secure["items"]).max()),
        "network_max_abs_diff": float(np.abs(plain["network"] - secure["network"]).max()),
        "items_max_abs": float(np.abs(plain["items"]).max()),
    }
    print("one round:", exact, flush=True)

    runs = []
    for seed in args.seeds:
        config = FedNCFConfig(
            client_optimizer="fresh",
            model=model,
            global_rounds=args.global_rounds,
            eval_every=0,
            seed=seed,
        )
        row = {"seed": seed}
        for name, secure_flag in (("plain", False), ("secagg+", True)):
            result = run_simulation(**common, config=config, secure=secure_flag)
            keys = ("hit_rate", "ndcg", "median_round_seconds", "aggregation_rounds")
            row[name] = {k: result[k] for k in keys}
        for aggregator in ("mf-fedavg", "mf-secavg"):
            local = train_federated(
                dataset="ml-100k",
                data_dir=data_dir,
                config=FedNCFConfig(
                    client_optimizer="fresh",
                    model=model,
                    aggregator=aggregator,
                    global_rounds=args.global_rounds,
                    eval_every=0,
                    seed=seed,
                ),
                progress=False,
            )
            row[f"in-process {aggregator}"] = {
                "hit_rate": local.final.hit_rate,
                "round_seconds": local.train_seconds / row["plain"]["aggregation_rounds"],
            }
        print(json.dumps(row), flush=True)
        runs.append(row)

    def median(key: str, field: str) -> float:
        return statistics.median(r[key][field] for r in runs)

    summary = {
        "data": data_name,
        "nodes": args.nodes,
        "global_rounds": args.global_rounds,
        "seeds": args.seeds,
        "one_round_exactness": exact,
        "runs": runs,
        "median_round_seconds": {
            "flower plain": median("plain", "median_round_seconds"),
            "flower secagg+": median("secagg+", "median_round_seconds"),
            "in-process mf-fedavg": median("in-process mf-fedavg", "round_seconds"),
            "in-process mf-secavg": median("in-process mf-secavg", "round_seconds"),
        },
        "measured": time.strftime("%Y-%m-%d"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["median_round_seconds"], indent=1))


if __name__ == "__main__":
    run_script(main)
