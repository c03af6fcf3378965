"""Loaders of the MovieLens files: ML-100K, ML-1M and the ``ratings.csv`` of ML-20M / ML-25M.

Each returns a :class:`~fedrec.envs.datasets.logged_dataset.LoggedDataset`; every field is
checked by the parser engine (:mod:`fedrec.envs.datasets.parsing`). RecBole's atomic copies of
MovieLens are read by :mod:`fedrec.envs.datasets.recbole_files`.
"""

from __future__ import annotations

from collections.abc import Callable
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
    Field,
    Parsed,
    id_field,
    one_of,
    parse_delimited,
    read_delimited,
    require,
    unix_seconds_field,
)

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


#: MovieLens 100K / 1M ratings: whole stars from 1 to 5.
_STARS = Field("rating", "float", low=1, high=5, step=1)
_GENDER = Field("gender", "str", pattern="M|F", expect="be 'M' or 'F'")
_AGE = Field("age", "int", low=0, high=150, expect="years")


def load_ml100k(directory: Path) -> LoggedDataset:
    """MovieLens 100K: ``u.data`` (tab: user item rating unix_ts), ``u.user``, ``u.item`` (Latin-1).

    Ratings are whole stars 1-5, timestamps Unix seconds (1995-2099); ``u.user`` and ``u.item``
    have one row per user / item, with ``u.occupation``'s occupations and 0/1 genre flags.
    """
    ratings = _Ratings(directory, "u.data", sep="\t")
    users = ratings.side_file("u.user", _ml100k_users)
    items = ratings.side_file("u.item", _ml100k_items)
    return ratings.dataset("ml-100k", users, items)


def load_ml1m(directory: Path) -> LoggedDataset:
    """MovieLens 1M: ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``), ``users.dat``,
    ``movies.dat`` (Latin-1). The same rules as :func:`load_ml100k`; genres are ``|``-separated
    names of the 18 ML-1M genres."""
    ratings = _Ratings(directory, "ratings.dat", sep="::")
    users = ratings.side_file("users.dat", _ml1m_users)
    items = ratings.side_file("movies.dat", _ml1m_items)
    return ratings.dataset("ml-1m", users, items)


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
        fields=(id_field("user"), id_field("item"), half_stars, unix_seconds_field("timestamp")),
        header=("userId", "movieId", "rating", "timestamp"),
    )
    return LoggedDataset(
        name=name,
        interactions=interactions_frame(log["user"], log["item"], log["rating"], log["timestamp"]),
        files=(data,),
    )


class _Ratings:
    """The ratings file of ML-100K / ML-1M (required; whole stars, Unix seconds) and the optional
    side files read with it, in the order they are read."""

    def __init__(self, directory: Path, name: str, *, sep: str) -> None:
        self.directory = Path(directory)
        (data,) = require(self.directory, name)
        self.log = read_delimited(
            data,
            sep=sep,
            fields=(id_field("user"), id_field("item"), _STARS, unix_seconds_field("timestamp")),
        )
        self.files = [data]

    def side_file(self, name: str, read: Callable[[Path], pd.DataFrame]) -> pd.DataFrame | None:
        """The side file ``name`` as ``read`` reads it, or None where the folder lacks it."""
        if not (self.directory / name).is_file():
            return None
        path = self.directory / name
        table = read(path)
        self.files.append(path)
        return table

    def dataset(
        self, name: str, users: pd.DataFrame | None, items: pd.DataFrame | None
    ) -> LoggedDataset:
        log = self.log
        return LoggedDataset(
            name=name,
            interactions=interactions_frame(
                log["user"], log["item"], log["rating"], log["timestamp"]
            ),
            files=tuple(self.files),
            user_features=users,
            item_features=items,
        )


def _ml100k_users(path: Path) -> pd.DataFrame:
    occupation = Field(
        "occupation",
        "str",
        pattern=one_of(ML100K_OCCUPATIONS),
        expect="be one of the 21 occupations of u.occupation",
    )
    parsed = parse_delimited(
        path, sep="|", fields=(id_field("user"), _AGE, _GENDER, occupation, Field("zip", "opt"))
    )
    return _user_table(parsed, lambda names: category_codes(names, ML100K_OCCUPATIONS))


def _ml1m_users(path: Path) -> pd.DataFrame:
    occupation = Field("occupation", "int", low=0, high=20, expect="an ML-1M occupation code")
    parsed = parse_delimited(
        path, sep="::", fields=(id_field("user"), _GENDER, _AGE, occupation, Field("zip", "opt"))
    )
    return _user_table(parsed, lambda codes: codes.to_numpy(np.int64) + 1)


def _user_table(parsed: Parsed, occupation: Callable[[pd.Series], np.ndarray]) -> pd.DataFrame:
    """One row per user (a repeated user is an error): age, gender (1.0 = F), occupation code."""
    parsed.require_unique(["user"], "user")
    raw = parsed.frame
    return pd.DataFrame(
        {
            "age": raw["age"].to_numpy(np.float32),
            "gender": (raw["gender"] == "F").to_numpy(np.float32),
            "occupation": occupation(raw["occupation"]),
        },
        index=raw["user"].to_numpy(),
    )


def _ml100k_items(path: Path) -> pd.DataFrame:
    texts = (Field(name, "opt") for name in ("title", "release", "video_release", "url"))
    flags = (Field(genre, "int", low=0, high=1, expect="a genre flag") for genre in ML100K_GENRES)
    parsed = parse_delimited(
        path, sep="|", fields=(id_field("item"), *texts, *flags), encoding="latin-1"
    )
    return _genre_table(
        parsed, ML100K_GENRES, lambda raw: raw[list(ML100K_GENRES)].to_numpy(np.float32)
    )


def _ml1m_items(path: Path) -> pd.DataFrame:
    genre = f"(?:{one_of(ML1M_GENRES)})"
    genres = Field(
        "genres",
        "str",
        pattern=rf"{genre}(?:\|{genre})*",
        expect="be '|'-separated ML-1M genres (Action, ..., Western)",
    )
    parsed = parse_delimited(
        path,
        sep="::",
        fields=(id_field("item"), Field("title", "opt"), genres),
        encoding="latin-1",
    )
    return _genre_table(parsed, ML1M_GENRES, lambda raw: multi_hot(raw["genres"], ML1M_GENRES, "|"))


def _genre_table(
    parsed: Parsed, genres: tuple[str, ...], flags: Callable[[pd.DataFrame], np.ndarray]
) -> pd.DataFrame:
    """One row per item (a repeated item is an error): its 0/1 ``genres`` flags."""
    parsed.require_unique(["item"], "item")
    raw = parsed.frame
    return pd.DataFrame(flags(raw), columns=list(genres), index=raw["item"].to_numpy())
