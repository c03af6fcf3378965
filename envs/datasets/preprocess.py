"""The FedNCF preprocessing and evaluation protocol, with a report of everything each step removes.

Steps, in order (see ``docs``/the README section *Logged data*):

1. **Implicit feedback.** Every logged interaction is a positive (optionally only ratings at or
   above ``rating_threshold``; the rows below are reported as removed).
2. **De-duplication.** One row per (user, item), keeping the latest timestamp; among rows with the
   same latest timestamp, the one that comes last in the file.
3. **Minimum activity.** Users with fewer than ``min_interactions`` (default 5) remaining items are
   removed, with their rows. Items are not filtered.
4. **Id remapping.** Users and items get contiguous 0-based ids in ascending order of their raw ids.
5. **Leave-one-out.** Each user's rows are stably sorted by (timestamp, file order) and the **last**
   row is the test item (*tie rule*: among rows sharing the latest timestamp, the one later in the
   file is held out); the rest are training positives.
6. **Test negatives.** 100 items the user never interacted with (train or test), drawn without
   replacement with ``numpy.random.default_rng(seed)``, users in id order: fixed by the seed and
   shared by every model. The evaluation candidates are the test item plus these negatives, in an
   order shuffled by the same generator (so the position of the positive carries no signal).
7. **Training negatives** are drawn afresh every epoch by :func:`sample_training_negatives`:
   ``num_negatives`` (default 4) per training positive, uniform over the items the user never
   interacted with (the test item is excluded too, so it is never taught as a negative).

Optionally (:meth:`PreparedData.with_validation`) each user's second-to-last row is held out of
training as well, as a **validation item** with its own 100 fixed negatives (a second seeded
stream), for picking a training round or epoch without looking at the test items.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fedrec.envs.datasets.formats import LoggedDataset


@dataclass(frozen=True)
class Statistics:
    """Size and activity statistics (as in FedNCF's tables 3 and 4; std is the population std)."""

    users: int
    items: int
    interactions: int
    per_user_min: int
    per_user_mean: float
    per_user_max: int
    per_user_std: float

    @property
    def sparsity(self) -> float:
        """1 - interactions / (users * items)."""
        cells = self.users * self.items
        return 1.0 - self.interactions / cells if cells else 0.0

    @classmethod
    def of(cls, users: np.ndarray | pd.Series, items: np.ndarray | pd.Series) -> Statistics:
        """Statistics of parallel arrays of (raw or remapped) user and item ids."""
        users = pd.Series(np.asarray(users))
        counts = users.value_counts().to_numpy()
        if len(counts) == 0:
            return cls(0, 0, 0, 0, 0.0, 0, 0.0)
        return cls(
            users=int(users.nunique()),
            items=int(pd.Series(np.asarray(items)).nunique()),
            interactions=len(users),
            per_user_min=int(counts.min()),
            per_user_mean=float(counts.mean()),
            per_user_max=int(counts.max()),
            per_user_std=float(counts.std()),
        )

    def as_rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs for printing."""
        return [
            ("users", f"{self.users:,}"),
            ("items", f"{self.items:,}"),
            ("interactions", f"{self.interactions:,}"),
            ("sparsity", f"{100 * self.sparsity:.2f}%"),
            (
                "interactions per user (min / mean / max / std)",
                f"{self.per_user_min} / {self.per_user_mean:.2f} / {self.per_user_max} / "
                f"{self.per_user_std:.2f}",
            ),
        ]


@dataclass(frozen=True)
class FilterStep:
    """What one preprocessing step kept and removed."""

    name: str
    detail: str
    rows_before: int
    rows_after: int
    users_before: int
    users_after: int
    items_before: int
    items_after: int

    @property
    def rows_removed(self) -> int:
        return self.rows_before - self.rows_after

    def __str__(self) -> str:
        return (
            f"{self.name} ({self.detail}): removed {self.rows_removed:,} of {self.rows_before:,} "
            f"rows, {self.users_before - self.users_after:,} of {self.users_before:,} users, "
            f"{self.items_before - self.items_after:,} of {self.items_before:,} items"
        )


def _step(name: str, detail: str, before: pd.DataFrame, after: pd.DataFrame) -> FilterStep:
    return FilterStep(
        name=name,
        detail=detail,
        rows_before=len(before),
        rows_after=len(after),
        users_before=int(before["user"].nunique()),
        users_after=int(after["user"].nunique()),
        items_before=int(before["item"].nunique()),
        items_after=int(after["item"].nunique()),
    )


def to_implicit(
    frame: pd.DataFrame, rating_threshold: float | None = None
) -> tuple[pd.DataFrame, FilterStep]:
    """Binarise: keep every row (or those with ``rating >= rating_threshold``) as a positive."""
    if rating_threshold is None:
        return frame, _step("implicit", "every interaction is a positive", frame, frame)
    if frame["rating"].isna().all():
        raise ValueError("rating_threshold was given but the data set has no ratings")
    kept = frame[frame["rating"] >= rating_threshold]
    return kept, _step("implicit", f"ratings >= {rating_threshold} are positives", frame, kept)


def deduplicate(frame: pd.DataFrame) -> tuple[pd.DataFrame, FilterStep]:
    """One row per (user, item): the latest timestamp, ties broken by the later file row."""
    ordered = frame.sort_values(["user", "item", "timestamp", "order"], kind="stable")
    kept = ordered.drop_duplicates(["user", "item"], keep="last").sort_values("order")
    return kept, _step("deduplicate", "one row per (user, item), latest kept", frame, kept)


def filter_min_interactions(
    frame: pd.DataFrame, min_interactions: int
) -> tuple[pd.DataFrame, FilterStep]:
    """Remove users with fewer than ``min_interactions`` rows (items are not filtered)."""
    counts = frame["user"].map(frame["user"].value_counts())
    kept = frame[counts.to_numpy() >= min_interactions]
    detail = f"users with fewer than {min_interactions} interactions removed"
    return kept, _step("min-interactions", detail, frame, kept)


@dataclass
class PreparedData:
    """A data set after the FedNCF protocol: training log, held-out items and fixed negatives.

    Ids are contiguous: users ``0..num_users-1`` (raw ids in ``user_ids``), items
    ``0..num_items-1`` (raw ids in ``item_ids``). Per-user positives are stored as CSR arrays in
    chronological order (tie rule applied), the last one of each user being its test item.
    """

    name: str
    user_ids: np.ndarray
    item_ids: np.ndarray
    indptr: np.ndarray  # (U+1,) offsets into the chronological positives
    items: np.ndarray  # all positives (train + test), per user in chronological order
    timestamps: np.ndarray
    ratings: np.ndarray
    test_negatives: np.ndarray  # (U, num_test_negatives)
    eval_candidates: np.ndarray  # (U, 1 + num_test_negatives), shuffled
    eval_target: np.ndarray  # (U,) column of the test item in eval_candidates
    raw_statistics: Statistics
    report: list[FilterStep]
    seed: int
    user_features: np.ndarray | None = None  # (U, du) float32
    user_feature_names: tuple[str, ...] = ()
    item_features: np.ndarray | None = None  # (I, di) float32
    item_feature_names: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    held_out: int = 1
    """positives held out of training at the end of each user's history: 1 (the test item) or 2
    (the validation item before it, :meth:`with_validation`)."""
    validation_candidates: np.ndarray | None = None
    """(U, 1 + num_test_negatives) the validation item and its fixed negatives, shuffled."""
    validation_target: np.ndarray | None = None
    """(U,) column of the validation item in ``validation_candidates``."""
    _keys: np.ndarray | None = None

    @property
    def num_users(self) -> int:
        return len(self.user_ids)

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    @property
    def test_items(self) -> np.ndarray:
        """(U,) the held-out item of each user (its last positive)."""
        return self.items[self.indptr[1:] - 1]

    @property
    def validation_items(self) -> np.ndarray:
        """(U,) the validation item of each user (its second-to-last positive; needs
        :meth:`with_validation`)."""
        if self.held_out < 2:
            raise ValueError(f"{self.name}: no validation split (see PreparedData.with_validation)")
        return self.items[self.indptr[1:] - 2]

    @property
    def train_mask(self) -> np.ndarray:
        """Boolean mask over ``items``: True for training rows (all but each user's last
        ``held_out``)."""
        mask = np.ones(len(self.items), dtype=bool)
        for back in range(1, self.held_out + 1):
            mask[self.indptr[1:] - back] = False
        return mask

    def with_validation(self) -> PreparedData:
        """This data with each user's second-to-last positive held out of training too, as a
        validation item ranked among fixed negatives (as many as the test's, none of them a
        positive of the user, drawn from their own seeded stream), for choosing a training
        round or epoch without looking at the test items. Training has one positive fewer per
        user; the test items, their negatives and candidates are unchanged."""
        if self.held_out != 1:
            raise ValueError(f"{self.name}: this data already has a validation split")
        counts = np.diff(self.indptr)
        if (counts < 3).any():
            user = int(np.flatnonzero(counts < 3)[0])
            raise ValueError(
                f"{self.name}: user {self.user_ids[user]} has {counts[user]} positives; a "
                "validation split needs 3 (test, validation and at least one to train on)"
            )
        rng = np.random.default_rng([self.seed, 1])
        negatives = sample_test_negatives(self, rng, self.test_negatives.shape[1])
        candidates, target = _shuffled_candidates(self.items[self.indptr[1:] - 2], negatives, rng)
        return dataclasses.replace(
            self,
            held_out=2,
            validation_candidates=candidates,
            validation_target=target,
            _keys=None,
        )

    @property
    def user_of_row(self) -> np.ndarray:
        """The user id of every row of ``items``."""
        return np.repeat(np.arange(self.num_users), np.diff(self.indptr))

    def train(self) -> tuple[np.ndarray, np.ndarray]:
        """(users, items) of the training positives, per user in chronological order."""
        mask = self.train_mask
        return self.user_of_row[mask], self.items[mask]

    def positives(self, user: int) -> np.ndarray:
        """All positives of ``user`` (train + test), chronological."""
        return self.items[self.indptr[user] : self.indptr[user + 1]]

    def item_popularity(self) -> np.ndarray:
        """(I,) number of training positives per item (for popularity baselines)."""
        return np.bincount(self.train()[1], minlength=self.num_items)

    def is_positive(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Whether each (user, item) pair is a logged positive (train or test)."""
        if self._keys is None:
            self._keys = np.sort(self.user_of_row * self.num_items + self.items)
        keys = np.asarray(users, np.int64) * self.num_items + np.asarray(items, np.int64)
        where = np.searchsorted(self._keys, keys)
        where = np.minimum(where, len(self._keys) - 1)
        return self._keys[where] == keys

    def statistics(self) -> Statistics:
        """Statistics after preprocessing (all positives, train + test)."""
        return Statistics.of(self.user_of_row, self.items)


def prepare(
    dataset: LoggedDataset,
    *,
    min_interactions: int = 5,
    rating_threshold: float | None = None,
    num_test_negatives: int = 100,
    seed: int = 0,
) -> PreparedData:
    """Apply the FedNCF protocol (module docstring) to a loaded log."""
    if min_interactions < 2:
        raise ValueError(f"min_interactions must be >= 2 for leave-one-out, got {min_interactions}")
    for what, features in (("user", dataset.user_features), ("item", dataset.item_features)):
        if features is not None and not features.index.is_unique:
            repeated = features.index[features.index.duplicated()].unique()[:5].tolist()
            raise ValueError(
                f"{dataset.name}: the {what} features have more than one row for {what} id(s) "
                f"{repeated}; each {what} needs one row (the loaders check this per file and line)"
            )
    frame = dataset.interactions.copy()
    frame["order"] = np.arange(len(frame), dtype=np.int64)
    raw = Statistics.of(frame["user"], frame["item"])
    report = []
    frame, step = to_implicit(frame, rating_threshold)
    report.append(step)
    frame, step = deduplicate(frame)
    report.append(step)
    frame, step = filter_min_interactions(frame, min_interactions)
    report.append(step)
    if len(frame) == 0:
        raise ValueError(f"{dataset.name}: no user has {min_interactions} or more interactions")

    user_ids = np.sort(frame["user"].unique())
    item_ids = np.sort(frame["item"].unique())
    users = np.searchsorted(user_ids, frame["user"].to_numpy())
    items = np.searchsorted(item_ids, frame["item"].to_numpy())
    order = np.lexsort((frame["order"].to_numpy(), frame["timestamp"].to_numpy(), users))
    users, items = users[order], items[order]
    counts = np.bincount(users, minlength=len(user_ids))
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    prepared = PreparedData(
        name=dataset.name,
        user_ids=user_ids,
        item_ids=item_ids,
        indptr=indptr,
        items=items.astype(np.int64),
        timestamps=frame["timestamp"].to_numpy(np.int64)[order],
        ratings=frame["rating"].to_numpy(np.float64)[order],
        test_negatives=np.empty((0, num_test_negatives), np.int64),
        eval_candidates=np.empty((0, num_test_negatives + 1), np.int64),
        eval_target=np.empty(0, np.int64),
        raw_statistics=raw,
        report=report,
        seed=seed,
        notes=list(dataset.notes),
    )
    rng = np.random.default_rng(seed)
    prepared.test_negatives = sample_test_negatives(prepared, rng, num_test_negatives)
    prepared.eval_candidates, prepared.eval_target = _shuffled_candidates(
        prepared.test_items, prepared.test_negatives, rng
    )
    if dataset.user_features is not None:
        aligned = dataset.user_features.reindex(user_ids).fillna(0)
        prepared.user_features = aligned.to_numpy(np.float32)
        prepared.user_feature_names = tuple(map(str, aligned.columns))
    if dataset.item_features is not None:
        aligned = dataset.item_features.reindex(item_ids).fillna(0)
        prepared.item_features = aligned.to_numpy(np.float32)
        prepared.item_feature_names = tuple(map(str, aligned.columns))
    return prepared


def _shuffled_candidates(
    items: np.ndarray, negatives: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(U, 1 + n) each user's held-out item among its negatives in a random order, and the
    column of the held-out item."""
    candidates = np.concatenate([items[:, None], negatives], axis=1)
    perm = np.argsort(rng.random(candidates.shape), axis=1)
    return np.take_along_axis(candidates, perm, axis=1), np.argmax(perm == 0, axis=1).astype(
        np.int64
    )


def _free_items(positives_sorted: np.ndarray, free_index: np.ndarray) -> np.ndarray:
    """Map indices into the complement of ``positives_sorted`` (in 0..I-1) to item ids."""
    shifted = positives_sorted - np.arange(len(positives_sorted))
    return free_index + np.searchsorted(shifted, free_index, side="right")


def sample_test_negatives(
    prepared: PreparedData, rng: np.random.Generator, num_negatives: int = 100
) -> np.ndarray:
    """(U, num_negatives) distinct items per user, none of them among the user's positives."""
    num_items = prepared.num_items
    out = np.empty((prepared.num_users, num_negatives), dtype=np.int64)
    for user in range(prepared.num_users):
        positives = np.unique(prepared.positives(user))
        free = num_items - len(positives)
        if free < num_negatives:
            raise ValueError(
                f"{prepared.name}: user {prepared.user_ids[user]} has only {free} non-interacted "
                f"items, fewer than the {num_negatives} test negatives required"
            )
        chosen = rng.choice(free, num_negatives, replace=False)
        out[user] = _free_items(positives, chosen)
    return out


@dataclass(frozen=True)
class TrainingSamples:
    """One epoch of training examples: positives and freshly drawn negatives, shuffled."""

    users: np.ndarray
    items: np.ndarray
    labels: np.ndarray  # float32, 1 for positives and 0 for negatives


def sample_training_negatives(
    prepared: PreparedData,
    rng: np.random.Generator,
    num_negatives: int = 4,
    *,
    shuffle: bool = True,
) -> TrainingSamples:
    """An epoch of training samples: every training positive plus ``num_negatives`` negatives.

    Negatives are uniform over the items the user never interacted with (rejection sampling on
    all of the user's positives, so the test item is never a training negative).
    """
    users, items = prepared.train()
    neg_users = np.repeat(users, num_negatives)
    neg_items = rng.integers(0, prepared.num_items, len(neg_users))
    bad = prepared.is_positive(neg_users, neg_items)
    for _ in range(1000):
        if not bad.any():
            break
        neg_items[bad] = rng.integers(0, prepared.num_items, int(bad.sum()))
        bad[bad] = prepared.is_positive(neg_users[bad], neg_items[bad])
    else:
        raise ValueError(f"{prepared.name}: some users have no non-interacted items to sample")
    all_users = np.concatenate([users, neg_users])
    all_items = np.concatenate([items, neg_items])
    labels = np.concatenate([np.ones(len(users), np.float32), np.zeros(len(neg_users), np.float32)])
    if shuffle:
        perm = rng.permutation(len(all_users))
        all_users, all_items, labels = all_users[perm], all_items[perm], labels[perm]
    return TrainingSamples(all_users, all_items, labels)
