"""Where the clients' Adam state lives between rounds: the three optimiser-state stores.

FedNCF does not say what a client's Adam state is. ``client_optimizer="federated"`` (the
default, :class:`FederatedOptimizerState`) federates the Adam state of the item rows and network
like the weights: sent with them, continued by the clients and aggregated by the server's rule,
while a user row's state stays on its client; with one client per round this is one Adam over all
clients' batches. ``"persistent"`` (:class:`ClientOptimizerStore`) lets each client keep its own
Adam state across its participations; ``"fresh"`` gives it a new Adam every participation (no
store). :class:`AdamStateStore` is what the simulations load a round's state from and save it to;
:func:`_adam_factors` turns bias corrections into the per-step factors they use.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np
import torch

from fedrec.agents.ncf import NCF, NCFConfig
from fedrec.federation.aggregators import ClientUpdates
from fedrec.federation.secagg import SecureTables

#: Adam's (and SparseAdam's) constants, as ``torch.optim`` uses them.
BETA1, BETA2, EPS = 0.9, 0.999, 1e-8

#: Fraction bits of the Adam moments under MF-SecAvg (64-bit words: steps of 1.8e-15, values
#: up to 2^(63-46) / clients).
MOMENT_FRACTION_BITS = 46

#: The arrays of a checkpointed :class:`FederatedOptimizerState`.
FEDERATED_STATE = ("user_moments", "network_moments", "item_moments")


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

    A store serves one simulation. The batched and compiled simulations keep the state as stacked
    arrays (``steps``, ``dense_m``/``dense_v`` over ``[user row | network]``, ``item_moments``
    ``[m | v]`` per client and item; zero until first used, so pages are allocated as clients
    touch rows), the reference simulation as each client's ``torch.optim`` state dicts.
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
