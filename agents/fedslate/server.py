"""The FedSlate server: the global network F, which sees Q values, gradients and labels only."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedrec.agents.fedslate.config import FedSlateConfig
from fedrec.agents.fedslate.networks import FederatedNetwork, _adam, _seeded
from fedrec.federation.channel import Channel
from fedrec.federation.messages import SERVER, MessageKind


class FederatedServer:
    """The federated server: the global network F (online and target) and its optimiser.

    It sees Q-value tensors, Q-value gradients and TD labels, nothing else; it has no reference
    to any platform object.
    """

    def __init__(
        self,
        platforms: Sequence[str],
        *,
        num_candidates: int,
        config: FedSlateConfig,
        channel: Channel,
        seed: int,
    ) -> None:
        self.platforms, self.channel, self.config = list(platforms), channel, config
        self.network = _seeded(
            seed,
            lambda: FederatedNetwork(
                len(self.platforms),
                num_candidates,
                config.global_hidden,
                config.global_network,
                config.head,
            ),
        )
        self.target_network = copy.deepcopy(self.network).requires_grad_(False)
        self.optimizer = _adam(self.network.parameters(), config.learning_rate)
        self.rng = np.random.default_rng(seed)
        self.updates = 0
        self._q: dict[str, np.ndarray] = {}
        self._labels: dict[str, np.ndarray] = {}
        self._pending: tuple[str, torch.Tensor, torch.Tensor] | None = None

    def _inputs(self, own: str, q: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([q[own]] + [q[p] for p in self.platforms if p != own], dim=1)

    def _collect(self, kind: MessageKind, senders: Sequence[str]) -> dict[str, np.ndarray]:
        return {p: self.channel.receive(SERVER, kind) for p in senders}

    def serve(self, platforms: Sequence[str] | None = None) -> None:
        """Acting phase: receive every platform's Q(s), send each its Q~ = F([own; others])."""
        q = self._collect(MessageKind.Q_VALUES, self.platforms)
        tensors = {p: torch.from_numpy(np.array(v)) for p, v in q.items()}
        with torch.no_grad():
            for p in platforms or self.platforms:
                fed = self.network(self._inputs(p, tensors)).numpy()
                self.channel.send(MessageKind.FEDERATED_Q_VALUES, SERVER, p, fed)

    def send_indices(self, size: int) -> None:
        """The round's shared replay rows (uniform, without replacement), to every platform."""
        index = self.rng.choice(size, self.config.batch_size, replace=False).astype(np.int64)
        for p in self.platforms:
            self.channel.send(MessageKind.SAMPLE_INDICES, SERVER, p, index)

    def serve_targets(self, receivers: Sequence[str]) -> None:
        """F^-([Q^-_own(s'); Q^-_others(s')]) to each platform that computes a label."""
        q = self._collect(MessageKind.TARGET_Q_VALUES, self.platforms)
        tensors = {p: torch.from_numpy(np.array(v)) for p, v in q.items()}
        with torch.no_grad():
            for p in receivers:
                fed = self.target_network(self._inputs(p, tensors)).numpy()
                self.channel.send(MessageKind.FEDERATED_Q_VALUES, SERVER, p, fed)

    def receive_q_values(self, senders: Sequence[str]) -> None:
        for p, value in self._collect(MessageKind.Q_VALUES, senders).items():
            self._q[p] = np.array(value)

    def receive_label(self, sender: str) -> None:
        self._labels[sender] = np.array(self.channel.receive(SERVER, MessageKind.TD_TARGETS))

    def forward_label(self, source: str, receiver: str) -> None:
        self.channel.send(MessageKind.TD_TARGETS, SERVER, receiver, self._labels[source])

    def send_federated(self, platform: str) -> None:
        """Send Q~_p = F([Q_p; Q_others]) (graph kept) to platform p for its loss."""
        leaves = {
            p: torch.tensor(value, requires_grad=(p == platform)) for p, value in self._q.items()
        }
        fed = self.network(self._inputs(platform, leaves))
        self._pending = (platform, fed, leaves[platform])
        self.channel.send(
            MessageKind.FEDERATED_Q_VALUES, SERVER, platform, fed.detach().numpy().copy()
        )

    def apply_gradient(self) -> None:
        """Receive dLoss/dQ~_p, step F, and return dLoss/dQ_p to platform p."""
        platform, fed, leaf = self._pending
        grad = self.channel.receive(SERVER, MessageKind.Q_GRADIENTS)
        self.optimizer.zero_grad()
        fed.backward(torch.from_numpy(np.array(grad)))
        self.optimizer.step()
        self.updates += 1
        self._pending = None
        self.channel.send(MessageKind.Q_GRADIENTS, SERVER, platform, leaf.grad.numpy())

    def end_round(self) -> None:
        self._q, self._labels = {}, {}

    def sync_target(self) -> None:
        self.target_network.load_state_dict(self.network.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {
            "network": self.network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "updates": self.updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.network.load_state_dict(state["network"])
        self.target_network.load_state_dict(state["target_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.updates = int(state["updates"])
