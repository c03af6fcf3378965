"""Loader of RecBole's atomic files (``.inter`` with optional ``.user`` / ``.item``).

:func:`load_atomic` returns a :class:`~fedrec.envs.datasets.logged_dataset.LoggedDataset`;
:data:`MOVIELENS_ATOMIC` holds the rules it applies to RecBole's MovieLens copies. Every field is
checked by the parser engine (:mod:`fedrec.envs.datasets.parsing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fedrec.envs.datasets.logged_dataset import (
    LoggedDataset,
    category_codes,
    interactions_frame,
    multi_hot,
)
from fedrec.envs.datasets.parsing import (
    INT64_MAX,
    UNIX_SECONDS,
    Field,
    FormatError,
    Parsed,
    parse_delimited,
    plain,
)

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
                f"{plain(rating.iloc[row])!r}"
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
        interactions=interactions_frame(user, item, rating, timestamp),
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
                f"{plain(shown.iloc[row])!r}"
            ),
        )
    fractional = not np.all(np.mod(stamp, 1) == 0)
    unit, scaled = ("ms", stamp * 1000) if fractional else ("s", stamp)
    parsed.require(
        (scaled >= -(2.0**63)) & (scaled < 2.0**63),
        lambda row: (
            f"field 'timestamp' must fit in int64 (as {'milliseconds' if fractional else 'seconds'})"
            f", got {plain(shown.iloc[row])!r}"
        ),
    )
    if fractional:
        whole = np.rint(scaled)
        parsed.require(
            np.abs(scaled - whole) <= 1e-3,
            lambda row: (
                f"field 'timestamp' has more than millisecond precision "
                f"({plain(shown.iloc[row])!r}); timestamps are stored as whole milliseconds"
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
                    columns[column] = category_codes(values).astype(np.float32)
            elif column == "gender":
                parsed.require(
                    values.isin(("M", "F")).to_numpy(bool),
                    lambda row, v=values: (
                        f"field 'gender' must be 'M' or 'F', got {str(v.iloc[row])[:40]!r}"
                    ),
                )
                columns[column] = (values == "F").to_numpy(np.float32)
            else:
                columns[column] = category_codes(values).astype(np.float32)
        elif kind == "token_seq":
            texts = frame[column].astype(str)
            vocabulary = sorted({t for text in texts for t in text.split(" ") if t})
            if len(vocabulary) <= 64:
                block = multi_hot(texts, vocabulary, " ")
                for j, token in enumerate(vocabulary):
                    columns[f"{column}={token}"] = block[:, j]
    return pd.DataFrame(columns, index=frame[key].to_numpy())
