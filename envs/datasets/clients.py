"""Every client's local data for the federated recommenders: :class:`ClientData` (CSR arrays).

A client is a user of a prepared logged data set; its data are its training positives (in time
order) and all its positives (sorted, never sampled as negatives). :meth:`ClientData.of` builds
them from a :class:`~fedrec.envs.datasets.preprocess.PreparedData`;
:func:`fedrec.envs.datasets.synthetic_clients.synthetic_clients` builds them in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrec.envs.datasets.preprocess import PreparedData


@dataclass(frozen=True)
class ClientData:
    """Every client's local data as CSR arrays: training positives and all positives (sorted)."""

    train_indptr: np.ndarray
    """(U+1,) offsets of each user's training positives in ``train_items``."""
    train_items: np.ndarray
    """training positives (each user's held-out item excluded), per user chronological."""
    positives_indptr: np.ndarray
    """(U+1,) offsets of each user's positives in ``positives_sorted``."""
    positives_sorted: np.ndarray
    """all positives (train + held-out), per user sorted ascending: never sampled as negatives."""
    num_items: int

    @classmethod
    def of(cls, data: PreparedData) -> ClientData:
        mask = data.train_mask
        train_counts = np.diff(data.indptr) - data.held_out
        users = data.user_of_row
        order = np.lexsort((data.items, users))  # distinct per user after preprocessing
        return cls(
            train_indptr=np.concatenate([[0], np.cumsum(train_counts)]).astype(np.int64),
            train_items=data.items[mask].astype(np.int64),
            positives_indptr=data.indptr.astype(np.int64),
            positives_sorted=data.items[order].astype(np.int64),
            num_items=data.num_items,
        )

    def train_of(self, user: int) -> np.ndarray:
        return self.train_items[self.train_indptr[user] : self.train_indptr[user + 1]]
