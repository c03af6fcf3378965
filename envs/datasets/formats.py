"""Loaders for the real file formats of the logged data sets, with errors that name file and line.

Every loader returns a :class:`LoggedDataset`: the interaction log in file order (columns
``user``, ``item``, ``rating``, ``timestamp``) plus optional user and item side features.

Every field of every line is validated against its :class:`Field` rule (ids non-negative and
within int64, timestamps integral and within a plausible range, numbers finite, categories from
their vocabulary) and keyed files must not repeat a key; any violation raises
:class:`FormatError` naming the file, the 1-based line number and what was expected. Nothing is
dropped, wrapped or cast silently. Files are parsed with pyarrow as text and checked column by
column (an ML-1M-sized log loads in well under a second); only when a check fails is the file
scanned line by line to name the first bad line. docs/datasets.md ("What the loaders check")
lists the rules and what no loader can detect (a file cut exactly at a line end).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

Kind = Literal["int", "float", "str", "opt"]
"""What a field must hold: an integer, a number, a non-empty string, or anything (may be empty)."""

ML100K_GENRES = (
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
)
ML1M_GENRES = ML100K_GENRES[1:]
ML100K_OCCUPATIONS = (
    "administrator",
    "artist",
    "doctor",
    "educator",
    "engineer",
    "entertainment",
    "executive",
    "healthcare",
    "homemaker",
    "lawyer",
    "librarian",
    "marketing",
    "none",
    "other",
    "programmer",
    "retired",
    "salesman",
    "scientist",
    "student",
    "technician",
    "writer",
)

TAOBAO_RAW_SAMPLE_HEADER = ("user", "time_stamp", "adgroup_id", "pid", "nonclk", "clk")
TAOBAO_AD_FEATURE_HEADER = ("adgroup_id", "cate_id", "campaign_id", "customer", "brand", "price")
TAOBAO_USER_PROFILE_HEADER = (
    "userid",
    "cms_segid",
    "cms_group_id",
    "final_gender_code",
    "age_level",
    "pvalue_level",
    "shopping_level",
    "occupation",
    "new_user_class_level",
)
FOURSQUARE_TIME_FORMAT = "%a %b %d %H:%M:%S %z %Y"


class FormatError(ValueError):
    """A data file does not have the expected format; the message names file, line and expectation."""

    def __init__(self, path: Path | str, line: int | None, message: str) -> None:
        where = f"{path}" if line is None else f"{path}, line {line}"
        super().__init__(f"{where}: {message}")
        self.path = Path(path)
        self.line = line


@dataclass
class LoggedDataset:
    """An interaction log as read from disk, before any filtering.

    :ivar interactions: one row per logged event, in file order, with columns ``user``, ``item``
        (raw ids as in the files), ``rating`` (float, NaN where the data set has none) and
        ``timestamp`` (int64, in ``timestamp_unit``).
    :ivar user_features: numeric public user features indexed by raw user id (or None).
    :ivar item_features: numeric item features indexed by raw item id (or None).
    """

    name: str
    interactions: pd.DataFrame
    files: tuple[Path, ...]
    user_features: pd.DataFrame | None = None
    item_features: pd.DataFrame | None = None
    timestamp_unit: str = "s"
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Field rules

INT64_MIN, INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
#: Plausible Unix seconds of a logged event: 1995-01-01 (MovieLens's first ratings) to 2099-12-31.
#: A timestamp cut short by a truncated file (``881250949`` -> ``8812509``) falls below it.
UNIX_SECONDS = (788_918_400, 4_102_444_799)
#: Plausible Unix milliseconds of a Lastfm tag assignment: 1900-01-01 to 2099-12-31 (the HetRec
#: file has tag times as early as 1956, before the Unix epoch, so the bound is wide).
LASTFM_MILLISECONDS = (-2_208_988_800_000, 4_102_444_799_999)

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
            key = tuple(_plain(self.frame[k].iloc[row]) for k in keys)
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


def read_delimited(
    path: Path,
    *,
    sep: str,
    fields: Sequence[Field],
    header: Sequence[str] | Literal["auto"] | None = None,
    encoding: str = "utf-8",
    quoted: bool = False,
) -> pd.DataFrame:
    """The columns of :func:`parse_delimited` (same arguments and checks)."""
    return parse_delimited(
        path, sep=sep, fields=fields, header=header, encoding=encoding, quoted=quoted
    ).frame


def _interactions(
    user: pd.Series, item: pd.Series, rating: pd.Series | None, timestamp: pd.Series
) -> pd.DataFrame:
    n = len(user)
    return pd.DataFrame(
        {
            "user": user.to_numpy(),
            "item": item.to_numpy(),
            "rating": np.full(n, np.nan) if rating is None else rating.to_numpy(np.float64),
            "timestamp": timestamp.to_numpy(np.int64),
        }
    )


def _codes(values: pd.Series, vocabulary: Sequence[str] | None = None) -> np.ndarray:
    """Integer codes of a categorical column: 1.. in vocabulary (or first-seen) order, 0 = missing."""
    if vocabulary is not None:
        lookup = {v: i + 1 for i, v in enumerate(vocabulary)}
        return values.map(lambda v: lookup.get(v, 0)).to_numpy(np.int64)
    codes, _ = pd.factorize(values.replace("", np.nan))
    return codes.astype(np.int64) + 1


def _multi_hot(values: pd.Series, vocabulary: Sequence[str], sep: str) -> np.ndarray:
    lookup = {v: i for i, v in enumerate(vocabulary)}
    out = np.zeros((len(values), len(vocabulary)), dtype=np.float32)
    for row, text in enumerate(values):
        for token in text.split(sep):
            if token in lookup:
                out[row, lookup[token]] = 1.0
    return out


def require(directory: Path, *names: str) -> list[Path]:
    """Paths of required files, or FileNotFoundError listing those that are missing."""
    paths = [directory / name for name in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{directory}: missing {', '.join(missing)}")
    return paths


def _id(name: str) -> Field:
    """A non-negative integer id within int64."""
    return Field(name, "int", low=0)


def _unix_seconds(name: str) -> Field:
    low, high = UNIX_SECONDS
    return Field(name, "int", low=low, high=high, expect="Unix seconds, 1995-01-01 to 2099-12-31")


def _one_of(values: Sequence[str]) -> str:
    return "|".join(re.escape(v) for v in values)


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


#: MovieLens 100K / 1M ratings: whole stars from 1 to 5.
_STARS = Field("rating", "float", low=1, high=5, step=1)
_GENDER = Field("gender", "str", pattern="M|F", expect="be 'M' or 'F'")
_AGE = Field("age", "int", low=0, high=150, expect="years")


# --------------------------------------------------------------------------------------------
# MovieLens


def load_ml100k(directory: Path) -> LoggedDataset:
    """MovieLens 100K: ``u.data`` (tab: user item rating unix_ts), ``u.user``, ``u.item`` (Latin-1).

    Ratings are whole stars 1-5, timestamps Unix seconds (1995-2099); ``u.user`` and ``u.item``
    have one row per user / item, with ``u.occupation``'s occupations and 0/1 genre flags.
    """
    directory = Path(directory)
    (data,) = require(directory, "u.data")
    log = read_delimited(
        data,
        sep="\t",
        fields=(_id("user"), _id("item"), _STARS, _unix_seconds("timestamp")),
    )
    files = [data]
    users = items = None
    if (directory / "u.user").is_file():
        path = directory / "u.user"
        occupation = Field(
            "occupation",
            "str",
            pattern=_one_of(ML100K_OCCUPATIONS),
            expect="be one of the 21 occupations of u.occupation",
        )
        parsed = parse_delimited(
            path, sep="|", fields=(_id("user"), _AGE, _GENDER, occupation, Field("zip", "opt"))
        )
        parsed.require_unique(["user"], "user")
        raw = parsed.frame
        users = pd.DataFrame(
            {
                "age": raw["age"].to_numpy(np.float32),
                "gender": (raw["gender"] == "F").to_numpy(np.float32),
                "occupation": _codes(raw["occupation"], ML100K_OCCUPATIONS),
            },
            index=raw["user"].to_numpy(),
        )
        files.append(path)
    if (directory / "u.item").is_file():
        path = directory / "u.item"
        texts = (Field(name, "opt") for name in ("title", "release", "video_release", "url"))
        flags = (
            Field(genre, "int", low=0, high=1, expect="a genre flag") for genre in ML100K_GENRES
        )
        parsed = parse_delimited(
            path, sep="|", fields=(_id("item"), *texts, *flags), encoding="latin-1"
        )
        parsed.require_unique(["item"], "item")
        raw = parsed.frame
        items = pd.DataFrame(
            raw[list(ML100K_GENRES)].to_numpy(np.float32),
            columns=list(ML100K_GENRES),
            index=raw["item"].to_numpy(),
        )
        files.append(path)
    return LoggedDataset(
        name="ml-100k",
        interactions=_interactions(log["user"], log["item"], log["rating"], log["timestamp"]),
        files=tuple(files),
        user_features=users,
        item_features=items,
    )


def load_ml1m(directory: Path) -> LoggedDataset:
    """MovieLens 1M: ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``), ``users.dat``,
    ``movies.dat`` (Latin-1). The same rules as :func:`load_ml100k`; genres are ``|``-separated
    names of the 18 ML-1M genres."""
    directory = Path(directory)
    (data,) = require(directory, "ratings.dat")
    log = read_delimited(
        data,
        sep="::",
        fields=(_id("user"), _id("item"), _STARS, _unix_seconds("timestamp")),
    )
    files = [data]
    users = items = None
    if (directory / "users.dat").is_file():
        path = directory / "users.dat"
        occupation = Field("occupation", "int", low=0, high=20, expect="an ML-1M occupation code")
        parsed = parse_delimited(
            path, sep="::", fields=(_id("user"), _GENDER, _AGE, occupation, Field("zip", "opt"))
        )
        parsed.require_unique(["user"], "user")
        raw = parsed.frame
        users = pd.DataFrame(
            {
                "age": raw["age"].to_numpy(np.float32),
                "gender": (raw["gender"] == "F").to_numpy(np.float32),
                "occupation": raw["occupation"].to_numpy(np.int64) + 1,
            },
            index=raw["user"].to_numpy(),
        )
        files.append(path)
    if (directory / "movies.dat").is_file():
        path = directory / "movies.dat"
        genre = f"(?:{_one_of(ML1M_GENRES)})"
        genres = Field(
            "genres",
            "str",
            pattern=rf"{genre}(?:\|{genre})*",
            expect="be '|'-separated ML-1M genres (Action, ..., Western)",
        )
        parsed = parse_delimited(
            path,
            sep="::",
            fields=(_id("item"), Field("title", "opt"), genres),
            encoding="latin-1",
        )
        parsed.require_unique(["item"], "item")
        raw = parsed.frame
        items = pd.DataFrame(
            _multi_hot(raw["genres"], ML1M_GENRES, "|"),
            columns=list(ML1M_GENRES),
            index=raw["item"].to_numpy(),
        )
        files.append(path)
    return LoggedDataset(
        name="ml-1m",
        interactions=_interactions(log["user"], log["item"], log["rating"], log["timestamp"]),
        files=tuple(files),
        user_features=users,
        item_features=items,
    )


def load_ml_csv(directory: Path, name: str = "ml-20m") -> LoggedDataset:
    """MovieLens 20M / 25M: ``ratings.csv`` (header ``userId,movieId,rating,timestamp``).

    Ratings are half stars from 0.5 to 5, timestamps Unix seconds (1995-2099).
    """
    directory = Path(directory)
    (data,) = require(directory, "ratings.csv")
    half_stars = Field("rating", "float", low=0.5, high=5, step=0.5)
    log = read_delimited(
        data,
        sep=",",
        fields=(_id("user"), _id("item"), half_stars, _unix_seconds("timestamp")),
        header=("userId", "movieId", "rating", "timestamp"),
    )
    return LoggedDataset(
        name=name,
        interactions=_interactions(log["user"], log["item"], log["rating"], log["timestamp"]),
        files=(data,),
    )


# --------------------------------------------------------------------------------------------
# Lastfm 2K (HetRec 2011)


def load_lastfm2k(directory: Path) -> LoggedDataset:
    """Lastfm 2K (HetRec 2011): tag assignments with timestamps as the timed interaction log.

    Leave-one-out needs timestamps, which only ``user_taggedartists-timestamps.dat`` (userID,
    artistID, tagID, timestamp in ms; tab-separated, CRLF) has. Each row is one tag a user gave an
    artist; de-duplication to (user, artist) pairs happens in preprocessing, which reports both
    counts. ``user_artists.dat`` (listening weights), when present, is read and validated (one row
    per user and artist) and its pair count noted, but it is not the log (it has no time).
    """
    directory = Path(directory)
    (data,) = require(directory, "user_taggedartists-timestamps.dat")
    low, high = LASTFM_MILLISECONDS
    stamp = Field(
        "timestamp", "int", low=low, high=high, expect="Unix milliseconds, 1900-01-01 to 2099-12-31"
    )
    log = read_delimited(
        data,
        sep="\t",
        fields=(_id("userID"), _id("artistID"), _id("tagID"), stamp),
        header="auto",
    )
    notes = [f"{len(log):,} tag assignments (one row per user, artist and tag)"]
    files = [data]
    if (directory / "user_artists.dat").is_file():
        path = directory / "user_artists.dat"
        parsed = parse_delimited(
            path,
            sep="\t",
            fields=(_id("userID"), _id("artistID"), _id("weight")),
            header="auto",
        )
        parsed.require_unique(["userID", "artistID"], "(userID, artistID) pair")
        notes.append(
            f"user_artists.dat: {len(parsed.frame):,} user-artist listening pairs (no time)"
        )
        files.append(path)
    return LoggedDataset(
        name="lastfm-2k",
        interactions=_interactions(log["userID"], log["artistID"], None, log["timestamp"]),
        files=tuple(files),
        timestamp_unit="ms",
        notes=notes,
    )


# --------------------------------------------------------------------------------------------
# Foursquare NYC (TSMC 2014)

FOURSQUARE_NAMES = (
    "user",
    "venue",
    "category_id",
    "category",
    "latitude",
    "longitude",
    "tz_offset",
    "utc_time",
)
_HEX_ID = {"kind": "str", "pattern": "[0-9a-fA-F]{24}", "expect": "be a 24-hex-digit Foursquare id"}
FOURSQUARE_FIELDS = (
    _id("user"),
    Field("venue", **_HEX_ID),
    Field("category_id", **_HEX_ID),
    Field("category", "opt"),
    Field("latitude", "float", low=-90, high=90),
    Field("longitude", "float", low=-180, high=180),
    Field("tz_offset", "int", low=-720, high=840, expect="minutes from UTC"),
    Field(
        "utc_time",
        "str",
        pattern=r"[A-Z][a-z]{2} [A-Z][a-z]{2} [0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} [+-][0-9]{4} [0-9]{4}",
        expect="look like 'Tue Apr 03 18:00:09 +0000 2012'",
    ),
)


def load_foursquare_nyc(directory: Path) -> LoggedDataset:
    """Foursquare NYC check-ins (Yang et al. 2015): ``dataset_TSMC2014_NYC.txt``, tab-separated.

    Fields: user, venue (24 hex digits), venue-category id (24 hex digits), category name,
    latitude, longitude, timezone offset (minutes) and UTC time ``Tue Apr 03 18:00:09 +0000
    2012``; timestamps become Unix seconds (1995-2099). A venue's features (category, latitude,
    longitude) are those of its first check-in. The file is read as UTF-8, or Latin-1 if it is not
    valid UTF-8.
    """
    directory = Path(directory)
    (data,) = require(directory, "dataset_TSMC2014_NYC.txt")
    raw = data.read_bytes()
    encoding = "utf-8"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        encoding = "latin-1"
    parsed = parse_delimited(data, sep="\t", fields=FOURSQUARE_FIELDS, encoding=encoding)
    log = parsed.frame
    times = log["utc_time"]
    stamps = pd.to_datetime(times, format=FOURSQUARE_TIME_FORMAT, utc=True, errors="coerce")
    parsed.require(
        stamps.notna(),
        lambda row: (
            f"field 'utc_time' must be a valid date like 'Tue Apr 03 18:00:09 +0000 "
            f"2012', got {times.iloc[row]!r}"
        ),
    )
    seconds = (stamps - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)
    low, high = UNIX_SECONDS
    parsed.require(
        (seconds >= low) & (seconds <= high),
        lambda row: (
            f"field 'utc_time' must lie within 1995-01-01 to 2099-12-31, got {times.iloc[row]!r}"
        ),
    )
    venues = log.drop_duplicates("venue").set_index("venue")
    items = pd.DataFrame(
        {
            "category": _codes(venues["category_id"]).astype(np.float32),
            "latitude": venues["latitude"].to_numpy(np.float32),
            "longitude": venues["longitude"].to_numpy(np.float32),
        },
        index=venues.index,
    )
    return LoggedDataset(
        name="foursquare-nyc",
        interactions=_interactions(log["user"], log["venue"], None, seconds),
        files=(data,),
        item_features=items,
    )


# --------------------------------------------------------------------------------------------
# RecBole atomic files

_ATOMIC_TYPES = ("token", "token_seq", "float", "float_seq")
#: The rules :func:`load_atomic` applies to RecBole's MovieLens files (as the catalogue does).
MOVIELENS_ATOMIC: dict = {
    "integer_tokens": True,
    "timestamp_range": UNIX_SECONDS,
    "rating_range": (0.5, 5.0),
}


def parse_atomic(path: Path) -> tuple[Parsed, dict[str, str]]:
    """A RecBole atomic file (tab-separated, header ``name:type``) and its ``{name: type}``.

    ``float`` fields become float64 (finite, decimal); the others stay (stripped) strings.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    first = path.open(encoding="utf-8", errors="replace").readline().rstrip("\r\n")
    types: dict[str, str] = {}
    for number, spec in enumerate(first.split("\t"), start=1):
        name, _, kind = spec.partition(":")
        if kind not in _ATOMIC_TYPES:
            raise FormatError(
                path,
                1,
                f"header field {number} must be 'name:type' with type in {_ATOMIC_TYPES}, "
                f"got {spec!r}",
            )
        if name in types:
            raise FormatError(path, 1, f"header field {number}: {name!r} appears twice")
        types[name] = kind
    fields = [Field(name, "float" if kind == "float" else "opt") for name, kind in types.items()]
    parsed = parse_delimited(path, sep="\t", fields=fields, header=first.split("\t"))
    return parsed, types


def read_atomic(path: Path) -> pd.DataFrame:
    """A RecBole atomic file (tab-separated, header ``name:type``), columns named without types.

    ``float`` fields become float64; ``token``, ``token_seq`` and ``float_seq`` stay strings
    (sequences are space-separated), except token columns whose every value is a non-negative
    integer within int64, which become int64.
    """
    parsed, types = parse_atomic(path)
    frame = parsed.frame
    for name, kind in types.items():
        if kind != "float":
            frame[name] = _maybe_int(frame[name])
    return frame


def _digits_within_int64(values: pd.Series) -> np.ndarray:
    text = values.astype(str)
    digits = text.str.fullmatch(r"[0-9]+").to_numpy(bool)
    significant = text.str.lstrip("0")
    length = significant.str.len().to_numpy()
    fits = (length < 19) | ((length == 19) & (significant <= str(INT64_MAX)).to_numpy(bool))
    return digits & fits


def _maybe_int(values: pd.Series) -> pd.Series:
    """Integer tokens as int64 (so ``196`` sorts and matches as in ``u.data``), else unchanged."""
    if len(values) and values.dtype != np.int64 and _digits_within_int64(values).all():
        return values.astype(np.int64)
    return values


def _integer_tokens(parsed: Parsed, column: str, integer: bool | None) -> pd.Series:
    """Token column ``column`` as int64, or as its exact text.

    ``integer=True``: every value must be a non-negative integer within int64 (a stray ``1_000``
    or ``10000000000000000000`` is an error naming its line). ``None``: int64 only if every value
    is one, else the exact text of every token (never truncated, wrapped or merged). ``False``:
    text.
    """
    values = parsed.frame[column]
    if values.dtype == np.int64 or integer is False:
        return values
    fits = _digits_within_int64(values)
    if integer is None and not fits.all():
        return values
    parsed.require(
        fits,
        lambda row: (
            f"field {column!r} must be a non-negative integer within int64 (at most "
            f"{INT64_MAX}), got {str(values.iloc[row])[:40]!r}"
        ),
    )
    return values.astype(np.int64)


def load_atomic(
    directory: Path,
    prefix: str,
    *,
    name: str | None = None,
    integer_tokens: bool | None = None,
    timestamp_range: tuple[int, int] | None = None,
    rating_range: tuple[float, float] | None = None,
) -> LoggedDataset:
    """RecBole atomic files ``<prefix>.inter`` (+ optional ``.user``, ``.item``).

    The ``.inter`` file needs ``user_id`` and ``item_id`` fields; ``rating`` and ``timestamp`` are
    used when present (without a timestamp, file order is the time). Side features: ``token``
    fields become integer codes (0 = empty), ``float`` fields stay numbers, and a ``token_seq``
    field with at most 64 distinct tokens (e.g. ML-100K's ``class`` genres) becomes a multi-hot
    block; other fields (titles, zip codes) are skipped. ``age`` is a number where its tokens are
    integers (else codes), ``gender`` must be ``M`` or ``F``.

    ``integer_tokens`` says whether the ids (``user_id``, ``item_id``) and ``age`` are integers:
    True (each must be a non-negative integer within int64, else :class:`FormatError`), None
    (integers where every token of the column is one, else the exact text) or False (text); see
    :func:`_integer_tokens`. Checks: ids of the same kind in ``.inter`` and the side files, unique
    keys in ``.user`` / ``.item``. Timestamps are finite, Unix seconds (integral) or, if any has a
    fraction, seconds with at most millisecond precision (stored as ms); they must lie within
    ``timestamp_range`` (seconds) when given and within int64 always. Ratings are finite and within
    ``rating_range`` when given. :data:`MOVIELENS_ATOMIC` holds the rules for RecBole's MovieLens.
    """
    directory = Path(directory)
    path = directory / f"{prefix}.inter"
    parsed, _ = parse_atomic(path)
    frame = parsed.frame
    for needed in ("user_id", "item_id"):
        if needed not in frame.columns:
            raise FormatError(
                path, 1, f"the header has no {needed!r} field ({list(frame.columns)})"
            )
    user = _integer_tokens(parsed, "user_id", integer_tokens)
    item = _integer_tokens(parsed, "item_id", integer_tokens)
    rating = frame["rating"] if "rating" in frame.columns else None
    if rating is not None and rating_range is not None:
        low, high = rating_range
        parsed.require(
            (rating >= low) & (rating <= high),
            lambda row: (
                f"field 'rating' must be a number from {low:g} to {high:g}, got "
                f"{_plain(rating.iloc[row])!r}"
            ),
        )
    unit = "s"
    if "timestamp" in frame.columns:
        timestamp, unit = _atomic_timestamps(parsed, timestamp_range)
    else:
        timestamp = pd.Series(np.arange(len(frame), dtype=np.int64))
    files = [path]
    users = items = None
    user_path, item_path = directory / f"{prefix}.user", directory / f"{prefix}.item"
    if user_path.is_file():
        users = _atomic_features(user_path, "user_id", integer_tokens, user, skip=("zip_code",))
        files.append(user_path)
    if item_path.is_file():
        items = _atomic_features(item_path, "item_id", integer_tokens, item, skip=("movie_title",))
        files.append(item_path)
    return LoggedDataset(
        name=name or prefix,
        interactions=_interactions(user, item, rating, timestamp),
        files=tuple(files),
        user_features=users,
        item_features=items,
        timestamp_unit=unit,
    )


def _atomic_timestamps(
    parsed: Parsed, timestamp_range: tuple[int, int] | None
) -> tuple[pd.Series, str]:
    stamp = parsed.frame["timestamp"].to_numpy(np.float64)  # finite: checked by the parser
    shown = parsed.frame["timestamp"]
    if timestamp_range is not None:
        low, high = timestamp_range
        dates = " (1995-01-01 to 2099-12-31)" if tuple(timestamp_range) == UNIX_SECONDS else ""
        parsed.require(
            (stamp >= low) & (stamp <= high),
            lambda row: (
                f"field 'timestamp' must be Unix seconds from {low} to {high}{dates}, got "
                f"{_plain(shown.iloc[row])!r}"
            ),
        )
    fractional = not np.all(np.mod(stamp, 1) == 0)
    unit, scaled = ("ms", stamp * 1000) if fractional else ("s", stamp)
    parsed.require(
        (scaled >= -(2.0**63)) & (scaled < 2.0**63),
        lambda row: (
            f"field 'timestamp' must fit in int64 (as {'milliseconds' if fractional else 'seconds'})"
            f", got {_plain(shown.iloc[row])!r}"
        ),
    )
    if fractional:
        whole = np.rint(scaled)
        parsed.require(
            np.abs(scaled - whole) <= 1e-3,
            lambda row: (
                f"field 'timestamp' has more than millisecond precision "
                f"({_plain(shown.iloc[row])!r}); timestamps are stored as whole milliseconds"
            ),
        )
        scaled = whole
    return pd.Series(scaled.astype(np.int64)), unit


def _atomic_features(
    path: Path, key: str, integer_tokens: bool | None, log_ids: pd.Series, *, skip: Sequence[str]
) -> pd.DataFrame:
    parsed, types = parse_atomic(path)
    frame = parsed.frame
    if key not in frame.columns:
        raise FormatError(path, 1, f"the header has no {key!r} field ({list(frame.columns)})")
    ids = _integer_tokens(parsed, key, integer_tokens)
    if (ids.dtype == np.int64) != (log_ids.dtype == np.int64):
        kinds = ("integers", "text") if ids.dtype == np.int64 else ("text", "integers")
        raise FormatError(
            path,
            parsed.line(0),
            f"field {key!r} holds {kinds[0]} but the .inter file's {key} holds {kinds[1]}: the "
            "features could not be matched to the log",
        )
    frame[key] = ids
    parsed.require_unique([key], key)
    columns: dict[str, np.ndarray] = {}
    for column in frame.columns:
        if column == key or column in skip:
            continue
        kind = types[column]
        if kind == "float":
            columns[column] = frame[column].to_numpy(np.float32)
        elif kind == "token":
            values = frame[column]
            if column == "age":
                ages = _integer_tokens(parsed, column, integer_tokens)
                if ages.dtype == np.int64:
                    columns[column] = ages.to_numpy(np.float32)
                else:
                    columns[column] = _codes(values).astype(np.float32)
            elif column == "gender":
                parsed.require(
                    values.isin(("M", "F")).to_numpy(bool),
                    lambda row, v=values: (
                        f"field 'gender' must be 'M' or 'F', got {str(v.iloc[row])[:40]!r}"
                    ),
                )
                columns[column] = (values == "F").to_numpy(np.float32)
            else:
                columns[column] = _codes(values).astype(np.float32)
        elif kind == "token_seq":
            texts = frame[column].astype(str)
            vocabulary = sorted({t for text in texts for t in text.split(" ") if t})
            if len(vocabulary) <= 64:
                block = _multi_hot(texts, vocabulary, " ")
                for j, token in enumerate(vocabulary):
                    columns[f"{column}={token}"] = block[:, j]
    return pd.DataFrame(columns, index=frame[key].to_numpy())


# --------------------------------------------------------------------------------------------
# Taobao Ali_Display_Ad_Click


@dataclass
class TaobaoLog:
    """The three Taobao display-ad files, validated, with headers as published (stripped)."""

    impressions: pd.DataFrame  # user, time_stamp, adgroup_id, pid, nonclk, clk (file order)
    ads: pd.DataFrame  # adgroup_id, cate_id, campaign_id, customer, brand ("NULL" kept), price
    users: pd.DataFrame  # userid and the 8 profile columns (strings; "" = empty)
    files: tuple[Path, ...]


TAOBAO_PIDS = ("430548_1007", "430539_1007")


def load_taobao(directory: Path) -> TaobaoLog:
    """Taobao Ali_Display_Ad_Click: ``raw_sample.csv``, ``ad_feature.csv``, ``user_profile.csv``.

    Checks the exact headers (``user_profile.csv``'s trailing space is stripped); ids are
    non-negative integers, ``time_stamp`` Unix seconds (1995-2099), ``pid`` one of the two
    positions, ``clk`` 0 or 1 and ``nonclk = 1 - clk`` on every row; ``brand`` is an integer or
    ``NULL``, ``price`` a finite number >= 0; the profile fields are integers or empty; each ad
    and each user has at most one feature row.
    """
    directory = Path(directory)
    sample_path, ad_path, user_path = require(
        directory, "raw_sample.csv", "ad_feature.csv", "user_profile.csv"
    )
    flag = {"kind": "int", "low": 0, "high": 1, "expect": "0 or 1"}
    parsed = parse_delimited(
        sample_path,
        sep=",",
        fields=(
            _id("user"),
            _unix_seconds("time_stamp"),
            _id("adgroup_id"),
            Field(
                "pid", "str", pattern=_one_of(TAOBAO_PIDS), expect="be " + " or ".join(TAOBAO_PIDS)
            ),
            Field("nonclk", **flag),
            Field("clk", **flag),
        ),
        header=TAOBAO_RAW_SAMPLE_HEADER,
    )
    impressions = parsed.frame
    clk, nonclk = impressions["clk"].to_numpy(), impressions["nonclk"].to_numpy()
    parsed.require(
        np.isin(clk, (0, 1)) & (nonclk == 1 - clk),
        lambda row: (
            f"expected clk in {{0, 1}} and nonclk = 1 - clk, got clk={clk[row]}, "
            f"nonclk={nonclk[row]}"
        ),
    )
    parsed = parse_delimited(
        ad_path,
        sep=",",
        fields=(
            _id("adgroup_id"),
            _id("cate_id"),
            _id("campaign_id"),
            _id("customer"),
            Field("brand", "str", pattern="NULL|[0-9]+", expect="be an integer or NULL"),
            Field("price", "float", low=0),
        ),
        header=TAOBAO_AD_FEATURE_HEADER,
    )
    parsed.require_unique(["adgroup_id"], "adgroup_id")
    ads = parsed.frame
    code = {"kind": "opt", "pattern": "[0-9]*", "expect": "be an integer code or empty"}
    parsed = parse_delimited(
        user_path,
        sep=",",
        fields=(
            _id("userid"),
            *(Field(name, **code) for name in TAOBAO_USER_PROFILE_HEADER[1:]),
        ),
        header=TAOBAO_USER_PROFILE_HEADER,
    )
    parsed.require_unique(["userid"], "userid")
    return TaobaoLog(
        impressions=impressions,
        ads=ads,
        users=parsed.frame,
        files=(sample_path, ad_path, user_path),
    )


def parse_foursquare_time(text: str) -> int:
    """Unix seconds of a Foursquare UTC time string (e.g. ``Tue Apr 03 18:00:09 +0000 2012``)."""
    return int(datetime.strptime(text, FOURSQUARE_TIME_FORMAT).timestamp())
