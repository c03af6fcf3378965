"""The three views of a result table, shared by ``fedrec eval`` and every ``fedrec bench`` driver.

* **compact** (the default): the essential columns under short headers, every line at most
  :data:`WIDTH` (100) characters whatever the terminal, a legend of the abbreviations and the
  notes under the table;
* **wide** (``--wide``): every column, as the command printed it before (rich's boxed tables or
  Markdown);
* **CSV** (``--csv [PATH]``): every column, machine-readable. ``--csv PATH`` writes the first
  table to PATH and any further table to PATH with ``_KEY`` before ``.csv``, beside the human
  view; ``--csv`` alone (or ``--csv -``) writes CSV to stdout instead of the human view (several
  tables as blocks separated by one empty line, each starting with its header row) and sends
  the command's other messages to stderr.

A command builds :class:`TextTable` objects and calls :func:`show`; the view comes from the
command line (:func:`view_of`), or from :func:`using_view` for code that prints tables without
seeing the options (``fedrec bench`` sets it around every driver's handler). Only the standard
library is imported here.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import csv
import io
import re
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

#: The compact view's line length.
WIDTH = 100
#: The longest label kept as it is in a compact table; longer ones become G1, G2, ... (legend).
LABEL_WIDTH = 24
#: The placeholder of a cell cut short.
ELLIPSIS = "…"


@dataclass
class TextTable:
    """A table of printed cells: every column for ``--wide`` and ``--csv``, a selection under
    short headers for the compact view."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    #: full column name -> short header, in the compact view's order (None: every column).
    compact: Mapping[str, str] | None = None
    #: abbreviation -> meaning, printed under the compact table.
    legend: Mapping[str, str] = field(default_factory=dict)
    #: sentences printed under the table (both human views).
    notes: list[str] = field(default_factory=list)
    #: the CSV file suffix of a table after the first (``PATH_KEY.csv``).
    key: str = ""
    #: the columns printed left-aligned (text); the others are right-aligned.
    text_columns: Sequence[str] = ()
    #: column -> its cells in the compact view (short labels, see :func:`short_labels`).
    short_cells: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(
                    f"{self.title}: a row of {len(row)} cells, {len(self.columns)} columns"
                )


@dataclass(frozen=True)
class View:
    """How tables are shown: ``wide`` (every column) and ``csv`` (None, ``"-"`` or a path)."""

    wide: bool = False
    csv: str | None = None

    @property
    def csv_to_stdout(self) -> bool:
        return self.csv == "-"

    @property
    def human(self) -> bool:
        """Whether the compact or wide view is printed (not when CSV goes to stdout)."""
        return not self.csv_to_stdout

    def log_stream(self) -> IO[str]:
        """Where a command's messages go: stderr when stdout carries CSV."""
        return sys.stderr if self.csv_to_stdout else sys.stdout

    def log(self, *parts: object) -> None:
        print(*parts, file=self.log_stream())


_VIEW: contextvars.ContextVar[View | None] = contextvars.ContextVar("fedrec_view", default=None)


def current_view() -> View:
    """The view set by :func:`using_view` (the compact view by default)."""
    return _VIEW.get() or View()


@contextlib.contextmanager
def using_view(view: View) -> Iterator[View]:
    token = _VIEW.set(view)
    try:
        yield view
    finally:
        _VIEW.reset(token)


def add_view_options(parser: argparse.ArgumentParser, *, csv_help: str | None = None) -> None:
    """``--wide`` and ``--csv [PATH]``."""
    parser.add_argument(
        "--wide",
        action="store_true",
        help="print every column (the default view keeps the essential ones within 100 "
        "characters, with a legend of the abbreviations)",
    )
    parser.add_argument(
        "--csv",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help=csv_help
        or "write every column as CSV: to PATH beside the printed table (a further table to "
        "PATH with _NAME before .csv), or to stdout instead of the table when PATH is - or left "
        "out",
    )


def view_of(args: argparse.Namespace) -> View:
    """The view of parsed :func:`add_view_options` options."""
    target = getattr(args, "csv", None)
    return View(
        wide=bool(getattr(args, "wide", False)), csv=None if target is None else str(target)
    )


# ------------------------------------------------------------------------------ short labels


def short_labels(
    labels: Sequence[str], *, width: int = LABEL_WIDTH
) -> tuple[list[str], dict[str, str], str]:
    """Short forms of row labels: the words every label shares (after the first) are dropped
    and named once (the third value, "" when none); a label still longer than ``width`` becomes
    ``G1``, ``G2``, ... with a legend entry (the second value)."""
    words = [label.split() for label in labels]
    distinct = list(dict.fromkeys(labels))
    common: list[str] = []
    if len(distinct) > 1 or (distinct and len(distinct[0]) > width):
        first_rest = words[0][1:] if words else []
        common = [w for w in first_rest if all(w in ws[1:] for ws in words)]
    shortened = [" ".join(ws[:1] + [w for w in ws[1:] if w not in common]) for ws in words]
    names: dict[str, str] = {}
    legend: dict[str, str] = {}
    out = []
    for label, short in zip(labels, shortened, strict=True):
        if len(short) <= width:
            out.append(short)
            continue
        if label not in names:
            names[label] = f"G{len(names) + 1}"
            legend[names[label]] = short
        out.append(names[label])
    return out, legend, " ".join(common)


# ------------------------------------------------------------------------------ rendering


_NUMBER = re.compile(r"^[-+–]?[\d.,]")


def _right(column: str, cells: Sequence[str], table: TextTable) -> bool:
    if column in table.text_columns:
        return False
    filled = [c for c in cells if c and c != "–"]
    return bool(filled) and all(_NUMBER.match(c) for c in filled)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + ELLIPSIS


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    return textwrap.wrap(
        " ".join(text.split()),
        width=width,
        subsequent_indent=indent,
        break_long_words=True,
        break_on_hyphens=False,
    ) or [""]


def render_compact(table: TextTable, width: int = WIDTH) -> str:
    """The compact view: the :attr:`TextTable.compact` columns under their short headers, every
    line at most ``width`` characters (the widest text column is cut first, then columns are
    dropped from the right, and a line says so), the legend and the notes wrapped."""
    chosen = table.compact if table.compact is not None else {c: c for c in table.columns}
    index = [table.columns.index(c) for c in chosen if c in table.columns]
    headers = [h for c, h in chosen.items() if c in table.columns]
    full = [list(row) for row in table.rows]
    for column, cells in table.short_cells.items():
        k = table.columns.index(column)
        for row, cell in zip(full, cells, strict=True):
            row[k] = cell
    rows = [[row[i] for i in index] for row in full]
    columns = list(zip(headers, *rows, strict=True)) if headers else []
    widths = [max(len(cell) for cell in column) for column in columns]
    right = [_right(table.columns[i], [r[i] for r in full], table) for i in index]
    gap = 2

    def total(ws: Sequence[int]) -> int:
        return sum(ws) + gap * max(len(ws) - 1, 0)

    # cut the widest left-aligned column down to 12 characters, then drop columns from the right
    while total(widths) > width:
        text = [k for k, r in enumerate(right) if not r and widths[k] > 12]
        if not text:
            break
        k = max(text, key=lambda k: widths[k])
        widths[k] = max(12, widths[k] - (total(widths) - width))
    while total(widths) > width and len(widths) > 1:
        widths.pop()
        right.pop()
        headers.pop()
        rows = [row[:-1] for row in rows]

    def line(cells: Sequence[str]) -> str:
        parts = [
            _cut(c, w).rjust(w) if r else _cut(c, w).ljust(w)
            for c, w, r in zip(cells, widths, right, strict=False)
        ]
        return (" " * gap).join(parts).rstrip()

    out = _wrap(table.title, width)
    out.append(line(headers))
    out.append("-" * min(total(widths), width))
    out += [line(row) for row in rows]
    words = {word for row in rows for cell in row for word in (cell, *cell.split())}
    legend = [f"{k} = {v}" for k, v in table.legend.items() if k in {*headers, *words}]
    if legend:
        out += _wrap("legend: " + "; ".join(legend) + ".", width, "  ")
    hidden = len(table.columns) - len(headers)
    if hidden > 0:
        more = (
            f"{hidden} more column{'s: --wide shows them' if hidden > 1 else ': --wide shows it'}"
        )
        out += _wrap(f"({more}, --csv writes every column)", width)
    for note in table.notes:
        out += _wrap(note, width)
    return "\n".join(_cut(text, width) for text in out)


def render_plain(table: TextTable) -> str:
    """Every column under its full header, aligned, without a length limit (a wide view for a
    command that had no other)."""
    return render_compact(
        TextTable(
            table.title,
            table.columns,
            table.rows,
            legend={},
            notes=table.notes,
            text_columns=table.text_columns,
        ),
        width=10**6,
    )


def csv_text(table: TextTable) -> str:
    """The table (every column) as CSV text."""
    handle = io.StringIO()
    writer = csv.writer(handle, lineterminator="\n")
    writer.writerow(table.columns)
    writer.writerows(table.rows)
    return handle.getvalue()


def csv_path(path: Path, table: TextTable, first: bool) -> Path:
    """``path`` for the first table, ``path`` with ``_KEY`` before its suffix for the others."""
    if first:
        return path
    key = table.key or re.sub(r"\W+", "_", table.title.lower()).strip("_")[:40]
    return path.with_name(f"{path.stem}_{key}{path.suffix or '.csv'}")


def write_csv(
    tables: Sequence[TextTable], target: str, *, stream: IO[str] | None = None
) -> list[Path]:
    """Every table as CSV: to ``stream`` (stdout) when ``target`` is ``-``, else to files (see
    the module doc); returns the files written."""
    if target == "-":
        stream = stream or sys.stdout
        stream.write("\n".join(csv_text(t) for t in tables))
        stream.flush()
        return []
    written = []
    for n, table in enumerate(tables):
        path = csv_path(Path(target), table, n == 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(csv_text(table), encoding="utf-8")
        written.append(path)
    return written


def show(
    tables: Sequence[TextTable],
    view: View | None = None,
    *,
    wide: Callable[[], None] | None = None,
    stream: IO[str] | None = None,
) -> list[Path]:
    """Print ``tables`` in ``view`` (default :func:`current_view`): compact, or ``wide()`` (the
    command's full rendering; :func:`render_plain` of each table when None), and the CSV.
    Returns the CSV files written."""
    view = view or current_view()
    out = stream or sys.stdout
    if view.human:
        if view.wide:
            if wide is not None:
                wide()
            else:
                print("\n\n".join(render_plain(t) for t in tables), file=out)
        else:
            print("\n\n".join(render_compact(t) for t in tables), file=out)
        out.flush()
    if view.csv is not None:
        return write_csv(tables, view.csv, stream=out if view.csv_to_stdout else None)
    return []


# ------------------------------------------------------------------------------ Markdown


def tables_from_markdown(markdown: str) -> tuple[list[TextTable], list[str]]:
    """The pipe tables of a Markdown text, each titled by the heading before it (when no other
    table lies between), with the paragraphs that follow it (before the next heading) as its
    notes; and the other headings and paragraphs, in order."""
    blocks: list[tuple[str, object]] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        text = lines[i].strip()
        if text.startswith("|") and i + 1 < len(lines) and set(lines[i + 1].strip()) <= set("|-: "):
            header = _cells(text)
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append((_cells(lines[i].strip()) + [""] * len(header))[: len(header)])
                i += 1
            blocks.append(("table", TextTable("", header, rows)))
            continue
        if text.startswith("#"):
            blocks.append(("heading", text.lstrip("#").strip()))
        elif text:
            blocks.append(("text", text))
        i += 1
    tables: list[TextTable] = []
    loose: list[str] = []
    for n, (kind, value) in enumerate(blocks):
        if isinstance(value, TextTable):
            tables.append(value)
            continue
        following = [k for k, _ in blocks[n + 1 :]]
        heading_of_table = kind == "heading" and following[:1] == ["table"]
        if heading_of_table:
            table = blocks[n + 1][1]
            assert isinstance(table, TextTable)
            table.title = str(value)
            continue
        previous = [k for k, _ in blocks[:n] if k != "text"]
        if kind == "text" and previous[-1:] == ["table"]:
            tables[-1].notes.append(str(value))
        else:
            loose.append(str(value))
    return tables, loose


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


# ------------------------------------------------------------------------------ rich


class _Collector:
    """A stand-in for a rich ``Console`` that keeps what is printed."""

    def __init__(self) -> None:
        self.items: list[object] = []

    def print(self, *objects: object, **_: object) -> None:
        self.items.extend(objects)


def _plain(cell: object) -> str:
    from rich.text import Text

    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell)).plain


def tables_from_rich(render: Callable[[object], None]) -> list[TextTable]:
    """The tables a rich rendering function prints (``render(console)``), as :class:`TextTable`
    objects: title, headers and cells as plain text, the caption and the lines printed after a
    table as its notes."""
    from rich.table import Table

    collector = _Collector()
    render(collector)
    tables: list[TextTable] = []
    for item in collector.items:
        if isinstance(item, Table):
            columns = [_plain(c.header) for c in item.columns]
            cells = [[_plain(x) for x in c._cells] for c in item.columns]
            rows = [list(row) for row in zip(*cells, strict=True)]
            notes = [_plain(item.caption)] if item.caption else []
            text = [
                c for c, col in zip(columns, item.columns, strict=True) if col.justify == "left"
            ]
            tables.append(
                TextTable(_plain(item.title or ""), columns, rows, notes=notes, text_columns=text)
            )
        elif tables:
            tables[-1].notes.append(_plain(item))
    return tables
