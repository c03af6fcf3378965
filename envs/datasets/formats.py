"""Loaders for the real file formats of the logged data sets, with errors that name file and line.

Every loader returns a :class:`LoggedDataset`: the interaction log in file order (columns
``user``, ``item``, ``rating``, ``timestamp``) plus optional user and item side features. The
interaction files are parsed with pandas' pyarrow engine (an ML-1M-sized log loads in well under a
second); when pandas reports or leaves a problem (a short row, a non-numeric field, an empty
field), a line-by-line validation pass finds the first bad line and raises :class:`FormatError`
naming the file, the 1-based line number and what was expected.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

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
# Generic delimited reader with a validation pass


def _check_value(text: str, kind: Kind) -> bool:
    if kind == "opt":
        return True
    if kind == "str":
        return text != ""
    try:
        if kind == "int":
            int(text)
        else:
            value = float(text)
            return not np.isnan(value)
    except ValueError:
        return False
    return True


_KIND_TEXT = {
    "int": "an integer",
    "float": "a number",
    "str": "a non-empty value",
    "opt": "a value",
}


def _split_line(line: str, sep: str, quoted: bool) -> list[str]:
    if quoted:
        return next(csv.reader([line], delimiter=sep))
    return line.split(sep)


def find_bad_line(
    path: Path,
    text: str,
    *,
    sep: str,
    names: Sequence[str],
    kinds: Sequence[Kind],
    header_lines: int,
    quoted: bool = False,
) -> FormatError | None:
    """The first malformed line of ``text`` as a :class:`FormatError`, or None if all lines parse.

    Blank lines are skipped (as the fast parser does). Field counts and per-field kinds are checked.
    """
    shown_sep = {"\t": "tab", ",": "comma", "|": "'|'", "::": "'::'"}.get(sep, repr(sep))
    for number, raw in enumerate(text.splitlines(), start=1):
        if number <= header_lines:
            continue
        line = raw.rstrip("\r")
        if line.strip() == "":
            continue
        fields = _split_line(line, sep, quoted)
        if len(fields) != len(names):
            hint = " (truncated file?)" if len(fields) < len(names) else ""
            return FormatError(
                path,
                number,
                f"expected {len(names)} {shown_sep}-separated fields ({', '.join(names)}), "
                f"got {len(fields)}{hint}: {line[:80]!r}",
            )
        for name, kind, value in zip(names, kinds, fields, strict=True):
            if not _check_value(value.strip(), kind):
                return FormatError(
                    path,
                    number,
                    f"field {name!r} must be {_KIND_TEXT[kind]}, got {value[:40]!r}",
                )
    return None


def _read_text(path: Path, encoding: str) -> str:
    data = path.read_bytes()
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise FormatError(path, line, f"not valid {encoding} text ({error.reason})") from error


def read_delimited(
    path: Path,
    *,
    sep: str,
    names: Sequence[str],
    kinds: Sequence[Kind],
    header: Sequence[str] | Literal["auto"] | None = None,
    encoding: str = "utf-8",
    quoted: bool = False,
    fast: bool = True,
) -> pd.DataFrame:
    """Read a delimited file into columns ``names``, validating every field's kind.

    :param header: the exact expected header (checked, whitespace-stripped), None for a file
        without a header, or ``"auto"`` for a header that some copies have and some do not (it is
        present when the first line's fields equal ``names`` case-insensitively).
    :param fast: parse with pandas' pyarrow engine (for large logs); else the C engine, which
        handles unquoted files whose text fields contain quote characters.
    :raises FormatError: naming the file, the line and the expectation.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    text = _read_text(path, encoding)
    first = text.split("\n", 1)[0].rstrip("\r")
    header_lines = 0
    if header == "auto":
        fields = [f.strip().lower() for f in _split_line(first, sep, quoted)]
        header_lines = int(fields == [n.lower() for n in names])
    elif header is not None:
        fields = [f.strip() for f in _split_line(first, sep, quoted)]
        if fields != list(header):
            raise FormatError(
                path, 1, f"expected the header {sep.join(header)!r}, got {first[:120]!r}"
            )
        header_lines = 1
    if text.strip() == "" or len(text.splitlines()) <= header_lines:
        raise FormatError(path, None, "the file has no data rows (empty or truncated file)")

    body = text
    if len(sep) > 1:  # pyarrow and C engines need a one-character separator
        body = text.replace(sep, "\x1f")
    one_char = "\x1f" if len(sep) > 1 else sep
    dtypes = {name: str for name, kind in zip(names, kinds, strict=True) if kind in ("str", "opt")}
    frame: pd.DataFrame | None = None
    try:
        if fast:
            frame = pd.read_csv(
                io.BytesIO(body.encode("utf-8")),
                sep=one_char,
                header=None,
                names=list(names),
                skiprows=header_lines,
                engine="pyarrow",
                dtype=dtypes or None,
                keep_default_na=False,
            )
        else:
            frame = pd.read_csv(
                io.StringIO(body),
                sep=one_char,
                header=None,
                names=list(names),
                skiprows=header_lines,
                engine="c",
                quoting=csv.QUOTE_MINIMAL if quoted else csv.QUOTE_NONE,
                dtype=str,
                keep_default_na=False,
                skip_blank_lines=True,
            )
    except Exception:  # any parser failure: locate the line ourselves
        frame = None
    if frame is not None and _frame_ok(frame, names, kinds, fast=fast):
        return _convert(frame, names, kinds)
    problem = find_bad_line(
        path, text, sep=sep, names=names, kinds=kinds, header_lines=header_lines, quoted=quoted
    )
    if problem is not None:
        raise problem
    if frame is None:
        raise FormatError(path, None, f"could not be parsed as {sep!r}-separated {list(names)}")
    return _convert(frame, names, kinds)


def _frame_ok(
    frame: pd.DataFrame, names: Sequence[str], kinds: Sequence[Kind], *, fast: bool
) -> bool:
    if list(frame.columns) != list(names):
        return False
    for name, kind in zip(names, kinds, strict=True):
        column = frame[name]
        if kind == "int":
            if not pd.api.types.is_integer_dtype(column.dtype):
                return False
        elif kind == "float":
            if not pd.api.types.is_numeric_dtype(column.dtype) or column.isna().any():
                return False
        elif kind == "str" and (column.isna().any() or (column.astype(str) == "").any()):
            return False
    return True


def _convert(frame: pd.DataFrame, names: Sequence[str], kinds: Sequence[Kind]) -> pd.DataFrame:
    out = {}
    for name, kind in zip(names, kinds, strict=True):
        column = frame[name]
        if kind == "int":
            out[name] = pd.to_numeric(column).astype(np.int64)
        elif kind == "float":
            out[name] = pd.to_numeric(column).astype(np.float64)
        else:
            out[name] = column.fillna("").astype(str).str.strip()
    return pd.DataFrame(out)


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


# --------------------------------------------------------------------------------------------
# MovieLens


def load_ml100k(directory: Path) -> LoggedDataset:
    """MovieLens 100K: ``u.data`` (tab: user item rating unix_ts), ``u.user``, ``u.item`` (Latin-1)."""
    directory = Path(directory)
    (data,) = require(directory, "u.data")
    log = read_delimited(
        data,
        sep="\t",
        names=("user", "item", "rating", "timestamp"),
        kinds=("int", "int", "float", "int"),
    )
    files = [data]
    users = items = None
    if (directory / "u.user").is_file():
        path = directory / "u.user"
        raw = read_delimited(
            path,
            sep="|",
            names=("user", "age", "gender", "occupation", "zip"),
            kinds=("int", "int", "str", "str", "opt"),
            fast=False,
        )
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
        names = ("item", "title", "release", "video_release", "url", *ML100K_GENRES)
        kinds: tuple[Kind, ...] = ("int", "opt", "opt", "opt", "opt", *(["int"] * 19))
        raw = read_delimited(
            path, sep="|", names=names, kinds=kinds, encoding="latin-1", fast=False
        )
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
    ``movies.dat`` (Latin-1)."""
    directory = Path(directory)
    (data,) = require(directory, "ratings.dat")
    log = read_delimited(
        data,
        sep="::",
        names=("user", "item", "rating", "timestamp"),
        kinds=("int", "int", "float", "int"),
    )
    files = [data]
    users = items = None
    if (directory / "users.dat").is_file():
        path = directory / "users.dat"
        raw = read_delimited(
            path,
            sep="::",
            names=("user", "gender", "age", "occupation", "zip"),
            kinds=("int", "str", "int", "int", "opt"),
            fast=False,
        )
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
        raw = read_delimited(
            path,
            sep="::",
            names=("item", "title", "genres"),
            kinds=("int", "opt", "opt"),
            encoding="latin-1",
            fast=False,
        )
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
    """MovieLens 20M / 25M: ``ratings.csv`` (header ``userId,movieId,rating,timestamp``)."""
    directory = Path(directory)
    (data,) = require(directory, "ratings.csv")
    log = read_delimited(
        data,
        sep=",",
        names=("user", "item", "rating", "timestamp"),
        kinds=("int", "int", "float", "int"),
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
    counts. ``user_artists.dat`` (listening weights), when present, is read and validated and its
    pair count noted, but it is not the log (it has no time).
    """
    directory = Path(directory)
    (data,) = require(directory, "user_taggedartists-timestamps.dat")
    log = read_delimited(
        data,
        sep="\t",
        names=("userID", "artistID", "tagID", "timestamp"),
        kinds=("int", "int", "int", "int"),
        header="auto",
    )
    notes = [f"{len(log):,} tag assignments (one row per user, artist and tag)"]
    files = [data]
    if (directory / "user_artists.dat").is_file():
        path = directory / "user_artists.dat"
        weights = read_delimited(
            path,
            sep="\t",
            names=("userID", "artistID", "weight"),
            kinds=("int", "int", "int"),
            header="auto",
        )
        notes.append(f"user_artists.dat: {len(weights):,} user-artist listening pairs (no time)")
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
_TIME_RE = re.compile(r"^[A-Z][a-z]{2} [A-Z][a-z]{2} \d{2} \d{2}:\d{2}:\d{2} [+-]\d{4} \d{4}$")


def load_foursquare_nyc(directory: Path) -> LoggedDataset:
    """Foursquare NYC check-ins (Yang et al. 2015): ``dataset_TSMC2014_NYC.txt``, tab-separated.

    Fields: user, venue, venue-category id, category name, latitude, longitude, timezone offset
    (minutes) and UTC time ``Tue Apr 03 18:00:09 +0000 2012``; timestamps become Unix seconds. The
    file is read as UTF-8, or Latin-1 if it is not valid UTF-8.
    """
    directory = Path(directory)
    (data,) = require(directory, "dataset_TSMC2014_NYC.txt")
    raw = data.read_bytes()
    encoding = "utf-8"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        encoding = "latin-1"
    kinds: tuple[Kind, ...] = ("int", "str", "str", "opt", "float", "float", "int", "str")
    log = read_delimited(data, sep="\t", names=FOURSQUARE_NAMES, kinds=kinds, encoding=encoding)
    times = log["utc_time"]
    good = times.str.match(_TIME_RE)
    if not good.all():
        row = int(np.flatnonzero(~good.to_numpy())[0])
        raise FormatError(
            data,
            _line_of_row(data, row, encoding),
            f"field 'utc_time' must look like 'Tue Apr 03 18:00:09 +0000 2012', got {times.iloc[row]!r}",
        )
    stamps = pd.to_datetime(times, format=FOURSQUARE_TIME_FORMAT, utc=True)
    seconds = (stamps - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)
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


def _line_of_row(path: Path, row: int, encoding: str, header_lines: int = 0) -> int:
    """1-based line number of data row ``row`` (0-based, blank lines skipped)."""
    seen = -1
    for number, line in enumerate(path.read_text(encoding).splitlines(), start=1):
        if number <= header_lines or line.strip() == "":
            continue
        seen += 1
        if seen == row:
            return number
    return header_lines + row + 1


# --------------------------------------------------------------------------------------------
# RecBole atomic files

_ATOMIC_TYPES = ("token", "token_seq", "float", "float_seq")


def read_atomic(path: Path) -> pd.DataFrame:
    """A RecBole atomic file (tab-separated, header ``name:type``), columns named without types.

    ``float`` fields become float64; ``token``, ``token_seq`` and ``float_seq`` stay strings
    (sequences are space-separated).
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    first = path.open(encoding="utf-8", errors="replace").readline().rstrip("\r\n")
    names, kinds = [], []
    for number, spec in enumerate(first.split("\t"), start=1):
        name, _, kind = spec.partition(":")
        if kind not in _ATOMIC_TYPES:
            raise FormatError(
                path,
                1,
                f"header field {number} must be 'name:type' with type in {_ATOMIC_TYPES}, "
                f"got {spec!r}",
            )
        names.append(name)
        kinds.append("float" if kind == "float" else "opt")
    frame = read_delimited(
        path,
        sep="\t",
        names=names,
        kinds=kinds,
        header=first.split("\t"),
        fast=len(names) <= 4,
    )
    for name, kind in zip(names, kinds, strict=True):
        if kind == "opt":
            frame[name] = _maybe_int(frame[name])
    return frame


def _maybe_int(values: pd.Series) -> pd.Series:
    """Integer tokens as int64 (so ``196`` sorts and matches as in ``u.data``), else unchanged."""
    if len(values) and values.str.fullmatch(r"-?\d{1,18}").all():
        return values.astype(np.int64)
    return values


def load_atomic(directory: Path, prefix: str, *, name: str | None = None) -> LoggedDataset:
    """RecBole atomic files ``<prefix>.inter`` (+ optional ``.user``, ``.item``).

    The ``.inter`` file needs ``user_id`` and ``item_id`` fields; ``rating`` and ``timestamp`` are
    used when present (without a timestamp, file order is the time). Side features: ``token``
    fields become integer codes (0 = empty), ``float`` fields stay numbers, and a ``token_seq``
    field with at most 64 distinct tokens (e.g. ML-100K's ``class`` genres) becomes a multi-hot
    block; other fields (titles, zip codes) are skipped.
    """
    directory = Path(directory)
    path = directory / f"{prefix}.inter"
    frame = read_atomic(path)
    for needed in ("user_id", "item_id"):
        if needed not in frame.columns:
            raise FormatError(
                path, 1, f"the header has no {needed!r} field ({list(frame.columns)})"
            )
    rating = frame["rating"] if "rating" in frame.columns else None
    if "timestamp" in frame.columns:
        stamp = frame["timestamp"]
        if not np.all(np.mod(stamp.to_numpy(), 1) == 0):
            stamp = stamp * 1000
        timestamp = stamp.astype(np.int64)
    else:
        timestamp = pd.Series(np.arange(len(frame), dtype=np.int64))
    files = [path]
    users = items = None
    user_path, item_path = directory / f"{prefix}.user", directory / f"{prefix}.item"
    if user_path.is_file():
        users = _atomic_features(user_path, "user_id", skip=("zip_code",))
        files.append(user_path)
    if item_path.is_file():
        items = _atomic_features(item_path, "item_id", skip=("movie_title",))
        files.append(item_path)
    return LoggedDataset(
        name=name or prefix,
        interactions=_interactions(frame["user_id"], frame["item_id"], rating, timestamp),
        files=tuple(files),
        user_features=users,
        item_features=items,
    )


def _atomic_features(path: Path, key: str, *, skip: Sequence[str]) -> pd.DataFrame:
    frame = read_atomic(path)
    if key not in frame.columns:
        raise FormatError(path, 1, f"the header has no {key!r} field ({list(frame.columns)})")
    types = dict(
        spec.split(":", 1)
        for spec in path.open(encoding="utf-8").readline().rstrip("\r\n").split("\t")
    )
    columns: dict[str, np.ndarray] = {}
    for column in frame.columns:
        if column == key or column in skip:
            continue
        kind = types[column]
        if kind == "float":
            columns[column] = frame[column].to_numpy(np.float32)
        elif kind == "token":
            values = frame[column]
            numeric = pd.to_numeric(values, errors="coerce")
            if column == "age" and numeric.notna().all():
                columns[column] = numeric.to_numpy(np.float32)
            elif column == "gender":
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


def load_taobao(directory: Path) -> TaobaoLog:
    """Taobao Ali_Display_Ad_Click: ``raw_sample.csv``, ``ad_feature.csv``, ``user_profile.csv``.

    Checks the exact headers (``user_profile.csv``'s trailing space is stripped), that ``clk`` is 0
    or 1 and ``nonclk = 1 - clk`` on every row.
    """
    directory = Path(directory)
    sample_path, ad_path, user_path = require(
        directory, "raw_sample.csv", "ad_feature.csv", "user_profile.csv"
    )
    impressions = read_delimited(
        sample_path,
        sep=",",
        names=TAOBAO_RAW_SAMPLE_HEADER,
        kinds=("int", "int", "int", "str", "int", "int"),
        header=TAOBAO_RAW_SAMPLE_HEADER,
    )
    clk, nonclk = impressions["clk"].to_numpy(), impressions["nonclk"].to_numpy()
    bad = ~np.isin(clk, (0, 1)) | (nonclk != 1 - clk)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise FormatError(
            sample_path,
            _line_of_row(sample_path, row, "utf-8", header_lines=1),
            f"expected clk in {{0, 1}} and nonclk = 1 - clk, got clk={clk[row]}, nonclk={nonclk[row]}",
        )
    ads = read_delimited(
        ad_path,
        sep=",",
        names=TAOBAO_AD_FEATURE_HEADER,
        kinds=("int", "int", "int", "int", "str", "float"),
        header=TAOBAO_AD_FEATURE_HEADER,
    )
    users = read_delimited(
        user_path,
        sep=",",
        names=TAOBAO_USER_PROFILE_HEADER,
        kinds=("int", *(["opt"] * 8)),
        header=TAOBAO_USER_PROFILE_HEADER,
    )
    return TaobaoLog(
        impressions=impressions, ads=ads, users=users, files=(sample_path, ad_path, user_path)
    )


def parse_foursquare_time(text: str) -> int:
    """Unix seconds of a Foursquare UTC time string (e.g. ``Tue Apr 03 18:00:09 +0000 2012``)."""
    return int(datetime.strptime(text, FOURSQUARE_TIME_FORMAT).timestamp())
