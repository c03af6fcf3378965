"""The views of the ``fedrec bench`` tables (issue 33, item 4): the default view fits 100
columns with a legend, ``--wide`` has every column, ``--csv`` parses and matches the data."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from fedrec.cli import build_parser, main
from fedrec.eval import tables as views
from fedrec.eval.tables import TextTable, View, render_compact, show, tables_from_markdown
from fedrec.experiments import fedncf, fel, longterm

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
FEL_TABLES = sorted(RESULTS.glob("fel/*/table.md"))
LEADERBOARDS = sorted(RESULTS.glob("longterm/*/leaderboard.md"))
FEDNCF_SUMMARIES = [
    RESULTS / "fedncf" / name / "results.json" for name in ("federated", "validation")
]


def _lines_fit(text: str, width: int = 100) -> None:
    too_long = [line for line in text.splitlines() if len(line) > width]
    assert not too_long, too_long


def _csv_blocks(text: str) -> list[list[list[str]]]:
    return [list(csv.reader(io.StringIO(block))) for block in text.strip("\n").split("\n\n")]


def _check_views(tables: list[TextTable], capsys: pytest.CaptureFixture[str]) -> str:
    """Compact fits and has the legend of its short headers; CSV has every column and cell."""
    assert tables
    compact = "\n\n".join(render_compact(t) for t in tables)
    _lines_fit(compact)
    for table in tables:
        text = render_compact(table)
        short = [h for c, h in (table.compact or {}).items() if c in table.columns]
        for header in short:
            if header in table.legend and header in text.splitlines()[1]:
                assert f"{header} = " in " ".join(text.split())
    show(tables, View(csv="-"))
    blocks = _csv_blocks(capsys.readouterr().out)
    assert [b[0] for b in blocks] == [t.columns for t in tables]
    assert [b[1:] for b in blocks] == [t.rows for t in tables]
    show(tables, View(wide=True))
    wide = capsys.readouterr().out
    for table in tables:
        for column in table.columns:
            assert column in wide
    return compact


@pytest.mark.parametrize("path", FEL_TABLES, ids=lambda p: p.parent.name)
def test_fel_tables(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    markdown = path.read_text(encoding="utf-8")
    tables = fel.text_tables(markdown)
    compact = _check_views(tables, capsys)
    assert "Δ% route = relative AUC change" in " ".join(compact.split())
    assert tables[0].columns[:4] == ["method", "K", "updates", "plain FL"]
    # --wide is the Markdown as written to table.md
    show(tables, View(wide=True), wide=lambda: print(markdown))
    assert capsys.readouterr().out.strip() == markdown.strip()


@pytest.mark.parametrize("path", LEADERBOARDS, ids=lambda p: p.parent.name)
def test_longterm_leaderboards(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = longterm.text_table(path.read_text(encoding="utf-8"), key=path.parent.name)
    compact = _check_views([table], capsys)
    assert table.columns == longterm.COLUMNS
    assert "planner *" in compact and "* = oracle" in " ".join(compact.split())
    with (path.parent / "leaderboard.csv").open(encoding="utf-8", newline="") as handle:
        assert list(csv.reader(handle)) == [table.columns, *table.rows]


@pytest.mark.parametrize("path", FEDNCF_SUMMARIES, ids=lambda p: p.parent.name)
def test_fedncf_tables(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = json.loads(path.read_text(encoding="utf-8"))
    tables = fedncf.text_tables(summary)
    _check_views(tables, capsys)
    assert {t.key for t in tables} >= {"aggregators", "central", "cost"}


def test_bench_envs_views(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fast = ["bench", "envs", "--quick", "--steps", "20", "--no-recsim"]
    assert main(fast) == 0
    out = capsys.readouterr().out
    _lines_fit(out)
    assert "user-steps/s" in out and "Targets" in out
    assert main([*fast, "--csv"]) == 0
    captured = capsys.readouterr()
    throughput, targets = _csv_blocks(captured.out)
    assert throughput[0] == [
        "N",
        "n",
        "environment",
        "users",
        "user-steps/s",
        "min–max",
        "vs RecSim",
    ]
    assert all(row[0] == "10" and row[1] == "3" for row in throughput[1:])  # filled down
    assert targets[0][0] == "target"
    path = tmp_path / "envs.csv"
    assert main([*fast, "--csv", str(path)]) == 0
    assert "Targets" in capsys.readouterr().out  # the table is printed beside the files
    with path.open(encoding="utf-8") as handle:
        assert next(csv.reader(handle))[0] == "N"
    assert (tmp_path / "envs_targets.csv").is_file()


def test_every_bench_driver_has_the_view_options() -> None:
    parser = build_parser()
    bench = parser._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    drivers = bench._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert {"envs", "fedncf", "fedslate", "fel", "longterm"} <= set(drivers)
    for name, sub in drivers.items():
        sub.populate()  # the options are added when a command is used
        flags = {flag for action in sub._actions for flag in action.option_strings}
        assert {"--wide", "--csv"} <= flags, name


def test_compact_cuts_and_drops_to_fit() -> None:
    wide_cells = [f"{'x' * 30}{i}" for i in range(6)]
    table = TextTable(
        "a title " * 30,
        [f"column {i}" for i in range(6)],
        [wide_cells, wide_cells],
        legend={"column 0": "the first"},
        notes=["a note " * 40],
    )
    text = render_compact(table)
    _lines_fit(text)
    assert "…" in text  # the text columns are cut first
    assert "column 0 = the first" in text
    numbers = TextTable("t", [f"c{i}" for i in range(20)], [["12345.6 ± 7.8"] * 20])
    text = render_compact(numbers)
    _lines_fit(text)
    assert "more columns: --wide shows them" in text and "12345.6 ± 7.8" in text


def test_short_labels_name_the_shared_words_once() -> None:
    labels = [
        'LinUCBRelay ChocKaleMultiPlatform-v0 share="scores" episodes=400',
        'fedslate ChocKaleMultiPlatform-v0 share="scores" episodes=400',
    ]
    short, legend, common = views.short_labels(labels)
    assert short == ["LinUCBRelay", "fedslate"] and legend == {}
    assert common == 'ChocKaleMultiPlatform-v0 share="scores" episodes=400'
    long = ["agent " + "x" * 30 + "a", "agent " + "x" * 30 + "b"]
    short, legend, _ = views.short_labels(long)
    assert short == ["G1", "G2"] and legend["G1"] == long[0]


def test_markdown_tables_keep_their_notes() -> None:
    markdown = "# Title\n\nintro text\n\n## Part\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nafter\n"
    (table,), loose = tables_from_markdown(markdown)
    assert table.title == "Part" and table.rows == [["1", "2"]] and table.notes == ["after"]
    assert loose == ["Title", "intro text"]


def test_show_markdown_gives_a_markdown_driver_the_views(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fedrec.eval.tables import using_view
    from fedrec.experiments import harness

    cells = " | ".join(f"{i}.123456 ± 0.000001" for i in range(9))
    markdown = (
        "# Bench\n\nintro\n\n| name | "
        + " | ".join(f"metric {i}" for i in range(9))
        + " |\n"
        + "|---" * 10
        + "|\n| a | "
        + cells
        + " |\n"
    )
    harness.show_markdown(markdown, legend={"metric 0": "the first"})
    out = capsys.readouterr().out
    _lines_fit(out)
    assert out.startswith("Bench") and "metric 0 = the first" in out and "intro" in out
    with using_view(View(wide=True)):
        harness.show_markdown(markdown)
    assert capsys.readouterr().out.strip() == markdown.strip()
    with using_view(View(csv="-")):
        harness.show_markdown(markdown)
    (block,) = _csv_blocks(capsys.readouterr().out)
    assert block[0][:2] == ["name", "metric 0"] and block[1][1] == "0.123456 ± 0.000001"
