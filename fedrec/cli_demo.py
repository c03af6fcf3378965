"""``fedrec demo``: reference policies on every Choc-vs-Kale env, then a short FedSlate comparison.

Prints the mean episode return (with a 95% confidence interval over episodes) of the random
policy, the fixed heuristics, the best open-loop schedule of fixed rules (with the rule it found),
the myopic and optimal-planner oracles and each one's regret against the planner. With
``--fedslate`` (what ``make demo`` runs) it then trains SlateQ, FedSlate and random on the
two-platform env for a few hundred episodes (:mod:`fedrec.experiments.demo_fedslate`), prints the
per-platform ``fedrec eval`` table and writes the learning-curve plot.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from fedrec.registration import CHOC_KALE_ENVIRONMENTS

if TYPE_CHECKING:  # the run imports them: `fedrec --help` loads neither PyTorch nor SciPy
    from fedrec.eval.rollout import ReturnSummary

#: In table order; ``belief_planner`` exists on the envs with hidden user types only.
POLICIES = ("random", "top_x", "bottom_x", "best_open_loop", "myopic", "belief_planner", "planner")

#: ``fedrec demo --help``.
DESCRIPTION = (
    "Roll out the reference policies on every registered Choc-vs-Kale environment: random, the "
    "fixed heuristics top_x and bottom_x (the n largest / smallest-feature candidates), "
    "best_open_loop (the best schedule of fixed rules, searched with the env's model), the "
    "oracles myopic and planner (they read the user's hidden state) and, on the envs with hidden "
    "user types, belief_planner; print mean returns with 95% confidence intervals and the regret "
    "against the planner. The default run takes about 1.5 minutes on a quiet 2-core machine "
    "(80 s of CPU time). With --fedslate (what 'make demo' runs) it then trains SlateQ, "
    "FedSlate and random on the two-platform env for --fedslate-episodes episodes and prints "
    "the 'fedrec eval' table (1-2 minutes more; all durations grow several-fold when "
    "other jobs share the cores)."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the reference policies on every Choc-vs-Kale env (random, fixed heuristics, best "
        "open-loop rule, oracles), then optionally a short FedSlate comparison",
        description=DESCRIPTION,
    )
    parser.add_argument("--episodes", type=int, default=2000, help="episodes per policy and env")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first episode batch")
    parser.add_argument("--num-envs", type=int, default=1000, help="users simulated at once")
    parser.add_argument(
        "--fedslate",
        action="store_true",
        help="then train the short SlateQ / FedSlate / random comparison (1-2 minutes)",
    )
    parser.add_argument(
        "--fedslate-episodes", type=int, default=400, help="training episodes of that comparison"
    )
    parser.add_argument(
        "--out",
        default="runs/demo_fedslate",
        help="run directories and plot of the comparison (default runs/demo_fedslate, git-ignored: "
        "the demo leaves the repository clean; results/demo_fedslate holds the reference output)",
    )
    parser.set_defaults(handler=run)


def _joint(name: str, policy: Any, env: Any) -> Any:
    """A reference policy on every platform of a multi-platform env."""
    if name == "belief_planner":  # its filter needs every platform's observations at once
        from fedrec.agents.belief_planner import JointBeliefPlanner

        return JointBeliefPlanner.for_env(env)
    from fedrec.agents.reference import JointReferencePolicy

    return JointReferencePolicy(policy, env.params, env.possible_agents)


def run(args: argparse.Namespace) -> int:
    import gymnasium as gym
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from fedrec.agents.reference import env_params, reference_policies
    from fedrec.eval.rollout import evaluate_joint_policy, evaluate_policy

    if args.fedslate and args.fedslate_episodes < 1:
        raise SystemExit("--fedslate-episodes must be >= 1")
    console = Console(width=None if sys.stdout.isatty() else 130)
    started = time.perf_counter()
    rows: list[tuple[str, str, ReturnSummary, float, str]] = []
    oracles: set[str] = set()  # the policies that read the user's hidden state (marked)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("rolling out", total=len(CHOC_KALE_ENVIRONMENTS) * len(POLICIES))
        for entry in CHOC_KALE_ENVIRONMENTS:
            progress.update(task, description=f"{entry.id}: solving the planner's DP")
            results: dict[str, ReturnSummary] = {}
            details: dict[str, str] = {}
            if entry.api == "gymnasium":
                params = env_params(gym.make(entry.id))
                for name, policy in reference_policies(params, seed=args.seed).items():
                    progress.update(task, description=f"{entry.id}: {name}")
                    if policy.oracle:
                        oracles.add(name)
                    results[name] = evaluate_policy(
                        entry.id,
                        policy,
                        episodes=args.episodes,
                        num_envs=args.num_envs,
                        seed=args.seed,
                    )
                    if name == "best_open_loop":
                        details[name] = f"rule: {policy.plan.describe()}"
                    progress.advance(task)
            else:
                from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv

                env = ChocKaleMultiPlatformBatchEnv(num_users=1, **entry.kwargs)
                for name, policy in reference_policies(env.params, seed=args.seed).items():
                    progress.update(task, description=f"{entry.id}: {name}")
                    joint = _joint(name, policy, env)
                    per_platform = evaluate_joint_policy(
                        joint,
                        episodes=args.episodes,
                        num_envs=args.num_envs,
                        seed=args.seed,
                        env_kwargs=entry.kwargs,
                    )
                    results[name] = per_platform.pop("total")
                    details[name] = ", ".join(
                        f"{agent.removeprefix('platform_')}: {summary.mean:.1f}"
                        for agent, summary in per_platform.items()
                    )
                    if name == "best_open_loop":  # one schedule over the visits a, b, a, b, ...
                        details[name] += f"; rule over visits: {policy.plan.describe()}"
                    progress.advance(task)
            best = results["planner"].mean
            for name in (name for name in POLICIES if name in results):
                regret = best - results[name].mean
                rows.append((entry.id, name, results[name], regret, details.get(name, "")))

    table = Table(
        title=f"Reference policies: mean episode return ({args.episodes} episodes, 95% CI)"
    )
    table.add_column("environment", style="bold")
    table.add_column("policy")
    table.add_column("return", justify="right")
    table.add_column("regret vs planner", justify="right")
    table.add_column("per platform (true engagement); rule found")
    for env_id, name, summary, regret, detail in rows:
        label = f"{name} (oracle)" if name in oracles else name
        table.add_row(env_id, label, str(summary), f"{regret:.1f}", detail)
    console.print(table)
    console.print(
        "top_x / bottom_x: the fixed heuristics that serve the n largest / smallest-feature "
        "candidates (no learning, no oracle); best_open_loop: the best schedule of fixed rules "
        "as a function of the step only, searched with the env's model (no feedback, no "
        "learning: the bar a learning claim must clear); myopic and planner are oracles; "
        "belief_planner (hidden user types) knows the model but not the user: it acts on the "
        "exact posterior of what it observes, and planner - belief_planner bounds what knowing "
        "the type is worth. "
        "Multi-platform: "
        "return = total engagement over both platforms (a with feedback, b without). "
        f"Seed {args.seed}; {time.perf_counter() - started:.0f} s."
    )
    if args.fedslate:
        from fedrec.experiments.demo_fedslate import run_demo

        console.print(
            f"\nFedSlate comparison: SlateQ, FedSlate and random at (N, n) = (10, 3), "
            f"{args.fedslate_episodes} episodes, seed 0 (training...)"
        )
        return run_demo(args.out, episodes=args.fedslate_episodes)
    return 0
