"""Speed of the batched FedNCF client simulation against the per-client reference loop.

Usage: ``python benchmarks/fedncf_speed.py [--dataset ml-100k] [--models gmf neumf]
[--rounds 12] [--repeats 3] [--clients-per-round 20]``.

For each model it trains the same ``--rounds`` aggregation rounds (same clients, same local
examples, MF-FedAvg) with :func:`train_round_batched` and :func:`train_round_reference`, times the
client simulation (sampling included, evaluation excluded), repeats ``--repeats`` times and prints
a Markdown table: median seconds per aggregation round (min-max), the speed-up, and both
extrapolated to 400 global rounds (400 x ceil(U / c) aggregation rounds). It also checks that the
two simulations produced the same global model (max |difference|).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from fedrec.agents.ncf import NCF, NCFConfig
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.federation.aggregators import MFFedAvg
from fedrec.train.fedncf import (
    ClientData,
    round_rng,
    sample_round,
    train_round_batched,
    train_round_reference,
)


def simulate(
    model: str, simulation: str, *, data, clients: ClientData, rounds: int, c: int, seed: int
) -> tuple[float, torch.Tensor]:
    """Seconds to simulate ``rounds`` aggregation rounds, and the final flat global model."""
    config = NCFConfig(model=model)
    net = NCF(
        config,
        num_users=data.num_users,
        num_items=data.num_items,
        generator=torch.Generator().manual_seed(seed),
    )
    users_store, items, network = net.user_table(), net.item_table(), net.network_vector()
    selection = np.random.default_rng([seed, 1])
    train = train_round_batched if simulation == "batched" else train_round_reference
    aggregator = MFFedAvg()
    elapsed = 0.0
    for r in range(rounds):
        users = np.sort(selection.choice(data.num_users, c, replace=False))
        start = time.perf_counter()
        samples = sample_round(clients, users, round_rng(seed, r), num_negatives=4, local_epochs=2)
        updates, rows = train(
            config,
            round_samples=samples,
            user_rows=users_store[torch.from_numpy(users)],
            items=items,
            network=network,
            lr=1e-3,
            batch_size=64,
        )
        elapsed += time.perf_counter() - start
        users_store[torch.from_numpy(users)] = rows
        items, network = aggregator.aggregate(items=items, network=network, updates=updates)
    return elapsed, torch.cat([items.reshape(-1), network, users_store.reshape(-1)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--data-dir")
    parser.add_argument("--models", nargs="+", default=["gmf", "neumf"])
    parser.add_argument("--rounds", type=int, default=12, help="aggregation rounds per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients-per-round", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = load_prepared(args.dataset, args.data_dir)
    clients = ClientData.of(data)
    per_global = math.ceil(data.num_users / args.clients_per_round)
    print(
        f"{args.dataset}: {data.num_users} clients, {args.clients_per_round} per round, "
        f"{per_global} aggregation rounds per global round; {args.rounds} rounds x "
        f"{args.repeats} repeats, 1 thread\n"
    )
    print(
        "| model | batched s/round | reference s/round | speed-up | batched 400 global rounds "
        "| reference 400 global rounds | max abs diff |"
    )
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        times: dict[str, list[float]] = {"batched": [], "reference": []}
        finals = {}
        for _ in range(args.repeats):
            for simulation in times:
                seconds, finals[simulation] = simulate(
                    model,
                    simulation,
                    data=data,
                    clients=clients,
                    rounds=args.rounds,
                    c=args.clients_per_round,
                    seed=args.seed,
                )
                times[simulation].append(seconds / args.rounds)
        med = {k: statistics.median(v) for k, v in times.items()}
        span = {k: f"{min(v):.3f}–{max(v):.3f}" for k, v in times.items()}
        total = 400 * per_global
        diff = float((finals["batched"] - finals["reference"]).abs().max())
        print(
            f"| {model.upper()} | {med['batched']:.3f} ({span['batched']}) | "
            f"{med['reference']:.3f} ({span['reference']}) | {med['reference'] / med['batched']:.1f}x | "
            f"{med['batched'] * total / 60:.1f} min | {med['reference'] * total / 3600:.1f} h | {diff:.1e} |"
        )


if __name__ == "__main__":
    main()
