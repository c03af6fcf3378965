"""A round's local training examples: every client's positives and fresh uniform negatives,
every local epoch, shuffled (:func:`sample_round`, all clients in a few vectorised calls).

Each client rebuilds its local set every local epoch: its training positives plus
``num_negatives`` negatives per positive drawn uniformly from the items it never interacted
with. :func:`round_rng` is the sampling stream of one aggregation round.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from fedrec.envs.datasets.clients import ClientData

__all__ = ["ClientData", "RoundSamples", "round_rng", "sample_round"]


def _segments(indptr: np.ndarray, values: np.ndarray, users: np.ndarray) -> tuple[np.ndarray, ...]:
    """(values, owner position, index within owner) of the CSR segments of ``users``."""
    starts, lengths = indptr[users], indptr[users + 1] - indptr[users]
    owner = np.repeat(np.arange(len(users)), lengths)
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    within = np.arange(int(lengths.sum())) - first[owner]
    return values[starts[owner] + within], owner, within


@dataclass(frozen=True)
class RoundSamples:
    """The local training examples of a round's clients, all local epochs (S examples)."""

    users: np.ndarray
    """(C,) the clients (user ids)."""
    samples: np.ndarray
    """(C,) n_k: examples per local epoch (positives plus negatives)."""
    client: np.ndarray
    """(S,) position of each example's client in ``users``."""
    epoch: np.ndarray
    """(S,) local epoch of each example."""
    position: np.ndarray
    """(S,) place of the example in its client's shuffled epoch (0..n_k-1)."""
    items: np.ndarray
    """(S,) item ids."""
    labels: np.ndarray
    """(S,) float32 1 for positives, 0 for negatives."""

    def client_epochs(self, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """(items, labels) of client ``k``'s local epochs, in training order."""
        out = []
        for epoch in range(int(self.epoch.max()) + 1):
            rows = np.flatnonzero((self.client == k) & (self.epoch == epoch))
            rows = rows[np.argsort(self.position[rows])]
            out.append((self.items[rows], self.labels[rows]))
        return out


def round_rng(seed: int, aggregation_round: int) -> np.random.Generator:
    """The local-sampling stream of one aggregation round."""
    return np.random.default_rng([seed, 3, aggregation_round])


def sample_round(
    clients: ClientData,
    users: np.ndarray,
    rng: np.random.Generator,
    *,
    num_negatives: int,
    local_epochs: int,
) -> RoundSamples:
    """Every local epoch of every client: its positives + fresh uniform negatives, shuffled.

    Negatives are drawn uniformly (with replacement) from the items the client never interacted
    with, by indexing the complement of its sorted positives directly (no rejection loop); all
    clients are sampled together in a few vectorised calls.
    """
    users = np.asarray(users, dtype=np.int64)
    num_items, count = clients.num_items, len(users)
    positives, pos_owner, _ = _segments(clients.train_indptr, clients.train_items, users)
    known, known_owner, _ = _segments(clients.positives_indptr, clients.positives_sorted, users)
    n_known = np.bincount(known_owner, minlength=count)
    free = num_items - n_known
    if np.any(free < 1):
        raise ValueError(f"user {users[free < 1][0]} interacted with every item; no negatives")
    # complement indexing: the f-th free item of a client is the f-th entry of its row of the
    # (clients x items) table of free items, read in ascending order
    is_free = np.ones(count * num_items, dtype=bool)
    is_free[known_owner * num_items + known] = False
    free_items = np.flatnonzero(is_free)
    free_start = np.zeros(count, np.int64)
    np.cumsum(free[:-1], out=free_start[1:])
    n_pos = np.bincount(pos_owner, minlength=count)
    neg_owner = np.repeat(np.arange(count), n_pos * num_negatives)
    neg_free = free[neg_owner]
    neg_base = free_start[neg_owner]
    neg_offset = neg_owner * num_items
    owner = np.concatenate([pos_owner, neg_owner])
    num_pos, size = len(pos_owner), len(owner)
    samples = n_pos * (1 + num_negatives)
    group_start = np.zeros(count, np.int64)
    np.cumsum(samples[:-1], out=group_start[1:])
    arange = np.arange(size)
    total = local_epochs * size
    client = np.empty(total, np.int64)
    position = np.empty(total, np.int64)
    items = np.empty(total, np.int64)
    labels_all = np.empty(total, np.float32)
    pool = np.empty(size, np.int64)
    pool[:num_pos] = positives
    # the pool grouped by client, for the shuffles (see _shuffle_order)
    by_owner = np.argsort(owner.astype(np.uint16) if count < 2**16 else owner, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(samples)]).tolist()
    for epoch in range(local_epochs):
        index = (rng.random(len(neg_owner)) * neg_free).astype(np.int64)
        index += neg_base
        negatives = free_items.take(index)
        np.subtract(negatives, neg_offset, out=pool[num_pos:])
        order = _shuffle_order(owner + rng.random(size), by_owner, bounds)
        part = slice(epoch * size, (epoch + 1) * size)
        owner_sorted = owner.take(order)
        client[part] = owner_sorted
        np.subtract(arange, group_start.take(owner_sorted), out=position[part])
        pool.take(order, out=items[part])
        np.less(order, num_pos, out=labels_all[part])
    epoch_of = np.repeat(np.arange(local_epochs), size)
    return RoundSamples(users, samples, client, epoch_of, position, items, labels_all)


def _shuffle_order(keys: np.ndarray, by_owner: np.ndarray, bounds: list[int]) -> np.ndarray:
    """``np.argsort(keys)`` for keys ``owner + uniform[0, 1)``, sorting each client's keys apart.

    ``by_owner`` lists the positions client after client, ``bounds`` where each client's start.
    When the keys are distinct the sorted order is unique, so this is exactly ``np.argsort(keys)``
    (checked on the result); with a tie, it is ``np.argsort(keys)`` itself.
    """
    grouped = keys.take(by_owner)
    local = np.empty(len(keys), np.int64)
    for lo, hi in itertools.pairwise(bounds):
        np.add(grouped[lo:hi].argsort(), lo, out=local[lo:hi])
    order = by_owner.take(local)
    ordered = keys.take(order)
    if not np.all(ordered[1:] > ordered[:-1]):
        return np.argsort(keys)
    return order
