"""Synthetic federated users shaped like MovieLens-100K, at any population size, in memory.

:func:`synthetic_clients` builds a :class:`~fedrec.envs.datasets.clients.ClientData` (what
FedNCF trains from) of ``U`` users without files or preprocessing, so that 100,000 users take
seconds: 1,682 items; per-user counts from 20 + a log-normal (sigma = 1), clipped to 737, with a
mean of about 106 (ML-100K: min 20, max 737, mean 106); items picked without replacement with
Zipf-like popularity (weight proportional to rank^-0.8), ranks shuffled over item ids; each
user's held-out item is one of its positives at random. The same seed gives the same users in every process
(the scale benchmarks and the Flower nodes rely on it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedrec.envs.datasets.clients import ClientData

#: MovieLens-100K after FedNCF's preprocessing: items, and per-user interactions (min, max, mean).
ML100K_ITEMS, ML100K_MIN, ML100K_MAX, ML100K_MEAN = 1682, 20, 737, 106.0
#: Zipf exponent of the item popularity (as in fedrec.envs.datasets.synthetic).
POPULARITY_EXPONENT = 0.8


@dataclass(frozen=True)
class Shape:
    """The shape of a synthetic data set apart from its number of users."""

    num_items: int = ML100K_ITEMS
    mean_interactions: float = ML100K_MEAN
    min_interactions: int = ML100K_MIN
    max_interactions: int = ML100K_MAX


def synthetic_clients(
    num_users: int,
    *,
    shape: Shape = Shape(),
    seed: int = 0,
    chunk_users: int = 4096,
) -> ClientData:
    """A ``ClientData`` of ``num_users`` synthetic users shaped like MovieLens-100K (see above).

    Each user draws its count, then that many distinct items with probability ∝ popularity
    (Efraimidis-Spirakis: the items with the smallest Exp(1) / weight keys). Users are processed
    in chunks of similar counts, so a chunk needs a partition and a short sort, not a full sort.
    """
    items_n = shape.num_items
    if num_users < 1:
        raise ValueError(f"num_users must be >= 1, got {num_users}")
    if not 2 <= shape.min_interactions <= shape.max_interactions < items_n:
        raise ValueError("need 2 <= min_interactions <= max_interactions < num_items")
    if not shape.min_interactions < shape.mean_interactions < shape.max_interactions:
        raise ValueError("need min_interactions < mean_interactions < max_interactions")
    rng = np.random.default_rng([seed, 7])
    sigma = 1.0
    mu = math.log(shape.mean_interactions - shape.min_interactions) - sigma**2 / 2
    counts = shape.min_interactions + np.rint(rng.lognormal(mu, sigma, num_users)).astype(np.int64)
    np.clip(counts, shape.min_interactions, shape.max_interactions, out=counts)
    weight = (np.arange(1, items_n + 1, dtype=np.float64) ** -POPULARITY_EXPONENT)[
        rng.permutation(items_n)
    ]
    inverse_weight = (1.0 / weight).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    items = np.empty(int(indptr[-1]), np.int64)
    by_count = np.argsort(counts, kind="stable")
    for lo in range(0, num_users, chunk_users):
        users = by_count[lo : lo + chunk_users]
        n = counts[users]
        top = int(n.max())
        keys = rng.standard_exponential((len(users), items_n), dtype=np.float32)
        keys *= inverse_weight
        if top < items_n:
            candidates = np.argpartition(keys, top - 1, axis=1)[:, :top]
        else:
            candidates = np.broadcast_to(np.arange(items_n), keys.shape)
        ranked = np.take_along_axis(
            candidates,
            np.argsort(np.take_along_axis(keys, candidates, axis=1), axis=1),
            axis=1,
        )
        take = np.arange(top)[None, :] < n[:, None]
        owner = np.repeat(users, n)
        within = np.nonzero(take)[1]
        items[indptr[owner] + within] = ranked[take]
    # the held-out (last) positive: one of the user's items at random
    last = indptr[1:] - 1
    pick = indptr[:-1] + (rng.random(num_users) * counts).astype(np.int64)
    held_out = items[pick].copy()
    items[pick] = items[last]
    items[last] = held_out
    owner = np.repeat(np.arange(num_users, dtype=np.int64), counts)
    positives_sorted = np.sort(owner * items_n + items) - owner * items_n
    train_mask = np.ones(len(items), dtype=bool)
    train_mask[last] = False
    return ClientData(
        train_indptr=np.concatenate([[0], np.cumsum(counts - 1)]).astype(np.int64),
        train_items=items[train_mask],
        positives_indptr=indptr,
        positives_sorted=positives_sorted,
        num_items=items_n,
    )
