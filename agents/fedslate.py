"""FedSlate (Deng et al., 2024): federated slate Q-learning across platforms, and its baselines.

K platforms recommend to the same user. Platform k keeps a *local* Q network Q_k(s_k) in R^N (one
value per candidate), its replay, rewards and choice model; a federated server keeps the *global*
network F, which maps [Q_k(s_k); Q_others(s_others)] (own first, the others in platform order) to
platform k's federated item values Q~_k. A platform serves the SlateQ greedy slate on
(v, Q~_k), with v its choice model's weights. Every tensor that crosses a party boundary goes
through :class:`fedrec.federation.channel.Channel` (validated and counted); the parties are
separate objects (:class:`Platform`, :class:`FederatedServer`) that hold no reference to each
other, so no party can read another's data, rewards or parameters. The protocol (who sends what,
when) is in :class:`FedSlateAgent` and ``docs/fedslate.md``.

Methods (``FedSlateConfig.method``):

* ``fedslate`` -- the basic version (spec 2.4): each platform with feedback does the "A" update
  (SmoothL1 of Q~_A(s, i_c) on y_A = r + gamma (1 - done) W(s', greedy on F^-[Q^-(s')])); each
  platform without feedback does the "B" update: SmoothL1 of its greedy slate value W(s_B, Q~_B)
  on the feedback platform's label y_A for the same step (it never sees a reward of its own).
* ``fedslate_exp`` -- FedSlate(exp) (spec 2.5): every platform has feedback and does the A update
  with its own reward, click and next state.
* ``fedq`` -- our FedQ baseline (no public code): the same federated networks and protocol, but
  a DQN without the slate decomposition: the consumed item is the action, the target is
  r + gamma max_j Q~^-(s', j), slates are the top-k of Q~ and a no-feedback platform regresses
  max_j Q~_B(s_B, j) on the label.
* ``slateq`` -- per-platform SlateQ with the same local network and schedule, without F: nothing
  crosses a boundary, and a platform without feedback cannot learn (it keeps its initial net).

``global_network="linear"`` is the paper's ablation (F is one linear layer).
``global_network="residual"`` (Q~_k = Q_k + MLP([Q_k; Q_others]), the MLP's last layer starting at
zero) and ``local_network="itemwise"`` are labelled deviations from the paper, measured in
``docs/fedslate.md`` ("Diagnosis"); the paper's architecture stays the default.

Quirks of the official code that are fixed (spec 2.7): predictions use online nets on s and
targets use target nets on s' (all platforms); labels are NumPy arrays received by message, so no
gradient flows through them; no raw document ids (state = [user, candidate features, last H
engagement vectors]); linear output heads with rewards scaled by 1 / mean |reward| of the burn-in
(the code's tanh heads saturate with per-step rewards of 10-20); the agent's choice model defaults
to the env's true MNL (``choice_model="paper"`` is the code's misspecified softmax).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from fedrec.agents.choice_models import TrueChoiceModel
from fedrec.agents.slate_selection import select_slates, slate_values
from fedrec.agents.slateq import FeatureNormalizer, clicked_slots
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.federation.channel import Channel, Transport
from fedrec.federation.messages import SERVER, MessageKind, PrivacyViolation

Method = Literal["fedslate", "fedslate_exp", "fedq", "slateq"]
METHODS: tuple[str, ...] = ("fedslate", "fedslate_exp", "fedq", "slateq")
FEDERATED_METHODS = ("fedslate", "fedslate_exp", "fedq")
Observations = Mapping[str, Mapping[str, np.ndarray]]


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class FedSlateConfig:
    """FedSlate hyperparameters; the official code's value is given where ours differs.

    Counts are in transitions of one platform (user-steps), the code's "steps", so a batched env
    of U users follows the same schedule per unit of experience.
    """

    method: str = dataclasses.field(
        default="fedslate",
        metadata=_help("fedslate | fedslate_exp | fedq | slateq (local only, no federation)"),
    )
    global_network: Literal["mlp", "linear", "residual"] = dataclasses.field(
        default="mlp",
        metadata=_help(
            "F: mlp (the paper's), linear (the paper's ablation), or residual: own Q + MLP "
            "(a labelled deviation, see docs/fedslate.md)"
        ),
    )
    gamma: float = dataclasses.field(default=0.9, metadata=_help("discount (code: 0.9)"))
    local_network: Literal["position", "itemwise"] = dataclasses.field(
        default="position",
        metadata=_help(
            "position: the paper's state -> N outputs; itemwise: one MLP shared across candidates "
            "(a labelled deviation, see docs/fedslate.md)"
        ),
    )
    local_hidden: tuple[int, ...] = dataclasses.field(
        default=(128, 128), metadata=_help("local Q net hidden layers, Mish (code: 5 x 4096)")
    )
    global_hidden: tuple[int, ...] = dataclasses.field(
        default=(128, 128), metadata=_help("federated net F hidden layers, Mish (code: 4 x 2048)")
    )
    local_activation: Literal["mish", "relu"] = dataclasses.field(
        default="mish",
        metadata=_help("local net activation (code: Mish; relu is SlateQ's and ~4x cheaper)"),
    )
    head: Literal["linear", "tanh"] = dataclasses.field(
        default="linear",
        metadata=_help("output heads (code: tanh, which saturates on rewards of 10-20)"),
    )
    learning_rate: float = dataclasses.field(
        default=1e-3, metadata=_help("Adam step size, one optimiser per network (code: 0.01)")
    )
    batch_size: int = dataclasses.field(default=32, metadata=_help("replay batch (code: 32)"))
    buffer_size: int = dataclasses.field(
        default=2_000, metadata=_help("replay capacity per platform (code: 2,000)")
    )
    learning_starts: int = dataclasses.field(
        default=5_000, metadata=_help("burn-in transitions before learning (code: 5,000)")
    )
    train_frequency: int = dataclasses.field(
        default=3, metadata=_help("transitions per learning round (code: 3)")
    )
    target_update_interval: int = dataclasses.field(
        default=500, metadata=_help("transitions between target syncs, all nets (code: 500)")
    )
    epsilon_decay: float = dataclasses.field(
        default=0.99995, metadata=_help("epsilon = decay ** transitions (code: 0.99995)")
    )
    epsilon_floor: float = dataclasses.field(
        default=0.1, metadata=_help("below this epsilon drops to epsilon_end (code: 0.1)")
    )
    epsilon_end: float = dataclasses.field(
        default=0.0, metadata=_help("exploration after the floor is crossed (code: 0)")
    )
    reward_scale: float = dataclasses.field(
        default=0.0, metadata=_help("reward multiplier in labels; 0 = 1 / mean |r| of burn-in")
    )
    choice_model: Literal["true", "paper"] = dataclasses.field(
        default="true",
        metadata=_help("env's true MNL, or the code's softmax([u x_i, 1]) (misspecified)"),
    )
    normalize_inputs: bool = dataclasses.field(
        default=True, metadata=_help("standardise states with mean/std frozen after burn-in")
    )

    def __post_init__(self) -> None:
        checks = {
            "method": self.method in METHODS,
            "global_network": self.global_network in ("mlp", "linear", "residual"),
            "gamma": 0.0 <= self.gamma <= 1.0,
            "local_network": self.local_network in ("position", "itemwise"),
            "local_hidden": len(self.local_hidden) >= 1 and min(self.local_hidden) >= 1,
            "local_activation": self.local_activation in ("mish", "relu"),
            "global_hidden": len(self.global_hidden) >= 1 and min(self.global_hidden) >= 1,
            "head": self.head in ("linear", "tanh"),
            "learning_rate": self.learning_rate > 0,
            "batch_size": self.batch_size >= 1,
            "buffer_size": self.buffer_size >= self.batch_size,
            "learning_starts": self.learning_starts >= 0,
            "train_frequency": self.train_frequency >= 1,
            "target_update_interval": self.target_update_interval >= 1,
            "epsilon_decay": 0.0 < self.epsilon_decay <= 1.0,
            "epsilon_floor": 0.0 <= self.epsilon_floor <= 1.0,
            "epsilon_end": 0.0 <= self.epsilon_end <= 1.0,
            "reward_scale": self.reward_scale >= 0,
            "choice_model": self.choice_model in ("true", "paper"),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if self.global_network == "residual" and self.head != "linear":
            bad.append("head")  # the residual F adds a correction to Q_own: no squashing head
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise ValueError(f"invalid FedSlate config: {values}")

    @property
    def federated(self) -> bool:
        return self.method in FEDERATED_METHODS


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


def platform_state(observations: Mapping[str, np.ndarray]) -> np.ndarray:
    """A platform's state vector: [user (1), candidate features (N), last H engagements (H n)].

    No document ids (spec 2.7). A platform without feedback has no engagement history.
    """
    parts = [
        np.asarray(observations["user"], dtype=np.float32).reshape(len(observations["user"]), -1),
        np.asarray(observations["candidates"], dtype=np.float32)[..., 0],
    ]
    if "response_engagement" in observations:
        engagement = np.asarray(observations["response_engagement"], dtype=np.float32)
        parts.append(engagement.reshape(len(engagement), -1))
    return np.concatenate(parts, axis=1)


class PlatformReplay:
    """A platform's own ring buffer. A platform without feedback stores no reward and no click."""

    def __init__(self, capacity: int, *, feedback: bool) -> None:
        self.capacity, self.feedback = int(capacity), feedback
        self.size = 0
        self.cursor = 0
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, **batch: np.ndarray) -> None:
        if not self.feedback and ({"reward", "clicked_slot"} & set(batch)):
            raise PrivacyViolation("a platform without feedback cannot store rewards or clicks")
        if not self.arrays:
            self.arrays = {
                k: np.zeros((self.capacity, *np.shape(v)[1:]), dtype=np.asarray(v).dtype)
                for k, v in batch.items()
            }
        count = len(next(iter(batch.values())))
        index = (self.cursor + np.arange(count)) % self.capacity
        for key, value in batch.items():
            self.arrays[key][index] = value
        self.cursor = int((self.cursor + count) % self.capacity)
        self.size = min(self.size + count, self.capacity)

    def take(self, index: np.ndarray) -> dict[str, np.ndarray]:
        return {key: value[index] for key, value in self.arrays.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "cursor": self.cursor,
            "arrays": {k: v.copy() for k, v in self.arrays.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.size, self.cursor = int(state["size"]), int(state["cursor"])
        self.arrays = {k: np.array(v) for k, v in state["arrays"].items()}


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
        """Q_k^-(s'_k): the target net on the *next* states (spec 2.7)."""
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


class FedSlateAgent:
    """The K platforms and the server, and the protocol that runs them (acting and learning).

    The orchestration below passes no data between parties: each call tells one party to do
    its part, and whatever it needs from another party arrives through the channel.

    :param platforms: platform names in env order; ``feedback`` says which observe responses.
    :param state_dims: each platform's state size (:func:`platform_state`).
    """

    def __init__(
        self,
        *,
        platforms: Sequence[str],
        feedback: Mapping[str, bool],
        state_dims: Mapping[str, int],
        params: ChocKaleParams,
        config: FedSlateConfig = FedSlateConfig(),
        seed: int = 0,
        transport: Transport | None = None,
    ) -> None:
        self.config, self.params = config, params
        self.names = list(platforms)
        self.feedback = {p: bool(feedback[p]) for p in self.names}
        self.feedback_platforms = [p for p in self.names if self.feedback[p]]
        self.silent_platforms = [p for p in self.names if not self.feedback[p]]
        if config.method == "fedslate_exp" and self.silent_platforms:
            raise ValueError(
                f"fedslate_exp needs feedback on every platform; {self.silent_platforms} have none"
            )
        if config.federated and self.silent_platforms and not self.feedback_platforms:
            raise ValueError("a platform without feedback needs a feedback platform's label")
        seeds = np.random.SeedSequence(seed).generate_state(len(self.names) + 1)
        self.channel = (
            Channel(self.names, num_candidates=params.num_candidates, transport=transport)
            if config.federated
            else None
        )
        self.platforms = {
            name: Platform(
                name,
                feedback=self.feedback[name],
                state_dim=int(state_dims[name]),
                params=params,
                config=config,
                channel=self.channel,
                seed=int(seeds[i]),
            )
            for i, name in enumerate(self.names)
        }
        self.server = (
            FederatedServer(
                self.names,
                num_candidates=params.num_candidates,
                config=config,
                channel=self.channel,
                seed=int(seeds[-1]),
            )
            if config.federated
            else None
        )
        #: the label each platform without feedback learns from (the first feedback platform)
        self.label_source = self.feedback_platforms[0] if self.feedback_platforms else None
        self.transitions_seen = 0
        self.rounds = 0
        self.target_syncs = 0
        self._train_debt = 0
        self.last_loss: dict[str, float] = {}

    @classmethod
    def from_env(
        cls, env: Any, *, config: FedSlateConfig | None = None, seed: int = 0, **kwargs: Any
    ) -> FedSlateAgent:
        """Build for a :class:`~fedrec.envs.multi_platform.ChocKaleMultiPlatformBatchEnv`."""
        config = config if config is not None else FedSlateConfig()
        dims = {}
        for name in env.possible_agents:
            sample = {
                k: np.asarray(v)[None] for k, v in env.observation_spaces[name].sample().items()
            }
            dims[name] = platform_state(sample).shape[1]
        return cls(
            platforms=env.possible_agents,
            feedback=env.feedback,
            state_dims=dims,
            params=env.params,
            config=config,
            seed=seed,
            **kwargs,
        )

    # ------------------------------------------------------------------ schedule
    @property
    def epsilon(self) -> float:
        c = self.config
        eps = c.epsilon_decay**self.transitions_seen
        return c.epsilon_end if eps < c.epsilon_floor else eps

    @property
    def learning(self) -> bool:
        return self.transitions_seen >= self.config.learning_starts

    # ------------------------------------------------------------------ acting
    def _slates(self, observations: Observations, epsilon: float) -> dict[str, np.ndarray]:
        states = {p: platform_state(observations[p]) for p in self.names}
        if self.channel is not None:
            self.channel.step = self.transitions_seen
            for p in self.names:
                self.platforms[p].send_q_values(states[p])
            self.server.serve()
        return {p: self.platforms[p].choose(states[p], epsilon) for p in self.names}

    def explore(self, observations: Observations) -> dict[str, np.ndarray]:
        """Behaviour slates: greedy on federated values, an independent epsilon coin per platform."""
        return self._slates(observations, self.epsilon)

    def act(self, observations: Observations) -> dict[str, np.ndarray]:
        """Greedy slates (evaluation)."""
        return self._slates(observations, 0.0)

    def act_joint(
        self, observations: Observations, oracle: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """:class:`fedrec.eval.rollout.JointPolicy` interface (the oracle is ignored)."""
        del oracle
        return self.act(observations)

    # ------------------------------------------------------------------ learning
    def observe(
        self,
        observations: Observations,
        slates: Mapping[str, np.ndarray],
        rewards: Mapping[str, np.ndarray],
        next_observations: Observations,
        terminated: np.ndarray,
    ) -> dict[str, float]:
        """Store one joint step for U users and run the learning rounds it pays for.

        ``rewards`` holds the platforms *with feedback* only; a reward for a platform without
        feedback is refused (:class:`PrivacyViolation`)."""
        leaked = [p for p in rewards if not self.feedback.get(p, False)]
        if leaked:
            raise PrivacyViolation(f"rewards of platforms without feedback were passed: {leaked}")
        burn_in = not self.learning
        for p in self.names:
            self.platforms[p].store(
                observations[p],
                slates[p],
                next_observations[p],
                terminated,
                rewards.get(p) if self.feedback[p] else None,
                burn_in=burn_in,
            )
        before = self.transitions_seen
        self.transitions_seen += len(terminated)
        interval = self.config.target_update_interval
        syncs = self.transitions_seen // interval - before // interval
        if burn_in and self.learning:
            for platform in self.platforms.values():
                platform.start_learning()
            if self.server is not None:
                self.server.sync_target()
        if self.learning:
            self._train_debt += self.transitions_seen - max(before, self.config.learning_starts)
            while self._train_debt >= self.config.train_frequency:
                self._train_debt -= self.config.train_frequency
                self.learn_round()
        if syncs:
            self.sync_targets()
        return dict(self.last_loss)

    def sync_targets(self) -> None:
        for platform in self.platforms.values():
            platform.sync_target()
        if self.server is not None:
            self.server.sync_target()
        self.target_syncs += 1

    def learn_round(self) -> None:
        """One learning round: every local net updated once, F once per platform (spec 2.4)."""
        size = self.platforms[self.names[0]].replay.size
        if size < self.config.batch_size:
            return
        if self.server is None:
            self._local_round()
        else:
            self._federated_round(size)
        self.rounds += 1

    def _local_round(self) -> None:
        for p in self.feedback_platforms:  # a platform without feedback cannot learn alone
            platform = self.platforms[p]
            platform.begin_round()
            platform.compute_label(send=False)
            self.last_loss[p] = platform.local_update()

    def _federated_round(self, size: int) -> None:
        server, platforms = self.server, self.platforms
        self.channel.step = self.transitions_seen
        server.send_indices(size)
        for p in self.names:
            platforms[p].begin_round()
        # Labels of the feedback platforms, from F^- on every platform's target values at s'.
        for p in self.names:
            platforms[p].send_target_q_values()
        server.serve_targets(self.feedback_platforms)
        for p in self.feedback_platforms:
            platforms[p].compute_label(send=bool(self.silent_platforms) and p == self.label_source)
            if self.silent_platforms and p == self.label_source:
                server.receive_label(p)
        # Updates in order: feedback platforms ("A"), then those without feedback ("B").
        for p in self.feedback_platforms + self.silent_platforms:
            if not self.feedback[p]:
                server.forward_label(self.label_source, p)
            fresh = [name for name in self.names if platforms[name].needs_fresh_q]
            for name in fresh:
                platforms[name].send_fresh_q_values()
            server.receive_q_values(fresh)
            server.send_federated(p)
            self.last_loss[p] = platforms[p].send_loss_gradient()
            server.apply_gradient()
            platforms[p].apply_gradient()
        server.end_round()
        if self.channel.transport.pending():
            raise RuntimeError("protocol error: undelivered messages at the end of a round")

    # ------------------------------------------------------------------ bookkeeping
    def end_episode(self, episodes: int) -> None:
        if self.channel is not None:
            self.channel.end_episode(episodes)

    def traffic(self) -> dict[str, dict[str, float]]:
        return self.channel.per_episode() if self.channel is not None else {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(self.config),
            "platforms": {p: self.platforms[p].state_dict() for p in self.names},
            "server": self.server.state_dict() if self.server is not None else None,
            "channel": self.channel.state_dict() if self.channel is not None else None,
            "transitions_seen": self.transitions_seen,
            "rounds": self.rounds,
            "target_syncs": self.target_syncs,
            "train_debt": self._train_debt,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for p in self.names:
            self.platforms[p].load_state_dict(state["platforms"][p])
        if self.server is not None:
            self.server.load_state_dict(state["server"])
        if self.channel is not None:
            self.channel.load_state_dict(state["channel"])
        self.transitions_seen = int(state["transitions_seen"])
        self.rounds = int(state["rounds"])
        self.target_syncs = int(state["target_syncs"])
        self._train_debt = int(state["train_debt"])


class RandomMultiPolicy:
    """Uniformly random slates of n distinct items on every platform (the code's baseline)."""

    def __init__(self, platforms: Sequence[str], params: ChocKaleParams, *, seed: int = 0):
        self.names, self.params = list(platforms), params
        self.rng = np.random.default_rng(seed)
        self.config = None

    @classmethod
    def from_env(cls, env: Any, *, seed: int = 0, **_: Any) -> RandomMultiPolicy:
        return cls(env.possible_agents, env.params, seed=seed)

    def act(self, observations: Observations) -> dict[str, np.ndarray]:
        p = self.params
        users = len(observations[self.names[0]]["candidates"])
        return {
            name: np.argsort(self.rng.random((users, p.num_candidates)), axis=1)[
                :, : p.slate_size
            ].astype(np.int64)
            for name in self.names
        }

    explore = act

    def act_joint(self, observations: Observations, oracle: Any = None) -> dict[str, np.ndarray]:
        return self.act(observations)

    def observe(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return {}

    def end_episode(self, episodes: int) -> None:
        return None

    def traffic(self) -> dict[str, dict[str, float]]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


#: Method names accepted by :func:`make_agent` (``random`` plus :data:`METHODS`).
ALL_METHODS: tuple[str, ...] = (*METHODS, "random")


def make_agent(
    method: str, env: Any, *, seed: int = 0, config: FedSlateConfig | None = None, **overrides: Any
) -> FedSlateAgent | RandomMultiPolicy:
    """The agent for ``method`` on ``env`` (``random`` or a :class:`FedSlateConfig` method)."""
    if method == "random":
        return RandomMultiPolicy.from_env(env, seed=seed)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {ALL_METHODS}")
    base = config if config is not None else FedSlateConfig()
    return FedSlateAgent.from_env(
        env, config=dataclasses.replace(base, method=method, **overrides), seed=seed
    )
