"""``fedrec bench BENCHMARK``: the project's benchmarks, each a driver module under
``experiments/`` registered with ``experiments/harness.py``'s ``add_bench_parser``; default output
folders under the git-ignored ``runs/bench/``, ``results/`` only when ``--out`` names it."""

from __future__ import annotations

import argparse
import importlib

#: benchmark name -> module with ``add_parser(bench_subparsers)``.
BENCHMARKS = {
    "envs": "fedrec.experiments.envs",
    "fedncf": "fedrec.experiments.fedncf",
    "fedslate": "fedrec.experiments.fedslate",
    "fel": "fedrec.experiments.fel",
    "longterm": "fedrec.experiments.longterm",
    "ope": "fedrec.experiments.ope",
    "zoo": "fedrec.experiments.zoo",
}

#: ``fedrec bench --help``: every benchmark, and where its files go.
DESCRIPTION = (
    f"Benchmarks: {', '.join(BENCHMARKS)} (one line each below; `fedrec bench NAME --help` lists "
    "its options). Output: by default runs/bench/NAME/HASH (git-ignored; HASH of the "
    "configuration, fedslate's prefixed by its setting; envs writes a file only with --json), "
    "never the committed results/ unless --out names it; a folder of another configuration is "
    "refused."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run a benchmark and print its table",
        description=DESCRIPTION,
    )
    bench_subparsers = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for module_name in BENCHMARKS.values():
        importlib.import_module(module_name).add_parser(bench_subparsers)
