"""Does centralised NCF also lose accuracy when trained as long as the federated runs?

Usage: ``python benchmarks/fedncf_long_training.py [--model neumf] [--epochs 400] [--seed 0]
[--eval-every 10] [--federated-runs fedncf-bench-fed/runs] [--out DIR] [--overwrite]
[--plot-only]``.

FedNCF compares 400 global rounds of federated training (each client trains 2 local epochs per
global round, so 800 local passes over every user's data) with 20 centralised epochs. Federated MLP
and NeuMF reach the centralised HR@10 within 100 global rounds and then lose about 0.03. This trains
the centralised model for ``--epochs`` epochs with the bench's settings (batch 256, Adam 1e-3, 4
negatives; evaluated every ``--eval-every`` epochs) and writes
``central_<model>_<epochs>_epochs.json``; with ``--federated-runs`` (a ``fedrec bench fedncf`` run
cache) it also plots the federated runs' HR@10 per global round beside it
(``fedncf_<model>_long_training.png``). ``--plot-only`` re-plots from the JSON already written.
``--out`` defaults to ``runs/benchmarks/fedncf_long_training/`` (the committed files are in
``results/fedncf/federated``); files of an earlier run are replaced only with ``--overwrite``. A
centralised NeuMF run of 400 epochs takes about 40 minutes on one core.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out


def train(model: str, epochs: int, seed: int, eval_every: int) -> dict:
    import torch

    from fedrec.agents.ncf import NCFConfig
    from fedrec.train.fedncf import CentralConfig, train_centralised

    torch.set_num_threads(1)
    start = time.perf_counter()
    config = CentralConfig(
        model=NCFConfig(model=model), epochs=epochs, eval_every=eval_every, seed=seed
    )
    result = train_centralised(dataset="ml-100k", config=config)
    return {
        "command": f"train_centralised(dataset='ml-100k', config=CentralConfig(model=NCFConfig("
        f"model='{model}'), epochs={epochs}, eval_every={eval_every}, seed={seed}))",
        "history": [
            {"epoch": int(p.global_round), "hit_rate": p.hit_rate, "ndcg": p.ndcg}
            for p in result.history
        ],
        "train_and_eval_seconds": round(time.perf_counter() - start, 1),
    }


def federated_curves(runs: Path, model: str) -> list[tuple[int, list[float], list[float]]]:
    """(seed, global rounds, HR@10) of every cached federated MF-FedAvg run of ``model``."""
    curves = []
    for path in sorted(runs.glob(f"federated-{model}-mf-fedavg-s*.json")):
        record = json.loads(path.read_text())
        history = record["history"]
        curves.append(
            (
                record["spec"]["seed"],
                [p["global_round"] for p in history],
                [p["hit_rate"] for p in history],
            )
        )
    return curves


def plot_path(out: Path, model: str) -> Path:
    return out / f"fedncf_{model}_long_training.png"


def plot(central: dict, curves: list, model: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    seeds = ", ".join(str(seed) for seed, _, _ in curves)
    for at, (_, rounds, hit_rates) in enumerate(curves):
        label = f"federated, MF-FedAvg (seeds {seeds})" if at == 0 else None
        ax.plot(rounds, hit_rates, color="C0", alpha=0.7, label=label)
    history = central["history"]
    ax.plot(
        [p["epoch"] for p in history],
        [p["hit_rate"] for p in history],
        color="k",
        lw=2,
        label=f"centralised (seed {central['command'].split('seed=')[-1].rstrip(')')})",
    )
    ax.axvline(20, color="k", ls=":", lw=1, label="20 centralised epochs (the bench)")
    ax.set_xlabel("global rounds (federated) / epochs (centralised)")
    ax.set_ylabel("HR@10 (test)")
    ax.set_title(f"{model.upper()} on ML-100K: long training, federated and centralised")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = plot_path(out, model)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="neumf", choices=("gmf", "mlp", "neumf"))
    parser.add_argument("--epochs", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--federated-runs", type=Path, help="a fedrec bench fedncf run cache")
    add_out_arguments(parser, "fedncf_long_training", what="folder of the JSON and the plot")
    parser.add_argument("--plot-only", action="store_true", help="re-plot from the JSON")
    args = parser.parse_args()
    args.out = script_out("fedncf_long_training", args.out)
    path = args.out / f"central_{args.model}_{args.epochs}_epochs.json"
    written = [] if args.plot_only else [path]
    if args.federated_runs is not None:
        written.append(plot_path(args.out, args.model))
    claim_outputs(written, overwrite=args.overwrite)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        central = json.loads(path.read_text())
    else:
        central = train(args.model, args.epochs, args.seed, args.eval_every)
        path.write_text(json.dumps(central, indent=1))
    best = max(central["history"], key=lambda p: p["hit_rate"])
    last = central["history"][-1]
    print(
        f"centralised {args.model}: best HR@10 {best['hit_rate']:.4f} at epoch {best['epoch']}, "
        f"{last['hit_rate']:.4f} at epoch {last['epoch']} ({path})"
    )
    if args.federated_runs is not None:
        curves = federated_curves(args.federated_runs, args.model)
        if not curves:
            raise SystemExit(f"no federated {args.model} runs in {args.federated_runs}")
        for seed, rounds, hit_rates in curves:
            print(f"federated seed {seed}: HR@10 {hit_rates[-1]:.4f} at round {rounds[-1]:g}")
        print(f"plot: {plot(central, curves, args.model, args.out)}")


if __name__ == "__main__":
    run_script(main)
