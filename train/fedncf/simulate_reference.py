"""The reference client simulation (``simulation="reference"``): one :class:`NCF` module,
``torch.optim``'s Adam and SparseAdam and autograd per client, clients one after another.

Slow, and written to be obviously FedNCF's client: the batched and compiled simulations are
tested against it (tests/test_fedncf_train.py).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.agents.ncf import NCF, NCFConfig, make_optimizers
from fedrec.federation.aggregators import ClientUpdates
from fedrec.train.fedncf.optim_state import (
    AdamStateStore,
    ClientOptimizerStore,
    FederatedOptimizerState,
)
from fedrec.train.fedncf.sampling import RoundSamples


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
