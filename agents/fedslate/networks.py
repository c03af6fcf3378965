"""FedSlate's networks: the platforms' local Q networks and the server's federated network F."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {"mish": nn.Mish, "relu": nn.ReLU}


def _mlp(
    inputs: int, hidden: Sequence[int], outputs: int, head: str, activation: str = "mish"
) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = inputs
    for size in hidden:
        layers += [nn.Linear(width, size), ACTIVATIONS[activation]()]
        width = size
    layers.append(nn.Linear(width, outputs))
    if head == "tanh":
        layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class LocalQNetwork(nn.Module):
    """Q_k(s_k): a platform's state to one value per candidate (Mish or ReLU MLP)."""

    def __init__(
        self,
        state_dim: int,
        num_candidates: int,
        hidden: Sequence[int],
        head: str,
        activation: str = "mish",
    ):
        super().__init__()
        self.net = _mlp(state_dim, hidden, num_candidates, head, activation)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.net(state)


class ItemwiseLocalQNetwork(nn.Module):
    """Q_k(s_k, i) with one Mish MLP over [user part of the state, candidate i's feature], shared by
    all candidates (as SlateQ's Q-bar). A labelled deviation from the paper's per-position output
    layer, which must learn the same item function once per position (docs/fedslate.md,
    "Diagnosis"). Same input (the state vector) and output (B, N) as :class:`LocalQNetwork`.

    The first layer W [u; x_i] + b is computed as (W_u u + b) + w_x x_i: the same function, with
    the user part evaluated once per user instead of once per candidate.
    """

    def __init__(
        self,
        state_dim: int,
        num_candidates: int,
        hidden: Sequence[int],
        head: str,
        activation: str = "mish",
    ):
        super().__init__()
        self.num_candidates = num_candidates
        first, *rest = hidden
        self.user_layer = nn.Linear(state_dim - num_candidates, first)
        self.item_layer = nn.Linear(1, first, bias=False)
        act = ACTIVATIONS[activation]
        self.head = (
            nn.Sequential(act(), _mlp(first, rest, 1, head, activation))
            if rest
            else nn.Sequential(act(), nn.Linear(first, 1), *([nn.Tanh()] if head == "tanh" else []))
        )

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        n = self.num_candidates
        items = state[:, 1 : 1 + n, None]  # platform_state: [user (1), candidates (N), history]
        user = torch.cat([state[:, :1], state[:, 1 + n :]], dim=1)
        hidden = self.user_layer(user)[:, None, :] + self.item_layer(items)
        return self.head(hidden).squeeze(-1)


class FederatedNetwork(nn.Module):
    """F: [Q_own; Q_others] (K N) to the own platform's federated values (N).

    ``kind="residual"`` (a labelled deviation) is Q_own + MLP([Q_own; Q_others]) with the MLP's
    output layer starting at zero, so F starts as the identity on the own platform's values. The
    paper's dense F has to learn that pass-through position by position from one clicked item per
    sample, and in our measurements it does not (docs/fedslate.md, "Diagnosis").
    """

    def __init__(
        self, num_platforms: int, num_candidates: int, hidden: Sequence[int], kind: str, head: str
    ):
        super().__init__()
        inputs = num_platforms * num_candidates
        self.num_candidates = num_candidates
        self.residual = kind == "residual"
        if kind == "linear":
            self.net = nn.Linear(inputs, num_candidates)
        elif self.residual:
            self.net = _mlp(inputs, hidden, num_candidates, "linear")
            nn.init.zeros_(self.net[-1].weight)
            nn.init.zeros_(self.net[-1].bias)
        else:
            self.net = _mlp(inputs, hidden, num_candidates, head)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out = self.net(inputs)
        return out + inputs[:, : self.num_candidates] if self.residual else out


LOCAL_NETWORKS = {"position": LocalQNetwork, "itemwise": ItemwiseLocalQNetwork}


def _adam(parameters: Any, lr: float) -> torch.optim.Adam:
    """Adam; the fused kernel is ~2x faster for these small networks on CPU."""
    parameters = list(parameters)
    try:
        return torch.optim.Adam(parameters, lr=lr, fused=True)
    except (RuntimeError, TypeError):  # older PyTorch without fused CPU Adam
        return torch.optim.Adam(parameters, lr=lr)


def _seeded(seed: int, build: Any) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()
