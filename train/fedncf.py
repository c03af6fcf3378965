"""FedNCF training: federated GMF/MLP/NeuMF with a batched client simulation, and centralised NCF.

Federated protocol (``docs/fedncf.md`` §2): every user is a client holding its own interactions
and its own user embedding row, which never leaves it (simulated by a private per-user store). In
each *aggregation round* the server picks ``clients_per_round`` clients, sends them the global item
table(s) and network weights; each client rebuilds its local set (its training positives plus
``num_negatives`` fresh uniform negatives per positive, every local epoch), trains for
``local_epochs`` epochs, and uploads its touched item rows, network weights and n_k; the server
aggregates (:mod:`fedrec.federation.aggregators`).

**Units.** A *global round* is one pass over all clients: the users are permuted and split into
``ceil(U / clients_per_round)`` aggregation rounds of ``clients_per_round`` or one fewer clients,
so every user trains exactly once per global round. FedNCF's "400 epochs" are 400 global rounds
(≈ 19k aggregation rounds on ML-100K with 20 clients), not 400 aggregation rounds.

**Optimiser.** Adam (lr 1e-3) on the network weights and, lazily, on embedding rows
(``torch.optim.SparseAdam``, as for ``nn.Embedding(sparse=True)``): a row moves only on steps
whose batch contains it. The batch size (not given by FedNCF) defaults to 64 on clients and 256
(NCF's default) centrally. FedNCF does not say what a client's Adam state is. By default
(``client_optimizer="federated"``, :class:`FederatedOptimizerState`) the Adam state of the item
rows and network is federated like the weights: sent with them, continued by the clients and
aggregated by the server's rule, while a user row's state stays on its client; with one client per
round this is one Adam over all clients' batches. ``"persistent"`` lets each client keep its own
Adam state across its participations (:class:`ClientOptimizerStore`); ``"fresh"`` gives it a new
Adam every participation (the paper's literal reading).

**Batched simulation.** :func:`train_round_batched` trains a round's clients together: their
network weights and user rows are stacked into one (C, ·) array, their item rows into one flat
table (each client only holds the rows it will touch), and each step runs all clients' batches
through stacked NumPy ``matmul``/gathers with hand-written gradients and a vectorised
(Sparse)Adam (NumPy because its per-call overhead is several times PyTorch's at these tiny
sizes). Sampling and batch layout for all clients take a few vectorised calls per round. Clients are
sorted by their number of local steps, so the clients still training at any step are a prefix of
the stack. :func:`train_round_reference` is the plain per-client loop (an :class:`NCF` module,
``torch.optim``'s optimisers, autograd) that the batched version is tested against.
``simulation="compiled"`` (:mod:`fedrec.train.fedncf_compiled`) trains a round in one Numba
kernel call instead, clients in parallel, 2-3x faster, tested against the same reference.
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
import math
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.agents.ncf import NCF, NCFConfig, make_optimizers
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.envs.datasets.clients import ClientData
from fedrec.envs.datasets.preprocess import PreparedData, sample_training_negatives
from fedrec.eval.ranking_metrics import RankingResult
from fedrec.federation.aggregators import ClientUpdates
from fedrec.federation.registry import AGGREGATOR_NAMES, make_aggregator
from fedrec.train.core import Trainer, progress_bar

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8


# ------------------------------------------------------------------------------------------------
# Configurations and results


#: Fraction bits of the Adam moments under MF-SecAvg (64-bit words: steps of 1.8e-15, values
#: up to 2^(63-46) / clients).
MOMENT_FRACTION_BITS = 46

#: The arrays of a checkpointed :class:`FederatedOptimizerState`.
FEDERATED_STATE = ("user_moments", "network_moments", "item_moments")

#: How the clients of a round are simulated (:attr:`FedNCFConfig.simulation`).
SIMULATIONS: tuple[str, ...] = ("batched", "compiled", "reference")

#: How a client's Adam state lives between participations (:attr:`FedNCFConfig.client_optimizer`).
CLIENT_OPTIMIZERS: tuple[str, ...] = ("federated", "persistent", "fresh")


@dataclass(frozen=True)
class FedNCFConfig:
    """One federated training run (defaults: FedNCF on ML-100K)."""

    model: NCFConfig = field(default_factory=NCFConfig)
    """the NCF architecture (GMF, MLP or NeuMF)."""
    aggregator: str = "mf-fedavg"
    """server rule: "simpleavg", "fedavg", "mf-fedavg" or "mf-secavg"."""
    global_rounds: int = 400
    """passes over all clients (FedNCF's "epochs"); ignored when aggregation_rounds is set."""
    aggregation_rounds: int | None = None
    """if set, train exactly this many aggregation rounds instead (the other unit)."""
    clients_per_round: int = 20
    """c: clients selected per aggregation round (FedNCF: 20 for ML-100K)."""
    local_epochs: int = 2
    """local epochs per participation."""
    batch_size: int = 64
    """local mini-batch size (FedNCF does not give one)."""
    lr: float = 1e-3
    """Adam learning rate."""
    num_negatives: int = 4
    """sampled negatives per training positive, redrawn every local epoch."""
    eval_every: int = 10
    """evaluate HR@10/NDCG@10 every this many global rounds (0: only at the end)."""
    validation: bool = False
    """hold each user's second-to-last positive out of training as a validation item, rank it at
    every evaluation, and report the test metrics of the round with the best validation HR@K
    (:attr:`TrainResult.selected`); the paper reports the last round's."""
    top_k: int = 10
    """K of HR@K and NDCG@K."""
    seed: int = 0
    """seeds initialisation, client selection and local sampling."""
    simulation: Literal["batched", "compiled", "reference"] = "batched"
    """client simulation: "batched" (stacked NumPy arrays, every client in lockstep), "compiled"
    (a Numba kernel, clients in parallel; about 2-3x faster, needs ``fedrec[fast]``; float32
    rounding differs, so its runs differ from batched ones) or "reference" (the per-client
    ``torch.optim`` loop, slow)."""
    client_optimizer: Literal["federated", "persistent", "fresh"] = "federated"
    """federated: the Adam state of the item rows and network is federated like the weights (sent
    with them, continued by the clients, aggregated by the server's rule) and each user row's stays
    on its client (:class:`FederatedOptimizerState`; the best measured); persistent: each client
    keeps its own Adam state across its participations; fresh: a new Adam every participation
    (the paper's literal reading; docs/fedncf.md, "Client optimiser state")."""
    selection: Literal["permutation", "cohorts"] = "permutation"
    """client selection: "permutation" splits a fresh random permutation of the clients into the
    aggregation rounds of every global round; "cohorts" draws that split once, at the first
    global round, and afterwards only shuffles the order of the same groups (fixed cohorts: with
    MF-SecAvg each pair of neighbours agrees on a key once per run, docs/secure_aggregation.md)."""

    def __post_init__(self) -> None:
        if self.aggregator.lower() not in AGGREGATOR_NAMES:
            raise ValueError(
                f"aggregator must be one of {AGGREGATOR_NAMES}, got {self.aggregator!r}"
            )
        positive = {
            "clients_per_round": self.clients_per_round,
            "local_epochs": self.local_epochs,
            "batch_size": self.batch_size,
            "num_negatives": self.num_negatives,
            "top_k": self.top_k,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.aggregation_rounds is None and self.global_rounds < 1:
            raise ValueError(f"global_rounds must be >= 1, got {self.global_rounds}")
        if self.aggregation_rounds is not None and self.aggregation_rounds < 1:
            raise ValueError(f"aggregation_rounds must be >= 1, got {self.aggregation_rounds}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
        if self.simulation not in SIMULATIONS:
            raise ValueError(f"simulation must be one of {SIMULATIONS}, got {self.simulation!r}")
        if self.client_optimizer not in CLIENT_OPTIMIZERS:
            raise ValueError(
                f"client_optimizer must be one of {CLIENT_OPTIMIZERS}, got {self.client_optimizer!r}"
            )
        if self.selection not in ("permutation", "cohorts"):
            raise ValueError(
                f"selection must be 'permutation' or 'cohorts', got {self.selection!r}"
            )

    def rounds_per_global(self, num_users: int) -> int:
        """Aggregation rounds in one global round: ceil(U / clients_per_round)."""
        return math.ceil(num_users / min(self.clients_per_round, num_users))

    def total_aggregation_rounds(self, num_users: int) -> int:
        """The run's length in aggregation rounds."""
        if self.aggregation_rounds is not None:
            return self.aggregation_rounds
        return self.global_rounds * self.rounds_per_global(num_users)


@dataclass(frozen=True)
class CentralConfig:
    """One centralised training run on the pooled data (the upper bound)."""

    model: NCFConfig = field(default_factory=NCFConfig)
    """the NCF architecture (GMF, MLP or NeuMF)."""
    epochs: int = 20
    """passes over the pooled training data (fresh negatives each)."""
    batch_size: int = 256
    """mini-batch size (NCF's default)."""
    lr: float = 1e-3
    """Adam learning rate."""
    num_negatives: int = 4
    """sampled negatives per training positive, redrawn every epoch."""
    eval_every: int = 1
    """evaluate every this many epochs (0: only at the end)."""
    validation: bool = False
    """hold out a validation item per user and select the epoch on it (:class:`FedNCFConfig`)."""
    top_k: int = 10
    """K of HR@K and NDCG@K."""
    seed: int = 0
    """seeds initialisation and sampling."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "num_negatives", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")


@dataclass(frozen=True)
class EvalPoint:
    """HR@K / NDCG@K after a number of global rounds (or epochs)."""

    global_round: float
    """global rounds (federated) or epochs (centralised) completed."""
    aggregation_round: int
    """aggregation rounds completed (equal to epochs when centralised)."""
    hit_rate: float
    ndcg: float
    seconds: float
    """training wall time so far (evaluation excluded)."""
    validation_hit_rate: float | None = None
    """HR@K of the validation items (None without a validation split)."""
    validation_ndcg: float | None = None


def select_by_validation(history: Sequence[EvalPoint]) -> EvalPoint | None:
    """The evaluation point with the best validation HR@K (the earliest of equals; NDCG@K
    breaks ties of HR@K), or None without validation metrics."""
    scored = [p for p in history if p.validation_hit_rate is not None]
    if not scored:
        return None
    return max(scored, key=lambda p: (p.validation_hit_rate, p.validation_ndcg or 0.0))


@dataclass
class TrainResult:
    """What a training run produced: the model, its learning curve and costs."""

    model: NCF
    history: list[EvalPoint]
    final: RankingResult
    train_seconds: float
    aborted_rounds: int = 0
    """MF-SecAvg rounds aborted because too many clients dropped (global model kept)."""
    participations: int = 0
    """client participations in all (a client trained in a round)"""
    client_samples: int = 0
    """sum of n_k over the participations (for the per-client cost); a running total, not a
    list: a list grows by U entries per global round and every checkpoint would copy it"""
    aggregation_seconds: float = 0.0
    """time spent in the aggregator (server side, plus client masking for MF-SecAvg)."""

    @property
    def selected(self) -> EvalPoint | None:
        """With a validation split: the evaluation point with the best validation HR@K, whose
        test metrics are the run's model-selected result (:func:`select_by_validation`)."""
        return select_by_validation(self.history)


# ------------------------------------------------------------------------------------------------
# Client data and local sampling


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


# ------------------------------------------------------------------------------------------------
# Client optimiser state kept across participations ("persistent")


class AdamStateStore(abc.ABC):
    """Where the clients' Adam state lives between rounds (``client_optimizer`` other than
    "fresh"): the batched simulation loads a round's starting state and saves its final one."""

    def __init__(self) -> None:
        self._corrections = np.ones((2, 1))  # 1 - beta1**s, 1 - beta2**s for s = 0, 1, ...

    def bias_corrections(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(1 - beta1**s, 1 - beta2**s) for the step counts ``steps``, as Python floats compute them.

        The table of every count so far is extended as counts grow (one ``**`` per new count).
        """
        top = int(steps.max()) + 1
        known = self._corrections.shape[1]
        if top > known:
            new = range(known, max(top, 2 * known))
            more = [[1 - BETA1**n for n in new], [1 - BETA2**n for n in new]]
            self._corrections = np.concatenate([self._corrections, np.array(more)], 1)
        return self._corrections[0].take(steps), self._corrections[1].take(steps)

    @abc.abstractmethod
    def load(
        self, users: np.ndarray, row_client: np.ndarray, row_item: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The round's starting Adam state: (C, D) m and v of the stacked ``users``' [user row |
        network], (R, 2E) [m | v] of the flat item rows (client ``users[row_client]``, item
        ``row_item``) and each client's step count so far (C,)."""

    @abc.abstractmethod
    def save(
        self,
        users: np.ndarray,
        row_client: np.ndarray,
        row_item: np.ndarray,
        *,
        dense_m: np.ndarray,
        dense_v: np.ndarray,
        item_mv: np.ndarray,
        local_steps: np.ndarray,
    ) -> None:
        """Keep the round's final Adam state (the inverse of :meth:`load`)."""


class ClientOptimizerStore(AdamStateStore):
    """Every client's Adam state between its participations (``client_optimizer="persistent"``).

    This is client-side state that never leaves the client: the moments of its user row, of its
    copy of the network weights and of every item row it has touched, and its step count. Both
    optimisers step on every local batch and every embedding table gets a gradient on every
    batch, so one count per client serves SparseAdam's and Adam's bias corrections. Parameters are
    not kept here: they come from the server (items, network) and the private user store.

    A store serves one simulation. :func:`train_round_batched` keeps the state as stacked arrays
    (``steps``, ``dense_m``/``dense_v`` over ``[user row | network]``, ``item_moments``
    ``[m | v]`` per client and item; zero until first used, so pages are allocated as clients
    touch rows), :func:`train_round_reference` as each client's ``torch.optim`` state dicts.
    """

    def __init__(self, config: NCFConfig, *, num_users: int, num_items: int) -> None:
        super().__init__()
        width = config.item_width
        self.steps = np.zeros(num_users, np.int64)
        """(U,) local steps each client has taken so far."""
        self.dense_m = np.zeros((num_users, width + config.network_size), np.float32)
        """(U, D) first moments of each client's [user row | network]."""
        self.dense_v = np.zeros_like(self.dense_m)
        """(U, D) second moments of each client's [user row | network]."""
        self.item_moments = np.zeros((num_users, num_items, 2 * width), np.float32)
        """(U, I, 2E) each client's [m | v] of every item row (zero until it touches the row)."""
        self.torch_states: dict[int, list[dict]] = {}
        """the reference's state dicts (SparseAdam, Adam) per user."""

    def load(
        self, users: np.ndarray, row_client: np.ndarray, row_item: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The round's starting Adam state: (C, D) m and v of the stacked ``users``' [user row |
        network], (R, 2E) [m | v] of the flat item rows (client ``users[row_client]``, item
        ``row_item``) and each client's step count so far (C,)."""
        rows = users[row_client] * self.item_moments.shape[1] + row_item
        item_mv = self.item_moments.reshape(-1, self.item_moments.shape[2]).take(rows, axis=0)
        return self.dense_m[users], self.dense_v[users], item_mv, self.steps[users]

    def save(
        self,
        users: np.ndarray,
        row_client: np.ndarray,
        row_item: np.ndarray,
        *,
        dense_m: np.ndarray,
        dense_v: np.ndarray,
        item_mv: np.ndarray,
        local_steps: np.ndarray,
    ) -> None:
        """Keep the round's final Adam state on its clients (the inverse of :meth:`load`)."""
        rows = users[row_client] * self.item_moments.shape[1] + row_item
        self.item_moments.reshape(-1, self.item_moments.shape[2])[rows] = item_mv
        self.dense_m[users], self.dense_v[users] = dense_m, dense_v
        self.steps[users] += local_steps


class FederatedOptimizerState(AdamStateStore):
    """The Adam state of the shared parameters, federated like them (``client_optimizer="federated"``).

    Why: with a client-owned Adam (fresh or persistent) every client divides its gradients by its
    own second moments, so each client's first steps on a row are about lr·sign(g) however small
    g is, and the average of 20 such sign-like steps is not an Adam step of the average gradient.
    FedMLP's item rows then drift (docs/fedncf.md, "Client optimiser state"). Here the server keeps
    the moments [m | v] of every item row and of the network and one step count, and sends them
    with the weights; each client continues Adam from them over its local steps and uploads its
    moments with its weights; the server aggregates them with the round's rule (MF-FedAvg: an item
    row's moments over the clients that touched it; the network's weighted by n_k) and advances the
    count by the round's longest client. A user row's moments are private and stay on its client,
    like the row. With one client per round this is one Adam over all clients' batches in turn.

    The moments travel as columns appended to the item table and network (download and upload
    three times the weights); they are functions of the clients' gradients like the weights, so
    they take the same aggregation path as the weights.
    """

    def __init__(self, config: NCFConfig, *, num_users: int, num_items: int) -> None:
        super().__init__()
        width = config.item_width
        self.step_count = 0
        """global Adam step count (advanced by the longest client of each round)."""
        self.user_moments = np.zeros((num_users, 2 * width), np.float32)
        """(U, 2E) [m | v] of each client's private user row (never sent)."""
        self.network_moments = np.zeros(2 * config.network_size, np.float32)
        """(2N,) the global [m | v] of the network weights."""
        self.item_moments = np.zeros((num_items, 2 * width), np.float32)
        """(I, 2E) the global [m | v] of every item row."""
        self.uploads: tuple[np.ndarray, np.ndarray, int] | None = None
        """the last round's (C, 2N) network [m | v], (R, 2E) item-row [m | v] and longest client."""

    def load(
        self, users: np.ndarray, row_client: np.ndarray, row_item: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        width = self.user_moments.shape[1] // 2
        network_m, network_v = np.split(self.network_moments, 2)
        user = self.user_moments[users]
        c = len(users)
        dense_m = np.concatenate(
            [user[:, :width], np.broadcast_to(network_m, (c, network_m.size))], 1
        )
        dense_v = np.concatenate(
            [user[:, width:], np.broadcast_to(network_v, (c, network_v.size))], 1
        )
        steps = np.full(c, self.step_count, np.int64)
        return dense_m, dense_v, self.item_moments.take(row_item, axis=0), steps

    def save(
        self,
        users: np.ndarray,
        row_client: np.ndarray,
        row_item: np.ndarray,
        *,
        dense_m: np.ndarray,
        dense_v: np.ndarray,
        item_mv: np.ndarray,
        local_steps: np.ndarray,
    ) -> None:
        width = self.user_moments.shape[1] // 2
        self.user_moments[users] = np.concatenate([dense_m[:, :width], dense_v[:, :width]], 1)
        network_mv = np.concatenate([dense_m[:, width:], dense_v[:, width:]], 1)
        self.uploads = (network_mv, np.array(item_mv, np.float32), int(local_steps.max()))

    def _table_columns(self, model: NCF) -> list[tuple[torch.nn.Parameter, bool, slice]]:
        """(weight, is the user table, its columns in the combined [GMF | MLP] rows) per table."""
        gmf, mlp = model.config.gmf_dim, model.config.mlp_dim
        tables = (
            (model.user_gmf, True, slice(0, gmf)),
            (model.item_gmf, False, slice(0, gmf)),
            (model.user_mlp, True, slice(gmf, gmf + mlp)),
            (model.item_mlp, False, slice(gmf, gmf + mlp)),
        )
        return [(table.weight, user, cols) for table, user, cols in tables if table is not None]

    def start_client(self, model: NCF, optimizers: list[torch.optim.Optimizer], user: int) -> None:
        """Set a reference client's (SparseAdam, Adam) state from the global moments and its
        private user row's (the torch.optim form of :meth:`load`)."""
        width = self.user_moments.shape[1] // 2
        item_m, item_v = self.item_moments[:, :width], self.item_moments[:, width:]
        user_m, user_v = (
            self.user_moments[user : user + 1, :width],
            self.user_moments[user : user + 1, width:],
        )
        for weight, is_user, cols in self._table_columns(model):
            m, v = (user_m, user_v) if is_user else (item_m, item_v)
            optimizers[0].state[weight] = {
                "step": self.step_count,
                "exp_avg": torch.from_numpy(m[:, cols].copy()),
                "exp_avg_sq": torch.from_numpy(v[:, cols].copy()),
            }
        network_m, network_v = np.split(self.network_moments, 2)
        at = 0
        for param in model.network_parameters():
            n = param.numel()
            optimizers[1].state[param] = {
                "step": torch.tensor(float(self.step_count)),
                "exp_avg": torch.from_numpy(network_m[at : at + n].reshape(param.shape).copy()),
                "exp_avg_sq": torch.from_numpy(network_v[at : at + n].reshape(param.shape).copy()),
            }
            at += n

    def finish_client(
        self,
        model: NCF,
        optimizers: list[torch.optim.Optimizer],
        user: int,
        touched: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Keep a reference client's user-row moments; return its uploads: the network's [m | v]
        (2N,), the touched item rows' [m | v] (R_k, 2E) and its number of local steps."""
        width = self.user_moments.shape[1] // 2
        rows = torch.from_numpy(touched)
        item_mv = np.zeros((len(touched), 2 * width), np.float32)
        steps = 0
        for weight, is_user, cols in self._table_columns(model):
            state = optimizers[0].state[weight]
            steps = int(state["step"]) - self.step_count
            m, v = state["exp_avg"], state["exp_avg_sq"]
            if is_user:
                self.user_moments[user, cols] = m[0].numpy()
                self.user_moments[user, width + cols.start : width + cols.stop] = v[0].numpy()
            else:
                item_mv[:, cols] = m[rows].numpy()
                item_mv[:, width + cols.start : width + cols.stop] = v[rows].numpy()
        states = [optimizers[1].state[p] for p in model.network_parameters()]
        network_mv = torch.cat(
            [torch.cat([s[key].reshape(-1) for s in states]) for key in ("exp_avg", "exp_avg_sq")]
        )
        return network_mv.numpy(), item_mv, steps

    def aggregate(
        self,
        aggregator: Any,
        *,
        items: torch.Tensor,
        network: torch.Tensor,
        updates: ClientUpdates,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Aggregate the round's weights and moments, keep the new global moments and return the
        new (items, network). A plain rule takes the moments as extra columns of one call;
        MF-SecAvg takes them in the weights' protocol run (:meth:`MFSecAvg.aggregate_with`: one
        set of masks and shares), as 64-bit words with :data:`MOMENT_FRACTION_BITS` fraction
        bits (second moments go down to ~1e-12, below the weights' fixed-point step). If a round
        aborts, nothing changes (the trainer keeps its global model)."""
        if self.uploads is None:
            raise RuntimeError("no round trained since the last aggregation")
        network_mv, item_mv, longest = self.uploads
        self.uploads = None
        network_mv, item_mv = torch.from_numpy(network_mv), torch.from_numpy(item_mv)
        item_moments = torch.from_numpy(self.item_moments)
        network_moments = torch.from_numpy(self.network_moments)
        width, size = items.shape[1], network.shape[0]
        if aggregator.name == "mf-secavg":
            from fedrec.federation.secagg import SecureTables

            moments = dataclasses.replace(updates, network=network_mv, item_rows=item_mv)
            companion = SecureTables(
                item_moments, network_moments, moments, fraction_bits=MOMENT_FRACTION_BITS
            )
            (new_items, new_network), (new_item_mv, new_network_mv) = aggregator.aggregate_with(
                items=items, network=network, updates=updates, companion=companion
            )
        else:
            joint = dataclasses.replace(
                updates,
                network=torch.cat([updates.network, network_mv], 1),
                item_rows=torch.cat([updates.item_rows, item_mv], 1),
            )
            new_items, new_network = aggregator.aggregate(
                items=torch.cat([items, item_moments], 1),
                network=torch.cat([network, network_moments]),
                updates=joint,
            )
            new_items, new_item_mv = new_items[:, :width].contiguous(), new_items[:, width:]
            new_network, new_network_mv = new_network[:size].contiguous(), new_network[size:]
        self.item_moments = new_item_mv.numpy().astype(np.float32)
        self.network_moments = new_network_mv.numpy().astype(np.float32)
        # second moments are means of non-negative values; keep rounding from making one negative
        np.maximum(self.item_moments[:, width:], 0, out=self.item_moments[:, width:])
        np.maximum(self.network_moments[size:], 0, out=self.network_moments[size:])
        self.step_count += longest
        return new_items, new_network


def _adam_factors(
    bc1: np.ndarray, bc2: np.ndarray, *, lr: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Float32 (SparseAdam step size lr·sqrt(bc2)/bc1, Adam step size lr/bc1, sqrt(bc2),
    eps/sqrt(bc2)) from the bias corrections, computed in float64 as the fresh path's scalars are.
    """
    sqrt_bc2 = np.sqrt(bc2)
    item_lr, dense_lr = lr * sqrt_bc2 / bc1, lr / bc1
    return tuple(x.astype(np.float32) for x in (item_lr, dense_lr, sqrt_bc2, EPS / sqrt_bc2))


# ------------------------------------------------------------------------------------------------
# The reference client: one NCF module and torch.optim per client


def train_round_reference(
    config: NCFConfig,
    *,
    round_samples: RoundSamples,
    user_rows: torch.Tensor,
    items: torch.Tensor,
    network: torch.Tensor,
    lr: float,
    batch_size: int,
    optimizer_store: AdamStateStore | None = None,
) -> tuple[ClientUpdates, torch.Tensor]:
    """Train the round's clients one after another with ``torch.optim`` (the reference).

    ``user_rows`` (C, E) are the clients' private rows; returns the uploads and the new rows. With
    an ``optimizer_store`` each client's optimisers start from the state dicts it saved at its
    previous participation (fresh ones otherwise) and save theirs after training.
    """
    networks, new_rows, row_client, row_item, item_rows = [], [], [], [], []
    moment_uploads: list[tuple[np.ndarray, np.ndarray, int]] = []
    federated = isinstance(optimizer_store, FederatedOptimizerState)
    num_items = items.shape[0]
    for k in range(len(round_samples.users)):
        epochs = round_samples.client_epochs(k)
        model = NCF(config, num_users=1, num_items=num_items)
        model.load_federated(user_table=user_rows[k : k + 1], item_table=items, network=network)
        optimizers = make_optimizers(model, lr=lr)
        client_id = int(round_samples.users[k])
        if federated:
            optimizer_store.start_client(model, optimizers, client_id)
        elif (
            isinstance(optimizer_store, ClientOptimizerStore)
            and client_id in optimizer_store.torch_states
        ):
            saved = optimizer_store.torch_states[client_id]
            for optimizer, state in zip(optimizers, saved, strict=True):
                optimizer.load_state_dict(state)
        for batch_items, batch_labels in _batches(epochs, batch_size):
            user = torch.zeros(len(batch_items), dtype=torch.int64)
            logits = model(user, torch.from_numpy(batch_items))
            loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch_labels))
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
        touched = np.unique(np.concatenate([e[0] for e in epochs]))
        if federated:
            moment_uploads.append(
                optimizer_store.finish_client(model, optimizers, client_id, touched)
            )
        elif isinstance(optimizer_store, ClientOptimizerStore):
            optimizer_store.torch_states[client_id] = [o.state_dict() for o in optimizers]
        networks.append(model.network_vector())
        new_rows.append(model.user_table()[0])
        row_client.append(np.full(len(touched), k))
        row_item.append(touched)
        item_rows.append(model.item_table()[torch.from_numpy(touched)])
    updates = ClientUpdates(
        clients=round_samples.users.copy(),
        num_samples=round_samples.samples.copy(),
        network=torch.stack(networks),
        row_client=torch.from_numpy(np.concatenate(row_client)),
        row_item=torch.from_numpy(np.concatenate(row_item)),
        item_rows=torch.cat(item_rows),
        num_items=num_items,
    )
    if federated:
        network_mv, item_mv, steps = zip(*moment_uploads, strict=True)
        optimizer_store.uploads = (np.stack(network_mv), np.concatenate(item_mv), max(steps))
    return updates, torch.stack(new_rows)


def _batches(
    epochs: list[tuple[np.ndarray, np.ndarray]], batch_size: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for items, labels in epochs:
        for start in range(0, len(items), batch_size):
            out.append((items[start : start + batch_size], labels[start : start + batch_size]))
    return out


# ------------------------------------------------------------------------------------------------
# The batched simulation


@dataclass
class _RoundPlan:
    """A round's examples packed for lockstep training (clients sorted by local steps, desc).

    Step t trains the first ``active[t]`` clients of the stack on one batch each; its entries are
    ``[offsets[t], offsets[t+1])`` of the packed arrays, laid out (active[t], B). Each client's
    item rows live in one flat table (the rows it touches, then a dummy row for padding). A step's
    distinct rows are listed in the order of their first occurrence, its repeated occurrences in
    entry order (so repeats of one row are added in the order of their entries).
    """

    order: np.ndarray  # (C,) client positions, by descending local steps
    active: np.ndarray  # (T,) clients still training at step t (a prefix of the stack)
    offsets: np.ndarray  # (T+1,) packed-entry offsets of each step
    flat_rows: np.ndarray  # (entries,) flat-table row of each entry (dummy for padding)
    labels: np.ndarray  # (entries,) float32
    weights: np.ndarray  # (entries,) float32 1/(valid batch size); 0 for padding
    unique_offsets: np.ndarray  # (T+1,) offsets of each step's distinct rows
    unique_rows: np.ndarray  # distinct flat rows touched at each step, step after step
    unique_first: np.ndarray  # step-relative entry holding each distinct row's first occurrence
    dup_offsets: np.ndarray  # (T+1,) offsets of each step's repeated occurrences
    dup_target: np.ndarray  # step-relative distinct-row index of each repeated occurrence
    dup_source: np.ndarray  # step-relative entry of each repeated occurrence
    row_client: np.ndarray  # (R,) stack position of each flat row's client
    row_item: np.ndarray  # (R,) item id of each flat row


def _plan_round(samples: RoundSamples, *, batch_size: int, num_items: int) -> _RoundPlan:
    n = samples.samples
    batches = -(-n // batch_size)
    steps = (int(samples.epoch.max()) + 1) * batches
    order = np.argsort(-steps, kind="stable")
    slot_of = np.empty_like(order)
    slot_of[order] = np.arange(len(order))
    total_steps = int(steps.max())
    active = (steps[order][None, :] > np.arange(total_steps)[:, None]).sum(1)
    offsets = np.concatenate([[0], np.cumsum(active * batch_size)])
    client = samples.client
    slot = slot_of[client]
    batch, within_batch = np.divmod(samples.position, batch_size)
    t = samples.epoch * batches[client] + batch
    rel = slot * batch_size + within_batch  # entry within its step
    # flat table: each client's touched items in (slot, item) order, then the dummy row
    key = slot * num_items + samples.items
    mark = np.zeros(len(order) * num_items, dtype=bool)
    mark[key] = True
    touched = np.flatnonzero(mark)
    flat = (np.cumsum(mark) - 1)[key]
    dummy = len(touched)
    entries = int(offsets[-1])
    flat_rows = np.full(entries, dummy, np.int64)
    labels = np.zeros(entries, np.float32)
    weights = np.zeros(entries, np.float32)
    packed = offsets[t] + rel
    flat_rows[packed] = flat
    labels[packed] = samples.labels
    # 1 / (size of the batch): per client and batch, then per example
    sizes = n[:, None] - np.arange(int(batches.max()))[None, :] * batch_size
    weight_of = 1.0 / np.clip(sizes, 1, batch_size)
    weights[packed] = weight_of.ravel()[client * weight_of.shape[1] + batch]
    # distinct rows per step. A row repeats only inside one client's batch; the entries (in packed
    # order: by step, then entry) are grouped by row with a stable sort, so that each group of
    # one row at one step starts with its first entry.
    valid = np.zeros(entries, dtype=bool)
    valid[packed] = True
    entry = np.flatnonzero(valid)  # packed positions of the examples, ascending
    rows = flat_rows[entry]
    step = np.repeat(np.arange(total_steps), active * batch_size)[entry]
    by_row = np.argsort(rows.astype(np.uint16) if dummy < 2**16 else rows, kind="stable")
    row_step = (rows * total_steps + step)[by_row]
    first_s = np.ones(len(entry), dtype=bool)
    np.not_equal(row_step[1:], row_step[:-1], out=first_s[1:])
    first = np.empty_like(first_s)
    first[by_row] = first_s
    unique_index = np.cumsum(first) - 1  # in packed order, among the first occurrences
    group_unique = unique_index[by_row[first_s]]  # each group's distinct-row index
    dups_s = ~first_s
    dup_entry = by_row[dups_s]
    dup_unique = group_unique[(np.cumsum(first_s) - 1)[dups_s]]
    in_order = np.argsort(dup_entry)  # the repeats in packed order
    dup_entry, dup_unique = dup_entry[in_order], dup_unique[in_order]
    within = entry - offsets[step]
    unique_offsets = np.searchsorted(step[first], np.arange(total_steps + 1))
    dup_step = step[dup_entry]
    return _RoundPlan(
        order=order,
        active=active,
        offsets=offsets,
        flat_rows=flat_rows,
        labels=labels,
        weights=weights,
        unique_offsets=unique_offsets,
        unique_rows=rows[first],
        unique_first=within[first],
        dup_offsets=np.searchsorted(dup_step, np.arange(total_steps + 1)),
        dup_target=dup_unique - unique_offsets[dup_step],
        dup_source=within[dup_entry],
        row_client=touched // num_items,
        row_item=touched % num_items,
    )


class _Views(types.SimpleNamespace):
    """Views of a :class:`_Workspace`'s arrays for the first ``a`` clients of the stack."""


class _Workspace:
    """The arrays of the batched simulation, for up to ``clients`` clients and batch ``batch``.

    Each per-step array is a prefix (the active clients) of one of these, so a step allocates
    almost nothing, and the views of each prefix are built once (:meth:`views`).
    """

    def __init__(self, engine: _BatchedNetwork, clients: int, batch: int) -> None:
        cfg, f32 = engine.config, np.float32
        d, w, c, b = engine.dense_size, engine.width, clients, batch
        self.engine, self.clients, self.batch = engine, clients, batch
        self.dense = np.zeros((c, d), f32)  # [user row | network] of each client
        self.moments = np.zeros((c, 2 * d), f32)  # their Adam [m | v]
        self.grads = np.zeros((c, 2 * d), f32)  # [gradient | gradient squared]
        self.tmp = np.zeros((2, c, d), f32)
        # Adam's m and v updates as one product with [beta1.. | beta2..] and [1-beta1.. | 1-beta2..]
        self.decay = np.repeat(np.array([BETA1, BETA2], f32), d)
        self.gain = np.repeat(np.array([1 - BETA1, 1 - BETA2], f32), d)
        self.row_decay = np.array([BETA1, BETA2], f32)[:, None, None]
        self.row_gain = np.array([1 - BETA1, 1 - BETA2], f32)[:, None, None]
        self.q = np.zeros((c * b, w), f32)  # the step's item rows
        self.d_q = np.zeros((c * b, w), f32)  # their gradients
        self.plane_rows = np.zeros((3, c * b), np.int64)  # distinct rows in the three planes
        self.row_grads = np.zeros((2, c * b, w), f32)  # distinct rows' gradient, and squared
        self.row_tmp = np.zeros((2, c * b, w), f32)
        self.logits = np.zeros((c, b, 1), f32)
        self.g = np.zeros((c, b), f32)
        if cfg.model == "gmf":
            self.ph = np.zeros((c, w), f32)
            self.d_ph = np.zeros((c, 1, w), f32)
        else:
            hidden, g_dim, m_dim = cfg.hidden, cfg.gmf_dim, cfg.mlp_dim
            self.z0 = np.zeros((c, b, 2 * m_dim), f32)
            # a layer 1 wide keeps its own contiguous arrays, as NumPy's matmul treats a strided
            # vector differently from a contiguous one
            self.last_alone = hidden[-1] == 1 and g_dim > 0
            self.z = [np.zeros((c, b, width), f32) for width in hidden[:-1]]
            self.z += [np.zeros((c, b, 1), f32)] if self.last_alone else []
            self.d_pre_alone = [
                np.zeros((c, b, 1), f32) if width == 1 else None for width in hidden
            ]
            self.mask = [np.zeros((c, b, width), f32) for width in hidden]
            self.feats = np.zeros((c, b, cfg.head_inputs), f32)
            self.d_feats = np.zeros_like(self.feats)
            self.d_z = [np.zeros((c, b, width), f32) for width in hidden[:-1]]
            # one array, summed over the batch in one call (but for its last m_dim columns):
            # [d_pre of every layer | d_fg * q^G | d z0 = (d p^M, d q^M)]
            widths = [0 if width == 1 else width for width in hidden] + [g_dim, m_dim, m_dim]
            self.column = np.concatenate([[0], np.cumsum(widths)])
            self.summed = np.zeros((c, b, int(self.column[-1])), f32)
            self.sums = np.zeros((c, int(self.column[-2])), f32)
            bias = [lo + int(np.prod(shape)) for lo, _, shape in engine.slices[:-2:2]]
            # the dense columns of the sums: each layer's bias, then the user row
            self.targets = [*bias, 0, g_dim]
            self.sum_targets = np.concatenate(
                [
                    np.arange(lo, lo + width)
                    for lo, width in zip(self.targets, widths[:-1], strict=True)
                ]
            )
        self._views: dict[int, _Views] = {}
        self._planes = np.zeros((3, 0, w), f32)

    def item_state(self, rows: int) -> np.ndarray:
        """(3, >= rows, E) planes for the flat table's [param, m, v] (contents left as they are)."""
        if self._planes.shape[1] < rows:
            self._planes = np.zeros((3, rows + rows // 4, self.engine.width), np.float32)
        return self._planes

    def views(self, a: int) -> _Views:
        v = self._views.get(a)
        if v is None:
            v = self._views[a] = self._make_views(a)
        return v

    def _make_views(self, a: int) -> _Views:
        engine, cfg, b = self.engine, self.engine.config, self.batch
        d, w = engine.dense_size, engine.width
        v = _Views()
        v.x = self.dense[:a]
        v.moments, v.m, v.v = self.moments[:a], self.moments[:a, :d], self.moments[:a, d:]
        v.grads, v.grad, v.grad_sq = self.grads[:a], self.grads[:a, :d], self.grads[:a, d:]
        v.tmp0, v.tmp1 = self.tmp[0, :a], self.tmp[1, :a]
        v.tmp0_user, v.tmp0_net = v.tmp0[:, :w], v.tmp0[:, w:]
        v.q2 = self.q[: a * b]
        v.q = v.q2.reshape(a, b, w)
        v.d_q2 = self.d_q[: a * b]
        v.d_q = v.d_q2.reshape(a, b, w)
        v.logits = self.logits[:a]
        v.logits2 = v.logits[..., 0]
        v.g = self.g[:a]
        v.g3, v.g_row = v.g[:, :, None], v.g[:, None, :]
        user = self.dense[:a, :w]
        views = [self.dense[:a, lo:hi].reshape(a, *shape) for lo, hi, shape in engine.slices]
        grads = [self.grads[:a, lo:hi].reshape(a, *shape) for lo, hi, shape in engine.slices]
        head_w, v.head_b = views[-2][:, 0], views[-1]
        v.head_w3, v.head_w_row = head_w[:, :, None], head_w[:, None, :]
        v.d_head_w3, v.d_head_b = grads[-2], grads[-1]
        if cfg.model == "gmf":
            v.user, v.head_w = user, head_w
            v.ph = self.ph[:a]
            v.ph3, v.ph_row = v.ph[:, :, None], v.ph[:, None, :]
            v.d_ph3 = self.d_ph[:a]
            v.d_ph = v.d_ph3[:, 0]
            v.d_user, v.d_head_w = self.grads[:a, :w], grads[-2][:, 0]
            return v
        g_dim, m_dim, layers = cfg.gmf_dim, cfg.mlp_dim, len(cfg.hidden)
        v.user_g3 = user[:, None, :g_dim]
        v.q_g, v.q_m = v.q[..., :g_dim], v.q[..., g_dim:]
        v.feats = self.feats[:a]
        v.feats_g = v.feats[..., :g_dim]
        v.d_feats = self.d_feats[:a]
        v.d_fg = v.d_feats[..., :g_dim]
        v.d_q_g, v.d_q_m = v.d_q[..., :g_dim], v.d_q[..., g_dim:]
        column, summed = self.column, self.summed[:a]
        v.summed = summed[..., : column[-2]]
        v.sums = self.sums[:a]
        v.gprod = summed[..., column[layers] : column[layers + 1]]
        d_z0 = summed[..., column[layers + 1] :]
        v.d_z0_item = d_z0[..., m_dim:]
        v.z0 = self.z0[:a]
        v.z0_user, v.z0_item = v.z0[..., :m_dim], v.z0[..., m_dim:]
        v.user_m3 = np.broadcast_to(user[:, None, g_dim:], (a, b, m_dim))
        inputs = [v.z0, *(z[:a] for z in self.z[: layers - 1])]
        outputs = [*(z[:a] for z in self.z[: layers - 1])]
        outputs.append(self.z[-1][:a] if self.last_alone else v.feats[..., g_dim:])
        v.last_copy = (v.feats[..., g_dim:], outputs[-1]) if self.last_alone else None
        d_outputs = [*(d_z[:a] for d_z in self.d_z), v.d_feats[..., g_dim:]]
        d_inputs = [d_z0, *(d_z[:a] for d_z in self.d_z)]
        v.layers = []
        for layer in range(layers):
            alone = self.d_pre_alone[layer]
            d_pre = summed[..., column[layer] : column[layer + 1]] if alone is None else alone[:a]
            weight = views[2 * layer]
            v.layers.append(
                (
                    inputs[layer],
                    weight.transpose(0, 2, 1),
                    views[2 * layer + 1][:, None, :],  # bias
                    outputs[layer],  # after the ReLU
                    self.mask[layer][:a],  # 1 where the output is positive, else 0
                    d_outputs[layer],
                    d_pre,
                    d_pre.transpose(0, 2, 1),
                    grads[2 * layer],  # d weight
                    weight,
                    d_inputs[layer],
                )
            )
        v.sum_targets = self.sum_targets
        # NumPy sums a single column pairwise, not in order: such columns are summed alone
        widths = np.diff(column)[:-1]
        v.single = [
            (summed[..., lo : lo + 1], self.grads[:a, target : target + 1])
            for lo, width, target in zip(column[:-2], widths, self.targets, strict=True)
            if width == 1
        ]
        v.single += [
            (alone[:a], self.grads[:a, target : target + 1])
            for alone, target in zip(self.d_pre_alone, self.targets, strict=False)
            if alone is not None
        ]
        return v


class _BatchedNetwork:
    """Forward and hand-written backward of a stack of NCF networks (A clients, B examples each).

    Written in NumPy: at these sizes (20 x 64 examples, 12-d rows) the per-call overhead dominates
    and NumPy's is several times lower than PyTorch's; the maths is the same float32 arithmetic.
    Every step writes into the preallocated arrays of a :class:`_Workspace`.
    """

    def __init__(self, config: NCFConfig) -> None:
        self.config = config
        self.width = config.item_width
        self.slices: list[tuple[int, int, tuple[int, ...]]] = []
        offset = self.width  # the dense stack is [user row | network]
        for _, shape in config.network_shapes():
            size = int(np.prod(shape))
            self.slices.append((offset, offset + size, shape))
            offset += size
        self.dense_size = offset
        self.gradients = self._gmf_gradients if config.model == "gmf" else self._ncf_gradients
        self._workspaces: dict[int, _Workspace] = {}

    def workspace(self, clients: int, batch: int) -> _Workspace:
        """The arrays for ``clients`` clients (kept for later rounds with as many or fewer)."""
        space = self._workspaces.get(batch)
        if space is None or space.clients < clients:
            space = self._workspaces[batch] = _Workspace(self, clients, batch)
        return space

    @staticmethod
    def _gmf_gradients(v: _Views, y: np.ndarray, w: np.ndarray) -> None:
        """GMF (logit = q · (p ⊙ h) + b): the gradients into ``v.grad`` and ``v.d_q``."""
        np.multiply(v.user, v.head_w, out=v.ph)
        np.matmul(v.q, v.ph3, out=v.logits)
        g = v.g
        np.add(v.logits2, v.head_b, out=g)
        _sigmoid_minus(g, y, w)
        np.matmul(v.g_row, v.q, out=v.d_ph3)
        np.multiply(v.g3, v.ph_row, out=v.d_q)
        np.multiply(v.d_ph, v.head_w, out=v.d_user)
        np.multiply(v.d_ph, v.user, out=v.d_head_w)
        np.add.reduce(g, axis=1, keepdims=True, out=v.d_head_b)

    @staticmethod
    def _ncf_gradients(v: _Views, y: np.ndarray, w: np.ndarray) -> None:
        """MLP or NeuMF: the gradients into ``v.grad`` and ``v.d_q``."""
        np.multiply(v.user_g3, v.q_g, out=v.feats_g)
        np.copyto(v.z0_user, v.user_m3)
        np.copyto(v.z0_item, v.q_m)
        for inputs, weight_t, bias, outputs, mask, *_ in v.layers:
            np.matmul(inputs, weight_t, out=outputs)
            np.add(outputs, bias, out=outputs)
            np.maximum(outputs, 0, out=outputs)
            np.greater(outputs, 0, out=mask)
        if v.last_copy is not None:
            np.copyto(*v.last_copy)
        np.matmul(v.feats, v.head_w3, out=v.logits)
        g = v.g
        np.add(v.logits2, v.head_b, out=g)
        _sigmoid_minus(g, y, w)
        np.multiply(v.g3, v.head_w_row, out=v.d_feats)
        np.multiply(v.d_fg, v.q_g, out=v.gprod)
        np.multiply(v.d_fg, v.user_g3, out=v.d_q_g)
        for layer in reversed(v.layers):
            inputs, _, _, _, mask, d_outputs, d_pre, d_pre_t, d_weight, weight, d_inputs = layer
            np.multiply(d_outputs, mask, out=d_pre)
            np.matmul(d_pre_t, inputs, out=d_weight)
            np.matmul(d_pre, weight, out=d_inputs)
        np.copyto(v.d_q_m, v.d_z0_item)
        np.add.reduce(v.summed, axis=1, out=v.sums)
        v.grad[:, v.sum_targets] = v.sums
        for column, target in v.single:
            np.add.reduce(column, axis=1, out=target)
        np.matmul(v.g_row, v.feats, out=v.d_head_w3)
        np.add.reduce(g, axis=1, keepdims=True, out=v.d_head_b)


def _sigmoid_minus(g: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
    """In place, logits -> (σ(logits) − y) · w: the gradient of the weighted BCE-with-logits loss
    (an overflowing exp gives inf and then 0, as it should: call it under np.errstate)."""
    np.negative(g, out=g)
    np.exp(g, out=g)
    g += 1
    np.reciprocal(g, out=g)
    g -= y
    g *= w


def train_round_batched(
    config: NCFConfig,
    *,
    round_samples: RoundSamples,
    user_rows: torch.Tensor,
    items: torch.Tensor,
    network: torch.Tensor,
    lr: float,
    batch_size: int,
    engine: _BatchedNetwork | None = None,
    optimizer_store: AdamStateStore | None = None,
) -> tuple[ClientUpdates, torch.Tensor]:
    """Train a round's clients together (same results as :func:`train_round_reference`).

    Per step: gather every active client's batch rows from the flat table, one stacked
    forward/backward, then SparseAdam on the distinct rows touched (first occurrences plus the
    repeats added in) and Adam on the stacked [user row | network] of the active clients. With an
    ``optimizer_store`` the Adam moments and step counts start from each client's stored state
    (so bias corrections differ per client) and are written back after the round.
    """
    engine = engine or _BatchedNetwork(config)
    num_items, width = items.shape
    plan = _plan_round(round_samples, batch_size=batch_size, num_items=num_items)
    c, d, total_steps = len(plan.order), engine.dense_size, len(plan.active)
    space = engine.workspace(c, batch_size)
    dense, moments = space.dense[:c], space.moments[:c]
    dense[:, :width] = user_rows.numpy()[plan.order]
    dense[:, width:] = network.numpy()
    # flat state rows in three planes, param, m and v (a step gathers and scatters all three at
    # once); the last row is the dummy
    num_rows = len(plan.row_item) + 1
    planes = space.item_state(num_rows)
    state = planes[:, :num_rows]
    state[0, :-1] = items.numpy()[plan.row_item]
    state[0, -1] = 0
    persistent = optimizer_store is not None
    if optimizer_store is not None:
        stack_users = round_samples.users[plan.order]
        local_steps = (plan.active[:, None] > np.arange(c)[None, :]).sum(0)  # per stack slot
        dense_m, dense_v, stored, steps_so_far = optimizer_store.load(
            stack_users, plan.row_client, plan.row_item
        )
        moments[:, :d], moments[:, d:] = dense_m, dense_v
        # the clients' [m | v] of their flat-table rows
        state[1, :-1], state[2, :-1] = stored[:, :width], stored[:, width:]
        state[1:, -1] = 0
        # (T, C) step counts and Adam factors; each distinct row's step size, for all steps
        counts = steps_so_far + np.arange(1, total_steps + 1)[:, None]
        item_lr, dense_lr, sqrt_bc2s, user_eps = _adam_factors(
            *optimizer_store.bias_corrections(counts), lr=lr
        )
        unique_at = np.repeat(np.arange(total_steps) * c, np.diff(plan.unique_offsets))
        unique_at += plan.row_client.take(plan.unique_rows)
        unique_lr = item_lr.take(unique_at)[:, None]
    else:
        moments[:] = 0
        state[1:] = 0
        # the fresh optimisers' bias corrections (Python floats) for steps 1..T
        item_step, dense_step, sqrt_bc2s = [], [], []
        for step in range(1, total_steps + 1):
            bc1, bc2 = 1 - BETA1**step, 1 - BETA2**step
            sqrt_bc2 = math.sqrt(bc2)
            item_step.append(lr * sqrt_bc2 / bc1)
            dense_step.append(lr / bc1)
            sqrt_bc2s.append(sqrt_bc2)
        # Adam's eps per dense column: SparseAdam's eps / sqrt(bias_correction2) on the user row
        dense_eps = np.full((total_steps, d), EPS, np.float32)
        dense_eps[:, :width] = (EPS / np.array(sqrt_bc2s))[:, None]
    params = state[0]
    state_rows = planes.view(np.dtype((np.void, planes.strides[1]))).reshape(-1)
    plane = np.arange(3)[:, None] * planes.shape[1]
    flat_rows, unique_rows, unique_first = plan.flat_rows, plan.unique_rows, plan.unique_first
    dup_target, dup_source = plan.dup_target, plan.dup_source
    labels = plan.labels.reshape(-1, batch_size)
    weights = plan.weights.reshape(-1, batch_size)
    offsets, active = plan.offsets.tolist(), plan.active.tolist()
    unique_offsets, dup_offsets = plan.unique_offsets.tolist(), plan.dup_offsets.tolist()
    row_grads, row_tmp = space.row_grads, space.row_tmp
    row_decay, row_gain, decay, gain = space.row_decay, space.row_gain, space.decay, space.gain
    plane_rows = space.plane_rows
    gradients = engine.gradients
    # SparseAdam (user and item rows) is Adam with eps / sqrt(bias_correction2); the network is Adam
    with np.errstate(over="ignore"):
        for t in range(total_steps):
            a, lo, hi = active[t], offsets[t], offsets[t + 1]
            v = space.views(a)
            params.take(flat_rows[lo:hi], axis=0, out=v.q2, mode="clip")
            gradients(
                v,
                labels[lo // batch_size : hi // batch_size],
                weights[lo // batch_size : hi // batch_size],
            )
            # lazy Adam on the distinct rows of this step
            ulo, uhi = unique_offsets[t], unique_offsets[t + 1]
            n = uhi - ulo
            rows = unique_rows[ulo:uhi]
            grad = row_grads[:, :n]
            d_rows, d_rows_sq = grad[0], grad[1]
            v.d_q2.take(unique_first[ulo:uhi], axis=0, out=d_rows, mode="clip")
            dlo, dhi = dup_offsets[t], dup_offsets[t + 1]
            if dhi > dlo:
                np.add.at(d_rows, dup_target[dlo:dhi], v.d_q2.take(dup_source[dlo:dhi], axis=0))
            np.multiply(d_rows, d_rows, out=d_rows_sq)
            grad *= row_gain
            s = planes.take(rows, axis=1)
            mv = s[1:]
            mv *= row_decay
            mv += grad
            denom = np.sqrt(s[2], out=row_tmp[0, :n])
            denom += EPS
            if persistent:  # each row's client has its own step count
                step_rows = np.multiply(unique_lr[ulo:uhi], s[1], out=row_tmp[1, :n])
            else:
                step_rows = np.multiply(s[1], item_step[t], out=row_tmp[1, :n])
            step_rows /= denom
            param = s[0]
            param -= step_rows
            at = plane_rows[:, :n]
            np.add(rows, plane, out=at)
            np.put(state_rows, at, s.view(state_rows.dtype), mode="clip")
            # Adam on the active clients' user rows and networks
            np.multiply(v.grad, v.grad, out=v.grad_sq)
            v.grads *= gain
            v.moments *= decay
            v.moments += v.grads
            denom = np.sqrt(v.v, out=v.tmp0)
            if persistent:
                denom /= sqrt_bc2s[t, :a, None]
                v.tmp0_user += user_eps[t, :a, None]
                v.tmp0_net += EPS
                step_dense = np.multiply(dense_lr[t, :a, None], v.m, out=v.tmp1)
            else:
                denom /= sqrt_bc2s[t]
                denom += dense_eps[t]
                step_dense = np.multiply(v.m, dense_step[t], out=v.tmp1)
            step_dense /= denom
            v.x -= step_dense
    if optimizer_store is not None:
        optimizer_store.save(
            stack_users,
            plan.row_client,
            plan.row_item,
            dense_m=moments[:, :d],
            dense_v=moments[:, d:],
            item_mv=np.concatenate([state[1, :-1], state[2, :-1]], 1),
            local_steps=local_steps,
        )
    updates = ClientUpdates(
        clients=round_samples.users[plan.order],
        num_samples=round_samples.samples[plan.order],
        network=torch.from_numpy(dense[:, width:].copy()),
        row_client=torch.from_numpy(plan.row_client),
        row_item=torch.from_numpy(plan.row_item),
        item_rows=torch.from_numpy(state[0, :-1].copy()),
        num_items=num_items,
    )
    new_rows = torch.empty_like(user_rows)
    new_rows[torch.from_numpy(plan.order)] = torch.from_numpy(dense[:, :width].copy())
    return updates, new_rows


def round_trainer(simulation: str) -> Callable[..., tuple[ClientUpdates, torch.Tensor]]:
    """The function that trains one aggregation round's clients in ``simulation`` (the compiled
    kernel is compiled, or loaded from Numba's cache, here rather than in the first round)."""
    if simulation == "compiled":
        from fedrec.train.fedncf_compiled import compile_kernel, train_round_compiled

        compile_kernel()
        return train_round_compiled
    return train_round_batched if simulation == "batched" else train_round_reference


def round_extras(config: FedNCFConfig) -> dict[str, Any]:
    """The keyword arguments of ``round_trainer(config.simulation)`` that live across rounds
    without a client optimiser store: the batched simulation's preallocated workspace."""
    return {"engine": _BatchedNetwork(config.model)} if config.simulation == "batched" else {}


# ------------------------------------------------------------------------------------------------
# One aggregation round's pieces: the in-process trainer and the Flower apps
# (fedrec.federation.flower_fedncf) both call these, so a round is written once.


def select_round(
    groups: Sequence[np.ndarray],
    rng: np.random.Generator,
    *,
    aggregation_round: int,
    num_users: int,
    per_global: int,
    selection: str,
) -> tuple[list[np.ndarray], np.ndarray]:
    """(the global round's client groups, aggregation round ``aggregation_round``'s clients,
    sorted). At the start of a global round "permutation" splits a fresh permutation of the
    users, "cohorts" (after its first split) only shuffles the order of the same groups."""
    groups = list(groups)
    if aggregation_round % per_global == 0:
        if selection == "cohorts" and len(groups) == per_global:
            groups = [groups[i] for i in rng.permutation(per_global)]
        else:
            groups = np.array_split(rng.permutation(num_users), per_global)
    return groups, np.sort(groups[aggregation_round % per_global])


def train_clients(
    config: FedNCFConfig,
    clients: ClientData,
    users: np.ndarray,
    rng: np.random.Generator,
    *,
    user_rows: torch.Tensor,
    items: torch.Tensor,
    network: torch.Tensor,
    train_round: Callable[..., tuple[ClientUpdates, torch.Tensor]],
    extras: Mapping[str, Any],
) -> tuple[ClientUpdates, torch.Tensor]:
    """Train a round's clients ``users`` (their private ``user_rows``) from the global ``items``
    and ``network``: fresh local samples from ``rng``, then ``train_round`` (the configured
    simulation, with its ``extras``); returns their uploads and new private rows."""
    round_samples = sample_round(
        clients,
        users,
        rng,
        num_negatives=config.num_negatives,
        local_epochs=config.local_epochs,
    )
    return train_round(
        config.model,
        round_samples=round_samples,
        user_rows=user_rows,
        items=items,
        network=network,
        lr=config.lr,
        batch_size=config.batch_size,
        **extras,
    )


def aggregate_round(
    aggregator: Any,
    store: AdamStateStore | None,
    *,
    items: torch.Tensor,
    network: torch.Tensor,
    updates: ClientUpdates,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The new global (items, network): the server's rule on the round's uploads, with the
    federated Adam moments when ``store`` keeps them (may raise ``SecAggAborted``)."""
    if isinstance(store, FederatedOptimizerState):
        return store.aggregate(aggregator, items=items, network=network, updates=updates)
    return aggregator.aggregate(items=items, network=network, updates=updates)


# ------------------------------------------------------------------------------------------------
# Evaluation


def env_id_of(dataset: str) -> str:
    """The registered logged-data environment id of ``dataset`` (e.g. fedrec/MovieLens100K-v0)."""
    from fedrec.envs.datasets.catalog import spec_of
    from fedrec.envs.datasets.registry import LOGGED_DATA_ENVIRONMENTS

    name = spec_of(dataset).name
    for entry in LOGGED_DATA_ENVIRONMENTS:
        if entry.kwargs.get("dataset") == name:
            return entry.id
    raise ValueError(f"no ranking environment is registered for data set {dataset!r}")


def evaluate_model(
    model: NCF, *, dataset: str, data_dir: str | Path | None = None, top_k: int = 10
) -> RankingResult:
    """HR@K / NDCG@K of a trained model through the logged-data env's evaluation mode."""
    from fedrec.agents.fedncf_agent import NCFRankingAgent
    from fedrec.eval.ranking_metrics import evaluate_ranking_agent

    agent = NCFRankingAgent(model, slate_size=top_k)
    return evaluate_ranking_agent(env_id_of(dataset), agent, data_dir=data_dir, top_k=top_k)


def evaluate_candidates(
    model: NCF, *, candidates: np.ndarray, target: np.ndarray, top_k: int = 10
) -> RankingResult:
    """HR@K / NDCG@K of ranking each user's ``candidates`` (U, N) row, whose column ``target``
    is the held-out item, with the ranking agent and metric of the environments' evaluation mode
    (used for the validation items, which the environments do not hold)."""
    from fedrec.agents.fedncf_agent import NCFRankingAgent
    from fedrec.envs.datasets.environments import score_rankings

    agent = NCFRankingAgent(model, slate_size=top_k, seed=0)
    users = np.arange(len(candidates))[:, None]
    rankings = agent.act_batch({"user_id": users, "candidate_ids": candidates})
    scores = score_rankings(rankings, np.asarray(target))
    return RankingResult(
        float(scores["hit"].mean()), float(scores["ndcg"].mean()), len(candidates), top_k
    )


def evaluate_point(
    model: NCF,
    *,
    data: PreparedData,
    dataset: str,
    data_dir: str | Path | None,
    top_k: int,
    global_round: float,
    aggregation_round: int,
    seconds: float,
) -> EvalPoint:
    """An :class:`EvalPoint` of ``model``: the test metrics (through the environment) and, when
    ``data`` has a validation split, the validation metrics."""
    test = evaluate_model(model, dataset=dataset, data_dir=data_dir, top_k=top_k)
    point = EvalPoint(global_round, aggregation_round, test.hit_rate, test.ndcg, seconds)
    if data.held_out < 2:
        return point
    assert data.validation_candidates is not None and data.validation_target is not None
    validation = evaluate_candidates(
        model, candidates=data.validation_candidates, target=data.validation_target, top_k=top_k
    )
    return dataclasses.replace(
        point, validation_hit_rate=validation.hit_rate, validation_ndcg=validation.ndcg
    )


# ------------------------------------------------------------------------------------------------
# Training drivers


#: FedNCFConfig fields that set a run's length, not its setup (a finished run can be extended).
LENGTH_FIELDS = ("global_rounds", "aggregation_rounds", "eval_every")
#: What defines a FedNCF run: resuming with any of these changed is refused.
SETUP_KEYS = ("agent", "dataset", "seed", "agent_config")


def _setup_config(config: Any) -> dict[str, Any]:
    values = dataclasses.asdict(config)
    return {k: v for k, v in values.items() if k not in LENGTH_FIELDS}


class FedNCFTrainer(Trainer):
    """Federated NCF on the training core: one :meth:`step` is one aggregation round.

    The log (``eval.csv``) has one row per evaluation: ``aggregation_round, global_round,
    hit_rate, ndcg``; a checkpoint holds the private user store, the global item table and
    network, every client's persistent optimiser state (when kept), the selection RNG and the
    round's client groups, so a resumed run is bit-for-bit the uninterrupted one.
    """

    header = ("aggregation_round", "global_round", "hit_rate", "ndcg")
    row_tag = "eval"
    unit = "global rounds"
    log_name = "eval.csv"

    def __init__(
        self,
        *,
        dataset: str,
        config: FedNCFConfig,
        data_dir: str | Path | None = None,
        progress: bool = True,
        on_eval: Callable[[EvalPoint], None] | None = None,
        out_dir: str | Path | None = None,
        resume: bool = False,
        checkpoint_every: int = 10,
    ) -> None:
        self.dataset, self.config, self.data_dir, self.on_eval = dataset, config, data_dir, on_eval
        data = load_prepared(dataset, data_dir)
        if config.validation:
            data = data.with_validation()
            self.header = (*self.header, "validation_hit_rate", "validation_ndcg")
        self.data = data
        self.clients = ClientData.of(data)
        self.num_users, num_items = data.num_users, data.num_items
        generator = torch.Generator().manual_seed(config.seed)
        self.model = NCF(
            config.model, num_users=self.num_users, num_items=num_items, generator=generator
        )
        self.user_store = self.model.user_table()  # the clients' private rows (never sent)
        self.items, self.network = self.model.item_table(), self.model.network_vector()
        self.aggregator = make_aggregator(config.aggregator)
        self.selection_rng = np.random.default_rng([config.seed, 1])
        self.per_global = config.rounds_per_global(self.num_users)
        self.total_rounds = config.total_aggregation_rounds(self.num_users)
        self.train_round = round_trainer(config.simulation)
        self.extra: dict[str, Any] = round_extras(config)
        self.optimizer_store: AdamStateStore | None = None
        if config.client_optimizer != "fresh":
            kind = (
                FederatedOptimizerState
                if config.client_optimizer == "federated"
                else ClientOptimizerStore
            )
            self.optimizer_store = kind(config.model, num_users=self.num_users, num_items=num_items)
            self.extra["optimizer_store"] = self.optimizer_store
        self.rounds_done = 0
        self.history: list[EvalPoint] = []
        self.participations = 0
        self.samples = 0  # sum of n_k over the participations
        self.aborted = 0
        self.train_seconds = self.aggregation_seconds = 0.0
        self.groups: list[np.ndarray] = []
        run_config = {
            "agent": f"fed{config.model.model}",
            "dataset": dataset,
            "seed": config.seed,
            "agent_config": _setup_config(config),
            **{name: getattr(config, name) for name in LENGTH_FIELDS},
        }
        super().__init__(
            run_config=run_config,
            setup_keys=SETUP_KEYS,
            out_dir=out_dir,
            resume=resume,
            progress=progress,
            checkpoint_every=checkpoint_every,
            total=self.total_rounds / self.per_global,
            config_defaults=_setup_config(FedNCFConfig()),
        )

    def start(self) -> None:
        pass  # everything starts from the seeded initialisation built in __init__

    def finished(self) -> bool:
        return self.rounds_done >= self.total_rounds

    def progress(self) -> float:
        return self.rounds_done / self.per_global

    def parse_row(self, row: list[str]) -> list[Any]:
        return [int(row[0]), float(row[1]), float(row[2]), float(row[3])]

    def postfix(self) -> dict[str, str]:
        last = self.history[-1]
        return {"hr": f"{last.hit_rate:.4f}", "ndcg": f"{last.ndcg:.4f}"}

    def _evaluate(self, done: int) -> list[Any]:
        self.model.load_federated(
            user_table=self.user_store, item_table=self.items, network=self.network
        )
        point = evaluate_point(
            self.model,
            data=self.data,
            dataset=self.dataset,
            data_dir=self.data_dir,
            top_k=self.config.top_k,
            global_round=done / self.per_global,
            aggregation_round=done,
            seconds=self.train_seconds,
        )
        self.history.append(point)
        if self.on_eval is not None:
            self.on_eval(point)
        row = [done, point.global_round, point.hit_rate, point.ndcg]
        if self.config.validation:
            row += [point.validation_hit_rate, point.validation_ndcg]
        return row

    def step(self) -> tuple[list[Any], dict[str, float]]:
        from fedrec.federation.secagg import SecAggAborted

        c, r, per_global = self.config, self.rounds_done, self.per_global
        start = time.perf_counter()
        self.groups, users = select_round(
            self.groups,
            self.selection_rng,
            aggregation_round=r,
            num_users=self.num_users,
            per_global=per_global,
            selection=c.selection,
        )
        updates, new_rows = train_clients(
            c,
            self.clients,
            users,
            round_rng(c.seed, r),
            user_rows=self.user_store[torch.from_numpy(users)],
            items=self.items,
            network=self.network,
            train_round=self.train_round,
            extras=self.extra,
        )
        self.user_store[torch.from_numpy(users)] = new_rows
        self.participations += len(updates.num_samples)
        self.samples += int(np.sum(updates.num_samples))
        agg_start = time.perf_counter()
        try:
            self.items, self.network = aggregate_round(
                self.aggregator,
                self.optimizer_store,
                items=self.items,
                network=self.network,
                updates=updates,
            )
        except SecAggAborted:
            self.aborted += 1
        now = time.perf_counter()
        self.aggregation_seconds += now - agg_start
        self.train_seconds += now - start
        self.rounds_done = done = r + 1
        every = c.eval_every
        end_of_global = done % per_global == 0
        if done == self.total_rounds or (
            every and end_of_global and (done // per_global) % every == 0
        ):
            return [self._evaluate(done)], {}
        return [], {}

    def loop_state(self) -> dict[str, Any]:
        aggregator_rng = getattr(self.aggregator, "rng", None)
        return {
            "rounds_done": self.rounds_done,
            "groups": list(self.groups),
            "selection_rng": self.selection_rng.bit_generator.state,
            "aggregator_rng": aggregator_rng.bit_generator.state if aggregator_rng else None,
            "history": [dataclasses.asdict(p) for p in self.history],
            "participations": self.participations,
            "samples": self.samples,
            "aborted": self.aborted,
            "train_seconds": self.train_seconds,
            "aggregation_seconds": self.aggregation_seconds,
        }

    def load_loop_state(self, state: Mapping[str, Any]) -> None:
        self.rounds_done = int(state["rounds_done"])
        self.groups = [np.asarray(g) for g in state["groups"]]
        self.selection_rng.bit_generator.state = state["selection_rng"]
        if state["aggregator_rng"] is not None:
            self.aggregator.rng.bit_generator.state = state["aggregator_rng"]
        self.history = [EvalPoint(**p) for p in state["history"]]
        samples = state["samples"]
        if np.ndim(samples):  # a checkpoint of an older fedrec kept every n_k
            self.participations, self.samples = len(samples), int(np.sum(samples))
        else:
            self.participations, self.samples = int(state["participations"]), int(samples)
        self.aborted = int(state["aborted"])
        self.train_seconds = float(state["train_seconds"])
        self.aggregation_seconds = float(state["aggregation_seconds"])

    def component_states(self) -> dict[str, Any]:
        store = self.optimizer_store
        saved: dict[str, Any] | None = None
        if isinstance(store, FederatedOptimizerState):
            saved = {
                "step_count": store.step_count,
                "user_moments": store.user_moments,
                "network_moments": store.network_moments,
                "item_moments": store.item_moments,
            }
        elif isinstance(store, ClientOptimizerStore):
            saved = {
                "steps": store.steps,
                "dense_m": store.dense_m,
                "dense_v": store.dense_v,
                "item_moments": store.item_moments,
                "torch_states": {str(k): v for k, v in store.torch_states.items()},
            }
        return {
            "agent": {
                "user_store": self.user_store,
                "items": self.items,
                "network": self.network,
                "optimizer_store": saved,
            }
        }

    def load_component_states(self, states: Mapping[str, Any]) -> None:
        agent = states["agent"]
        for name in ("user_store", "items", "network"):
            current, saved = getattr(self, name), agent[name]
            if tuple(saved.shape) != tuple(current.shape):
                raise ValueError(
                    f"checkpoint: {name} has shape {tuple(saved.shape)}, this run's data set "
                    f"gives {tuple(current.shape)}"
                )
        store, saved = self.optimizer_store, agent["optimizer_store"]
        arrays: dict[str, np.ndarray] = {}
        if isinstance(store, FederatedOptimizerState):  # checked before anything is replaced
            if not isinstance(saved, Mapping) or not {"step_count", *FEDERATED_STATE} <= set(saved):
                raise ValueError("checkpoint: no federated optimizer state for this run")
            arrays = {name: np.array(saved[name], np.float32) for name in FEDERATED_STATE}
            for name, array in arrays.items():
                if array.shape != getattr(store, name).shape:
                    raise ValueError(
                        f"checkpoint: optimizer state {name} has shape {array.shape}, this run "
                        f"needs {getattr(store, name).shape}"
                    )
        self.user_store, self.items, self.network = (
            agent["user_store"].clone(),
            agent["items"].clone(),
            agent["network"].clone(),
        )
        if isinstance(store, FederatedOptimizerState):
            store.step_count = int(saved["step_count"])
            for name, array in arrays.items():
                setattr(store, name, array)
        elif isinstance(store, ClientOptimizerStore):
            store.steps = np.array(saved["steps"])
            store.dense_m = np.array(saved["dense_m"])
            store.dense_v = np.array(saved["dense_v"])
            store.item_moments = np.array(saved["item_moments"])
            store.torch_states = {int(k): v for k, v in saved["torch_states"].items()}

    def evaluate(self) -> dict[str, Any]:
        final = self.history[-1]
        return {
            "hit_rate": final.hit_rate,
            "ndcg": final.ndcg,
            "top_k": self.config.top_k,
            "num_users": self.num_users,
            "history": [dataclasses.asdict(p) for p in self.history],
            "aborted_rounds": self.aborted,
            "aggregation_seconds": self.aggregation_seconds,
        }


def train_federated(
    *,
    dataset: str,
    config: FedNCFConfig,
    data_dir: str | Path | None = None,
    progress: bool = True,
    on_eval: Callable[[EvalPoint], None] | None = None,
    out_dir: str | Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 10,
) -> TrainResult:
    """Federated training of ``config.model`` on ``dataset`` (see the module docstring).

    :param out_dir: a run directory (``config.json``, ``eval.csv``, ``checkpoint.pt``,
        ``final_eval.json``); None keeps everything in memory.
    :param resume: continue the run in ``out_dir`` exactly where its checkpoint left it.
    :param checkpoint_every: global rounds between checkpoints (0: only at the end).
    """
    trainer = FedNCFTrainer(
        dataset=dataset,
        config=config,
        data_dir=data_dir,
        progress=progress,
        on_eval=on_eval,
        out_dir=out_dir,
        resume=resume,
        checkpoint_every=checkpoint_every,
    )
    trainer.run()
    trainer.model.load_federated(
        user_table=trainer.user_store, item_table=trainer.items, network=trainer.network
    )
    final = trainer.history[-1]
    return TrainResult(
        model=trainer.model,
        history=trainer.history,
        final=RankingResult(final.hit_rate, final.ndcg, trainer.num_users, config.top_k),
        train_seconds=trainer.train_seconds,
        aborted_rounds=trainer.aborted,
        participations=trainer.participations,
        client_samples=trainer.samples,
        aggregation_seconds=trainer.aggregation_seconds,
    )


def train_centralised(
    *,
    dataset: str,
    config: CentralConfig,
    data_dir: str | Path | None = None,
    progress: bool = True,
) -> TrainResult:
    """Centralised NCF on the pooled training data (same model, loss, negatives and Adam)."""
    data = load_prepared(dataset, data_dir)
    if config.validation:
        data = data.with_validation()
    generator = torch.Generator().manual_seed(config.seed)
    model = NCF(
        config.model, num_users=data.num_users, num_items=data.num_items, generator=generator
    )
    optimizers = make_optimizers(model, lr=config.lr)
    rng = np.random.default_rng([config.seed, 2])
    history: list[EvalPoint] = []
    train_seconds = 0.0
    bar = progress_bar(
        enabled=progress, total=config.epochs, unit="epochs", desc=f"central {config.model.model}"
    )
    for epoch in range(config.epochs):
        start = time.perf_counter()
        epoch_samples = sample_training_negatives(data, rng, config.num_negatives)
        users = torch.from_numpy(epoch_samples.users)
        items = torch.from_numpy(epoch_samples.items)
        labels = torch.from_numpy(epoch_samples.labels)
        for lo in range(0, len(users), config.batch_size):
            hi = lo + config.batch_size
            loss = F.binary_cross_entropy_with_logits(
                model(users[lo:hi], items[lo:hi]), labels[lo:hi]
            )
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
        train_seconds += time.perf_counter() - start
        bar.update(1)
        done = epoch + 1
        if done == config.epochs or (config.eval_every and done % config.eval_every == 0):
            point = evaluate_point(
                model,
                data=data,
                dataset=dataset,
                data_dir=data_dir,
                top_k=config.top_k,
                global_round=done,
                aggregation_round=done,
                seconds=train_seconds,
            )
            history.append(point)
            bar.set_postfix(hr=f"{point.hit_rate:.4f}", ndcg=f"{point.ndcg:.4f}")
    bar.close()
    final = history[-1]
    return TrainResult(
        model=model,
        history=history,
        final=RankingResult(final.hit_rate, final.ndcg, data.num_users, config.top_k),
        train_seconds=train_seconds,
    )
