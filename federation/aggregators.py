"""Server-side aggregation rules of FedNCF: SimpleAvg, FedAvg and MF-FedAvg.

A round's uploads are held in :class:`ClientUpdates`: per client its flat network weights θ_k, its
training-set size n_k, and the item rows it *touched* (rows whose items were among its local
positives or sampled negatives; the indicator is MP_k). Untouched rows are implicitly the global
row the client received, so the sparse form is exact and every rule below is the dense formula
of ``docs/fedncf.md`` §3 written with deltas Δ_k[i] = Q_k[i] − Q[i] (zero when untouched):

=========== ================================ ==================================================
rule        network weights                  item row i
=========== ================================ ==================================================
SimpleAvg   (1/|S|) Σ θ_k                     Q[i] + (1/|S|) Σ_k Δ_k[i]
FedAvg      Σ (n_k/N) θ_k                     Q[i] + Σ_k (n_k/N) Δ_k[i]
MF-FedAvg   Σ (n_k/N) θ_k                     (1/|U_i|) Σ_{k∈U_i} Q_k[i] if U_i ≠ ∅, else Q[i]
=========== ================================ ==================================================

User embeddings are private and never reach the server. MF-SecAvg (the same result computed on
masked uploads) lives in :mod:`fedrec.federation.secagg`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ClientUpdates:
    """The uploads of one aggregation round's clients (C clients, R touched rows in all)."""

    clients: np.ndarray
    """(C,) the clients' (user) ids, for bookkeeping only."""
    num_samples: np.ndarray
    """(C,) n_k: local training examples per local epoch (positives plus negatives)."""
    network: torch.Tensor
    """(C, N) each client's network weights after local training (flattened)."""
    row_client: torch.Tensor
    """(R,) int64 position (0..C-1) of the client that touched each uploaded row."""
    row_item: torch.Tensor
    """(R,) int64 item id of each uploaded row; (client, item) pairs are distinct."""
    item_rows: torch.Tensor
    """(R, E) the client's item row after local training (combined GMF|MLP row)."""
    num_items: int
    """I: rows of the item table."""

    def __post_init__(self) -> None:
        c = len(self.clients)
        if c == 0:
            raise ValueError("an aggregation round needs at least one client update")
        if self.network.shape[0] != c or len(self.num_samples) != c:
            raise ValueError("clients, num_samples and network must have one entry per client")
        if not (len(self.row_client) == len(self.row_item) == self.item_rows.shape[0]):
            raise ValueError("row_client, row_item and item_rows must have the same length")
        if np.any(np.asarray(self.num_samples) <= 0):
            raise ValueError("every num_samples must be positive")

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def touched(self) -> torch.Tensor:
        """(C, I) bool: MP_k[i], whether client k touched item i."""
        mask = torch.zeros(self.num_clients, self.num_items, dtype=torch.bool)
        mask[self.row_client, self.row_item] = True
        return mask

    def item_tables(self, global_items: torch.Tensor) -> torch.Tensor:
        """(C, I, E) each client's full item table: its touched rows, the global row elsewhere."""
        tables = global_items.unsqueeze(0).repeat(self.num_clients, 1, 1)
        tables[self.row_client, self.row_item] = self.item_rows
        return tables

    def subset(self, keep: np.ndarray) -> ClientUpdates:
        """The updates of the clients at positions ``keep`` only (e.g. the survivors of a round)."""
        keep = np.asarray(keep, dtype=np.int64)
        new_pos = torch.full((self.num_clients,), -1, dtype=torch.int64)
        new_pos[torch.as_tensor(keep)] = torch.arange(len(keep))
        rows = new_pos[self.row_client] >= 0
        return ClientUpdates(
            clients=self.clients[keep],
            num_samples=self.num_samples[keep],
            network=self.network[torch.as_tensor(keep)],
            row_client=new_pos[self.row_client[rows]],
            row_item=self.row_item[rows],
            item_rows=self.item_rows[rows],
            num_items=self.num_items,
        )


def _weighted_network(updates: ClientUpdates, weights: torch.Tensor) -> torch.Tensor:
    return (weights[:, None] * updates.network).sum(0)


def _sample_weights(updates: ClientUpdates) -> torch.Tensor:
    n = torch.as_tensor(updates.num_samples, dtype=torch.float64)
    return (n / n.sum()).to(updates.network.dtype)


class Aggregator(abc.ABC):
    """Combines a round's client updates into the new global item table and network weights."""

    #: Short name used on the command line and in tables.
    name: str = ""
    #: Its name in printed tables (FedNCF's spelling).
    label: str = ""

    @abc.abstractmethod
    def aggregate(
        self, *, items: torch.Tensor, network: torch.Tensor, updates: ClientUpdates
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """New (items (I, E), network (N,)) from the global ones sent out and the uploads."""


class _DeltaAverage(Aggregator):
    """Item rows Q[i] + Σ_k w_k Δ_k[i] and network Σ_k w_k θ_k, for client weights w."""

    @abc.abstractmethod
    def weights(self, updates: ClientUpdates) -> torch.Tensor:
        """Per-client weights w (K,) of the round (the subclass's averaging rule)."""

    def aggregate(
        self, *, items: torch.Tensor, network: torch.Tensor, updates: ClientUpdates
    ) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.weights(updates)
        deltas = updates.item_rows - items[updates.row_item]
        new_items = items.clone()
        new_items.index_add_(0, updates.row_item, w[updates.row_client, None] * deltas)
        return new_items, _weighted_network(updates, w)


class SimpleAvg(_DeltaAverage):
    """Unweighted mean over the round's clients, untouched item copies included."""

    name = "simpleavg"
    label = "SimpleAvg"

    def weights(self, updates: ClientUpdates) -> torch.Tensor:
        c = updates.num_clients
        return torch.full((c,), 1.0 / c, dtype=updates.network.dtype)


class FedAvg(_DeltaAverage):
    """McMahan et al.'s FedAvg: mean weighted by n_k / N, untouched item copies included."""

    name = "fedavg"
    label = "FedAvg"

    def weights(self, updates: ClientUpdates) -> torch.Tensor:
        return _sample_weights(updates)


class MFFedAvg(Aggregator):
    """FedNCF's MF-FedAvg: each item row averaged over only the clients that touched it.

    The mean within U_i is unweighted (a count average); rows nobody touched keep their value;
    the network weights follow FedAvg.
    """

    name = "mf-fedavg"
    label = "MF-FedAvg"

    def aggregate(
        self, *, items: torch.Tensor, network: torch.Tensor, updates: ClientUpdates
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sums = torch.zeros_like(items).index_add_(0, updates.row_item, updates.item_rows)
        counts = torch.bincount(updates.row_item, minlength=updates.num_items)
        touched = counts > 0
        new_items = items.clone()
        new_items[touched] = sums[touched] / counts[touched, None].to(items.dtype)
        return new_items, _weighted_network(updates, _sample_weights(updates))
