"""FedNCF's client simulation compiled with Numba (``simulation="compiled"``, the default where
Numba installs): one kernel call trains a round's clients.

Why a compiled kernel: the batched NumPy simulation (:func:`~fedrec.train.fedncf.simulate_batched.train_round_batched`)
steps all of a round's clients in lockstep, 45-80 NumPy calls per step and as many steps as
the round's longest client (57 on ML-100K), so Python dispatch and one pass over memory per
elementwise operation dominate a round. Here one compiled call trains the whole round: a
``prange`` over the clients (each client's local steps in turn, so nothing waits for the longest
client), every matrix product of the MLP tower through BLAS's ``sgemm`` (``np.dot`` in Numba calls
SciPy's BLAS, as NumPy's ``matmul`` does), and the rest (gathers, GMF products, the loss
gradient, SparseAdam on the batch's distinct item rows, Adam on the user row and network) as
fused loops.

The maths is that of the per-client reference (``torch.optim``'s Adam and SparseAdam, one
``NCF`` module per client) and of the batched simulation, tested against the reference to the
same tolerance. The arithmetic is float32 in a different order, so a run differs from a batched
run in the last bits at first and, as training is chaotic, in its trajectory later: seeds give
reproducible runs per simulation (the thread count does not change the numbers: a client's
work stays on one thread), not identical runs across simulations.

Numba is an optional dependency (``pip install "fedrec[fast]"``). This module imports without it:
Numba is imported, and the kernel functions below are handed to ``numba.njit``, on the first
compiled round (:func:`compile_kernel`, which the trainer calls before its timed training); the
kernel is compiled then, or loaded from Numba's cache next to this file.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import numpy as np
import torch

from fedrec.agents.ncf import NCFConfig
from fedrec.federation.aggregators import ClientUpdates
from fedrec.train.fedncf.optim_state import BETA1, BETA2, EPS, AdamStateStore, _adam_factors
from fedrec.train.fedncf.sampling import RoundSamples

__all__ = ["compile_kernel", "numba_available", "train_round_compiled"]

# float32 constants, as the batched simulation's arrays hold them (a float64 would widen the loops)
_B1, _B2, _EPS = np.float32(BETA1), np.float32(BETA2), np.float32(EPS)
_G1, _G2 = np.float32(1 - BETA1), np.float32(1 - BETA2)

#: ``numba.prange`` once the kernel is compiled (:func:`_jit`); plain ``range`` before, so that
#: the module imports without Numba.
prange: Any = range

#: Whether :func:`_jit` has replaced the kernel functions by Numba's compiled ones.
_jitted = False


def _import_numba() -> Any:
    """``numba``, imported now (ImportError naming the extra when it is missing)."""
    # Numba's OpenMP threads would otherwise spin after every round, taking a core from the NumPy
    # and PyTorch work between rounds (set before Numba starts its thread pool).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import numba
    except ImportError as error:
        raise ImportError(
            'simulation="compiled" needs Numba: pip install "fedrec[fast]" (or pip install numba)'
        ) from error
    return numba


@functools.cache
def numba_available() -> bool:
    """Whether Numba imports in this environment (then ``simulation="auto"`` means compiled)."""
    try:
        _import_numba()
    except ImportError:
        return False
    return True


def _jit() -> None:
    """Hand the kernel functions to ``numba.njit`` (once per process): the module's globals
    ``_train_client``, ``_train_clients`` and ``prange`` become Numba's, so that
    ``_train_clients`` calls the compiled ``_train_client`` and runs its loop as a ``prange``.
    Numba compiles them at their first call, or loads them from its cache."""
    global _jitted, _train_client, _train_clients, prange
    if _jitted:
        return
    numba = _import_numba()
    prange = numba.prange
    _train_client = numba.njit(cache=True, nogil=True, error_model="numpy")(_train_client)
    _train_clients = numba.njit(cache=True, parallel=True, error_model="numpy")(_train_clients)
    _jitted = True


# The kernels' argument lists repeat on purpose: Numba compiles flat array arguments (a shared
# tuple or record of them would change the compiled code and its cache).
def _train_client(
    c,
    dense,
    dense_m,
    dense_v,
    params,
    item_m,
    item_v,
    row_grad,
    row_mark,
    ex_start,
    n,
    epochs,
    ex_rows,
    ex_labels,
    item_lr,
    dense_lr,
    sqrt_bc2,
    user_eps,
    g_dim,
    m_dim,
    dims,
    batch_size,
):  # pragma: no cover - compiled (coverage cannot see inside)
    """All local steps of client ``c`` (its dense row, moments and flat item rows, in place).

    Loops run over row views (``a[j]``, slices) rather than ``a[j, lo + k]``: LLVM vectorises
    the former, and Numba's float division is IEEE (``error_model="numpy"``), not a checked one.
    """
    width = g_dim + m_dim
    layers = len(dims) - 1
    x, mom1, mom2 = dense[c], dense_m[c], dense_v[c]
    size = x.shape[0]
    grad = np.zeros(size, np.float32)
    q = np.empty((batch_size, width), np.float32)
    d_q = np.empty((batch_size, width), np.float32)
    delta = np.empty(batch_size, np.float32)  # d loss / d logit of each example
    uniq = np.empty(batch_size, np.int64)
    # activations: z[0] the tower's input [p^M | q^M], z[i + 1] layer i's output after the ReLU;
    # d[i] the gradient at z[i] (at layer i - 1's pre-activation for i >= 1, once masked)
    z = [np.empty((batch_size, dims[layer]), np.float32) for layer in range(layers + 1)]
    d = [np.empty((batch_size, dims[layer]), np.float32) for layer in range(layers + 1)]
    # views of the [user row | network] vector and of its gradient
    w_lo = np.empty(layers + 1, np.int64)  # where each layer's weight starts; its bias follows
    w_lo[0] = width
    for layer in range(layers):
        w_lo[layer + 1] = w_lo[layer] + dims[layer + 1] * (dims[layer] + 1)
    at = w_lo[layers]  # the output layer
    weights = [
        x[w_lo[layer] : w_lo[layer] + dims[layer + 1] * dims[layer]].reshape(
            (dims[layer + 1], dims[layer])
        )
        for layer in range(layers)
    ]
    d_weights = [
        grad[w_lo[layer] : w_lo[layer] + dims[layer + 1] * dims[layer]].reshape(
            (dims[layer + 1], dims[layer])
        )
        for layer in range(layers)
    ]
    biases = [x[w_lo[layer + 1] - dims[layer + 1] : w_lo[layer + 1]] for layer in range(layers)]
    d_biases = [
        grad[w_lo[layer + 1] - dims[layer + 1] : w_lo[layer + 1]] for layer in range(layers)
    ]
    top_width = dims[layers] if layers > 0 else 0
    user_g, user_m = x[:g_dim], x[g_dim:width]
    d_user_g, d_user_m = grad[:g_dim], grad[g_dim:width]
    head_g, head_m = x[at : at + g_dim], x[at + g_dim : at + g_dim + top_width]
    d_head_g, d_head_m = grad[at : at + g_dim], grad[at + g_dim : at + g_dim + top_width]
    head_b = at + g_dim + top_width
    steps_per_epoch = (n + batch_size - 1) // batch_size
    step = 0
    for epoch in range(epochs):
        for batch in range(steps_per_epoch):
            lo = ex_start + epoch * n + batch * batch_size
            nb = min(batch_size, n - batch * batch_size)
            scale = np.float32(1.0 / nb)
            grad[:] = 0
            for j in range(nb):
                q_j, row = q[j], params[ex_rows[lo + j]]
                for k in range(width):
                    q_j[k] = row[k]
            # forward
            if layers > 0:
                z0 = z[0]
                for j in range(nb):
                    z_j, q_j = z0[j], q[j]
                    for k in range(m_dim):
                        z_j[k] = user_m[k]
                        z_j[m_dim + k] = q_j[g_dim + k]
                for layer in range(layers):
                    zl, bias = z[layer + 1][:nb], biases[layer]
                    np.dot(z[layer][:nb], weights[layer].T, zl)
                    for j in range(nb):
                        z_j = zl[j]
                        for o in range(z_j.shape[0]):
                            z_j[o] = max(z_j[o] + bias[o], np.float32(0))
            top = z[layers]
            for j in range(nb):
                q_j, top_j = q[j], top[j]
                s = np.float32(0)
                for k in range(g_dim):
                    s += user_g[k] * q_j[k] * head_g[k]
                for k in range(top_width):
                    s += top_j[k] * head_m[k]
                logit = s + x[head_b]
                sig = np.float32(1) / (np.float32(1) + np.exp(-logit))  # exp overflow: 0, fine
                delta[j] = (sig - ex_labels[lo + j]) * scale
            # backward: output layer and GMF branch
            for j in range(nb):
                g_j, q_j, d_q_j, top_j = delta[j], q[j], d_q[j], top[j]
                grad[head_b] += g_j
                for k in range(g_dim):
                    d_fg = g_j * head_g[k]
                    d_head_g[k] += g_j * user_g[k] * q_j[k]
                    d_user_g[k] += d_fg * q_j[k]
                    d_q_j[k] = d_fg * user_g[k]
                if layers > 0:
                    d_j = d[layers][j]
                    for k in range(top_width):
                        d_head_m[k] += g_j * top_j[k]
                        d_j[k] = g_j * head_m[k] if top_j[k] > 0 else np.float32(0)
            # backward: the tower (d[layer + 1] holds the gradient at the layer's pre-activation)
            for layer in range(layers - 1, -1, -1):
                dl, d_bias = d[layer + 1][:nb], d_biases[layer]
                np.dot(dl.T, z[layer][:nb], d_weights[layer])
                for j in range(nb):
                    d_j = dl[j]
                    for o in range(d_j.shape[0]):
                        d_bias[o] += d_j[o]
                below = d[layer][:nb]
                np.dot(dl, weights[layer], below)
                if layer > 0:
                    zl = z[layer]
                    for j in range(nb):
                        b_j, z_j = below[j], zl[j]
                        for i in range(b_j.shape[0]):
                            b_j[i] = b_j[i] if z_j[i] > 0 else np.float32(0)
            if layers > 0:
                d0 = d[0]
                for j in range(nb):
                    d_j, d_q_j = d0[j], d_q[j]
                    for k in range(m_dim):
                        d_user_m[k] += d_j[k]
                        d_q_j[g_dim + k] = d_j[m_dim + k]
            # SparseAdam on the batch's distinct item rows (repeats summed in entry order)
            count = 0
            for j in range(nb):
                r, d_q_j = ex_rows[lo + j], d_q[j]
                g_r = row_grad[r]
                if row_mark[r] != step:
                    row_mark[r] = step
                    uniq[count] = r
                    count += 1
                    for k in range(width):
                        g_r[k] = d_q_j[k]
                else:
                    for k in range(width):
                        g_r[k] += d_q_j[k]
            rate = item_lr[c, step]
            for u in range(count):
                r = uniq[u]
                g_r, m_r, v_r, p_r = row_grad[r], item_m[r], item_v[r], params[r]
                for k in range(width):
                    g_k = g_r[k]
                    m = m_r[k] * _B1 + g_k * _G1
                    v = v_r[k] * _B2 + (g_k * g_k) * _G2
                    m_r[k] = m
                    v_r[k] = v
                    p_r[k] -= (m * rate) / (np.sqrt(v) + _EPS)
            # Adam on [user row | network] (the user row is SparseAdam: eps / sqrt(bc2))
            rate, root, eps_user = dense_lr[c, step], sqrt_bc2[c, step], user_eps[c, step]
            for k in range(size):
                g_k = grad[k]
                m = mom1[k] * _B1 + g_k * _G1
                v = mom2[k] * _B2 + (g_k * g_k) * _G2
                mom1[k] = m
                mom2[k] = v
                eps = eps_user if k < width else _EPS
                x[k] -= (m * rate) / (np.sqrt(v) / root + eps)
            step += 1


def _train_clients(
    dense,
    dense_m,
    dense_v,
    params,
    item_m,
    item_v,
    row_grad,
    row_mark,
    ex_starts,
    samples,
    epochs,
    ex_rows,
    ex_labels,
    item_lr,
    dense_lr,
    sqrt_bc2,
    user_eps,
    g_dim,
    m_dim,
    dims,
    batch_size,
):  # pragma: no cover - compiled
    """Every client of the round, in parallel (their item rows are disjoint ranges)."""
    for c in prange(len(samples)):
        _train_client(
            c,
            dense,
            dense_m,
            dense_v,
            params,
            item_m,
            item_v,
            row_grad,
            row_mark,
            ex_starts[c],
            samples[c],
            epochs,
            ex_rows,
            ex_labels,
            item_lr,
            dense_lr,
            sqrt_bc2,
            user_eps,
            g_dim,
            m_dim,
            dims,
            batch_size,
        )


def _client_major(samples: RoundSamples, start: np.ndarray) -> np.ndarray:
    """The permutation that lists a round's examples client by client, each client's epochs in
    turn and each epoch in training order (``sample_round``'s arrays are epoch-major); ``start``
    is where each client's examples begin in that order."""
    n = samples.samples
    client = samples.client
    destination = start[client] + samples.epoch * n[client] + samples.position
    order = np.full_like(destination, -1)
    order[destination] = np.arange(len(destination))
    if np.any(order < 0):  # two examples in one place (then another place is empty)
        raise ValueError("a client's examples of one local epoch must have distinct positions")
    return order


def _check_inputs(
    config: NCFConfig,
    samples: RoundSamples,
    user_rows: torch.Tensor,
    items: torch.Tensor,
    network: torch.Tensor,
    batch_size: int,
) -> None:
    """Raise ValueError unless the round's arrays fit together (the kernel indexes unchecked)."""
    width, clients = config.item_width, len(samples.users)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if items.ndim != 2 or items.shape[1] != width:
        raise ValueError(f"items must be (num_items, {width}), got {tuple(items.shape)}")
    if tuple(user_rows.shape) != (clients, width):
        raise ValueError(f"user_rows must be ({clients}, {width}), got {tuple(user_rows.shape)}")
    if tuple(network.shape) != (config.network_size,):
        raise ValueError(f"network must be ({config.network_size},), got {tuple(network.shape)}")
    for name, tensor in (("user_rows", user_rows), ("items", items), ("network", network)):
        if tensor.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {tensor.dtype}")
    n = np.asarray(samples.samples)
    size = len(samples.items)
    if clients == 0 or len(n) != clients or np.any(n < 1):
        raise ValueError("a round needs at least one client and every client >= 1 example")
    if size == 0 or size % int(n.sum()) != 0:
        raise ValueError("the examples must be whole local epochs of every client")
    epochs = size // int(n.sum())
    arrays = (samples.client, samples.epoch, samples.position, samples.labels)
    if any(len(a) != size for a in arrays):
        raise ValueError(
            "the examples' arrays (client, epoch, position, items, labels) differ in length"
        )
    if samples.items.min() < 0 or samples.items.max() >= items.shape[0]:
        raise ValueError(f"example items must be in [0, {items.shape[0]})")
    if samples.client.min() < 0 or samples.client.max() >= clients:
        raise ValueError(f"example clients must be in [0, {clients})")
    if samples.epoch.min() < 0 or samples.epoch.max() >= epochs:
        raise ValueError(f"example epochs must be in [0, {epochs})")
    if samples.position.min() < 0 or np.any(samples.position >= n[samples.client]):
        raise ValueError("example positions must be in [0, n_k) of their client")
    counts = np.bincount(samples.client * epochs + samples.epoch, minlength=clients * epochs)
    if np.any(counts != np.repeat(n, epochs)):
        raise ValueError("every client must have n_k examples in every local epoch")


def train_round_compiled(
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
    """Train a round's clients with the compiled kernel (the arguments and results of
    :func:`~fedrec.train.fedncf.simulate_batched.train_round_batched`; clients in
    ``round_samples.users`` order).

    The kernel does not check its indices, so the inputs are checked here first (a
    :class:`ValueError` names the problem; nothing is changed)."""
    _check_inputs(config, round_samples, user_rows, items, network, batch_size)
    _jit()
    n = np.asarray(round_samples.samples, np.int64)
    clients, epochs = len(n), int(round_samples.epoch.max()) + 1
    num_items, width = items.shape
    ex_starts = np.zeros(clients, np.int64)
    np.cumsum(n[:-1] * epochs, out=ex_starts[1:])
    order = _client_major(round_samples, ex_starts)
    ex_items = round_samples.items[order]
    ex_labels = np.ascontiguousarray(round_samples.labels[order], np.float32)
    ex_client = np.repeat(np.arange(clients), n * epochs)
    # the flat table: each client's touched items in (client, item) order
    key = ex_client * num_items + ex_items
    mark = np.zeros(clients * num_items, dtype=bool)
    mark[key] = True
    touched = np.flatnonzero(mark)
    ex_rows = (np.cumsum(mark) - 1)[key]
    row_client, row_item = touched // num_items, touched % num_items
    params = np.ascontiguousarray(items.numpy()[row_item])
    dense = np.empty((clients, width + network.shape[0]), np.float32)
    dense[:, :width] = user_rows.numpy()
    dense[:, width:] = network.numpy()
    local_steps = epochs * -(-n // batch_size)
    longest = int(local_steps.max())
    if optimizer_store is not None:
        dense_m, dense_v, stored, steps_so_far = optimizer_store.load(
            round_samples.users, row_client, row_item
        )
        dense_m = np.array(dense_m, np.float32)
        dense_v = np.array(dense_v, np.float32)
        item_m = np.ascontiguousarray(stored[:, :width], np.float32)
        item_v = np.ascontiguousarray(stored[:, width:], np.float32)
        counts = steps_so_far[:, None] + np.arange(1, longest + 1)[None, :]
        bc1, bc2 = optimizer_store.bias_corrections(counts)
    else:
        dense_m, dense_v = np.zeros_like(dense), np.zeros_like(dense)
        item_m, item_v = np.zeros_like(params), np.zeros_like(params)
        counts = np.arange(1, longest + 1)
        bc1 = np.array([1 - BETA1**s for s in counts.tolist()])  # as Python floats, like the others
        bc2 = np.array([1 - BETA2**s for s in counts.tolist()])
        bc1, bc2 = (
            np.broadcast_to(bc1, (clients, longest)),
            np.broadcast_to(bc2, (clients, longest)),
        )
    factors = [np.ascontiguousarray(f) for f in _adam_factors(bc1, bc2, lr=lr)]
    dims = np.array([2 * config.mlp_dim, *config.hidden] if config.uses_mlp else [0], np.int64)
    _train_clients(
        dense,
        dense_m,
        dense_v,
        params,
        item_m,
        item_v,
        np.empty_like(params),
        np.full(len(params), -1, np.int64),
        ex_starts,
        n,
        epochs,
        np.ascontiguousarray(ex_rows),
        ex_labels,
        *factors,
        config.gmf_dim,
        config.mlp_dim,
        dims,
        batch_size,
    )
    if optimizer_store is not None:
        optimizer_store.save(
            round_samples.users,
            row_client,
            row_item,
            dense_m=dense_m,
            dense_v=dense_v,
            item_mv=np.concatenate([item_m, item_v], 1),
            local_steps=local_steps,
        )
    updates = ClientUpdates(
        clients=np.array(round_samples.users),
        num_samples=n.copy(),
        network=torch.from_numpy(dense[:, width:].copy()),
        row_client=torch.from_numpy(row_client),
        row_item=torch.from_numpy(row_item),
        item_rows=torch.from_numpy(params),
        num_items=num_items,
    )
    return updates, torch.from_numpy(dense[:, :width].copy())


def compile_kernel() -> float:
    """Compile the round kernel now (or load it from Numba's cache) with a one-example round, so
    that a run's timed training excludes it; returns the seconds it took (one kernel serves every
    model: the architecture is an argument)."""
    start = time.perf_counter()
    config = NCFConfig(model="neumf", latent_dim=1, hidden=(1,))
    one = np.zeros(1, np.int64)
    samples = RoundSamples(one, one + 1, one, one, one, one, np.ones(1, np.float32))
    width = config.item_width
    train_round_compiled(
        config,
        round_samples=samples,
        user_rows=torch.zeros(1, width),
        items=torch.zeros(1, width),
        network=torch.zeros(config.network_size),
        lr=1e-3,
        batch_size=1,
    )
    return time.perf_counter() - start
