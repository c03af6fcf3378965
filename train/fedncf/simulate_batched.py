"""The batched client simulation (``simulation="batched"``, the fallback where Numba is missing):
a round's clients trained together in stacked NumPy arrays (:func:`train_round_batched`).

Their network weights and user rows are stacked into one (C, ·) array, their item rows into one
flat table (each client only holds the rows it will touch), and each step runs all clients'
batches through stacked NumPy ``matmul``/gathers with hand-written gradients and a vectorised
(Sparse)Adam (NumPy because its per-call overhead is several times PyTorch's at these tiny
sizes). The round's layout is :func:`~fedrec.train.fedncf.batched_plan._plan_round`'s. Same
results as the per-client reference (:mod:`fedrec.train.fedncf.simulate_reference`).
"""

from __future__ import annotations

import math
import types

import numpy as np
import torch

from fedrec.agents.ncf import NCFConfig
from fedrec.federation.aggregators import ClientUpdates
from fedrec.train.fedncf.batched_plan import _plan_round
from fedrec.train.fedncf.optim_state import BETA1, BETA2, EPS, AdamStateStore, _adam_factors
from fedrec.train.fedncf.sampling import RoundSamples


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
