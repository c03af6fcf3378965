"""The report of ``fedrec eval``: per group of seeds and return series, the table of ETROR,
optimal reward, plateau, final greedy evaluation and the reference policies (mean ± 95% CI
across seeds, beside the papers' numbers), the notes under it, the greedy-slate diagnostics, the
CSV copies and the learning-curve plot (:func:`report`). ``fedrec eval`` (:mod:`fedrec.cli_eval`)
and ``fedrec bench fedslate`` print it; definitions in ``docs/metrics.md``.
"""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fedrec.eval.etror import JOINT_SERIES, Estimate, GroupSummary, RunLog, aggregate, load_run
from fedrec.eval.paper_numbers import SOURCE, paper_reference, setting_of
from fedrec.eval.tables import TextTable, View, current_view, short_labels, show

#: Decimals of returns (summed engagement, O(1000)) and of rates in [0, 1] (HR@10, NDCG@10).
RETURN_DIGITS, RATE_DIGITS = 1, 4
#: Printed under a table with per-platform series (docs/metrics.md, "Regret").
PLATFORM_REGRET_NOTE = (
    "per-platform regret can be negative: the joint planner maximises the user's total "
    "engagement over all platforms, not each platform's own return, so an agent that serves "
    "one platform greedily can beat it there."
)
#: Printed under a table with a joint row (docs/metrics.md, "Joint return").
JOINT_NOTE = (
    f"{JOINT_SERIES} = the sum of the platforms' returns of the same user-episode (the platforms "
    "share the user, so this is the user's total engagement); its final-eval CIs are over the "
    "per-episode sums; it has no alone or paper figures."
)
#: Printed under a table with top-x columns (docs/metrics.md, "Top-x, bottom-x, ...").
TOP_X_NOTE = (
    "top-x = the fixed heuristic that serves the n largest-feature candidates (no learning, no "
    "oracle); vs top-x = agent - top-x, paired; in the papers' settings top-x is (nearly) the "
    "planner, so a learning claim there is a claim over it."
)
#: Printed under a table with bottom-x columns (the same section).
BOTTOM_X_NOTE = (
    "bottom-x = the mirror heuristic (the n smallest-feature candidates); a learning claim is a "
    "claim over the better of the two heuristics (under long-term dynamics bottom-x is near the "
    "planner, top-x far below); vs bottom-x = agent - bottom-x, paired."
)
OPEN_LOOP_NOTE = (
    "best open-loop = the best schedule of the fixed rules (top-x, bottom-x, their mixtures, "
    "rank windows) as a function of the step only, searched with the env's model: the best "
    "policy that needs no feedback and learns nothing; a learning claim is a claim over it. "
    "vs open-loop = agent - best open-loop, paired."
)
BELIEF_NOTE = (
    "belief planner = knows the env's model but not the user: it infers each user's hidden type "
    "and exposure from the observations (exact posterior) and plans on it; it bounds from below "
    "the best any policy can do from the observations, so planner - belief planner bounds what "
    "knowing the user is worth; vs belief planner = agent - belief planner, paired."
)
#: The diagnostics table's columns and the note under it (docs/metrics.md, "Greedy-slate
#: diagnostics").
DIAGNOSTICS_COLUMNS = ["group", "platform", "seeds", "saturated", "top-x slates"]
DIAGNOSTICS_NOTE = (
    "saturated = fraction of the item values the greedy slates were chosen on with |value| >= "
    "0.99 (the tanh bound; – for linear heads, which have none); top-x slates = fraction of greedy slates equal, as sets, to the top-x "
    "slate; mean over seeds (min–max over seeds)."
)


@dataclass(frozen=True)
class EvalOptions:
    """How the curves are read and which paper columns are shown (``fedrec eval``'s options)."""

    log_every: int = 20
    """curve logging period"""
    window: int = 100
    """moving-average window"""
    tail: float = 0.2
    """fraction of the run for plateau"""
    tolerance: float = 0.01
    """ETROR tolerance (relative unless absolute)"""
    absolute: bool = False
    """the tolerance is in return units, not relative"""
    target: float | None = None
    """also report ETROR to this fixed return"""
    paper: str = "auto"
    """FedSlate paper columns: auto = match each group's N x n and agent; a setting forces it;
    none hides them"""
    scenario: str = "basic"
    """which of the paper's experiments to compare with"""


def _cell(estimate: Estimate | None, *, digits: int = 1, unit: str = "seeds") -> str:
    return "–" if estimate is None else estimate.format(digits, unit=unit)


def _paper(group: GroupSummary, series: str, options: EvalOptions) -> dict[str, str]:
    if options.paper == "none":
        return {}
    setting = (
        options.paper if options.paper != "auto" else setting_of(group.env_id, group.env_kwargs)
    )
    if setting is None:
        return {}
    numbers = paper_reference(
        algorithm=group.agent, setting=setting, series=series, scenario=options.scenario
    )
    return {metric: str(number) for metric, number in numbers.items()}


def _signed(estimate: Estimate | None, value: dict[str, int]) -> str:
    """A paired difference with an explicit + when positive."""
    text = _cell(estimate, **value)
    return ("+" + text) if estimate is not None and estimate.mean > 0 else text


def _write_csv(path: Path, columns: list[str], rows: list[list[str]]) -> None:
    """The printed table as CSV (for scripts and docs: the terminal table wraps wide cells)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)


def _diagnostics_csv(path: Path) -> Path:
    """The diagnostics CSV beside the main one: ``table.csv`` -> ``table_diagnostics.csv``."""
    return path.with_name(f"{path.stem}_diagnostics.csv")


def _print_diagnostics(console: Console, groups: list[GroupSummary], csv_path: Path | None) -> None:
    """The greedy-slate diagnostics table (one row per group and platform), and its CSV."""
    table = Table(title="Greedy-slate diagnostics (final evaluation)")
    for column in DIAGNOSTICS_COLUMNS:
        text = column in ("group", "platform")
        table.add_column(column, justify="left" if text else "right", no_wrap=text)
    rows = []
    for group in groups:
        for platform, d in group.diagnostics.items():
            fractions = [
                x.format() if x is not None else "–" for x in (d.saturated, d.top_x_slates)
            ]
            rows.append([group.label, platform, str(d.seeds), *fractions])
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(DIAGNOSTICS_NOTE, highlight=False)
    if csv_path is not None:
        _write_csv(_diagnostics_csv(csv_path), DIAGNOSTICS_COLUMNS, rows)


def load_checked(path: Path) -> RunLog:
    """:func:`~fedrec.eval.runs.load_run`, a binary run file being a one-line ``ValueError``."""
    try:
        return load_run(path)
    except UnicodeDecodeError as error:  # a binary file where a run file should be
        raise ValueError(f"{path}: a run file is not UTF-8 text ({error.reason})") from error


def check_output(option: str, path: Path | None) -> None:
    """Refuse, before any work, an output path that lies under a file or is a directory."""
    if path is None:
        return
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory; give a file path")
    parent = path.parent
    while not parent.exists() and parent.parent != parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is a file, not a directory")


def report(
    runs: Sequence[RunLog],
    options: EvalOptions = EvalOptions(),
    *,
    csv_path: Path | None = None,
    plot: bool = True,
    out: Path | None = None,
    view: View | None = None,
) -> None:
    """Print the table of ``runs`` (with notes and diagnostics) in ``view`` (default
    :func:`~fedrec.eval.tables.current_view`: compact within 100 characters, ``--wide`` the full
    table, ``--csv`` CSV), write it to ``csv_path`` and, with ``plot``, the learning curves to
    ``out`` (default: beside the first run)."""
    view = view or current_view()
    groups = aggregate(
        runs,
        log_every=options.log_every,
        window=options.window,
        tail=options.tail,
        tolerance=options.tolerance,
        relative=not options.absolute,
        target=options.target,
    )
    console = Console(width=None if sys.stdout.isatty() else 320)
    tolerance = f"{options.tolerance:g}" if options.absolute else f"{100 * options.tolerance:g}%"
    table = Table(
        title=f"Training runs: mean ± 95% CI across seeds (curve: mean of last {options.window} "
        f"episodes every {options.log_every}; ETROR tolerance {tolerance})"
    )
    rows = []
    for group in groups:
        for name, summary in group.series.items():
            rows.append((group, name, summary, _paper(group, name, options)))
    show_paper = any(paper for *_, paper in rows)
    show_target = options.target is not None
    columns = ["group", "series", "seeds", "ETROR", "ETROR→plateau"]
    columns += [f"ETROR→{options.target:g}"] if show_target else []
    columns += ["optimal (paper-style)", "plateau", "final greedy eval", "planner (oracle)"]
    show_myopic = any(summary.myopic is not None for _, _, summary, _ in rows)
    columns += ["myopic (oracle)"] if show_myopic else []
    columns += ["regret", "random", "vs random"]
    show_heuristic = any(summary.top_x is not None for _, _, summary, _ in rows)
    columns += ["top-x", "vs top-x"] if show_heuristic else []
    show_bottom = any(summary.bottom_x is not None for _, _, summary, _ in rows)
    columns += ["bottom-x", "vs bottom-x"] if show_bottom else []
    show_open_loop = any(summary.best_open_loop is not None for _, _, summary, _ in rows)
    columns += ["best open-loop", "vs open-loop"] if show_open_loop else []
    show_belief = any(summary.belief_planner is not None for _, _, summary, _ in rows)
    columns += ["belief planner (oracle)", "vs belief planner"] if show_belief else []
    show_alone = any(summary.alone is not None for _, _, summary, _ in rows)
    columns += ["alone", "alone vs top-x"] if show_alone else []
    columns += ["paper ETROR", "paper optimal", "paper random"] if show_paper else []
    for column in columns:
        text = column in ("group", "series")
        table.add_column(column, justify="left" if text else "right", no_wrap=text)
    cell_rows = []
    for group, name, summary, paper in rows:
        etror = {"digits": 0, "unit": "reached"}
        # Returns keep one decimal; a rate in [0, 1] (HR@10, NDCG@10 of an evaluation env) gets 4.
        value = {"digits": RATE_DIGITS if summary.unit_interval else RETURN_DIGITS}
        cells = [group.label, name, str(summary.seeds)]
        cells += [_cell(summary.etror, **etror), _cell(summary.etror_plateau, **etror)]
        cells += [_cell(summary.etror_target, **etror)] if show_target else []
        cells += [_cell(summary.optimal_reward, **value), _cell(summary.plateau, **value)]
        cells += [_cell(summary.final, **value), _cell(summary.planner, **value)]
        cells += [_cell(summary.myopic, **value)] if show_myopic else []
        cells += [_cell(summary.regret, **value), _cell(summary.random, **value)]
        cells += [_signed(summary.gain_over_random, value)]
        if show_heuristic:
            cells += [_cell(summary.top_x, **value), _signed(summary.gain_over_top_x, value)]
        if show_bottom:
            cells += [_cell(summary.bottom_x, **value), _signed(summary.gain_over_bottom_x, value)]
        if show_open_loop:
            cells += [
                _cell(summary.best_open_loop, **value),
                _signed(summary.gain_over_best_open_loop, value),
            ]
        if show_belief:
            cells += [
                _cell(summary.belief_planner, **value),
                _signed(summary.gain_over_belief_planner, value),
            ]
        if show_alone:
            cells += [_cell(summary.alone, **value), _signed(summary.alone_over_top_x, value)]
        if show_paper:
            cells += [paper.get(m, "–") for m in ("etror", "optimal_reward", "random_mean")]
        table.add_row(*cells)
        cell_rows.append(cells)
    if csv_path is not None:
        _write_csv(csv_path, columns, cell_rows)
    notes = [
        "optimal = max of the noisy curve (biased upwards, for comparison with the papers); "
        f"plateau = mean of the curve over the last {100 * options.tail:g}% of the run; "
        "final greedy eval, planner, random: held-out episodes (final_eval.json); "
        "regret = planner - agent; vs random = agent - random, paired on the same held-out "
        "episodes. One seed: final-eval CIs are over held-out episodes. (oracle): a reference "
        "policy that reads the user's hidden state, which the loops hand to no learner."
    ]
    if show_heuristic:
        notes.append(TOP_X_NOTE)
    if show_bottom:
        notes.append(BOTTOM_X_NOTE)
    if show_open_loop:
        notes.append(OPEN_LOOP_NOTE)
    if show_belief:
        notes.append(BELIEF_NOTE)
    if show_alone:
        notes.append(
            "alone = the platform's return when it alone follows the method and every other "
            "platform serves random slates (the user is shared, so another platform's policy "
            "changes this one's return); alone vs top-x = alone - top-x alone, paired: a "
            "comparison of one platform across methods with the others held fixed."
        )
    if any(name == JOINT_SERIES for _, name, _, _ in rows):
        notes.append(JOINT_NOTE)
    platform_regret = (
        name.startswith("return/") and name != JOINT_SERIES and summary.regret
        for _, name, summary, _ in rows
    )
    if any(platform_regret):
        notes.append(PLATFORM_REGRET_NOTE)
    if show_paper:
        notes.append(f"paper: {SOURCE} (scenario {options.scenario}).")
    short = [
        f"{g.label}: {s.series} has {max(c.total_episodes for c in s.per_run)} episodes "
        f"(< window {options.window})"
        for g in groups
        for s in g.series.values()
        if s.per_run and all(math.isnan(c.optimal_reward) for c in s.per_run)
    ]
    notes += [f"no curve: {text}" for text in short]
    diagnostics = any(group.diagnostics for group in groups)

    def wide() -> None:
        console.print(table)
        for note in notes:
            console.print(note, highlight=False)
        if diagnostics:
            _print_diagnostics(console, groups, None)

    tables = [_compact_table(table.title, columns, cell_rows, notes)]
    if diagnostics:
        tables.append(_diagnostics_table(groups))
        if csv_path is not None:
            _write_csv(_diagnostics_csv(csv_path), DIAGNOSTICS_COLUMNS, tables[-1].rows)
    show(tables, view, wide=wide)
    if plot:
        from fedrec.eval.plots import plot_learning_curves

        out = out or Path(runs[0].path).resolve().parent / "learning_curves.png"
        written = plot_learning_curves(groups, out, window=options.window)
        view.log(f"learning curves: {written}")


#: The compact view's columns (full name -> short header) and the legend of the short headers.
COMPACT_COLUMNS = {
    "group": "group",
    "series": "series",
    "seeds": "seeds",
    "ETROR": "ETROR",
    "final greedy eval": "final",
    "regret": "regret",
    "vs random": "vs rand",
    "vs top-x": "vs top-x",
    "vs open-loop": "vs open",
    "paper ETROR": "ppr ETROR",
}
COMPACT_LEGEND = {
    "ETROR": "episodes to reach the optimal reward",
    "final": "final greedy eval",
    "regret": "planner - agent",
    "vs rand": "agent - random",
    "vs top-x": "agent - top-x",
    "vs open": "agent - best open-loop",
    "ppr ETROR": "the paper's ETROR",
}


def _compact_table(
    title: str, columns: list[str], rows: list[list[str]], notes: list[str]
) -> TextTable:
    """The report's table: every column for ``--wide`` / ``--csv``, the essential ones with short
    group labels (the words all groups share named once) in the compact view."""
    labels, named, common = short_labels([row[0] for row in rows])
    legend = {"group": f"the agent (every group: {common})"} if common else {}
    series = [row[1] for row in rows]
    if any(s.startswith("return/") for s in series):
        series = [s.removeprefix("return/") for s in series]
        legend["series"] = "return/SERIES"
    legend = {**legend, **COMPACT_LEGEND, **named}
    return TextTable(
        title=title,
        columns=columns,
        rows=rows,
        compact=COMPACT_COLUMNS,
        legend=legend,
        notes=notes,
        text_columns=("group", "series"),
        short_cells={"group": labels, "series": series},
    )


def _diagnostics_table(groups: list[GroupSummary]) -> TextTable:
    rows = []
    for group in groups:
        for platform, d in group.diagnostics.items():
            fractions = [
                x.format() if x is not None else "–" for x in (d.saturated, d.top_x_slates)
            ]
            rows.append([group.label, platform, str(d.seeds), *fractions])
    labels, legend, common = short_labels([row[0] for row in rows])
    if common:
        legend = {"group": f"the agent (every group: {common})", **legend}
    return TextTable(
        title="Greedy-slate diagnostics (final evaluation)",
        columns=list(DIAGNOSTICS_COLUMNS),
        rows=rows,
        legend=legend,
        notes=[DIAGNOSTICS_NOTE],
        key="diagnostics",
        text_columns=("group", "platform"),
        short_cells={"group": labels},
    )
