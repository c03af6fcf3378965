"""What holds FedMLP back: the clients' Adam state, measured on short runs.

Usage: ``python benchmarks/fedncf_optimizer_state.py [--model mlp] [--global-rounds 60]
[--eval-every 10] [--sequential-passes 12] [--refit-epochs 4] [--seed 0] [--dataset ml-100k]
[--data-dir DIR] [--out PATH] [--overwrite]``.

Every variant is FedNCF's setting (MF-FedAvg, 20 clients per aggregation round, 2 local epochs,
batch 64, Adam lr 1e-3, 4 negatives per positive) and differs only in the clients' optimiser
state; HR@10 is printed every ``--eval-every`` global rounds:

* ``fresh``: a new Adam every participation (the paper's literal reading);
* ``persistent``: each client keeps its own Adam state between participations;
* ``federated``: the Adam state of the item rows and network is sent with the weights,
  continued by the clients and aggregated like the weights (fedrec's default);
* ``federated-v``: as ``federated`` but only the second moments v are shared; the first moments
  of the item rows and network start from zero at every participation (which part matters);
* ``one-client``: ``federated`` with one client per aggregation round, which is one Adam
  stepping through every client's local batches in turn (are one-user batches the problem?);
  ``--sequential-passes`` passes over the clients.

Then, from the ``persistent`` run's final model, two re-fits on the pooled data with everything
else frozen (``--refit-epochs`` epochs of batch 256 with a fresh Adam): the user rows alone (are
the private user rows stale?) and the network alone (is the tower the bottleneck?).

It takes about 15 minutes for FedMLP on 2 cores. Writes the JSON to ``--out`` ('' for none;
default ``runs/benchmarks/fedncf_optimizer_state/optimizer_state.json``, the committed one is
``results/fedncf/optimizer_state.json``); an earlier run's file is replaced only with
``--overwrite``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.agents.ncf import NCF, NCFConfig
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.envs.datasets.preprocess import sample_training_negatives
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.train.fedncf import (
    FederatedOptimizerState,
    FedNCFConfig,
    FedNCFTrainer,
    evaluate_model,
)

VARIANTS = ("fresh", "persistent", "federated", "federated-v", "one-client")


class SecondMomentsOnly(FederatedOptimizerState):
    """Shares only v: the first moments of the item rows and network start at zero each time."""

    def load(self, users, row_client, row_item):  # type: ignore[no-untyped-def]
        dense_m, dense_v, item_mv, steps = super().load(users, row_client, row_item)
        width = self.user_moments.shape[1] // 2
        dense_m = dense_m.copy()
        dense_m[:, width:] = 0  # the network's m; the user row's m is the client's own
        item_mv = item_mv.copy()
        item_mv[:, :width] = 0
        return dense_m, dense_v, item_mv, steps


def run_variant(args: argparse.Namespace, variant: str) -> tuple[list[dict[str, Any]], NCF]:
    """Train one variant; returns its evaluation points and final model."""
    optimizer = "federated" if variant in ("federated-v", "one-client") else variant
    rounds = args.sequential_passes if variant == "one-client" else args.global_rounds
    config = FedNCFConfig(
        model=NCFConfig(model=args.model),
        global_rounds=rounds,
        clients_per_round=1 if variant == "one-client" else 20,
        eval_every=args.eval_every if variant != "one-client" else 2,
        seed=args.seed,
        client_optimizer=optimizer,  # type: ignore[arg-type]
    )
    trainer = FedNCFTrainer(
        dataset=args.dataset, data_dir=args.data_dir, config=config, progress=False
    )
    if variant == "federated-v":
        store = SecondMomentsOnly(
            config.model, num_users=trainer.num_users, num_items=trainer.items.shape[0]
        )
        trainer.optimizer_store = trainer.extra["optimizer_store"] = store
    began = time.perf_counter()
    points = []

    def record(point: Any) -> None:
        points.append({"global_round": point.global_round, "hit_rate": point.hit_rate})
        print(f"{variant:12s} global round {point.global_round:6.1f}  HR@10 {point.hit_rate:.4f}"
              f"  ({time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip

    trainer.on_eval = record
    trainer.run()
    trainer.model.load_federated(
        user_table=trainer.user_store, item_table=trainer.items, network=trainer.network
    )
    return points, trainer.model


def refit(args: argparse.Namespace, model: NCF, part: str) -> list[float]:
    """HR@10 after each epoch of re-fitting ``part`` ("users" or "network") on the pooled data."""
    data = load_prepared(args.dataset, args.data_dir)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if part == "users":
        params = [t.weight for t in (model.user_gmf, model.user_mlp) if t is not None]
        optimizer: torch.optim.Optimizer = torch.optim.SparseAdam(params, lr=1e-3)
    else:
        params = list(model.network_parameters())
        optimizer = torch.optim.Adam(params, lr=1e-3)
    for parameter in params:
        parameter.requires_grad_(True)
    rng = np.random.default_rng([args.seed, 7])
    hit_rates = []
    for _ in range(args.refit_epochs):
        samples = sample_training_negatives(data, rng, 4)
        order = torch.from_numpy(rng.permutation(len(samples.users)))
        users = torch.from_numpy(samples.users)[order]
        items = torch.from_numpy(samples.items)[order]
        labels = torch.from_numpy(samples.labels)[order]
        for lo in range(0, len(users), 256):
            logits = model(users[lo : lo + 256], items[lo : lo + 256])
            loss = F.binary_cross_entropy_with_logits(logits, labels[lo : lo + 256])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        result = evaluate_model(model, dataset=args.dataset, data_dir=args.data_dir, top_k=10)
        hit_rates.append(result.hit_rate)
        print(f"refit {part:8s} epoch {len(hit_rates)}  HR@10 {result.hit_rate:.4f}", flush=True)
    return hit_rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=("gmf", "mlp", "neumf"))
    parser.add_argument("--global-rounds", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--sequential-passes", type=int, default=12)
    parser.add_argument("--refit-epochs", type=int, default=4)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--data-dir")
    add_out_arguments(
        parser, "fedncf_optimizer_state", name="optimizer_state.json", what="the JSON ('' for none)"
    )
    args = parser.parse_args()
    if args.out != "":
        args.out = str(script_out("fedncf_optimizer_state", args.out, "optimizer_state.json"))
        claim_outputs([args.out], overwrite=args.overwrite)
    torch.set_num_threads(1)
    settings = {k: v for k, v in vars(args).items() if k != "overwrite"}
    report: dict[str, Any] = {"settings": settings, "variants": {}, "load": os.getloadavg()}
    for variant in args.variants:
        points, model = run_variant(args, variant)
        report["variants"][variant] = points
        if variant == "persistent" and args.refit_epochs:
            report["refit_network"] = refit(args, copy.deepcopy(model), "network")
            report["refit_users"] = refit(args, model, "users")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    run_script(main)
