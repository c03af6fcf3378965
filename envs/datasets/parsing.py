"""The parser engine of the logged data files: field rules, a validating delimited reader, errors.

A loader describes each file as a sequence of :class:`Field` rules and reads it with
:func:`parse_delimited`, which validates every field of every line (ids non-negative and within
int64, timestamps integral and within a plausible range, numbers finite, categories from their
vocabulary) and raises :class:`FormatError` naming the file, the 1-based line number and what was
expected. Nothing is dropped, wrapped or cast silently. Files are parsed with pyarrow as text and
checked column by column (an ML-1M-sized log loads in well under a second); only when a check
fails is the file scanned line by line to name the first bad line. The loaders themselves live
in one module per data set family (see :mod:`fedrec.envs.datasets.formats`).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

Kind = Literal["int", "float", "str", "opt"]
"""What a field must hold: an integer, a number, a non-empty string, or anything (may be empty)."""


class FormatError(ValueError):
    """A data file does not have the expected format; the message names file, line and expectation."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        where = f"{path}" if line is None else f"{path}, line {line}"
        super().__init__(f"{where}: {message}")
        self.path = Path(path)
        self.line = line


# --------------------------------------------------------------------------------------------
# Field rules

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
#: Plausible Unix seconds of a logged event: 1995-01-01 (MovieLens's first ratings) to 2099-12-31.
#: A timestamp cut short by a truncated file (``881250949`` -> ``8812509``) falls below it.
UNIX_SECONDS = (788_918_400, 4_102_444_799)

_INT_TEXT = r" *-?[0-9]+ *"
_FLOAT_TEXT = r" *[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)? *"
_INT_RE = re.compile(_INT_TEXT)
_FLOAT_RE = re.compile(_FLOAT_TEXT)


@dataclass(frozen=True)
class Field:
    """One field of a delimited file and what it must hold.

    ``int`` fields hold decimal integers (ASCII digits, an optional ``-``; no ``+``, ``_``,
    exponent or hex) within int64 and within ``[low, high]``; ``float`` fields hold finite decimal
    numbers within ``[low, high]`` and, with ``step``, multiples of it; ``str`` fields a non-empty
    value and ``opt`` fields any value, both matching ``pattern`` (after stripping) when given.
    ``expect`` says what a range means (``Unix seconds``) or, for a pattern, what the value must
    do (``be 'M' or 'F'``), in error messages.
    """

    name: str
    kind: Kind = "int"
    low: float | None = None
    high: float | None = None
    step: float | None = None
    pattern: str | None = None
    expect: str = ""

    def describe(self) -> str:
        """What a valid value is, for error messages (``an integer from 1 to 5``)."""
        note = f" ({self.expect})" if self.expect else ""
        if self.kind in ("str", "opt"):
            return (self.expect or f"match {self.pattern!r}") if self.pattern else ""
        low = self.low if self.low is not None else (INT64_MIN if self.kind == "int" else None)
        high = self.high if self.high is not None else (INT64_MAX if self.kind == "int" else None)
        if self.kind == "int":
            if high == INT64_MAX:
                what = "a non-negative integer" if low == 0 else f"an integer >= {low}"
                if low == INT64_MIN:
                    what = "an integer"
                return f"{what} within int64 (at most {INT64_MAX}){note}"
            return f"an integer from {low} to {high}{note}"
        what = "a finite number"
        if self.step == 1:
            what = "a whole number"
        elif self.step is not None:
            what = f"a multiple of {self.step:g}"
        if low is not None and high is not None:
            return f"{what} from {low:g} to {high:g}{note}"
        if low is not None:
            return f"{what} >= {low:g}{note}"
        return f"{what}{note}"

    def parse(self, raw: str) -> tuple[object, str | None]:
        """The value of one field's text, or (None, what is wrong) (the slow, exact path)."""
        shown = repr(raw[:40])
        if self.kind == "int":
            if not _INT_RE.fullmatch(raw):
                return None, f"must be an integer, got {shown}"
            if len(raw.strip(" ").lstrip("-").lstrip("0")) > 19:  # beyond int64 (and int())
                return None, f"must be {self.describe()}, got {shown}"
            value: object = int(raw)
            if not self._in_range(value):
                return None, f"must be {self.describe()}, got {shown}"
            return value, None
        if self.kind == "float":
            if not _FLOAT_RE.fullmatch(raw):
                return None, f"must be a number (finite, in decimal notation), got {shown}"
            number = float(raw)
            if not (math.isfinite(number) and self._in_range(number) and self._on_step(number)):
                return None, f"must be {self.describe()}, got {shown}"
            return number, None
        text = raw.strip()
        if self.kind == "str" and text == "":
            return None, f"must be a non-empty value, got {shown}"
        if self.pattern is not None and not re.fullmatch(self.pattern, text):
            return None, f"must {self.describe()}, got {shown}"
        return text, None

    def _in_range(self, value: float) -> bool:
        low = self.low if self.low is not None else (INT64_MIN if self.kind == "int" else -math.inf)
        high = (
            self.high if self.high is not None else (INT64_MAX if self.kind == "int" else math.inf)
        )
        return low <= value <= high

    def _on_step(self, value: float) -> bool:
        return self.step is None or float(value / self.step).is_integer()

    def column(
        self, values: pa.ChunkedArray
    ) -> tuple[np.ndarray | pd.Series | None, np.ndarray | None]:
        """Vectorised check and conversion of a whole column (the fast path).

        Returns ``(converted, None)`` if every value is valid, ``(None, bad)`` with a mask of the
        rows that fail (a superset of those :meth:`parse` rejects: the caller asks :meth:`parse`
        for the message) or ``(None, None)`` where no mask is cheap (the caller scans the file).
        """
        if self.kind in ("int", "float"):
            text = _INT_TEXT if self.kind == "int" else _FLOAT_TEXT
            good = pc.match_substring_regex(values, f"^{text}$")
            if not _all(good):
                return None, ~good.to_numpy(zero_copy_only=False)
            try:
                numbers = pc.cast(pc.utf8_trim(values, " "), _ARROW_TYPE[self.kind]).to_numpy()
            except pa.ArrowInvalid:  # an integer beyond int64
                return None, None
            bad = ~self._valid(numbers)
            return (None, bad) if bad.any() else (numbers, None)
        if self.pattern is not None:
            good = pc.match_substring_regex(values, f"^(?:{self.pattern})$")
            if not _all(good):  # (maybe only spaces around the value: parse() decides)
                return None, ~good.to_numpy(zero_copy_only=False)
        text = values.to_pandas().astype(str).str.strip()
        if self.kind == "str":
            empty = (text == "").to_numpy(bool)
            if empty.any():
                return None, empty
        return text, None

    def _valid(self, numbers: np.ndarray) -> np.ndarray:
        low = self.low if self.low is not None else -np.inf
        high = self.high if self.high is not None else np.inf
        good = (numbers >= low) & (numbers <= high)
        if self.kind == "float":
            good &= np.isfinite(numbers)
            if self.step is not None:
                good &= np.mod(np.where(good, numbers, 0.0) / self.step, 1) == 0
        return good


_ARROW_TYPE = {"int": pa.int64(), "float": pa.float64()}


def _all(mask: pa.ChunkedArray) -> bool:
    return bool(pc.all(mask).as_py() is not False)


# --------------------------------------------------------------------------------------------
# Generic delimited reader: a fast vectorised parse, and an exact line-by-line scan on failure


@dataclass
class Parsed:
    """A parsed delimited file: the columns, and what is needed to name the line of any row."""

    frame: pd.DataFrame
    path: Path
    text: str
    header_lines: int
    _lines: np.ndarray | None = None

    def line(self, row: int) -> int:
        """1-based line number of data row ``row`` (0-based; blank lines are skipped)."""
        if self._lines is None:
            self._lines = _data_lines(self.text, self.header_lines)
        return int(self._lines[row])

    def fail(self, row: int, message: str) -> FormatError:
        """A :class:`FormatError` naming the file and the line of data row ``row``."""
        return FormatError(self.path, self.line(row), message)

    def require(self, good: np.ndarray | pd.Series, message: Callable[[int], str]) -> None:
        """Raise at the first row where ``good`` is False, with ``message(row)``."""
        good = np.asarray(good, dtype=bool)
        if not good.all():
            row = int(np.flatnonzero(~good)[0])
            raise self.fail(row, message(row))

    def require_unique(self, keys: Sequence[str], what: str) -> None:
        """Raise at the first row whose ``keys`` repeat an earlier row's (a duplicated key)."""
        duplicated = self.frame.duplicated(list(keys), keep="first").to_numpy()
        if duplicated.any():
            row = int(np.flatnonzero(duplicated)[0])
            key = tuple(plain(self.frame[k].iloc[row]) for k in keys)
            same = (self.frame[list(keys)] == self.frame[list(keys)].iloc[row]).all(axis=1)
            first = int(np.flatnonzero(same.to_numpy())[0])
            shown = key[0] if len(key) == 1 else key
            raise self.fail(
                row,
                f"duplicate {what} {shown!r} (already on line {self.line(first)}): "
                f"each {what} must appear once",
            )


def _data_lines(text: str, header_lines: int) -> np.ndarray:
    lines = text.split("\n")
    return np.array(
        [
            number
            for number, line in enumerate(lines[header_lines:], start=header_lines + 1)
            if line.rstrip("\r") != ""
        ],
        dtype=np.int64,
    )


def _split_line(line: str, sep: str, quoted: bool) -> list[str]:
    if quoted:
        return next(csv.reader([line], delimiter=sep))
    return line.split(sep)


def _shown_sep(sep: str) -> str:
    return {"\t": "tab", ",": "comma", "|": "'|'", "::": "'::'"}.get(sep, repr(sep))


def _scan(
    path: Path,
    text: str,
    *,
    sep: str,
    fields: Sequence[Field],
    header_lines: int,
    quoted: bool,
) -> tuple[dict[str, list], list[str]]:
    """Parse every line exactly; :class:`FormatError` at the first malformed line.

    Returns the converted columns and the raw text of each row's last field. Lines are split on
    ``\\n`` (a trailing ``\\r`` is dropped); empty lines are skipped, as the fast parser does.
    """
    names = [f.name for f in fields]
    columns: dict[str, list] = {name: [] for name in names}
    last: list[str] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        if number <= header_lines:
            continue
        line = raw.rstrip("\r")
        if line == "":
            continue
        parts = _split_line(line, sep, quoted)
        if len(parts) != len(fields):
            hint = " (truncated file?)" if len(parts) < len(fields) else ""
            raise FormatError(
                path,
                number,
                f"expected {len(fields)} {_shown_sep(sep)}-separated fields ({', '.join(names)}), "
                f"got {len(parts)}{hint}: {line[:80]!r}",
            )
        for field_, part in zip(fields, parts, strict=True):
            value, problem = field_.parse(part)
            if problem is not None:
                raise FormatError(path, number, f"field {field_.name!r} {problem}")
            columns[field_.name].append(value)
        last.append(parts[-1].strip(" "))
    return columns, last


def _frame(columns: dict[str, list], fields: Sequence[Field]) -> pd.DataFrame:
    out: dict[str, np.ndarray | pd.Series] = {}
    for field_ in fields:
        values = columns[field_.name]
        if field_.kind == "int":
            out[field_.name] = np.array(values, dtype=np.int64)
        elif field_.kind == "float":
            out[field_.name] = np.array(values, dtype=np.float64)
        else:
            out[field_.name] = pd.Series(values, dtype=object).astype(str)
    return pd.DataFrame(out)


def _read_text(path: Path, encoding: str) -> str:
    data = path.read_bytes()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise FormatError(path, line, f"not valid {encoding} text ({error.reason})") from error


def _fast(
    path: Path, text: str, sep: str, fields: Sequence[Field], header_lines: int, quoted: bool
) -> tuple[pd.DataFrame, pa.ChunkedArray] | None:
    """Parse with pyarrow and check every column vectorised.

    Returns the frame and the last field's raw text, raises :class:`FormatError` at the first bad
    row where the column checks locate it, or returns None to have the file scanned line by line.
    """
    if "\r" in text and text.count("\r") != text.count("\r\n"):
        return None  # a lone CR: pyarrow would break the line there, the scan would not
    body = text.replace(sep, "\x1f") if len(sep) > 1 else text
    names = [f.name for f in fields]
    try:
        table = pacsv.read_csv(
            io.BytesIO(body.encode("utf-8")),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=header_lines),
            parse_options=pacsv.ParseOptions(
                delimiter="\x1f" if len(sep) > 1 else sep,
                quote_char='"' if quoted else False,
                ignore_empty_lines=True,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.string()),
                null_values=[],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except pa.ArrowException:  # a short or long row, most often: the scan names it
        return None
    out = {}
    first_bad = table.num_rows
    for field_ in fields:
        column, bad = field_.column(table.column(field_.name))
        if column is None and bad is None:
            return None
        if bad is not None:
            first_bad = min(first_bad, int(np.flatnonzero(bad)[0]))
        out[field_.name] = column
    if first_bad < table.num_rows:
        raw = {name: table.column(name)[first_bad].as_py() for name in names}
        for field_ in fields:
            _, problem = field_.parse(raw[field_.name])
            if problem is not None:
                line = int(_data_lines(text, header_lines)[first_bad])
                raise FormatError(path, line, f"field {field_.name!r} {problem}")
        return None  # the mask was stricter than parse() (spaces around a value): scan
    return pd.DataFrame(out), pc.utf8_trim(table.column(names[-1]), " ")


def parse_delimited(
    path: Path,
    *,
    sep: str,
    fields: Sequence[Field],
    header: Sequence[str] | Literal["auto"] | None = None,
    encoding: str = "utf-8",
    quoted: bool = False,
) -> Parsed:
    """Read a delimited file into one column per field, validating every value (see :class:`Field`).

    The file is parsed with pyarrow and checked column by column (an ML-1M-sized log takes well
    under a second); if anything is off, an exact line-by-line scan finds the first bad line.
    A file that does not end with a newline may have been cut inside its last line: there, a
    numeric last field narrower than the same field on every other row is reported as truncated.

    :param header: the exact expected header (checked, whitespace-stripped), None for a file
        without a header, or ``"auto"`` for a header that some copies have and some do not (it is
        present when the first line's fields equal the field names case-insensitively).
    :raises FormatError: naming the file, the line and the expectation.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    text = _read_text(path, encoding)
    names = [f.name for f in fields]
    first = text.split("\n", 1)[0].rstrip("\r")
    header_lines = 0
    if header == "auto":
        found = [f.strip().lower() for f in _split_line(first, sep, quoted)]
        header_lines = int(found == [n.lower() for n in names])
    elif header is not None:
        found = [f.strip() for f in _split_line(first, sep, quoted)]
        if found != list(header):
            raise FormatError(
                path, 1, f"expected the header {sep.join(header)!r}, got {first[:120]!r}"
            )
        header_lines = 1
    fast = _fast(path, text, sep, fields, header_lines, quoted)
    if fast is not None:
        frame, last = fast
        widths = pc.utf8_length(last).to_numpy()
    else:
        columns, raw_last = _scan(
            path, text, sep=sep, fields=fields, header_lines=header_lines, quoted=quoted
        )
        frame = _frame(columns, fields)
        widths = np.array([len(value) for value in raw_last], dtype=np.int64)
    if len(frame) == 0:
        raise FormatError(
            path, header_lines + 1, "the file has no data rows (empty or truncated file)"
        )
    parsed = Parsed(frame=frame, path=path, text=text, header_lines=header_lines)
    final = fields[-1]
    if (
        not text.endswith(("\n", "\r"))
        and final.kind in ("int", "float")
        and len(widths) >= 2
        and widths[-1] < widths[:-1].min()
    ):
        raise parsed.fail(
            len(frame) - 1,
            f"the file does not end with a newline and its last line's field {final.name!r} "
            f"has {widths[-1]} characters, fewer than on any other line (at least "
            f"{widths[:-1].min()}): the file looks truncated",
        )
    return parsed


def read_delimited(path: Path, **options: Any) -> pd.DataFrame:
    """The columns of :func:`parse_delimited` (the same keyword arguments and checks)."""
    return parse_delimited(path, **options).frame


# --------------------------------------------------------------------------------------------
# Pieces every loader uses


def require(directory: Path, *names: str) -> list[Path]:
    """Paths of required files, or FileNotFoundError listing those that are missing."""
    paths = [directory / name for name in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{directory}: missing {', '.join(missing)}")
    return paths


def id_field(name: str) -> Field:
    """A non-negative integer id within int64."""
    return Field(name, "int", low=0)


def unix_seconds_field(name: str) -> Field:
    """Unix seconds within :data:`UNIX_SECONDS` (1995-01-01 to 2099-12-31)."""
    low, high = UNIX_SECONDS
    return Field(name, "int", low=low, high=high, expect="Unix seconds, 1995-01-01 to 2099-12-31")


def one_of(values: Sequence[str]) -> str:
    """A :attr:`Field.pattern` matching exactly one of ``values``."""
    return "|".join(re.escape(v) for v in values)


def plain(value: object) -> object:
    """A numpy scalar as the Python value (for error messages); anything else unchanged."""
    return value.item() if isinstance(value, np.generic) else value
