"""Per-user time of the SlateQ slate optimisers (top-k, greedy, LP, Dinkelbach) at FedSlate's sizes.

Usage: ``python benchmarks/slate_selection_speed.py [--users 64] [--repeats 5] [--seed 0]``. Each
method solves one batch of ``--users`` random users (v = exp(N(0,1)), q ~ N(0,1), v_null =
exp(N(0,1))); the table gives the median over ``--repeats`` runs of batch time / users, in
microseconds. Top-k, greedy and Dinkelbach are vectorised over the batch, so their per-user time
falls as the batch grows; the LP is one HiGHS solve per user. Also checks that LP and Dinkelbach
reach the same value.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedrec.agents.slate_selection import select_slates, slate_values

SIZES = ((10, 3), (100, 10), (500, 10))
METHODS = {
    "top-k": {"method": "topk"},
    "greedy": {"method": "greedy"},
    "LP (HiGHS)": {"method": "optimal", "solver": "lp"},
    "Dinkelbach": {"method": "optimal", "solver": "dinkelbach"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"per-user time in µs, median of {args.repeats} runs, batch of {args.users} users")
    print("| (N, k) | " + " | ".join(METHODS) + " | LP − Dinkelbach max |ΔW| |")
    print("|---" * (len(METHODS) + 2) + "|")
    for n, k in SIZES:
        v = np.exp(rng.normal(size=(args.users, n)))
        q = rng.normal(size=(args.users, n))
        v_null = np.exp(rng.normal(size=args.users))
        cells, values = [], {}
        for name, kwargs in METHODS.items():
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                slates = select_slates(
                    kwargs["method"], v, q, v_null, k, solver=kwargs.get("solver", "lp")
                )
                times.append(time.perf_counter() - start)
            values[name] = slate_values(v, q, v_null, slates)
            cells.append(f"{1e6 * float(np.median(times)) / args.users:.1f}")
        gap = np.abs(values["LP (HiGHS)"] - values["Dinkelbach"]).max()
        print(f"| ({n}, {k}) | " + " | ".join(cells) + f" | {gap:.1e} |")


if __name__ == "__main__":
    main()
