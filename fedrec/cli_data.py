"""``fedrec data``: list, fetch and describe the logged data sets, and score baselines on them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: The estimators of `fedrec data estimate` (fedrec.train.estimate.ESTIMATORS' keys, listed here
#: so that building the parser imports nothing heavy; a test keeps the two equal).
ESTIMATE_ESTIMATORS = (
    "slate-ips", "iips", "rips", "pseudoinverse", "ips", "dm", "dr", "pdis", "wdr", "mis",
)  # fmt: skip


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "data",
        help="fetch and describe logged data sets (MovieLens, Lastfm, Foursquare, Taobao)",
        description="Logged recommendation data sets. Files are cached under $FEDREC_DATA "
        "(default ~/.cache/fedrec), one folder per data set.",
    )
    commands = parser.add_subparsers(dest="data_command", metavar="SUBCOMMAND", required=True)

    listing = commands.add_parser(
        "list",
        help="the known data sets and whether they are cached",
        description="The known data sets: name, title, files, where each is cached (- when it "
        "is not) and its official source.",
    )
    listing.add_argument("--dir", type=Path, default=None, help="data directory (default: cache)")
    listing.set_defaults(handler=run_list)

    fetch = commands.add_parser(
        "fetch",
        help="download a data set from its official source, verify and unpack it",
        description="Download NAME from its official source into the cache, verify the published "
        "checksum (or the structure where none is published) and unpack it. For ml-100k, "
        "--source recbole takes RecBole's bundled copy via `pip download recbole==1.2.1` (also "
        "the automatic fallback when the official host cannot be reached).",
    )
    fetch.add_argument("name", help="data set name (see `fedrec data list`)")
    fetch.add_argument("--dir", type=Path, default=None, help="data directory (default: cache)")
    fetch.add_argument(
        "--source",
        choices=("auto", "official", "recbole"),
        default="auto",
        help="where to download from (auto: official, falling back to recbole for ml-100k)",
    )
    fetch.add_argument("--wheel", type=Path, default=None, help="a recbole-1.2.1 wheel on disk")
    fetch.add_argument("--timeout", type=float, default=10.0, help="network timeout in seconds")
    fetch.set_defaults(handler=run_fetch)

    info = commands.add_parser(
        "info",
        help="statistics of a data set (raw and after FedNCF preprocessing)",
        description="Users, items, interactions, sparsity and interactions per user "
        "(min/mean/max/std) of the raw log and after preprocessing (implicit feedback, "
        "de-duplication, users with fewer than --min-interactions removed), with what each "
        "filter removed.",
    )
    info.add_argument("name", help="data set name (see `fedrec data list`)")
    info.add_argument("--dir", type=Path, default=None, help="data directory (default: cache)")
    info.add_argument(
        "--min-interactions", type=int, default=5, help="users with fewer interactions are removed"
    )
    info.set_defaults(handler=run_info)

    baselines = commands.add_parser(
        "baselines",
        help="HR@K / NDCG@K of the random and popularity baselines (evaluation mode)",
        description="HR@K and NDCG@K of the random and popularity baselines on a cached data set "
        "in evaluation mode (leave-one-out, one held-out item among 100 sampled negatives); the "
        "random baseline is averaged over --seeds seeds.",
    )
    baselines.add_argument("name", help="ml-100k, ml-1m, lastfm-2k or foursquare-nyc")
    baselines.add_argument("--dir", type=Path, default=None, help="data directory (default: cache)")
    baselines.add_argument("--k", type=int, default=10, help="the K of HR@K and NDCG@K")
    baselines.add_argument("--seeds", type=int, default=5, help="random-agent seeds to average")
    baselines.set_defaults(handler=run_baselines)

    collect = commands.add_parser(
        "collect",
        help="log episodes of a policy with exact propensities as a Minari dataset (for OPE)",
        description="Roll a registered single-platform env with the logging policy "
        "(1 - E) * POLICY + E * MIXTURE (MIXTURE: uniformly random slates by default) and write "
        "a Minari dataset (Arrow storage) with the exact per-slate, per-slot and per-prefix "
        "logging propensities of every slate, at OUT/<dataset id>/data. Read it back with "
        "MINARI_DATASETS_PATH=OUT and minari.load_dataset(<dataset id>). POLICY and MIXTURE are "
        "'random' or a deterministic agent (built-in name, module:Class, file.py:Class). Needs "
        "fedrec[offline].",
    )
    collect.add_argument("--env", required=True, help="a registered single-platform env id")
    collect.add_argument("--policy", required=True, help="logging policy (deterministic or random)")
    collect.add_argument("--epsilon", type=float, default=0.0, help="mixture weight E")
    collect.add_argument("--mixture", default="random", help="the other component")
    collect.add_argument("--episodes", type=int, required=True, help="episodes to log")
    collect.add_argument("--seed", type=int, default=0, help="seed of the first episode batch")
    collect.add_argument("--num-envs", type=int, default=256, help="users per batch")
    collect.add_argument(
        "--env-kwarg", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
        help="env keyword argument, repeatable",
    )  # fmt: skip
    collect.add_argument("--out", type=Path, required=True, help="Minari datasets root folder")
    collect.add_argument("--dataset-id", default=None, help="Minari id (default: derived)")
    collect.add_argument("--no-progress", action="store_true", help="no progress bar")
    collect.set_defaults(handler=run_collect)

    estimate = commands.add_parser(
        "estimate",
        help="estimate a target policy's value from one collected dataset (off-policy)",
        description="Read a Minari dataset of `fedrec data collect` (validated whole, with its "
        "logging propensities), replay the target policy on the logged observations for its "
        "propensities of the logged slates, and print each estimator's value with its 95% "
        "interval, the number of samples and what it assumes, beside the logged (logger's) "
        "value. One-step episodes get the slate estimators (and, under a uniform logger, "
        "PseudoInverse and the top-item IPS, DM and DR); every dataset gets PDIS, WDR and MIS "
        "(ratio 1). --truth-episodes N also rolls the target on the dataset's env for the Monte "
        "Carlo truth. Needs fedrec[offline].",
    )
    estimate.add_argument("dataset", type=Path, help="the dataset folder (OUT/<dataset id>)")
    estimate.add_argument(
        "--target",
        required=True,
        help="the policy to evaluate: a deterministic agent name (e.g. top_x, bottom_x, "
        "best_open_loop), random, or POLICY@E for (1 - E) * POLICY + E * random",
    )
    estimate.add_argument(
        "--estimators", nargs="+", choices=ESTIMATE_ESTIMATORS, default=None, metavar="NAME",
        help=f"estimators to run, from {{{', '.join(ESTIMATE_ESTIMATORS)}}} (default: every one "
        "that applies)",
    )  # fmt: skip
    estimate.add_argument(
        "--truth-episodes", type=int, default=0,
        help="episodes of the target for the Monte Carlo truth (default: 0, none)",
    )  # fmt: skip
    estimate.add_argument(
        "--seed", type=int, default=0, help="seeds the target and the truth's episodes (default: 0)"
    )
    estimate.add_argument("--json", type=Path, default=None, help="also write the report here")
    estimate.set_defaults(handler=run_estimate)


def _key_value(text: str) -> tuple[str, object]:
    from fedrec.experiments.harness import key_value

    return key_value(text)


def run_collect(args: argparse.Namespace) -> int:
    from fedrec.train.collect import collect, save_minari

    try:
        data = collect(
            args.env,
            args.policy,
            episodes=args.episodes,
            seed=args.seed,
            epsilon=args.epsilon,
            mixture_with=args.mixture,
            env_kwargs=dict(args.env_kwarg),
            num_envs=args.num_envs,
            progress=not args.no_progress,
        )
        path = save_minari(data, args.out, args.dataset_id)
    except (ValueError, ImportError, FileExistsError, FileNotFoundError) as error:
        print(f"fedrec data collect: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2  # as every fedrec error
    steps = sum(len(e["rewards"]) for e in data.episodes)
    dataset_id = path.parent.relative_to(args.out).as_posix()
    print(f"{len(data.episodes)} episodes, {steps} steps -> {path.parent}")
    print(f"read it back: MINARI_DATASETS_PATH={args.out} minari.load_dataset({dataset_id!r})")
    return 0


def run_estimate(args: argparse.Namespace) -> int:
    import json

    from fedrec.train.estimate import estimate_dataset, format_report

    try:
        report = estimate_dataset(
            args.dataset,
            args.target,
            estimators=args.estimators,
            truth_episodes=args.truth_episodes,
            seed=args.seed,
        )
    except (ValueError, ImportError) as error:
        print(f"fedrec data estimate: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2  # as every fedrec error
    print(format_report(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.as_dict(), indent=2, allow_nan=False) + "\n")
        print(f"report -> {args.json}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from fedrec.envs.datasets.catalog import DATASETS, DatasetNotFoundError, data_root, locate

    table = Table(title=f"fedrec data sets (data directory: {args.dir or data_root()})")
    for column in ("name", "title", "files", "cached at", "source"):
        table.add_column(column)
    for spec in DATASETS.values():
        try:
            where = str(locate(spec.name, args.dir)[0])
        except DatasetNotFoundError:
            where = "-"
        table.add_row(
            spec.name, spec.title, ", ".join(spec.files), where, spec.url or spec.homepage
        )
    Console().print(table)
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    from fedrec.envs.datasets.fetch import FetchError, fetch

    try:
        fetch(args.name, args.dir, source=args.source, timeout=args.timeout, wheel=args.wheel)
    except (FetchError, OSError) as error:  # one line, no traceback; nothing left in the cache
        print(f"fedrec data fetch: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 1
    return 0


def run_info(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from fedrec.envs.datasets.catalog import load, load_prepared, locate, spec_of
    from fedrec.envs.datasets.preprocess import Statistics

    spec = spec_of(args.name)
    folder, _ = locate(spec.name, args.dir)
    console = Console()
    if spec.name == "taobao-ads":
        log = load(spec.name, args.dir)
        imp = log.impressions  # type: ignore[union-attr]
        stats = Statistics.of(imp["user"], imp["adgroup_id"])
        table = Table(title=f"{spec.title} ({folder})")
        table.add_column("statistic")
        table.add_column("impressions")
        for label, value in stats.as_rows():
            table.add_row(label.replace("interactions", "impressions"), value)
        table.add_row("clicks (CTR)", f"{int(imp['clk'].sum()):,} ({100 * imp['clk'].mean():.2f}%)")
        table.add_row("ad rows / profile rows", f"{len(log.ads):,} / {len(log.users):,}")  # type: ignore[union-attr]
        console.print(table)
        return 0
    data = load_prepared(spec.name, args.dir, min_interactions=args.min_interactions)
    table = Table(title=f"{spec.title} ({folder})")
    table.add_column("statistic")
    table.add_column("raw log")
    table.add_column("preprocessed")
    for (label, raw), (_, prepared) in zip(
        data.raw_statistics.as_rows(), data.statistics().as_rows(), strict=True
    ):
        table.add_row(label, raw, prepared)
    console.print(table)
    for step in data.report:
        print(f"  {step}")
    for note in data.notes:
        print(f"  note: {note}")
    train = int(data.train_mask.sum())
    print(
        f"  leave-one-out: {train:,} training rows, {data.num_users:,} test items, "
        f"{data.test_negatives.shape[1]} fixed negatives per user (seed {data.seed})"
    )
    return 0


def run_baselines(args: argparse.Namespace) -> int:
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    import fedrec  # noqa: F401  (registers the environment ids)
    from fedrec.agents.logged_baselines import PopularityAgent, RandomAgent
    from fedrec.envs.datasets.catalog import load_prepared, spec_of
    from fedrec.envs.datasets.registry import LOGGED_DATA_ENVIRONMENTS
    from fedrec.eval.ranking_metrics import evaluate_ranking_agent

    spec = spec_of(args.name)
    env_id = next(
        (e.id for e in LOGGED_DATA_ENVIRONMENTS if e.kwargs.get("dataset") == spec.name), None
    )
    if env_id is None:
        raise ValueError(f"no evaluation-mode environment for {spec.name}")
    data = load_prepared(spec.name, args.dir)
    kwargs = {"data_dir": args.dir, "top_k": args.k}
    table = Table(title=f"{env_id}, evaluation mode: {data.num_users:,} users, 1 + 100 candidates")
    for column in ("agent", f"HR@{args.k}", f"NDCG@{args.k}"):
        table.add_column(column)
    popular = evaluate_ranking_agent(
        env_id, PopularityAgent(data.item_popularity(), slate_size=args.k, seed=0), **kwargs
    )
    table.add_row("popularity", f"{popular.hit_rate:.4f}", f"{popular.ndcg:.4f}")
    results = [
        evaluate_ranking_agent(env_id, RandomAgent(slate_size=args.k, seed=s), seed=s, **kwargs)
        for s in range(args.seeds)
    ]
    hr = np.array([r.hit_rate for r in results])
    nd = np.array([r.ndcg for r in results])
    table.add_row(
        f"random (mean ± sd of {args.seeds} seeds)",
        f"{hr.mean():.4f} ± {hr.std(ddof=1) if len(hr) > 1 else 0:.4f}",
        f"{nd.mean():.4f} ± {nd.std(ddof=1) if len(nd) > 1 else 0:.4f}",
    )
    expected = args.k / data.eval_candidates.shape[1]
    Console().print(table)
    print(
        f"expected HR@{args.k} of a random ranking: {args.k}/{data.eval_candidates.shape[1]} = {expected:.4f}"
    )
    return 0
