"""One round of FEL's federated training, written once: the in-process trainer
(:class:`fedrec.train.fel.trainer.FELTrainer`) and the Flower apps (:mod:`fedrec.train.fel.flower`)
both call these.

**Batched simulation.** All sampled clients of a round, of every cluster, are trained together:
each client's copy of its cluster's leaf is one slice of stacked (C, ·) parameter tensors, a local
step runs every client's mini-batch through batched gathers and ``bmm``, and one autograd call
gives every client's gradient at once (the loss is the sum of the clients' mean losses, and the
clients share no parameter). Local training is plain SGD (``local_epochs`` passes over the
client's samples in seeded random order, batches of ``batch_size``); a client with fewer steps
than the longest simply stops (its padded steps carry no gradient). The server adds the weighted
mean update (FedAvg: weights n_k / Σ n) or, with DP, the clipped and noised update of
:func:`fedrec.federation.privacy.dp_aggregate`, times ``server_lr``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.agents.fel_model import forward
from fedrec.envs.datasets.click_data import ClickData
from fedrec.federation.privacy import dp_aggregate, noise_multiplier_for
from fedrec.train.fel.config import FedConfig


def client_schedules(
    data: ClickData,
    clients: np.ndarray,
    train_rows: Sequence[np.ndarray] | Mapping[int, np.ndarray],
    config: FedConfig,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """(C, S, B) sample indices and validity mask of every client's local mini-batches."""
    b = config.batch_size
    plans = []
    for c in clients:
        rows = train_rows[c]
        epochs = [rng.permutation(rows) for _ in range(config.local_epochs)]
        batches = [
            e[i : i + b] for e in epochs for i in range(0, len(e), b)
        ]  # short last batch per epoch
        plans.append(batches)
    steps = max(len(p) for p in plans)
    index = np.zeros((len(clients), steps, b), np.int64)
    mask = np.zeros((len(clients), steps, b), bool)
    for i, plan in enumerate(plans):
        for s, batch in enumerate(plan):
            index[i, s, : len(batch)] = batch
            mask[i, s, : len(batch)] = True
    return index, mask


def local_train(
    params: dict[str, torch.Tensor],
    data: ClickData,
    index: np.ndarray,
    mask: np.ndarray,
    lr: float,
    offset: np.ndarray | None = None,
) -> tuple[dict[str, torch.Tensor], float]:
    """Run every client's local SGD steps on its stacked copy; returns the trained copies and
    the clients' mean loss on their first batch (before any step). ``offset`` (M,) is a fixed
    logit added to every sample's output (the private leaf learns on top of the public score)."""
    codes_all = torch.as_tensor(data.sparse[index] + data.offsets)  # (C, S, B, F)
    dense_all = torch.as_tensor(data.dense[index])
    offset_all = None if offset is None else torch.as_tensor(offset[index], dtype=torch.float32)

    def logits_of(p: dict[str, torch.Tensor], s: int) -> torch.Tensor:
        logits = forward(p, codes_all[:, s], dense_all[:, s])
        return logits if offset_all is None else logits + offset_all[:, s]

    return local_sgd(params, logits_of, torch.as_tensor(data.label[index]), mask, lr)


def local_sgd(
    params: dict[str, torch.Tensor],
    logits_of: Callable[[dict[str, torch.Tensor], int], torch.Tensor],
    labels: torch.Tensor,
    mask: np.ndarray,
    lr: float,
) -> tuple[dict[str, torch.Tensor], float]:
    """The local SGD of every client on its copy of the stacked (C, ...) ``params`` (cloned):
    ``logits_of(p, s)`` gives the (C, B) logits of local step ``s``, ``labels`` (C, S, B) their
    labels, ``mask`` (C, S, B) the valid samples. The loss is the sum of the clients' mean
    binary cross-entropies (one autograd call, every client's gradient); a client whose steps ran
    out stops. Returns the trained copies and the clients' mean loss on their first batch.
    Shared by the leaves (:func:`local_train`) and the federated over-arch."""
    p = {k: t.clone().requires_grad_(True) for k, t in params.items()}
    mask_all = torch.as_tensor(mask, dtype=torch.float32)
    first_loss = float("nan")
    for s in range(mask.shape[1]):
        m = mask_all[:, s]
        n = m.sum(1)
        if not (n > 0).any():
            break
        losses = F.binary_cross_entropy_with_logits(logits_of(p, s), labels[:, s], reduction="none")
        loss = ((losses * m).sum(1) / n.clamp(min=1)).sum()
        if s == 0:
            first_loss = float(loss.detach()) / mask.shape[0]
        grads = torch.autograd.grad(loss, list(p.values()))
        with torch.no_grad():
            for t, g in zip(p.values(), grads, strict=True):
                t -= lr * g
    return {k: t.detach() for k, t in p.items()}, first_loss


def train_rows_of(data: ClickData) -> list[np.ndarray]:
    """Every client's training rows (its non-test samples)."""
    return [
        np.arange(data.indptr[u], data.indptr[u + 1])[
            ~data.is_test[data.indptr[u] : data.indptr[u + 1]]
        ]
        for u in range(data.num_clients)
    ]


def noise_multiplier_of(config: FedConfig) -> float | None:
    """z of DP-FedAvg: ``dp.noise_multiplier``, or the one that spends ``dp.target_epsilon`` over
    the run (None without DP)."""
    dp = config.dp
    if dp is None:
        return None
    if (dp.noise_multiplier is None) == (dp.target_epsilon is None):
        raise ValueError("DPConfig needs exactly one of noise_multiplier and target_epsilon")
    if dp.noise_multiplier is not None:
        return dp.noise_multiplier
    return noise_multiplier_for(dp.target_epsilon, dp.delta, config.sample_rate, config.rounds)


def poisson_sample(rng: np.random.Generator, rate: float, has_train: np.ndarray) -> np.ndarray:
    """(U,) bool: Poisson sampling of the clients with training rows, each with probability
    ``rate`` (one uniform draw per client, in client order)."""
    return (rng.random(len(has_train)) < rate) & has_train


def select_clients(
    rng: np.random.Generator, assignment: np.ndarray, has_train: np.ndarray, config: FedConfig
) -> np.ndarray:
    """A round's chosen clients, sorted: Poisson sampling with rate ``sample_rate`` among the
    clients with training rows and, without DP and with ``fill_empty_clusters``, one client at
    random for each cluster that drew none."""
    k = int(assignment.max()) + 1
    chosen = poisson_sample(rng, config.sample_rate, has_train)
    if config.dp is None and config.fill_empty_clusters:  # at least one client per cluster
        for c in range(k):
            if not chosen[assignment == c].any():
                members = np.flatnonzero((assignment == c) & has_train)
                if len(members):
                    chosen[rng.choice(members)] = True
    return np.flatnonzero(chosen)


def aggregate_leaves(
    flat: torch.Tensor,
    clients: np.ndarray,
    num_samples: np.ndarray,
    deltas: torch.Tensor,
    assignment: np.ndarray,
    config: FedConfig,
    *,
    noise_multiplier: float | None,
    denominator: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """(K, P) the leaves after a round from the chosen ``clients``' (C, P) ``deltas`` and
    training rows ``num_samples``: FedAvg with weights n_k / N inside each cluster or, with DP,
    :func:`~fedrec.federation.privacy.dp_aggregate` (clip, sum, noise from ``generator`` even for
    a cluster without clients, divide by q N_c), times ``server_lr``."""
    k = flat.shape[0]
    cl = torch.as_tensor(assignment[clients])
    deltas = deltas if len(clients) else torch.zeros(0, flat.shape[1])
    dp = config.dp
    if dp is None:
        if not len(clients):
            return flat
        n = torch.as_tensor(num_samples, dtype=torch.float32)
        w = n / torch.zeros(k).index_add_(0, cl, n)[cl]  # n_k / N within each cluster
        step = torch.zeros_like(flat).index_add_(0, cl, w[:, None] * deltas)
    else:
        step = dp_aggregate(
            deltas,
            cl,
            k,
            clip_norm=dp.clip_norm,
            noise_multiplier=float(noise_multiplier),
            denominator=denominator,
            generator=generator,
        )
    return flat + config.server_lr * step
