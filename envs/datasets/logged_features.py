"""The side-feature entries of the logged-data observations, for both modes: spaces and values.

A data set may have public user features (MovieLens: age, gender, occupation) and item features
(MovieLens genres; Foursquare venue category and position). Where it has them, every
observation holds ``user_features`` (du,) for its user and ``candidate_features`` (C, di) for its
candidates, in both the evaluation and the interaction mode.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from fedrec.envs.datasets.preprocess import PreparedData


def feature_box(values: np.ndarray) -> spaces.Box:
    """A float32 box over the rows of ``values``, bounded by their minimum and maximum."""
    low = float(values.min()) if values.size else 0.0
    high = float(values.max()) if values.size else 0.0
    return spaces.Box(low, max(high, low), values.shape[1:], np.float32)


def feature_spaces(data: PreparedData, num_candidates: int) -> dict[str, spaces.Space]:
    """The spaces of ``user_features`` and ``candidate_features``, where the data set has them."""
    entries: dict[str, spaces.Space] = {}
    if data.user_features is not None:
        entries["user_features"] = feature_box(data.user_features)
    if data.item_features is not None:
        box = feature_box(data.item_features)
        entries["candidate_features"] = spaces.Box(
            box.low.min(),
            box.high.max(),
            (num_candidates, data.item_features.shape[1]),
            np.float32,
        )
    return entries


def feature_observation(
    data: PreparedData, users: np.ndarray, candidates: np.ndarray
) -> dict[str, np.ndarray]:
    """The feature entries of a batch: ``users`` (B,) and their ``candidates`` (B, C)."""
    obs = {}
    if data.user_features is not None:
        obs["user_features"] = data.user_features[users]
    if data.item_features is not None:
        obs["candidate_features"] = data.item_features[candidates]
    return obs
