"""``fedrec flower``: FedNCF with its parties on Flower (:mod:`fedrec.train.fedncf.flower`)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from typing import Any


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "flower",
        help="FedNCF on Flower: the server and client nodes as Flower apps",
        description="FedNCF with the server as a Flower ServerApp and the users sharded over "
        "Flower nodes (ClientApps), each training its users with fedrec's client simulation.",
    )
    commands = parser.add_subparsers(dest="flower_command", metavar="SUBCOMMAND", required=True)
    simulate = commands.add_parser(
        "simulate",
        help="run on Flower's simulation engine (Ray), in this machine",
        description="Train FedNCF on Flower's simulation engine with --nodes SuperNodes; prints "
        "the final HR@K / NDCG@K (federated evaluation) and, with --compare, the in-process "
        "run with the same seed. Shows the finished aggregation rounds with an ETA on stderr "
        "when it is a terminal. Duration: 15 to 60 s to start Ray, then about 0.1 s per "
        "aggregation round (Flower's message poll) whatever it holds; on ml-100k a global round "
        "is 943 users / --clients-per-round aggregation rounds (48 at the default 20), so "
        "--global-rounds 20 trains in about 100 s and the default 400 in about 32 min; "
        "--compare adds the in-process run (about 15 s for 20 global rounds, 4 min for 400).",
    )
    _add_job_arguments(simulate)
    simulate.set_defaults(handler=run_flower, engine="simulation")
    deploy = commands.add_parser(
        "deploy",
        help="run on a real Flower deployment on loopback (SuperLink + SuperNode processes)",
        description="Start flower-superlink and --nodes flower-supernode processes on 127.0.0.1, "
        "run FedNCF on them with flwr run, print the result and stop every process (also on "
        "failure). Each message costs seconds on a deployment (a fresh ClientApp process per "
        "message): use few, large rounds (e.g. --clients-per-round 943). Shows the finished "
        "aggregation rounds with an ETA on stderr when it is a terminal. Duration: about 10 s "
        "to start, then about 10 to 25 s per aggregation round whatever it holds (measured "
        "with 2 nodes: --clients-per-round 943 --global-rounds 8 trains in 2 to 3 min; the "
        "defaults, 19,200 rounds, would take days).",
    )
    _add_job_arguments(deploy)
    deploy.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="seconds before the run is stopped (default 3600)",
    )
    deploy.add_argument("--log-dir", help="keep the processes' logs here (default: discarded)")
    deploy.set_defaults(handler=run_flower, engine="deployment")
    fel = commands.add_parser(
        "fel",
        help="FEL's federated leaves on Flower (simulation engine or loopback deployment)",
        description="Train FEL's per-cluster leaves with (DP-)FedAvg, the users sharded over "
        "Flower nodes; prints the test AUC of every ensemble rule and, with --compare, the "
        "in-process run with the same seed (one node: identical leaves). Duration (measured, "
        "docs/fel.md): simulate takes 25 to 65 s to start and evaluate, then about 0.1 s per "
        "round (the default 50 rounds: about 1 to 1.5 min); deploy about 15 to 25 s per round "
        "(--users 300 --rounds 5: about 2 min). Shows the finished rounds with an ETA on stderr "
        "when it is a terminal.",
    )
    fel.add_argument("engine", choices=("simulate", "deploy"), help="where to run it")
    fel.add_argument(
        "--data",
        default="taobao-synthetic",
        choices=("taobao-synthetic", "taobao", "ml-100k"),
        help="data set (default taobao-synthetic)",
    )
    fel.add_argument("--data-dir", help="the data set's folder (default: the fedrec cache)")
    fel.add_argument("--users", type=int, default=2000, help="synthetic users (default 2000)")
    fel.add_argument("--ads", type=int, default=400, help="synthetic ads (default 400)")
    fel.add_argument(
        "--method", default="feature", choices=("feature", "kmeans", "random"),
        help="how users are clustered (default: the data set's public feature cross)",
    )  # fmt: skip
    fel.add_argument("--clusters", type=int, help="K for kmeans / random (default: none)")
    fel.add_argument(
        "--cross",
        nargs="+",
        default=(),
        help="public features of the clustering (default: the data set's own cross)",
    )
    fel.add_argument("--nodes", type=int, default=2, help="Flower nodes (default 2)")
    fel.add_argument("--rounds", type=int, default=50, help="FedAvg rounds (default 50)")
    fel.add_argument(
        "--sample-rate",
        type=float,
        default=0.1,
        help="fraction of a cluster's users per round (default 0.1)",
    )
    fel.add_argument(
        "--noise-multiplier",
        type=float,
        help="DP-FedAvg inside each cluster with this noise (default: no DP)",
    )
    fel.add_argument("--clip-norm", type=float, default=1.0, help="DP clipping norm (default 1.0)")
    fel.add_argument("--baseline", action="store_true", help="also train plain FL on Flower")
    fel.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    fel.add_argument("--compare", action="store_true", help="also train in-process")
    fel.add_argument("--json", action="store_true", help="print the result as JSON")
    fel.add_argument(
        "--timeout", type=float, default=3600.0, help="deploy: seconds allowed (default 3600)"
    )
    fel.add_argument("--log-dir", help="deploy: keep the processes' logs here (default: discarded)")
    _add_progress(fel)
    fel.set_defaults(handler=run_fel)


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="ml-100k", help="logged data set (default ml-100k)")
    parser.add_argument("--data-dir", help="its folder (default: the fedrec cache)")
    parser.add_argument(
        "--model",
        default="gmf",
        choices=("gmf", "mlp", "neumf"),
        help="NCF model: gmf, mlp or neumf (default gmf)",
    )
    parser.add_argument("--nodes", type=int, default=2, help="Flower nodes (default 2)")
    parser.add_argument(
        "--global-rounds",
        type=int,
        default=400,
        help="global rounds, each a pass over every user (default 400)",
    )
    parser.add_argument(
        "--clients-per-round",
        type=int,
        default=20,
        help="users trained per aggregation round (default 20)",
    )
    # the names come from fedrec.federation.registry, checked in run_flower: importing the
    # registry here would load torch at every start of the `fedrec` command
    parser.add_argument(
        "--aggregator",
        help="the server's rule: a plain rule of the aggregator registry (default: FedNCF's, "
        "MF-FedAvg)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument(
        "--secure",
        action="store_true",
        help="aggregate with Flower's SecAgg+ workflow (MF-FedAvg only; costs 4 message "
        "rounds per aggregation round)",
    )
    parser.add_argument(
        "--compare", action="store_true", help="also train in-process and print both"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_progress(parser)


def _add_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a bar of the finished aggregation rounds with the elapsed time and ETA on stderr "
        "(default: shown when stderr is a terminal, quiet in a log file)",
    )


def run_flower(args: argparse.Namespace) -> int:
    from fedrec.agents.ncf import NCFConfig
    from fedrec.federation.registry import DEFAULT_AGGREGATOR, PLAIN_AGGREGATOR_NAMES
    from fedrec.train.fedncf import FedNCFConfig

    aggregator = args.aggregator or DEFAULT_AGGREGATOR
    if aggregator not in PLAIN_AGGREGATOR_NAMES:
        raise ValueError(
            f"--aggregator must be one of {', '.join(PLAIN_AGGREGATOR_NAMES)}, got {aggregator!r}"
        )
    _require_flower()
    from fedrec.train.fedncf import flower as flower_fedncf

    config = FedNCFConfig(
        model=NCFConfig(model=args.model),
        aggregator=aggregator,
        global_rounds=args.global_rounds,
        clients_per_round=args.clients_per_round,
        seed=args.seed,
        eval_every=0,
        client_optimizer="fresh",  # what Flower's nodes train
    )
    from fedrec.federation.flower_common import progress_wanted

    start = time.perf_counter()
    job = {
        "dataset": args.dataset,
        "data_dir": args.data_dir,
        "config": config,
        "num_nodes": args.nodes,
        "secure": args.secure,
        "progress": progress_wanted(args.progress),
    }
    if args.engine == "simulation":
        result = _stop_on_signal(flower_fedncf.run_simulation, **job)
    else:
        result = _stop_on_signal(  # the deployment's processes are stopped first
            flower_fedncf.run_deployment, **job, timeout=args.timeout, log_dir=args.log_dir
        )
    result["wall_seconds"] = time.perf_counter() - start
    result.pop("round_seconds", None)  # one entry per aggregation round: in the benchmarks
    if args.compare:
        from fedrec.train.fedncf import train_federated

        local = train_federated(
            dataset=args.dataset, data_dir=args.data_dir, config=config, progress=False
        )
        result["in_process"] = {
            "hit_rate": local.final.hit_rate,
            "ndcg": local.final.ndcg,
            "train_seconds": local.train_seconds,
        }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    quality = (
        f"HR@10 {result['hit_rate']:.4f}, NDCG@10 {result['ndcg']:.4f} over {result['users']} users"
        if result["hit_rate"] is not None
        else "no evaluation (synthetic users have no test data)"
    )
    print(
        f"Flower {args.engine}, {args.nodes} node(s){', SecAgg+' if args.secure else ''}: "
        f"{quality}; {result['aggregation_rounds']} aggregation rounds in "
        f"{result['train_seconds']:.1f} s ({result['wall_seconds']:.1f} s with the start)"
    )
    if args.compare:
        local = result["in_process"]
        print(
            f"in-process: HR@10 {local['hit_rate']:.4f}, NDCG@10 {local['ndcg']:.4f}; "
            f"{local['train_seconds']:.1f} s"
        )
    return 0


def run_fel(args: argparse.Namespace) -> int:
    from fedrec.train.fel import DPConfig, FedConfig

    _require_flower()
    from fedrec.train.fel import flower as flower_fel

    dp = None
    if args.noise_multiplier is not None:
        dp = DPConfig(clip_norm=args.clip_norm, noise_multiplier=args.noise_multiplier)
    job = {
        "data": args.data,
        "data_dir": args.data_dir,
        "users": args.users,
        "ads": args.ads,
        "clustering": flower_fel.FELClustering(
            args.method, num_clusters=args.clusters, features=tuple(args.cross), seed=args.seed
        ),
        "config": FedConfig(
            rounds=args.rounds, sample_rate=args.sample_rate, dp=dp, seed=args.seed
        ),
    }
    from fedrec.federation.flower_common import progress_wanted

    progress = progress_wanted(args.progress)
    start = time.perf_counter()
    if args.engine == "simulate":
        result = _stop_on_signal(
            flower_fel.run_simulation,
            **job,
            num_nodes=args.nodes,
            baseline=args.baseline,
            progress=progress,
        )
    else:
        result = _stop_on_signal(  # the deployment's processes are stopped first
            flower_fel.run_deployment,
            **job,
            num_nodes=args.nodes,
            baseline=args.baseline,
            timeout=args.timeout,
            log_dir=args.log_dir,
            progress=progress,
        )
    result["wall_seconds"] = time.perf_counter() - start
    result.pop("loss_history", None)
    if args.compare:
        result["in_process"] = flower_fel.run_in_process(**job)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    aucs = ", ".join(f"{rule} {auc:.4f}" for rule, auc in result["auc"].items())
    print(
        f"FEL on Flower ({args.engine}, {args.nodes} node(s), {result['num_clusters']} clusters): "
        f"test AUC {aucs}; {result['rounds']} rounds in {result['train_seconds']:.1f} s"
    )
    if args.compare:
        local = result["in_process"]
        same = local["leaves_sha256"] == result["leaves_sha256"]
        aucs = ", ".join(f"{rule} {auc:.4f}" for rule, auc in local["auc"].items())
        print(
            f"in-process: test AUC {aucs}; {local['train_seconds']:.1f} s; leaves "
            f"{'identical' if same else 'differ'}"
        )
    return 0


def _stop_on_signal(simulation: Callable[..., dict[str, Any]], **job: Any) -> dict[str, Any]:
    """Run a simulation; on SIGINT or SIGTERM (its Ray processes already stopped) print
    "interrupted" and exit with 128 + the signal's number (130, 143), without a traceback."""
    from fedrec.federation.flower_common import Interrupted

    try:
        return simulation(**job)
    except Interrupted as stop:
        print("interrupted", file=sys.stderr)
        raise SystemExit(128 + stop.signum) from None


def _require_flower() -> None:
    if importlib.util.find_spec("flwr") is None:  # pragma: no cover - a test dependency
        raise ValueError("Flower is not installed: pip install 'fedrec[flower]'")
