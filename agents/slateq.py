"""SlateQ (Ie et al., 2019): slate Q-learning by item-wise decomposition.

Q(s, A) = sum_{i in A} P(i | s, A) * Qbar(s, i), with one MLP ``Qbar`` over [user, item] features
shared by every candidate, by acting and by training. The file reads top to bottom like a CleanRL
script: the hyperparameters (:class:`SlateQConfig`), the network, then the agent, whose
:meth:`SlateQAgent.learn` is the whole algorithm (store, then every ``train_frequency``
transitions one TD step on a replay batch).

Defects of the public implementations that are *not* copied (see ``docs/slateq.md``):

1. RecSim and RLlib evaluate the target network at s instead of s'. Here targets use s'
   (``next_observations``), and a test pins it.
2. RecSim's Keras layers lost weight sharing, so the acting network was never trained. Here one
   module serves every candidate, acting and training (tested by identity).
3. RLlib passes RMSProp's decay 0.95 as ``weight_decay``. Here it is RMSProp's ``alpha`` and
   weight decay stays 0 (tested).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from fedrec.agents.base import (
    Info,
    Observation,
    SlateAgent,
    Transitions,
    random_slates,
    slate_size_of,
)
from fedrec.agents.choice_models import LearnedMNLChoiceModel, TrueChoiceModel
from fedrec.agents.consumption_memory import MEMORY_KEY, ConsumptionMemory
from fedrec.agents.replay import ReplayBuffer
from fedrec.agents.slate_selection import select_slates, slate_values

Selection = Literal["topk", "greedy", "optimal"]
Target = Literal["sarsa", "topk", "greedy", "optimal"]

#: Observation key of the candidates' features; every other key describes the user.
ITEM_KEY = "candidates"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class SlateQConfig:
    """SlateQ hyperparameters. Counts are in transitions (user-steps), so that batched and
    single-env training follow the same schedule per unit of experience."""

    gamma: float = dataclasses.field(
        default=0.9, metadata=_help("discount; 0 gives the myopic variant (MYOP)")
    )
    target: Target = dataclasses.field(
        default="optimal",
        metadata=_help("TD target: sarsa, topk (TT), greedy (GT) or optimal (OT)"),
    )
    selection: Selection = dataclasses.field(
        default="greedy",
        metadata=_help(
            "slate optimiser for acting: topk (TS), greedy (GS) or optimal (OS, linear program)"
        ),
    )
    optimal_solver: Literal["lp", "dinkelbach"] = dataclasses.field(
        default="dinkelbach",
        metadata=_help(
            "exact solver behind 'optimal': the Charnes-Cooper LP (HiGHS) or Dinkelbach (same optimum, faster)"
        ),
    )
    choice_model: Literal["true", "learned"] = dataclasses.field(
        default="true",
        metadata=_help("the env's true choice model, or a learned MNL with a null item"),
    )
    hidden_sizes: tuple[int, ...] = dataclasses.field(
        default=(64, 32),
        metadata=_help(
            "hidden layers of the shared item Q network (RecSim: 256 32; 64 32 is ~3x faster on CPU)"
        ),
    )
    learning_rate: float = dataclasses.field(default=1e-3, metadata=_help("optimiser step size"))
    optimizer: Literal["adam", "rmsprop"] = dataclasses.field(
        default="adam",
        metadata=_help("adam, or RMSProp (centered, alpha=rmsprop_decay) as in Dopamine"),
    )
    rmsprop_decay: float = dataclasses.field(
        default=0.95, metadata=_help("RMSProp's smoothing constant alpha (not weight decay)")
    )
    loss: Literal["mse", "huber"] = dataclasses.field(
        default="mse", metadata=_help("TD loss on clicked transitions (RecSim: mse)")
    )
    batch_size: int = dataclasses.field(
        default=32, metadata=_help("replay batch per gradient step")
    )
    buffer_size: int = dataclasses.field(
        default=20_000, metadata=_help("replay capacity in transitions")
    )
    learning_starts: int = dataclasses.field(
        default=5_000,
        metadata=_help("transitions collected (random slates) before the first update"),
    )
    train_frequency: int = dataclasses.field(
        default=4, metadata=_help("transitions per gradient step")
    )
    target_update_interval: int = dataclasses.field(
        default=500, metadata=_help("gradient steps between hard target-network copies")
    )
    epsilon_start: float = dataclasses.field(
        default=1.0, metadata=_help("exploration rate when learning starts")
    )
    epsilon_end: float = dataclasses.field(default=0.01, metadata=_help("final exploration rate"))
    epsilon_decay: int = dataclasses.field(
        default=50_000,
        metadata=_help("transitions over which epsilon decays linearly after learning_starts"),
    )
    reward_scale: float = dataclasses.field(
        default=0.0,
        metadata=_help(
            "multiplies rewards in TD targets; 0 = auto, 1 / mean |reward| of the warm-up"
        ),
    )
    normalize_inputs: bool = dataclasses.field(
        default=True, metadata=_help("standardise features with mean/std frozen at learning_starts")
    )
    memory_decay: float = dataclasses.field(
        default=0.0,
        metadata=_help(
            "decay of the agent's own memory of consumed item features (plus the step count), "
            "added to the state; 0 = off: the state is the observation, as in the paper"
        ),
    )

    def __post_init__(self) -> None:
        checks = {
            "gamma": 0.0 <= self.gamma <= 1.0,
            "target": self.target in ("sarsa", "topk", "greedy", "optimal"),
            "selection": self.selection in ("topk", "greedy", "optimal"),
            "optimal_solver": self.optimal_solver in ("lp", "dinkelbach"),
            "choice_model": self.choice_model in ("true", "learned"),
            "hidden_sizes": len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1,
            "learning_rate": self.learning_rate > 0,
            "optimizer": self.optimizer in ("adam", "rmsprop"),
            "rmsprop_decay": 0.0 < self.rmsprop_decay < 1.0,
            "loss": self.loss in ("mse", "huber"),
            "batch_size": self.batch_size >= 1,
            "buffer_size": self.buffer_size >= self.batch_size,
            "learning_starts": self.learning_starts >= 0,
            "train_frequency": self.train_frequency >= 1,
            "target_update_interval": self.target_update_interval >= 1,
            "epsilon_start": 0.0 <= self.epsilon_start <= 1.0,
            "epsilon_end": 0.0 <= self.epsilon_end <= 1.0,
            "epsilon_decay": self.epsilon_decay >= 0,
            "reward_scale": self.reward_scale >= 0,
            "memory_decay": 0.0 <= self.memory_decay <= 1.0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise ValueError(f"invalid SlateQ config: {values}")


class ItemQNetwork(nn.Module):
    """Qbar(s, i): one MLP over [user features, item features], applied to every candidate.

    The first layer W [u; d] + b is computed as (W_u u + b) + W_d d, which is the same function
    but evaluates the user part once per user instead of once per candidate (N times cheaper).
    """

    def __init__(self, user_dim: int, item_dim: int, hidden_sizes: tuple[int, ...]) -> None:
        super().__init__()
        first, *rest = hidden_sizes
        self.user_layer = nn.Linear(user_dim, first)
        self.item_layer = nn.Linear(item_dim, first, bias=False)
        layers: list[nn.Module] = [nn.ReLU()]
        width = first
        for size in rest:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.head = nn.Sequential(*layers)
        # Initialise like one nn.Linear(user_dim + item_dim, first) would.
        joint = nn.Linear(user_dim + item_dim, first)
        with torch.no_grad():
            self.user_layer.weight.copy_(joint.weight[:, :user_dim])
            self.user_layer.bias.copy_(joint.bias)
            self.item_layer.weight.copy_(joint.weight[:, user_dim:])

    def forward(self, user: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, U) and (B, N, D) -> item values (B, N)."""
        hidden = self.user_layer(user)[:, None, :] + self.item_layer(items)
        return self.head(hidden).squeeze(-1)


class FeatureNormalizer:
    """Per-feature mean/std of user and item features, accumulated until frozen.

    Freezing at ``learning_starts`` keeps the network's inputs stationary during learning.
    """

    def __init__(self) -> None:
        self.count = 0.0
        self.sums: dict[str, np.ndarray] = {}
        self.frozen = False
        self.mean: dict[str, np.ndarray] = {}
        self.std: dict[str, np.ndarray] = {}

    def update(self, **features: np.ndarray) -> None:
        if self.frozen:
            return
        for name, x in features.items():
            flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
            s = self.sums.setdefault(name, np.zeros((3, x.shape[-1])))
            s += [np.full(x.shape[-1], len(flat)), flat.sum(0), (flat**2).sum(0)]

    def freeze(self) -> None:
        for name, (n, total, squares) in self.sums.items():
            n = np.maximum(n, 1.0)
            mean = total / n
            self.mean[name] = mean.astype(np.float32)
            self.std[name] = (
                np.sqrt(np.maximum(squares / n - mean**2, 0.0)).clip(1e-3).astype(np.float32)
            )
        self.frozen = True

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        if not self.frozen or name not in self.mean:
            return x
        return (x - self.mean[name]) / self.std[name]

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums, "frozen": self.frozen, "mean": self.mean, "std": self.std}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sums = {k: np.array(v) for k, v in state["sums"].items()}
        self.frozen = bool(state["frozen"])
        self.mean = {k: np.array(v) for k, v in state["mean"].items()}
        self.std = {k: np.array(v) for k, v in state["std"].items()}


def split_features(observations: Observation) -> tuple[np.ndarray, np.ndarray]:
    """User features (B, U) (every non-candidate key, flattened) and item features (B, N, D)."""
    if ITEM_KEY not in observations:
        raise ValueError(
            f"SlateQ needs candidate features under {ITEM_KEY!r}; observation has {sorted(observations)}"
        )
    items = np.asarray(observations[ITEM_KEY], dtype=np.float32)
    batch = items.shape[0]
    parts = [
        np.asarray(observations[key], dtype=np.float32).reshape(batch, -1)
        for key in sorted(observations)
        if key != ITEM_KEY
    ]
    user = np.concatenate(parts, axis=1) if parts else np.zeros((batch, 0), np.float32)
    return user, items


@dataclasses.dataclass(frozen=True)
class _Batch:
    """A sampled batch of transitions as the tensors a gradient step needs."""

    next_obs: Observation
    user: torch.Tensor
    items: torch.Tensor
    next_user: torch.Tensor
    next_items: torch.Tensor
    slates: torch.Tensor
    clicked_slot: torch.Tensor


class SlateQAgent(SlateAgent):
    """SlateQ with a shared item Q network, replay, a target network and epsilon-greedy slates.

    Build it with :meth:`from_env` (reads the observation layout and, for ``choice_model='true'``,
    the env's choice model) or directly with the feature sizes.
    """

    Config = SlateQConfig

    def __init__(
        self,
        *,
        slate_size: int,
        num_candidates: int,
        user_dim: int,
        item_dim: int,
        num_envs: int,
        config: SlateQConfig = SlateQConfig(),
        true_choice: TrueChoiceModel | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        if slate_size > num_candidates:
            raise ValueError(f"slate_size {slate_size} exceeds num_candidates {num_candidates}")
        self.config, self.num_candidates = config, num_candidates
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.default_rng(seed).integers(2**31)))
            self.q_network = ItemQNetwork(user_dim, item_dim, config.hidden_sizes)
            self.choice = (
                LearnedMNLChoiceModel(user_dim, item_dim)
                if config.choice_model == "learned"
                else None
            )
        if config.choice_model == "true":
            if true_choice is None:
                raise ValueError("choice_model='true' needs the env's choice model (use from_env)")
            self.choice = true_choice
        self.target_network = copy.deepcopy(self.q_network).requires_grad_(False)
        self.optimizer = self._make_optimizer(self.q_network.parameters())
        self.choice_optimizer = (
            torch.optim.Adam(self.choice.parameters(), lr=config.learning_rate)
            if isinstance(self.choice, nn.Module)
            else None
        )
        self.replay = ReplayBuffer(capacity=config.buffer_size, num_envs=num_envs)
        self.normalizer = FeatureNormalizer()
        self.reward_scale = config.reward_scale
        self._abs_reward_sum = 0.0
        self.transitions_seen = 0
        self.gradient_steps = 0
        self._train_debt = 0
        self.memory = (
            ConsumptionMemory(decay=config.memory_decay, item_dim=item_dim)
            if config.memory_decay > 0
            else None
        )

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateQAgent:
        config = config if config is not None else SlateQConfig()
        space = getattr(env, "single_observation_space", None) or env.observation_space
        sample = {k: np.asarray(v)[None] for k, v in space.sample().items()}
        user, items = split_features(sample)
        memory_dim = items.shape[2] + 1 if config.memory_decay > 0 else 0
        true_choice = None
        if config.choice_model == "true":
            from fedrec.agents.reference import env_params  # a Choc-vs-Kale env is required

            true_choice = TrueChoiceModel(env_params(env))
        return cls(
            slate_size=slate_size_of(env),
            num_candidates=items.shape[1],
            user_dim=user.shape[1] + memory_dim,
            item_dim=items.shape[2],
            num_envs=getattr(env, "num_envs", 1),
            config=config,
            true_choice=true_choice,
            seed=seed,
        )

    def _make_optimizer(self, parameters: Any) -> torch.optim.Optimizer:
        c = self.config
        if c.optimizer == "rmsprop":  # Dopamine's settings; decay is alpha, not weight decay
            return torch.optim.RMSprop(
                parameters, lr=c.learning_rate, alpha=c.rmsprop_decay, eps=1e-5, centered=True
            )
        return torch.optim.Adam(parameters, lr=c.learning_rate)

    # ----------------------------------------------------------------------------- features
    def _tensors(self, observations: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        user, items = split_features(observations)
        user, items = self.normalizer("user", user), self.normalizer("items", items)
        return torch.from_numpy(np.ascontiguousarray(user)), torch.from_numpy(
            np.ascontiguousarray(items)
        )

    def _choice_weights(
        self, observations: Observation, user: torch.Tensor, items: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(self.choice, LearnedMNLChoiceModel):
            return self.choice.weights_from_features(user, items)
        return self.choice.weights(np.asarray(observations[ITEM_KEY]))

    def _select(self, method: str, v: np.ndarray, q: np.ndarray, v_null: np.ndarray) -> np.ndarray:
        if self.choice.positional:  # the user takes slot 0: best item first, then by value
            return np.argsort(-q, axis=1, kind="stable")[:, : self.slate_size].astype(np.int64)
        return select_slates(
            method, v, q, v_null, self.slate_size, solver=self.config.optimal_solver
        )

    def _slate_value(
        self, v: np.ndarray, q: np.ndarray, v_null: np.ndarray, slates: np.ndarray
    ) -> np.ndarray:
        if self.choice.positional:
            return np.take_along_axis(q, slates[:, :1], axis=1)[:, 0]
        return slate_values(v, q, v_null, slates)

    # ----------------------------------------------------------------------------- acting
    def begin_episodes(self, mask: np.ndarray) -> None:
        if self.memory is not None:
            self.memory.begin(mask)

    def _with_memory(self, observations: Observation, *, update: bool) -> Observation:
        if self.memory is None:
            return observations
        if update:
            return self.memory.observe(observations)
        if MEMORY_KEY in observations:
            return observations
        return {**observations, MEMORY_KEY: self.memory.memory.copy()}

    @torch.no_grad()
    def item_values(self, observations: Observation) -> np.ndarray:
        """Qbar(s, i) of every candidate (B, N), in reward units (no memory update)."""
        user, items = self._tensors(self._with_memory(observations, update=False))
        scale = self.reward_scale or 1.0
        return self.q_network(user, items).double().numpy() / scale

    @torch.no_grad()
    def _greedy(self, observations: Observation) -> np.ndarray:
        user, items = self._tensors(observations)
        q = self.q_network(user, items).double().numpy()
        v, v_null = self._choice_weights(observations, user, items)
        return self._select(self.config.selection, v, q, v_null)

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        observations = self._with_memory(observations, update=True)
        slates = self._greedy(observations)
        if self.memory is not None:
            self.memory.record(observations, slates)
        return slates

    @property
    def epsilon(self) -> float:
        c = self.config
        if self.transitions_seen < c.learning_starts:
            return 1.0
        if c.epsilon_decay == 0:
            return c.epsilon_end
        progress = min(1.0, (self.transitions_seen - c.learning_starts) / c.epsilon_decay)
        return c.epsilon_start + progress * (c.epsilon_end - c.epsilon_start)

    def explore_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        """Epsilon-greedy: with probability epsilon a uniformly random slate of distinct items."""
        observations = self._with_memory(observations, update=True)
        batch = len(np.asarray(observations[ITEM_KEY]))
        explore = self.rng.random(batch) < self.epsilon
        slates = random_slates(self.rng, batch, self.num_candidates, self.slate_size)
        if not explore.all():
            slates = np.where(explore[:, None], slates, self._greedy(observations))
        if self.memory is not None:
            self.memory.record(observations, slates)
        return slates

    # ----------------------------------------------------------------------------- learning
    def learn(self, transitions: Transitions) -> dict[str, float]:
        c = self.config
        clicked = clicked_slots(transitions.next_observations, transitions.slates)
        observations, next_observations = transitions.observations, transitions.next_observations
        if self.memory is not None:  # s and s' as the agent saw them: with its memory
            observations, next_observations = self.memory.transition(
                observations, next_observations, transitions.slates
            )
        self.replay.add(
            observations=observations,
            slates=transitions.slates,
            clicked_slot=clicked,
            rewards=transitions.rewards,
            next_observations=next_observations,
            terminated=transitions.terminated,
            truncated=transitions.truncated,
        )
        batch = transitions.batch_size
        before = self.transitions_seen
        self.transitions_seen += batch
        if before < c.learning_starts:
            user, items = split_features(observations)
            self.normalizer.update(user=user, items=items)
            self._abs_reward_sum += float(np.abs(transitions.rewards).sum())
            if self.transitions_seen < c.learning_starts:
                return {}
            self._start_learning()
        self._train_debt += self.transitions_seen - max(before, c.learning_starts)
        metrics: dict[str, float] = {}
        while self._train_debt >= c.train_frequency:
            self._train_debt -= c.train_frequency
            metrics = self._gradient_step()
        return metrics

    def _start_learning(self) -> None:
        if self.config.normalize_inputs:
            self.normalizer.freeze()
        if self.config.reward_scale == 0.0:
            mean_abs = self._abs_reward_sum / max(self.transitions_seen, 1)
            self.reward_scale = 1.0 / mean_abs if mean_abs > 0 else 1.0
        # Inputs changed scale: restart the target from the (still untrained) online network.
        self.target_network.load_state_dict(self.q_network.state_dict())

    def _gradient_step(self) -> dict[str, float]:
        c = self.config
        sample = self.replay.sample(self.rng, c.batch_size, need_next_slate=c.target == "sarsa")
        batch = self._batch(sample)
        metrics = self._fit_choice(batch)
        targets = self._td_targets(sample, batch.next_obs, batch.next_user, batch.next_items)
        clicked = batch.clicked_slot >= 0
        rows = torch.arange(len(batch.slates))
        clicked_item = batch.slates[rows, batch.clicked_slot.clamp(min=0)]
        # Only Qbar(s, i_c) enters the loss: evaluate the network on the clicked items alone.
        prediction = self.q_network(
            batch.user[clicked], batch.items[rows, clicked_item][clicked][:, None, :]
        )[:, 0]
        loss = self._td_loss(prediction, targets[clicked])
        self._optimise(loss)
        metrics.update(loss=loss.item(), epsilon=self.epsilon)
        return metrics

    def _batch(self, sample: Mapping[str, np.ndarray]) -> _Batch:
        """A sampled batch (the replay's, or a logged dataset's for offline SlateQ) as tensors."""
        obs = {k[4:]: v for k, v in sample.items() if k.startswith("obs/")}
        next_obs = {k[9:]: v for k, v in sample.items() if k.startswith("next_obs/")}
        user, items = self._tensors(obs)
        next_user, next_items = self._tensors(next_obs)
        return _Batch(
            next_obs=next_obs,
            user=user,
            items=items,
            next_user=next_user,
            next_items=next_items,
            slates=torch.from_numpy(sample["slate"]),
            clicked_slot=torch.from_numpy(sample["clicked_slot"]),
        )

    def _fit_choice(self, batch: _Batch) -> dict[str, float]:
        """One step of the learned MNL choice model on the batch (nothing with the true model)."""
        if self.choice_optimizer is None:
            return {}
        choice_loss = self.choice.loss(batch.user, batch.items, batch.slates, batch.clicked_slot)
        self.choice_optimizer.zero_grad()
        choice_loss.backward()
        self.choice_optimizer.step()
        return {"choice_loss": choice_loss.item()}

    def _td_loss(self, prediction: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The TD loss of Qbar(s, i_c) on the clicked transitions (Huber or squared error)."""
        if prediction.numel() == 0:
            # RecSim: the loss is 0 without clicked transitions, and the optimiser still steps
            # (zero gradients). The empty sum keeps the graph, so backward() gives those zeros.
            return prediction.sum()
        if self.config.loss == "huber":
            return nn.functional.smooth_l1_loss(prediction, targets)
        return nn.functional.mse_loss(prediction, targets)

    def _optimise(self, loss: torch.Tensor) -> None:
        """One optimiser step on ``loss``; the target network follows every interval."""
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.gradient_steps += 1
        if self.gradient_steps % self.config.target_update_interval == 0:
            self.target_network.load_state_dict(self.q_network.state_dict())

    @torch.no_grad()
    def _td_targets(
        self,
        sample: Mapping[str, np.ndarray],
        next_obs: Observation,
        next_user: torch.Tensor,
        next_items: torch.Tensor,
    ) -> torch.Tensor:
        """y = r + gamma (1 - terminated) V(s'), with V from the target network *at s'*."""
        c = self.config
        rewards = sample["reward"].astype(np.float64) * (self.reward_scale or 1.0)
        if c.gamma == 0.0:
            return torch.from_numpy(rewards.astype(np.float32))
        q_next = self.target_network(next_user, next_items).double().numpy()
        v, v_null = self._choice_weights(next_obs, next_user, next_items)
        if c.target == "sarsa":
            next_slates = sample["next_slate"]
        else:
            next_slates = self._select(c.target, v, q_next, v_null)
        value = self._slate_value(v, q_next, v_null, next_slates)
        value = np.where(sample["terminated"], 0.0, value)
        return torch.from_numpy((rewards + c.gamma * value).astype(np.float32))

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(
            config=dataclasses.asdict(self.config),
            q_network=self.q_network.state_dict(),
            target_network=self.target_network.state_dict(),
            optimizer=self.optimizer.state_dict(),
            replay=self.replay.state_dict(),
            normalizer=self.normalizer.state_dict(),
            reward_scale=self.reward_scale,
            abs_reward_sum=self._abs_reward_sum,
            transitions_seen=self.transitions_seen,
            gradient_steps=self.gradient_steps,
            train_debt=self._train_debt,
            memory=None if self.memory is None else self.memory.state_dict(),
        )
        if self.choice_optimizer is not None:
            state["choice"] = self.choice.state_dict()
            state["choice_optimizer"] = self.choice_optimizer.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.q_network.load_state_dict(state["q_network"])
        self.target_network.load_state_dict(state["target_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.replay.load_state_dict(state["replay"])
        self.normalizer.load_state_dict(state["normalizer"])
        self.reward_scale = float(state["reward_scale"])
        self._abs_reward_sum = float(state["abs_reward_sum"])
        self.transitions_seen = int(state["transitions_seen"])
        self.gradient_steps = int(state["gradient_steps"])
        self._train_debt = int(state["train_debt"])
        if self.memory is not None:
            self.memory.load_state_dict(state["memory"])
        if self.choice_optimizer is not None:
            self.choice.load_state_dict(state["choice"])
            self.choice_optimizer.load_state_dict(state["choice_optimizer"])


def clicked_slots(next_observations: Observation, slates: np.ndarray) -> np.ndarray:
    """The clicked slot of each user's last slate (-1: no click), read from its response.

    The env pushes the latest response into the last row of ``response_click`` (H, n), or gives
    the last slate's clicks alone, (n,) per user (fedrec/InterestEvolution-v0); an agent without
    feedback (no ``response_click``) cannot learn from clicks.
    """
    if "response_click" not in next_observations:
        raise ValueError("SlateQ needs click feedback ('response_click' in the observation)")
    response = np.asarray(next_observations["response_click"])
    last = response[:, -1, :] if response.ndim == 3 else response
    if last.shape != np.shape(slates):
        raise ValueError(f"response_click rows {last.shape} do not match slates {np.shape(slates)}")
    return np.where(last.max(axis=1) > 0, last.argmax(axis=1), -1).astype(np.int64)
