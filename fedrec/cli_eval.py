"""``fedrec eval RUN_DIR...``: ETROR, optimal reward, plateau and final evaluation of training runs.

Loads each run directory (``config.json``, ``episodes.csv`` or a compacted run's curve summary
``curve.json.gz``, optional ``final_eval.json``; a folder of run directories expands to its runs), groups seeds of the same experiment, prints one table row
per group and return series (mean ± 95% CI across seeds; the essential columns within 100
characters by default, ``--wide`` every column, ``--csv`` CSV; multi-platform runs add the joint return
``return/joint`` after their platforms), a table of greedy-slate diagnostics when the runs recorded
them (FedSlate family), and writes a learning-curve PNG. The definitions are in
``docs/metrics.md`` and :mod:`fedrec.eval.etror`; the report is :mod:`fedrec.eval.report`.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

# Only what the parser needs is imported here: `fedrec --help` does not load pandas or SciPy.
from fedrec.eval.paper_numbers import PAPER_CHOICES
from fedrec.eval.tables import add_view_options, using_view, view_of


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="ETROR, optimal reward and final evaluation of training runs, with learning curves",
        description="Summarise training run directories: per group of seeds and return series, "
        "ETROR (episodes to reach the optimal reward), the paper-style optimal reward (max of "
        "the logged moving average; biased upwards), the plateau (mean of the curve's last "
        "20%), the final greedy evaluation, the planner and random means and the regret, as "
        "mean ± 95% t-interval across seeds. Writes a learning-curve PNG. "
        "Definitions: docs/metrics.md.",
    )
    parser.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="run directories (or folders of them)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="PNG path (default: RUN_DIR/../learning_curves.png)"
    )
    parser.add_argument("--log-every", type=int, default=20, help="curve logging period")
    parser.add_argument("--window", type=int, default=100, help="moving-average window")
    parser.add_argument("--tail", type=float, default=0.2, help="fraction of the run for plateau")
    parser.add_argument(
        "--tolerance", type=float, default=0.01, help="ETROR tolerance (relative unless --absolute)"
    )
    parser.add_argument(
        "--absolute", action="store_true", help="the tolerance is in return units, not relative"
    )
    parser.add_argument(
        "--target", type=float, default=None, help="also report ETROR to this fixed return"
    )
    parser.add_argument(
        "--paper",
        choices=PAPER_CHOICES,
        default="auto",
        help="FedSlate paper columns: auto = match each group's N x n and agent; a setting "
        "forces it; none hides them",
    )
    parser.add_argument(
        "--scenario",
        choices=("basic", "sparse_team"),
        default="basic",
        help="which of the paper's experiments to compare with",
    )
    parser.add_argument("--no-plot", action="store_true", help="print the table only")
    parser.add_argument(
        "--complete-references",
        action="store_true",
        help="first evaluate the reference policies a run's final evaluation lacks (e.g. the best "
        "open-loop rule, added after older runs were trained) on its held-out episodes, into "
        "references.json beside final_eval.json (the run's own files are not changed)",
    )
    add_view_options(
        parser,
        csv_help="write every column as CSV (one row per group and series, cells as printed): "
        "to PATH beside the printed table, with any diagnostics table beside it (PATH with "
        "_diagnostics before .csv); to stdout instead of the table when PATH is - or left out",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedrec.eval.etror import find_runs
    from fedrec.eval.report import EvalOptions, check_output, load_checked, report

    view = view_of(args)
    check_output("--out", args.out)
    check_output("--csv", None if view.csv in (None, "-") else Path(view.csv))
    paths = find_runs(args.runs)
    if getattr(args, "complete_references", False):
        from fedrec.train.references import complete_references

        for path in paths:
            written = complete_references(path)
            if written is not None:
                view.log(f"{path}: references on its held-out episodes in {written.name}")
    runs = [load_checked(path) for path in paths]
    options = EvalOptions(
        **{field.name: getattr(args, field.name) for field in dataclasses.fields(EvalOptions)}
    )
    with using_view(view):
        report(runs, options, plot=not args.no_plot, out=args.out, view=view)
    return 0
