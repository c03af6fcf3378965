"""Why ``fedrec/ChocKaleLongTerm-v0`` uses tau = 0.05: the planner's gain over myopia as tau grows.

Usage: ``python benchmarks/long_term_sweep.py [--episodes 2000] [--seed 7]``. Prints a Markdown
table (mean return with 95% CI of random, myopic and the optimal planner on the FedSlate variant
with sensitivity tau, and the planner's gain over the myopic policy). README's table is its output.
"""

from __future__ import annotations

import argparse

from fedrec.agents.reference import reference_policies
from fedrec.envs.choc_kale import FEDSLATE_KWARGS
from fedrec.envs.choc_kale_model import make_params
from fedrec.eval.rollout import evaluate_policy

SENSITIVITIES = (0.01, 0.03, 0.05, 0.08, 0.1, 0.15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print("| tau | random | myopic | planner | planner DP value | planner vs myopic |")
    print("|---|---|---|---|---|---|")
    for tau in SENSITIVITIES:
        policies = reference_policies(make_params({**FEDSLATE_KWARGS, "sensitivity": tau}))
        results = {
            name: evaluate_policy(
                "fedrec/ChocKaleSlate-v0",
                policy,
                episodes=args.episodes,
                num_envs=1000,
                seed=args.seed,
                env_kwargs={"sensitivity": tau},
            )
            for name, policy in policies.items()
        }
        gain = results["planner"].mean / results["myopic"].mean - 1
        print(
            f"| {tau} | {results['random']} | {results['myopic']} | {results['planner']} "
            f"| {policies['planner'].expected_return():.1f} | {gain:+.1%} |"
        )


if __name__ == "__main__":
    main()
