"""``fedrec bench BENCHMARK``: the project's benchmarks (each a driver module under ``experiments/``, built on
``experiments/harness.py``; default output folders under the git-ignored ``runs/bench/``)."""

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
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run a benchmark and print its table",
        description="Benchmarks: `fedrec bench envs` measures environment throughput against RecSim.",
    )
    bench_subparsers = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for module_name in BENCHMARKS.values():
        importlib.import_module(module_name).add_parser(bench_subparsers)
