"""What every logged-data loader returns: :class:`LoggedDataset`, and the helpers that build it.

A :class:`LoggedDataset` is the interaction log in file order (columns ``user``, ``item``,
``rating``, ``timestamp``) plus optional user and item side features; :func:`interactions_frame`
builds the log's columns and :func:`category_codes` / :func:`multi_hot` the numeric features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd


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


def interactions_frame(
    user: pd.Series, item: pd.Series, rating: pd.Series | None, timestamp: pd.Series
) -> pd.DataFrame:
    """The log's columns ``user``, ``item``, ``rating`` (NaN without ratings), ``timestamp``."""
    n = len(user)
    return pd.DataFrame(
        {
            "user": user.to_numpy(),
            "item": item.to_numpy(),
            "rating": np.full(n, np.nan) if rating is None else rating.to_numpy(np.float64),
            "timestamp": timestamp.to_numpy(np.int64),
        }
    )


def category_codes(values: pd.Series, vocabulary: Sequence[str] | None = None) -> np.ndarray:
    """Integer codes of a categorical column: 1.. in vocabulary (or first-seen) order, 0 = missing."""
    if vocabulary is not None:
        lookup = {v: i + 1 for i, v in enumerate(vocabulary)}
        return values.map(lambda v: lookup.get(v, 0)).to_numpy(np.int64)
    codes, _ = pd.factorize(values.replace("", np.nan))
    return codes.astype(np.int64) + 1


def multi_hot(values: pd.Series, vocabulary: Sequence[str], sep: str) -> np.ndarray:
    """(rows, vocabulary) float32 flags of the ``sep``-separated tokens of each value."""
    lookup = {v: i for i, v in enumerate(vocabulary)}
    out = np.zeros((len(values), len(vocabulary)), dtype=np.float32)
    for row, text in enumerate(values):
        for token in text.split(sep):
            if token in lookup:
                out[row, lookup[token]] = 1.0
    return out
