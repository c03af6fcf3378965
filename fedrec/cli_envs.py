"""``fedrec envs``: list the registered environment ids."""

from __future__ import annotations

import argparse
import sys

from fedrec.registration import ENVIRONMENTS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "envs",
        help="list the registered environment ids",
        description="List every environment id registered on `import fedrec`, with its API "
        "(Gymnasium or PettingZoo parallel) and a one-line description.",
    )
    parser.add_argument("--plain", action="store_true", help="tab-separated output, no table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console  # imported when used: `fedrec --help` does not load rich
    from rich.table import Table

    if args.plain:
        for entry in ENVIRONMENTS:
            print(f"{entry.id}\t{entry.api}\t{entry.description}")
        return 0
    table = Table(title="fedrec environments")
    table.add_column("id", style="bold")
    table.add_column("API")
    table.add_column("batched")
    table.add_column("description")
    for entry in ENVIRONMENTS:
        if entry.vector_entry_point:
            batched = "native make_vec"
        elif entry.api == "gymnasium":
            batched = "SyncVectorEnv"
        else:
            batched = "batch class"
        table.add_row(entry.id, entry.api, batched, entry.description)
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    return 0
