"""Training speed of FedSlate and its baselines per setting, extrapolated to a 5,000-episode run.

Usage: ``python benchmarks/fedslate_speed.py [--settings 10x3 100x10 500x10 5platforms]
[--methods fedslate slateq] [--episodes 96] [--repeats 3]``.

For each setting and method it trains ``--episodes`` user-episodes with learning from the first
transition (burn-in 0, so every transition pays its share of learning rounds, as after the
burn-in of a real run), with the bench's 16 users in parallel and no evaluation, repeats
``--repeats`` times and prints a Markdown table: median seconds per 1,000 training episodes
(min-max) and the extrapolated time of a 5,000-episode run (whose
first ~80 episodes are burn-in and cost almost nothing, so this is an upper bound). The target of
the FedSlate issue is at most 10 minutes for FedSlate at (100, 10) on this 2-core machine.
Timings on a shared machine vary: read the min-max range.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from fedrec.agents.registry import MULTI_PLATFORM_AGENTS
from fedrec.experiments.fedslate import SETTINGS, env_for
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

RUN_EPISODES = 5_000


def time_run(setting: str, method: str, *, episodes: int, seed: int) -> float:
    """Training seconds of ``episodes`` episodes (learning from the first transition)."""
    env_kwargs = next(iter(SETTINGS[setting].envs.values()))
    config = MultiPlatformTrainConfig(
        method=method,
        episodes=episodes,
        num_users=16,
        seed=seed,
        env_kwargs=env_for(method, env_kwargs),
        agent_kwargs={"learning_starts": 0},
        eval_episodes=0,
        planner=False,
        progress=False,
    )
    return train_multi_platform(config).wall_time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", nargs="+", default=["10x3", "100x10", "500x10"])
    parser.add_argument("--methods", nargs="+", default=["fedslate", "slateq"])
    parser.add_argument("--episodes", type=int, default=96, help="episodes per timed run")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    unknown = [s for s in args.settings if s not in SETTINGS] + [
        m for m in args.methods if m not in MULTI_PLATFORM_AGENTS or m == "random"
    ]
    if unknown:
        parser.error(f"unknown settings or methods: {unknown}")
    print(
        f"| setting | method | s per 1,000 episodes, median (min-max) of {args.repeats} "
        f"| 5,000-episode run (upper bound) |"
    )
    print("|---|---|---|---|")
    for setting in args.settings:
        for method in args.methods:
            times = [
                time_run(setting, method, episodes=args.episodes, seed=r)
                for r in range(args.repeats)
            ]
            per_k = [1000 * t / args.episodes for t in times]
            median = statistics.median(per_k)
            print(
                f"| {setting} | {method} | {median:.0f} ({min(per_k):.0f}-{max(per_k):.0f}) "
                f"| {RUN_EPISODES * median / 1000 / 60:.1f} min |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
