"""SAC+TopK: soft actor-critic whose action is a vector in the candidates' feature space.

The SAC+TopK baseline of SARDINE (Deffayet et al., "SARDINE: A Simulator for Automated
Recommendation in Dynamic and Interactive Environments", TOIS 2024), from GeMS (Deffayet et al.,
WSDM 2023), over SAC (Haarnoja et al., 2018): the actor outputs a continuous action ``a`` of the
item feature size D, and the slate is the K candidates whose features have the largest dot
product with ``a``, largest first (SARDINE's ``TopK`` wrapper, GeMS's ``TopKRanker``). Read top to
bottom like CleanRL's ``sac_continuous_action.py``: the hyperparameters (:class:`SACTopKConfig`),
the networks, then the agent, whose :meth:`SACTopKAgent._gradient_step` is the whole update.

What follows SARDINE/GeMS (``naver/sardine`` 5093bde ``sardine/wrappers/topk.py``; ``naver/gems``
277a85f ``modules/agents.py`` class ``SAC``, ``GeMS/modules/rankers.py`` ``TopKRanker``,
``config/train_baselines.yml`` entry ``SAC``):

* the decoder: scores = candidate features @ a, the K best in descending order;
* a squashed diagonal Gaussian actor, ``a = center + scale * tanh(u)``, log-std clamped to
  [-20, 2]; before ``learning_starts`` actions are uniform in the action box;
* twin Q critics on [state, a], their targets ``min(Q1', Q2')(s', a') - alpha log pi(a'|s')``
  with Polyak-averaged target networks (``tau``) updated every gradient step, the Q loss
  ``(MSE1 + MSE2) / 2``, automatic entropy tuning towards ``-D``;
* the defaults of ``config/train_baselines.yml``: gamma 0.8, tau 0.002, Q learning rate 1e-3,
  actor learning rate 3e-3, alpha learning rate 1e-3 (the parser's default), one hidden layer of
  256 units in each network, replay 10,000, minibatch 20, 2,000 random steps, one gradient step
  per transition.

Labelled deviations:

* **the action box** (``action_box``): SARDINE's box is spanned by the item embeddings (per
  dimension, their min and max: ``action_box="features"``). Choc-vs-Kale's single feature lies in
  [0, 1], so every action in that box ranks candidates by the largest feature (the fixed rule
  ``top_x``) and SAC could learn nothing; the default ``"symmetric"`` box [-m, m] (m: the largest
  feature magnitude) also reaches the mirror ranking.
* **the state**: SARDINE's catalogue is fixed, so its state is the user's (a GRU belief); here the
  candidates change every step, so the actor and critics see [user features, candidate
  features] (the user part is the observation, as in fedrec's SlateQ, not a belief encoder).
* the initial entropy coefficient is ``alpha`` (GeMS starts its learned coefficient at 1 but acts
  with 0.2 until the first update); inputs are standardised with statistics frozen at
  ``learning_starts`` (``normalize_inputs``); ``reward_scale`` multiplies rewards (1: none).

All sampling noise comes from the agent's own NumPy generator, so a checkpoint (networks, target
networks, the three optimisers, the entropy coefficient, replay, input statistics, generator)
resumes bit for bit.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from fedrec.agents.base import Info, Observation, SlateAgent, Transitions, slate_size_of
from fedrec.agents.reinforce_topk import check_slate_env
from fedrec.agents.replay import PlatformReplay
from fedrec.agents.slateq import ITEM_KEY, FeatureNormalizer, split_features

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # GeMS's clamp of the actor's log-std


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class SACTopKConfig:
    """SAC+TopK hyperparameters (SARDINE/GeMS defaults). Counts are in transitions (user-steps)."""

    gamma: float = dataclasses.field(default=0.8, metadata=_help("discount (GeMS: 0.8)"))
    tau: float = dataclasses.field(
        default=0.002, metadata=_help("Polyak step of the target critics per gradient step")
    )
    q_learning_rate: float = dataclasses.field(
        default=1e-3, metadata=_help("Adam step size of the twin critics")
    )
    policy_learning_rate: float = dataclasses.field(
        default=3e-3, metadata=_help("Adam step size of the actor")
    )
    alpha: float = dataclasses.field(
        default=0.2, metadata=_help("entropy coefficient (its start value when autotuned)")
    )
    autotune: bool = dataclasses.field(
        default=True, metadata=_help("tune alpha towards the target entropy -D")
    )
    alpha_learning_rate: float = dataclasses.field(
        default=1e-3, metadata=_help("Adam step size of log alpha")
    )
    hidden_sizes: tuple[int, ...] = dataclasses.field(
        default=(256,), metadata=_help("hidden layers of the actor and of each critic")
    )
    batch_size: int = dataclasses.field(default=20, metadata=_help("minibatch per gradient step"))
    buffer_size: int = dataclasses.field(
        default=10_000, metadata=_help("replay capacity in transitions")
    )
    learning_starts: int = dataclasses.field(
        default=2_000,
        metadata=_help("transitions with uniformly random actions before the first update"),
    )
    train_frequency: int = dataclasses.field(
        default=1, metadata=_help("transitions per gradient step")
    )
    action_box: Literal["symmetric", "features"] = dataclasses.field(
        default="symmetric",
        metadata=_help(
            "action bounds: symmetric [-m, m] per feature, or SARDINE's box of the features' "
            "range (on Choc-vs-Kale it only ranks by the largest feature)"
        ),
    )
    reward_scale: float = dataclasses.field(
        default=1.0, metadata=_help("multiplies rewards in the critics' targets")
    )
    normalize_inputs: bool = dataclasses.field(
        default=True, metadata=_help("standardise features with mean/std frozen at learning_starts")
    )

    def __post_init__(self) -> None:
        checks = {
            "gamma": 0.0 <= self.gamma <= 1.0,
            "tau": 0.0 < self.tau <= 1.0,
            "q_learning_rate": self.q_learning_rate > 0,
            "policy_learning_rate": self.policy_learning_rate > 0,
            "alpha": self.alpha > 0,
            "alpha_learning_rate": self.alpha_learning_rate > 0,
            "hidden_sizes": len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1,
            "batch_size": self.batch_size >= 1,
            "buffer_size": self.buffer_size >= self.batch_size,
            "learning_starts": self.learning_starts >= 0,
            "train_frequency": self.train_frequency >= 1,
            "action_box": self.action_box in ("symmetric", "features"),
            "reward_scale": self.reward_scale > 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise ValueError(f"invalid sac_topk config: {values}")


def mlp(inputs: int, hidden_sizes: tuple[int, ...], outputs: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(inputs, size), nn.ReLU()]
        inputs = size
    return nn.Sequential(*layers, nn.Linear(inputs, outputs))


class SoftQNetwork(nn.Module):
    """Q(s, a) of a state vector and an action vector."""

    def __init__(self, state_dim: int, action_dim: int, hidden_sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.net = mlp(state_dim + action_dim, hidden_sizes, 1)

    def forward(self, state: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([state, action], dim=1)).squeeze(-1)


class SquashedGaussianActor(nn.Module):
    """``a = center + scale * tanh(u)``, ``u ~ N(mean(s), std(s))`` (independent dimensions)."""

    def __init__(
        self,
        state_dim: int,
        action_dim: int,
        hidden_sizes: tuple[int, ...],
        low: np.ndarray,
        high: np.ndarray,
    ) -> None:
        super().__init__()
        self.net = mlp(state_dim, hidden_sizes, 2 * action_dim)
        self.action_dim = action_dim
        self.register_buffer("center", torch.as_tensor((high + low) / 2, dtype=torch.float32))
        self.register_buffer("scale", torch.as_tensor((high - low) / 2, dtype=torch.float32))

    def forward(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(state).split(self.action_dim, dim=1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def greedy(self, state: torch.Tensor) -> torch.Tensor:
        return self.center + self.scale * torch.tanh(self(state)[0])

    def sample(self, state: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparameterised action for standard-normal ``noise`` and its log-density."""
        mean, log_std = self(state)
        u = mean + log_std.exp() * noise
        squashed = torch.tanh(u)
        log_prob = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        log_prob = log_prob - torch.log(self.scale * (1 - squashed.pow(2)) + 1e-6)
        return self.center + self.scale * squashed, log_prob.sum(1)


def action_bounds(item_space: Any, box: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature bounds (D,) of the action from the candidates' Box (N, D)."""
    low = np.asarray(item_space.low, dtype=np.float64).reshape(-1, item_space.shape[-1]).min(0)
    high = np.asarray(item_space.high, dtype=np.float64).reshape(-1, item_space.shape[-1]).max(0)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise ValueError(
            f"sac_topk needs bounded candidate features to bound its action; {ITEM_KEY!r} spans "
            f"[{low}, {high}]"
        )
    if box == "symmetric":
        m = np.maximum(np.abs(low), np.abs(high))
        low, high = -m, m
    high = np.maximum(high, low + 1e-6)  # a constant feature still gets a non-empty box
    return low.astype(np.float32), high.astype(np.float32)


def top_k_slates(items: np.ndarray, actions: np.ndarray, k: int) -> np.ndarray:
    """The K candidates with the largest ``features @ action``, largest first (ties: lower
    index). ``items`` (B, N, D), ``actions`` (B, D)."""
    scores = np.einsum("bnd,bd->bn", items.astype(np.float64), actions.astype(np.float64))
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.int64)


class SACTopKAgent(SlateAgent):
    """SAC+TopK (see the module doc). Build it with :meth:`from_env`."""

    Config = SACTopKConfig

    def __init__(
        self,
        *,
        slate_size: int,
        num_candidates: int,
        user_dim: int,
        item_dim: int,
        low: np.ndarray,
        high: np.ndarray,
        config: SACTopKConfig | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        if slate_size > num_candidates:
            raise ValueError(f"slate_size {slate_size} exceeds num_candidates {num_candidates}")
        c = self.config = config if config is not None else SACTopKConfig()
        self.num_candidates, self.item_dim = num_candidates, item_dim
        self.low, self.high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        state_dim = user_dim + num_candidates * item_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.default_rng(seed).integers(2**31)))
            self.actor = SquashedGaussianActor(
                state_dim, item_dim, c.hidden_sizes, self.low, self.high
            )
            self.qf1 = SoftQNetwork(state_dim, item_dim, c.hidden_sizes)
            self.qf2 = SoftQNetwork(state_dim, item_dim, c.hidden_sizes)
        self.qf1_target = copy.deepcopy(self.qf1).requires_grad_(False)
        self.qf2_target = copy.deepcopy(self.qf2).requires_grad_(False)
        self._online_params = [*self.qf1.parameters(), *self.qf2.parameters()]
        self._target_params = [*self.qf1_target.parameters(), *self.qf2_target.parameters()]
        self.q_optimizer = torch.optim.Adam(self._online_params, lr=c.q_learning_rate)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=c.policy_learning_rate)
        self.target_entropy = -float(item_dim)
        self.log_alpha = torch.tensor([math.log(c.alpha)], requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=c.alpha_learning_rate)
        self.alpha = c.alpha
        self.replay = PlatformReplay(c.buffer_size, feedback=True)
        self.normalizer = FeatureNormalizer()
        self.pending = np.zeros((0, item_dim), dtype=np.float32)  # explore_batch's actions
        self.transitions_seen = 0
        self.gradient_steps = 0
        self._train_debt = 0

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SACTopKAgent:
        config = config if config is not None else SACTopKConfig()
        space, sample = check_slate_env(env, "sac_topk", needs_clicks=False)
        user, items = split_features(sample)
        low, high = action_bounds(space.spaces[ITEM_KEY], config.action_box)
        return cls(
            slate_size=slate_size_of(env),
            num_candidates=items.shape[1],
            user_dim=user.shape[1],
            item_dim=items.shape[2],
            low=low,
            high=high,
            config=config,
            seed=seed,
        )

    # ----------------------------------------------------------------------------- acting
    def _state(self, user: np.ndarray, items: np.ndarray) -> torch.Tensor:
        """[user, candidates] as one standardised vector per user (B, U + N D)."""
        user, items = self.normalizer("user", user), self.normalizer("items", items)
        state = np.concatenate([user, items.reshape(len(items), -1)], axis=1)
        return torch.from_numpy(np.ascontiguousarray(state, dtype=np.float32))

    @torch.no_grad()
    def actions(self, observations: Observation) -> np.ndarray:
        """The greedy action vectors ``center + scale tanh(mean)`` (B, D)."""
        return self.actor.greedy(self._state(*split_features(observations))).numpy()

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        items = split_features(observations)[1]
        return top_k_slates(items, self.actions(observations), self.slate_size)

    def explore_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        """Uniform actions in the box until ``learning_starts``, then sampled from the actor."""
        user, items = split_features(observations)
        if self.transitions_seen < self.config.learning_starts:
            actions = self.rng.uniform(self.low, self.high, (len(items), self.item_dim))
        else:
            noise = self.rng.standard_normal((len(items), self.item_dim))
            with torch.no_grad():
                state = self._state(user, items)
                actions = self.actor.sample(state, torch.as_tensor(noise, dtype=torch.float32))[0]
            actions = actions.numpy()
        self.pending = np.asarray(actions, dtype=np.float32)
        return top_k_slates(items, self.pending, self.slate_size)

    # ----------------------------------------------------------------------------- learning
    def learn(self, transitions: Transitions) -> dict[str, float]:
        c = self.config
        users = transitions.batch_size
        if self.pending.shape[0] != users:
            raise RuntimeError(
                f"sac_topk.learn needs the {users} actions explore_batch took for this step "
                f"(it holds {self.pending.shape[0]})"
            )
        user, items = split_features(transitions.observations)
        next_user, next_items = split_features(transitions.next_observations)
        self.replay.add(
            user=user,
            items=items,
            action=self.pending,
            reward=np.asarray(transitions.rewards, dtype=np.float32),
            next_user=next_user,
            next_items=next_items,
            terminated=np.asarray(transitions.terminated, dtype=bool),
        )
        self.pending = np.zeros((0, self.item_dim), dtype=np.float32)
        before = self.transitions_seen
        self.transitions_seen += users
        if before < c.learning_starts:
            self.normalizer.update(user=user, items=items)
            if self.transitions_seen < c.learning_starts:
                return {}
            if c.normalize_inputs:
                self.normalizer.freeze()
        self._train_debt += self.transitions_seen - max(before, c.learning_starts)
        metrics: dict[str, float] = {}
        while self._train_debt >= c.train_frequency:
            self._train_debt -= c.train_frequency
            metrics = self._gradient_step()
        return metrics

    def _gradient_step(self) -> dict[str, float]:
        c = self.config
        b = self.replay.take(self.rng.integers(0, self.replay.size, c.batch_size))
        state = self._state(b["user"], b["items"])
        next_state = self._state(b["next_user"], b["next_items"])
        action = torch.from_numpy(b["action"])
        reward = torch.from_numpy(b["reward"] * np.float32(c.reward_scale))
        not_done = torch.from_numpy(~b["terminated"]).float()
        noise = torch.as_tensor(
            self.rng.standard_normal((2, c.batch_size, self.item_dim)), dtype=torch.float32
        )

        with torch.no_grad():
            next_action, next_log_pi = self.actor.sample(next_state, noise[0])
            next_q = torch.min(
                self.qf1_target(next_state, next_action), self.qf2_target(next_state, next_action)
            )
            target = reward + c.gamma * not_done * (next_q - self.alpha * next_log_pi)
        q1, q2 = self.qf1(state, action), self.qf2(state, action)
        q_loss = 0.5 * (nn.functional.mse_loss(q1, target) + nn.functional.mse_loss(q2, target))
        self.q_optimizer.zero_grad()
        q_loss.backward()
        self.q_optimizer.step()

        pi_action, log_pi = self.actor.sample(state, noise[1])
        q_pi = torch.min(self.qf1(state, pi_action), self.qf2(state, pi_action))
        actor_loss = (self.alpha * log_pi - q_pi).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()

        if c.autotune:
            alpha_loss = -(self.log_alpha.exp() * (log_pi.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad()
            alpha_loss.backward()
            self.alpha_optimizer.step()
            self.alpha = float(self.log_alpha.detach().exp())

        with torch.no_grad():  # Polyak averaging: target <- (1 - tau) target + tau online
            for param, target_param in zip(self._online_params, self._target_params, strict=True):
                target_param.lerp_(param, c.tau)
        self.gradient_steps += 1
        return {
            "q_loss": float(q_loss.detach()),
            "actor_loss": float(actor_loss.detach()),
            "alpha": self.alpha,
            "q_values": float(q1.detach().mean()),
        }

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        def weights(module: nn.Module) -> dict[str, torch.Tensor]:
            return {k: v.detach().clone() for k, v in module.state_dict().items()}

        return {
            **super().state_dict(),
            "config": dataclasses.asdict(self.config),
            "actor": weights(self.actor),
            "qf1": weights(self.qf1),
            "qf2": weights(self.qf2),
            "qf1_target": weights(self.qf1_target),
            "qf2_target": weights(self.qf2_target),
            "q_optimizer": copy.deepcopy(self.q_optimizer.state_dict()),
            "actor_optimizer": copy.deepcopy(self.actor_optimizer.state_dict()),
            "alpha_optimizer": copy.deepcopy(self.alpha_optimizer.state_dict()),
            "log_alpha": self.log_alpha.detach().clone(),
            "alpha": self.alpha,
            "replay": self.replay.state_dict(),
            "normalizer": self.normalizer.state_dict(),
            "pending": self.pending.copy(),
            "transitions_seen": self.transitions_seen,
            "gradient_steps": self.gradient_steps,
            "train_debt": self._train_debt,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        for name in ("actor", "qf1", "qf2", "qf1_target", "qf2_target"):
            getattr(self, name).load_state_dict(state[name])
        self.q_optimizer.load_state_dict(state["q_optimizer"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(state["log_alpha"]))
        self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.alpha = float(state["alpha"])
        self.replay.load_state_dict(state["replay"])
        self.normalizer.load_state_dict(state["normalizer"])
        self.pending = np.array(state["pending"], dtype=np.float32)
        self.transitions_seen = int(state["transitions_seen"])
        self.gradient_steps = int(state["gradient_steps"])
        self._train_debt = int(state["train_debt"])
