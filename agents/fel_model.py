"""FEL's leaf click model and its server-side ensembles: what a trained FEL model is and does.

:mod:`fedrec.train.fel` trains it (per-cluster leaves by (DP-)FedAvg, the over-arch);
:mod:`fedrec.agents.fel_agent` serves it in the logged-data environments.

**Leaf model** (:class:`LeafConfig`): logit = b + Σ_f w[x_f] + v·dense (a logistic regression over
one-hot sparse fields and the dense features), plus, when ``hidden > 0``, a one-hidden-layer MLP
over the concatenated field embeddings (dimension ``embedding_dim``) and the dense features. The
parameters of C leaves are stacked (C, ·) tensors (:func:`init_params`), so that C leaves (the K
clusters' leaves, or every client's copy in a round) run at once (:func:`forward`).

**Ensembles**: a fixed rule over the K leaves' logits (:func:`combine`: ``mean``, ``median``,
``max``, or the user's own cluster's leaf, ``route``) or a learned :class:`OverArch`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.envs.datasets.click_data import ClickData
from fedrec.federation.privacy import FELPrivacy

RULES = ("mean", "median", "max", "route")


@dataclass(frozen=True)
class LeafConfig:
    """The device-sized leaf click model."""

    embedding_dim: int = 8
    hidden: int = 0
    """width of the MLP's hidden layer; 0 = logistic regression only."""
    init_std: float = 0.05


# ------------------------------------------------------------------------------------------------
# The leaf model on stacked parameters


def init_params(
    data: ClickData, config: LeafConfig, count: int, seed: int
) -> dict[str, torch.Tensor]:
    """``count`` identical copies of a freshly initialised leaf, stacked on dim 0."""
    gen = torch.Generator().manual_seed(seed)
    v, f, d, e = data.vocab_size, len(data.field_sizes), data.dense.shape[1], config.embedding_dim
    one = {
        "bias": torch.zeros(1),
        "wide": torch.zeros(v),
        "dense": torch.zeros(d),
    }
    if config.hidden > 0:
        one["emb"] = config.init_std * torch.randn(v, e, generator=gen)
        inp = f * e + d
        one["w1"] = torch.randn(inp, config.hidden, generator=gen) / math.sqrt(inp)
        one["b1"] = torch.zeros(config.hidden)
        one["w2"] = torch.randn(config.hidden, generator=gen) / math.sqrt(config.hidden)
    return {k: t.unsqueeze(0).repeat(count, *([1] * t.dim())) for k, t in one.items()}


def flatten(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """(C, P) the stacked parameters as one flat vector per model."""
    return torch.cat([t.reshape(t.shape[0], -1) for t in params.values()], dim=1)


def unflatten(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, start = {}, 0
    for k, t in like.items():
        size = t[0].numel()
        out[k] = flat[:, start : start + size].reshape(flat.shape[0], *t.shape[1:])
        start += size
    return out


def forward(
    params: dict[str, torch.Tensor], codes: torch.Tensor, dense: torch.Tensor
) -> torch.Tensor:
    """(C, B) logits of C stacked models on their own batches: codes (C, B, F) into the shared
    vocabulary (field offsets added), dense (C, B, D)."""
    c = codes.shape[0]
    rows = torch.arange(c)[:, None, None]
    logit = params["bias"] + params["wide"][rows, codes].sum(-1)
    logit = logit + torch.einsum("cbd,cd->cb", dense, params["dense"])
    if "emb" in params:
        x = params["emb"][rows, codes].flatten(2)  # (C, B, F * E)
        h = torch.relu(torch.bmm(torch.cat([x, dense], -1), params["w1"]) + params["b1"][:, None])
        logit = logit + torch.einsum("cbh,ch->cb", h, params["w2"])
    return logit


def predict(
    params: dict[str, torch.Tensor], data: ClickData, rows: np.ndarray, *, chunk: int = 8192
) -> np.ndarray:
    """(len(rows), K) logits of every stacked model (e.g. the K leaves) on the samples ``rows``."""
    k = next(iter(params.values())).shape[0]
    codes_all = torch.as_tensor(data.sparse[rows] + data.offsets)
    dense_all = torch.as_tensor(data.dense[rows])
    out = []
    with torch.no_grad():
        for s in range(0, len(rows), chunk):
            codes = codes_all[s : s + chunk].unsqueeze(0).expand(k, -1, -1)
            dense = dense_all[s : s + chunk].unsqueeze(0).expand(k, -1, -1)
            out.append(forward(params, codes, dense).T)
    return torch.cat(out).numpy() if out else np.zeros((0, k), np.float32)


@dataclass
class FederatedResult:
    """Trained leaves (what :func:`fedrec.train.fel.train_federated` returns and an agent
    serves): the K stacked leaves and each client's cluster, with the run's client updates, DP
    noise multiplier and guarantee, and loss history."""

    params: dict[str, torch.Tensor]  # K stacked leaves
    assignment: np.ndarray  # (U,) cluster of each client
    client_updates: int  # client participations in all
    noise_multiplier: float | None
    privacy: FELPrivacy | None
    loss_history: list[float]  # per round: the sampled clients' mean loss on their first batch


# ------------------------------------------------------------------------------------------------
# Server-side ensembles


def combine(logits: np.ndarray, rule: str, cluster: np.ndarray | None = None) -> np.ndarray:
    """(M,) ensemble logit of (M, K) leaf logits: ``mean``, ``median``, ``max`` over the leaves, or
    ``route`` (each sample's own cluster's leaf; needs ``cluster`` (M,))."""
    if rule == "mean":
        return logits.mean(1)
    if rule == "median":
        return np.median(logits, axis=1)
    if rule == "max":
        return logits.max(1)
    if rule == "route":
        if cluster is None:
            raise ValueError("rule 'route' needs each sample's cluster")
        return logits[np.arange(len(logits)), cluster]
    raise ValueError(f"unknown rule {rule!r}; known: {', '.join(RULES)} and the over-arch")


#: Leaf logits enter the over-arch clamped to +-LOGIT_BOUND and divided by it. A leaf of a tiny
#: cluster under DP noise can output logits in the hundreds; unbounded, they dominate the
#: over-arch's gradients and its federated SGD diverges (|logit| > 10 means p < 5e-5 or
#: p > 1 - 5e-5: clamping there loses nothing a click model needs).
LOGIT_BOUND = 10.0


class OverArch(torch.nn.Module):
    """A small NN over the K leaf logits, the user's own cluster's leaf logit and the one-hot of
    that cluster (public), with a linear skip: ``linear(x) + mlp(x)``; logits are bounded first
    (:data:`LOGIT_BOUND`)."""

    def __init__(self, num_leaves: int, hidden: int = 16) -> None:
        super().__init__()
        self.num_leaves = num_leaves
        width = 2 * num_leaves + 1
        self.linear = torch.nn.Linear(width, 1)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    @staticmethod
    def features(logits: torch.Tensor, cluster: torch.Tensor, num_leaves: int) -> torch.Tensor:
        """(M, 2K + 1) inputs: the bounded K logits, the own cluster's, the cluster's one-hot."""
        bounded = logits.clamp(-LOGIT_BOUND, LOGIT_BOUND) / LOGIT_BOUND
        onehot = F.one_hot(cluster, num_leaves).to(bounded.dtype)
        own = bounded.gather(1, cluster[:, None])
        return torch.cat([bounded, own, onehot], 1)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return (self.linear(x) + self.mlp(x)).squeeze(1)

    def forward(self, logits: torch.Tensor, cluster: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(logits, cluster, self.num_leaves))


def over_arch_logits(arch: OverArch, logits: np.ndarray, cluster: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return arch(torch.as_tensor(logits, dtype=torch.float32), torch.as_tensor(cluster)).numpy()
