"""``fedrec bench fedslate``: FedSlate against SlateQ, FedSlate(exp), FedQ and random, per platform.

For a setting (the paper's (N, n) = 10x3, 100x10, 500x10; ``sparse``: the sparse team reward;
``5platforms``: five platforms, all with feedback and with two without; ``longterm``: 100x10 with
the long-term dynamics of ``fedrec/ChocKaleLongTerm-v0``, where planning matters) it trains every
method for ``--seeds`` seeds with :func:`fedrec.train.multi_platform.train_multi_platform`, saves
the run directories under ``--out``, prints each run's wall time, then prints the per-platform
table of ``fedrec eval`` (ETROR, optimal reward, plateau, final greedy evaluation, planner,
random, with 95% CIs across seeds, beside the paper's numbers), writes it to ``table.csv`` and
writes the learning curves (both beside the runs, for the runs of this call).

FedSlate(exp) needs feedback on every platform, so its runs use an env where every platform has
feedback (its platform-B numbers are then not comparable with a no-feedback platform B; the
paper uses it in the sparse-team-reward experiment, where that is the point).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from fedrec.registration import LONG_TERM_KWARGS

_ITEMWISE_RELU = {"local_network": "itemwise", "local_hidden": (64, 32), "local_activation": "relu"}

#: method name on the command line -> (agent method, FedSlateConfig overrides)
METHOD_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "slateq": ("slateq", {}),
    "fedslate": ("fedslate", {}),
    "fedslate_exp": ("fedslate_exp", {}),
    "fedq": ("fedq", {}),
    "random": ("random", {}),
    "fedslate_linear": ("fedslate", {"global_network": "linear"}),
    # Labelled deviations from the paper (docs/fedslate.md, "Diagnosis"): item-wise local nets.
    "slateq_itemwise": ("slateq", {"local_network": "itemwise"}),
    "fedslate_itemwise": ("fedslate", {"local_network": "itemwise"}),
    # ... and a pass-through (residual) F; small ReLU item-wise nets (64-32, SlateQ's widths).
    "fedslate_residual": ("fedslate", {"global_network": "residual"}),
    "slateq_itemwise_relu": ("slateq", _ITEMWISE_RELU),
    "fedslate_itemwise_residual": ("fedslate", {**_ITEMWISE_RELU, "global_network": "residual"}),
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """Env variants (suffix -> kwargs), default methods and the paper scenario to compare with."""

    envs: dict[str, dict[str, Any]]
    methods: tuple[str, ...]
    scenario: str = "basic"
    paper: str = "auto"


_BASIC = ("slateq", "fedslate", "fedslate_exp", "fedq", "random")
SETTINGS: dict[str, Setting] = {
    "10x3": Setting({"": {"num_candidates": 10, "slate_size": 3}}, _BASIC),
    "100x10": Setting({"": {"num_candidates": 100, "slate_size": 10}}, _BASIC),
    "500x10": Setting({"": {"num_candidates": 500, "slate_size": 10}}, _BASIC),
    "sparse": Setting(
        {
            "": {
                "num_candidates": 100,
                "slate_size": 10,
                "reward_mode": "sparse_team",
                "reward_interval": 10,
            }
        },
        ("fedslate", "fedslate_exp", "slateq", "random"),
        scenario="sparse_team",
    ),
    "5platforms": Setting(
        {
            "all-feedback": {
                "num_candidates": 100,
                "slate_size": 10,
                "num_platforms": 5,
                "feedback": [True] * 5,
            },
            "two-without": {
                "num_candidates": 100,
                "slate_size": 10,
                "num_platforms": 5,
                "feedback": [True, True, True, False, False],
            },
        },
        ("fedslate", "slateq", "random"),
        paper="none",
    ),
    "longterm": Setting(
        {
            "": {
                "num_candidates": 100,
                "slate_size": 10,
                "sensitivity": LONG_TERM_KWARGS["sensitivity"],
            }
        },
        ("slateq", "fedslate", "fedq", "random"),
        paper="none",
    ),
    "ablation": Setting(
        {"": {"num_candidates": 100, "slate_size": 10}}, ("fedslate", "fedslate_linear")
    ),
}


def env_for(method: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The env kwargs a method runs with: FedSlate(exp) gets feedback on every platform."""
    kwargs = dict(env_kwargs)
    if METHOD_SPECS[method][0] == "fedslate_exp":
        kwargs["feedback"] = [True] * int(kwargs.get("num_platforms", 2))
    return kwargs


def run_dirs(
    setting: str,
    *,
    seeds: int,
    episodes: int,
    first_seed: int = 0,
    methods: tuple[str, ...] | None = None,
    out: Path,
    num_users: int = 16,
    eval_episodes: int = 500,
    planner: bool = True,
    resume: bool = False,
    progress: bool = True,
    agent_kwargs: dict[str, Any] | None = None,
    log: Any = print,
) -> list[Path]:
    """Train every (env variant, method, seed) of ``setting``; returns the run directories."""
    from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

    spec = SETTINGS[setting]
    paths = []
    for suffix, env_kwargs in spec.envs.items():
        for method in methods or spec.methods:
            agent_method, overrides = METHOD_SPECS[method]
            label = method + (f" [{suffix}]" if suffix else "")
            if agent_method == "fedslate_exp":
                label += " (all feedback)"
            for seed in range(first_seed, first_seed + seeds):
                path = out / "-".join(x for x in (suffix, method) if x) / f"seed{seed}"
                extra = {} if agent_method == "random" else {**overrides, **(agent_kwargs or {})}
                config = MultiPlatformTrainConfig(
                    method=agent_method,
                    episodes=episodes,
                    num_users=num_users,
                    seed=seed,
                    env_kwargs=env_for(method, env_kwargs),
                    agent_kwargs=extra,
                    eval_episodes=eval_episodes,
                    planner=planner,
                    progress=progress,
                    label=label,
                )
                start = time.perf_counter()
                result = train_multi_platform(config, out_dir=path, resume=resume)
                log(
                    f"{label} seed {seed}: {episodes} episodes in {result.wall_time:.1f} s "
                    f"training ({time.perf_counter() - start:.1f} s with evaluation) -> {path}"
                )
                paths.append(path)
    return paths


def print_table(paths: list[Path], setting: str, *, plot: Path | None) -> int:
    """The ``fedrec eval`` table (and plot) of the runs, with the paper's columns."""
    from fedrec import cli_eval

    spec = SETTINGS[setting]
    args = argparse.Namespace(
        runs=[str(p) for p in paths],
        out=plot,
        log_every=20,
        window=100,
        tail=0.2,
        tolerance=0.01,
        absolute=False,
        target=None,
        paper=spec.paper,
        scenario=spec.scenario,
        no_plot=plot is None,
        csv=None if plot is None else plot.with_name("table.csv"),
    )
    return cli_eval.run(args)


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    parser = bench_subparsers.add_parser(
        "fedslate",
        help="FedSlate vs SlateQ, FedSlate(exp), FedQ and random on the multi-platform env",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("--setting", choices=tuple(SETTINGS), default="100x10")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per method")
    parser.add_argument(
        "--first-seed", type=int, default=0, help="the seeds are FIRST, FIRST + 1, ... (default 0)"
    )
    parser.add_argument("--episodes", type=int, default=5000, help="training user-episodes")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=tuple(METHOD_SPECS),
        default=None,
        help="methods to run (default: the setting's)",
    )
    parser.add_argument("--out", type=Path, default=None, help="default results/fedslate/SETTING")
    parser.add_argument("--num-users", type=int, default=16, help="users simulated in parallel")
    parser.add_argument("--eval-episodes", type=int, default=500, help="held-out episodes")
    parser.add_argument("--no-planner", action="store_true", help="skip the joint planner")
    parser.add_argument("--resume", action="store_true", help="continue existing runs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.seeds < 1 or args.episodes < 1 or args.first_seed < 0:
        raise SystemExit("--seeds and --episodes must be >= 1 and --first-seed >= 0")
    out = args.out or Path("results") / "fedslate" / args.setting
    paths = run_dirs(
        args.setting,
        seeds=args.seeds,
        episodes=args.episodes,
        first_seed=args.first_seed,
        methods=tuple(args.methods) if args.methods else None,
        out=out,
        num_users=args.num_users,
        eval_episodes=args.eval_episodes,
        planner=not args.no_planner,
        resume=args.resume,
        progress=not args.no_progress,
    )
    return print_table(paths, args.setting, plot=out / "learning_curves.png")
