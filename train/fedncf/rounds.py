"""One aggregation round, in pieces: the client selection (:func:`select_round`), the selected
clients' local training in the configured simulation (:func:`train_clients`, with
:func:`round_trainer` and :func:`round_extras`) and the server's aggregation
(:func:`aggregate_round`). The in-process trainer (:class:`~fedrec.train.fedncf.trainer.FedNCFTrainer`)
and the Flower apps (:mod:`fedrec.train.fedncf.flower`) both call these, so a round is written once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedrec.federation.aggregators import ClientUpdates
from fedrec.train.fedncf.config import FedNCFConfig
from fedrec.train.fedncf.optim_state import AdamStateStore, FederatedOptimizerState
from fedrec.train.fedncf.sampling import ClientData, sample_round
from fedrec.train.fedncf.simulate_batched import _BatchedNetwork, train_round_batched
from fedrec.train.fedncf.simulate_compiled import compile_kernel, train_round_compiled
from fedrec.train.fedncf.simulate_reference import train_round_reference


def round_trainer(simulation: str) -> Callable[..., tuple[ClientUpdates, torch.Tensor]]:
    """The function that trains one aggregation round's clients in ``simulation`` (the compiled
    kernel is compiled, or loaded from Numba's cache, here rather than in the first round)."""
    if simulation == "compiled":
        compile_kernel()
        return train_round_compiled
    return train_round_batched if simulation == "batched" else train_round_reference


def round_extras(config: FedNCFConfig) -> dict[str, Any]:
    """The keyword arguments of ``round_trainer(config.simulation)`` that live across rounds
    without a client optimiser store: the batched simulation's preallocated workspace."""
    return {"engine": _BatchedNetwork(config.model)} if config.simulation == "batched" else {}


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
