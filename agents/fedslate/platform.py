"""A FedSlate platform: its local Q network, replay, choice model, exploration and losses."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fedrec.agents.choice_models import TrueChoiceModel
from fedrec.agents.fedslate.config import FedSlateConfig
from fedrec.agents.fedslate.networks import LOCAL_NETWORKS, _adam, _seeded
from fedrec.agents.replay import PlatformReplay
from fedrec.agents.slate_selection import select_slates, slate_values
from fedrec.agents.slateq import FeatureNormalizer, clicked_slots
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.federation.channel import Channel
from fedrec.federation.messages import SERVER, MessageKind, PrivacyViolation


def platform_state(observations: Mapping[str, np.ndarray]) -> np.ndarray:
    """A platform's state vector: [user (1), candidate features (N), last H engagements (H n)].

    No document ids (docs/fedslate.md, "Official-code quirks fixed"). A platform without feedback has no engagement history.
    """
    parts = [
        np.asarray(observations["user"], dtype=np.float32).reshape(len(observations["user"]), -1),
        np.asarray(observations["candidates"], dtype=np.float32)[..., 0],
    ]
    if "response_engagement" in observations:
        engagement = np.asarray(observations["response_engagement"], dtype=np.float32)
        parts.append(engagement.reshape(len(engagement), -1))
    return np.concatenate(parts, axis=1)


def smooth_l1_and_grad(prediction: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    """SmoothL1 (beta 1), mean over the elements, and its gradient w.r.t. ``prediction``.

    Written out in NumPy (it equals ``torch.nn.functional.smooth_l1_loss``; tested) so that a
    platform computes its loss gradient on received values without an autograd graph."""
    if prediction.size == 0:
        return 0.0, np.zeros_like(prediction)
    diff = prediction.astype(np.float64) - target
    absolute = np.abs(diff)
    loss = np.where(absolute < 1.0, 0.5 * diff**2, absolute - 0.5).mean()
    return float(loss), np.clip(diff, -1.0, 1.0) / diff.size


class Platform:
    """One platform: its local Q network (online and target), replay, choice model, exploration.

    It talks to the server only through ``channel`` and holds no reference to other parties.
    """

    def __init__(
        self,
        name: str,
        *,
        feedback: bool,
        state_dim: int,
        params: ChocKaleParams,
        config: FedSlateConfig,
        channel: Channel | None,
        seed: int,
    ) -> None:
        self.name, self.feedback, self.config, self.channel = name, feedback, config, channel
        self.num_candidates, self.slate_size = params.num_candidates, params.slate_size
        self.q_network = _seeded(
            seed,
            lambda: LOCAL_NETWORKS[config.local_network](
                state_dim,
                params.num_candidates,
                config.local_hidden,
                config.head,
                config.local_activation,
            ),
        )
        self.target_network = copy.deepcopy(self.q_network).requires_grad_(False)
        self.optimizer = _adam(self.q_network.parameters(), config.learning_rate)
        self.true_choice = TrueChoiceModel(params)
        self.replay = PlatformReplay(config.buffer_size, feedback=feedback)
        self.normalizer = FeatureNormalizer()
        self.rng = np.random.default_rng(seed)
        self.reward_scale = config.reward_scale
        self.abs_reward_sum = 0.0
        self.reward_count = 0
        self.updates = 0
        # Round state (rebuilt every learning round, never checkpointed mid-round).
        self._batch: dict[str, np.ndarray] | None = None
        self._q_graph: torch.Tensor | None = None
        self._label: np.ndarray | None = None
        self._pending_loss = 0.0
        self.last_values: np.ndarray | None = None  # the item values of the last choice

    # ------------------------------------------------------------------ features and choice
    def _norm(self, state: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self.normalizer("state", state)))

    def choice_weights(self, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(v, v_null) of the candidates in a raw state vector (candidates at columns 1..N)."""
        candidates = state[:, 1 : 1 + self.num_candidates].astype(np.float64)
        if self.config.choice_model == "paper":  # the code's softmax([u x_1..u x_N, 1.0])
            logits = state[:, :1].astype(np.float64) * candidates
            top = np.maximum(logits.max(axis=1, keepdims=True), 1.0)
            return np.exp(logits - top), np.exp(1.0 - top[:, 0])
        return self.true_choice.weights(candidates[..., None])

    def _select(self, v: np.ndarray, q: np.ndarray, v_null: np.ndarray) -> np.ndarray:
        if self.config.method == "fedq":
            return np.argsort(-q, axis=1, kind="stable")[:, : self.slate_size].astype(np.int64)
        return select_slates("greedy", v, q, v_null, self.slate_size)

    # ------------------------------------------------------------------ acting
    @torch.no_grad()
    def local_q(self, state: np.ndarray) -> np.ndarray:
        return self.q_network(self._norm(state)).numpy()

    def send_q_values(self, state: np.ndarray) -> None:
        """Acting phase: Q_k(s_k) of the online net to the server."""
        self.channel.send(MessageKind.Q_VALUES, self.name, SERVER, self.local_q(state))

    def choose(self, state: np.ndarray, epsilon: float) -> np.ndarray:
        """The slate: greedy on the federated values (from the server) or local values; then an
        independent epsilon coin per user replaces it with n distinct random items."""
        if self.channel is not None:
            q = self.channel.receive(self.name, MessageKind.FEDERATED_Q_VALUES)
        else:
            q = self.local_q(state)
        v, v_null = self.choice_weights(state)
        slates = self._select(v, q.astype(np.float64), v_null)
        self.last_values = q  # for diagnostics (FedSlateAgent.diagnostics); not state
        if epsilon > 0.0:
            explore = self.rng.random(len(state)) < epsilon
            keys = self.rng.random((len(state), self.num_candidates))
            random = np.argsort(keys, axis=1)[:, : self.slate_size].astype(np.int64)
            slates = np.where(explore[:, None], random, slates)
        return slates

    # ------------------------------------------------------------------ experience
    def store(
        self,
        observations: Mapping[str, np.ndarray],
        slates: np.ndarray,
        next_observations: Mapping[str, np.ndarray],
        terminated: np.ndarray,
        reward: np.ndarray | None = None,
        *,
        burn_in: bool,
    ) -> None:
        state, next_state = platform_state(observations), platform_state(next_observations)
        batch = {
            "state": state,
            "slate": np.asarray(slates, dtype=np.int64),
            "next_state": next_state,
            "terminated": np.asarray(terminated, dtype=bool),
        }
        if self.feedback:
            if reward is None:
                raise ValueError(f"{self.name} has feedback: store() needs its reward")
            batch["reward"] = np.asarray(reward, dtype=np.float32)
            batch["clicked_slot"] = clicked_slots(next_observations, slates)
            if burn_in:
                self.abs_reward_sum += float(np.abs(reward).sum())
                self.reward_count += len(reward)
        elif reward is not None:
            raise PrivacyViolation(f"{self.name} has no feedback and must never receive a reward")
        if burn_in:
            self.normalizer.update(state=state)
        self.replay.add(**batch)

    def start_learning(self) -> None:
        if self.config.normalize_inputs:
            self.normalizer.freeze()
        if self.config.reward_scale == 0.0:
            mean_abs = self.abs_reward_sum / max(self.reward_count, 1)
            self.reward_scale = 1.0 / mean_abs if mean_abs > 0 else 1.0
        self.sync_target()

    def sync_target(self) -> None:
        self.target_network.load_state_dict(self.q_network.state_dict())

    # ------------------------------------------------------------------ learning round
    def begin_round(self, index: np.ndarray | None = None) -> None:
        """Load the round's batch: the server's shared indices, or (local) its own sample."""
        if index is None:
            if self.channel is not None:
                index = self.channel.receive(self.name, MessageKind.SAMPLE_INDICES)
            else:
                index = self.rng.choice(self.replay.size, self.config.batch_size, replace=False)
        self._batch = self.replay.take(np.asarray(index))
        self._q_graph = None
        self._label = None

    def send_target_q_values(self) -> None:
        """Q_k^-(s'_k): the target net on the *next* states (docs/fedslate.md, "Official-code quirks fixed")."""
        with torch.no_grad():
            q = self.target_network(self._norm(self._batch["next_state"])).numpy()
        self.channel.send(MessageKind.TARGET_Q_VALUES, self.name, SERVER, q)

    def send_fresh_q_values(self) -> None:
        """Q_k(s_k) of the online net on the batch, with its graph kept for the backward pass.

        Sent once per round and again after this platform's own update ("recompute Q_A")."""
        if self._q_graph is None:
            self._q_graph = self.q_network(self._norm(self._batch["state"]))
            payload = self._q_graph.detach().numpy().copy()
            self.channel.send(MessageKind.Q_VALUES, self.name, SERVER, payload)

    def compute_label(self, *, send: bool) -> None:
        """y = r + gamma (1 - done) V(s'), from federated (or local) target values at s'."""
        if not self.feedback:
            raise PrivacyViolation(f"{self.name} has no feedback: it has no reward to label with")
        b, c = self._batch, self.config
        if self.channel is not None:
            q_next = self.channel.receive(self.name, MessageKind.FEDERATED_Q_VALUES)
        else:
            with torch.no_grad():
                q_next = self.target_network(self._norm(b["next_state"])).numpy()
        q_next = q_next.astype(np.float64)
        if c.method == "fedq":
            value = q_next.max(axis=1)
        else:
            v, v_null = self.choice_weights(b["next_state"])
            value = slate_values(v, q_next, v_null, self._select(v, q_next, v_null))
        value = np.where(b["terminated"], 0.0, value)
        reward = b["reward"].astype(np.float64) * (self.reward_scale or 1.0)
        self._label = (reward + c.gamma * value).astype(np.float32)
        if send:
            self.channel.send(MessageKind.TD_TARGETS, self.name, SERVER, self._label)

    def loss_and_grad(self, q: np.ndarray, label: np.ndarray) -> tuple[float, np.ndarray]:
        """This platform's loss on item values ``q`` (B, N) and its gradient dLoss/dq.

        "A" update (own label): SmoothL1(q(s, i_c), y) on clicked rows. "B" update (the feedback
        platform's label): SmoothL1(W(s, greedy on q), y), with the greedy slate held fixed
        (FedQ: max_j q(s, j)). ``label`` is data: nothing flows back through it."""
        b = self._batch
        q = np.asarray(q, dtype=np.float64)
        grad = np.zeros_like(q)
        users = np.arange(len(q))
        if self.feedback:
            rows = np.flatnonzero(b["clicked_slot"] >= 0)
            item = b["slate"][rows, b["clicked_slot"][rows]]
            loss, g = smooth_l1_and_grad(q[rows, item], label[rows].astype(np.float64))
            grad[rows, item] = g
        elif self.config.method == "fedq":
            best = q.argmax(axis=1)
            loss, g = smooth_l1_and_grad(q[users, best], label.astype(np.float64))
            grad[users, best] = g
        else:
            v, v_null = self.choice_weights(b["state"])
            slates = self._select(v, q, v_null)
            vs = np.take_along_axis(v, slates, axis=1)
            den = v_null + vs.sum(axis=1)
            value = (vs * np.take_along_axis(q, slates, axis=1)).sum(axis=1) / den
            loss, g = smooth_l1_and_grad(value, label.astype(np.float64))
            np.put_along_axis(grad, slates, g[:, None] * vs / den[:, None], axis=1)
        return loss, grad.astype(np.float32)

    @property
    def needs_fresh_q(self) -> bool:
        """True when the server holds no Q(s) of this platform's current net for this round."""
        return self._q_graph is None

    def local_update(self) -> float:
        """SlateQ without federation: an ordinary TD step on the local net."""
        q = self.q_network(self._norm(self._batch["state"]))
        loss, grad = self.loss_and_grad(q.detach().numpy(), self._label)
        self.optimizer.zero_grad()
        q.backward(torch.from_numpy(grad))
        self.optimizer.step()
        self.updates += 1
        return loss

    def send_loss_gradient(self) -> float:
        """Receive Q~_k (and, without feedback, the label) and send dLoss/dQ~_k to the server."""
        label = self._label
        if not self.feedback:
            label = self.channel.receive(self.name, MessageKind.TD_TARGETS)
        fed = self.channel.receive(self.name, MessageKind.FEDERATED_Q_VALUES)
        loss, grad = self.loss_and_grad(fed, label)
        self.channel.send(MessageKind.Q_GRADIENTS, self.name, SERVER, grad)
        return loss

    def apply_gradient(self) -> None:
        """Receive dLoss/dQ_k(s_k) from the server and take one Adam step on the local net."""
        grad = self.channel.receive(self.name, MessageKind.Q_GRADIENTS)
        self.optimizer.zero_grad()
        self._q_graph.backward(torch.from_numpy(np.array(grad)))
        self.optimizer.step()
        self.updates += 1
        self._q_graph = None  # stale: the next use recomputes with the updated net

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "q_network": self.q_network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "replay": self.replay.state_dict(),
            "normalizer": self.normalizer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "reward_scale": self.reward_scale,
            "abs_reward_sum": self.abs_reward_sum,
            "reward_count": self.reward_count,
            "updates": self.updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.q_network.load_state_dict(state["q_network"])
        self.target_network.load_state_dict(state["target_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.normalizer.load_state_dict(state["normalizer"])
        self.rng.bit_generator.state = state["rng"]
        self.reward_scale = float(state["reward_scale"])
        self.abs_reward_sum = float(state["abs_reward_sum"])
        self.reward_count = int(state["reward_count"])
        self.updates = int(state["updates"])
