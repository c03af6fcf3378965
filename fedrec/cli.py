"""The ``fedrec`` command line: ``fedrec envs``, ``fedrec demo``, ``fedrec bench ...``, ``fedrec data ...``.

Each command lives in its own module and adds itself to the parser through a small
``add_parser(subparsers)`` function, so this file only wires them together.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from fedrec._version import __version__

EPILOG = """examples:
  fedrec envs                          list the registered environment ids
  fedrec demo                          roll out baseline policies on the Choc-vs-Kale envs
  fedrec bench envs                    environment throughput, fedrec vs RecSim
  fedrec data info ml-100k             statistics of a logged data set

Environments are also available directly:
  python -c "import gymnasium as gym, fedrec; env = gym.make('fedrec/ChocKale-v0')"
"""


def _threads_default() -> None:
    # Small-tensor PyTorch on 2 shared cores runs fastest single-threaded with a passive wait policy;
    # set before torch is imported by any command. Users can override both variables.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every command registers itself here)."""
    from fedrec import cli_bench, cli_demo, cli_envs, cli_eval, cli_train

    parser = argparse.ArgumentParser(
        prog="fedrec",
        description="fedrec: federated and cross-platform recommendation with reinforcement "
        "learning. Environments, agents, federation and benchmarks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fedrec {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (cli_envs, cli_demo, cli_train, cli_eval, cli_bench):
        module.add_parser(subparsers)
    for optional in ("fedrec.cli_data",):
        try:
            module = __import__(optional, fromlist=["add_parser"])
        except ModuleNotFoundError as error:
            if error.name != optional:
                raise
            continue
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedrec`` console script."""
    _threads_default()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.handler(args) or 0)
    except (ValueError, FileNotFoundError) as error:
        print(f"fedrec {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
