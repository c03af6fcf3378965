"""Why ``fedrec/ChocKaleUserTypes-v0`` mixes tau = 0 and tau = 0.1: the best fixed heuristic's gap
to the planner as the sensitive type's tau grows.

Usage: ``python benchmarks/user_types_sweep.py [--episodes 2000] [--seed 7]``. Half the users are
indifferent (tau = 0), half sensitive (the column's tau), drawn per episode and hidden from the
agent; the planner is told each user's tau. Prints a Markdown table (mean return with 95% CI over
episodes of random, the two fixed heuristics and the planner on the long-term env's parameters,
(N, n) = (10, 3), and the best heuristic's gap to the planner). The README's table is its output.
"""

from __future__ import annotations

import argparse

from fedrec.agents.reference import reference_policies
from fedrec.envs.choc_kale_model import make_params
from fedrec.eval.rollout import evaluate_policy
from fedrec.registration import LONG_TERM_KWARGS

SENSITIVE_TAUS = (0.05, 0.08, 0.1, 0.15)
NAMES = ("random", "top_x", "bottom_x", "planner")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print("| user types (tau) | random | top_x | bottom_x | planner | best heuristic vs planner |")
    print("|---|---|---|---|---|---|")
    for tau in SENSITIVE_TAUS:
        kwargs = {**LONG_TERM_KWARGS, "user_sensitivities": (0.0, tau)}
        policies = reference_policies(make_params(kwargs))
        results = {
            name: evaluate_policy(
                "fedrec/ChocKaleSlate-v0",
                policies[name],
                episodes=args.episodes,
                num_envs=1000,
                seed=args.seed,
                env_kwargs=kwargs,
            )
            for name in NAMES
        }
        best = max(results["top_x"].mean, results["bottom_x"].mean)
        gap = best / results["planner"].mean - 1
        row = " | ".join(str(results[name]) for name in NAMES)
        print(f"| 0 or {tau} | {row} | {gap:+.1%} |")


if __name__ == "__main__":
    main()
