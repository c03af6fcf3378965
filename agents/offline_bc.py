"""Behaviour cloning of logged slates (``bc``): imitate the logging policy, ignore the rewards.

A per-item scoring network f(s, i) (SlateQ's shared item MLP over [user, item] features,
:class:`fedrec.agents.slateq.ItemQNetwork`) defines a Plackett--Luce policy over slates: slot 1
is a softmax over the N candidates, slot k a softmax over the candidates not yet placed. Training
maximises the exact log-likelihood of the logged slates (the listwise loss of ListMLE, Xia et al.
2008, applied to logged slates as behaviour cloning does to logged actions, Pomerleau 1991);
acting returns the most likely slate's greedy approximation, the K best-scored candidates, best
first. BC recovers a deterministic logger exactly when f can rank as the logger does, and the
mode of a mixture logger (its most frequent slate) when the mixture's deterministic part dominates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fedrec.agents.base import Info, Observation, SlateAgent, slate_size_of
from fedrec.agents.offline import OfflineData, OfflineLearner, minibatch, observations_of
from fedrec.agents.slateq import FeatureNormalizer, ItemQNetwork, split_features


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class BCConfig:
    """Behaviour-cloning hyperparameters."""

    hidden_sizes: tuple[int, ...] = dataclasses.field(
        default=(64, 32), metadata=_help("hidden layers of the shared item scoring network")
    )
    learning_rate: float = dataclasses.field(default=1e-3, metadata=_help("Adam step size"))
    batch_size: int = dataclasses.field(
        default=256, metadata=_help("logged transitions per gradient step")
    )
    normalize_inputs: bool = dataclasses.field(
        default=True, metadata=_help("standardise features with the dataset's mean/std")
    )

    def __post_init__(self) -> None:
        checks = {
            "hidden_sizes": len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1,
            "learning_rate": self.learning_rate > 0,
            "batch_size": self.batch_size >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise ValueError(f"invalid BC config: {values}")


def plackett_luce_nll(scores: torch.Tensor, slates: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood per slot of ``slates`` (B, K) under the Plackett--Luce policy
    with item ``scores`` (B, N): slot k is a softmax over the candidates not placed before it."""
    rows = torch.arange(len(slates))
    placed = torch.zeros_like(scores, dtype=torch.bool)
    total = scores.new_zeros(len(slates))
    for k in range(slates.shape[1]):
        free = scores.masked_fill(placed, float("-inf"))
        total = total + torch.logsumexp(free, dim=1) - scores[rows, slates[:, k]]
        placed = placed.clone()
        placed[rows, slates[:, k]] = True
    return total.mean() / slates.shape[1]


class BehaviourCloningAgent(OfflineLearner, SlateAgent):
    """Plackett--Luce behaviour cloning of logged slates; acts by the top-K scores."""

    Config = BCConfig

    def __init__(
        self,
        *,
        slate_size: int,
        num_candidates: int,
        user_dim: int,
        item_dim: int,
        config: BCConfig = BCConfig(),
        seed: int | None = None,
    ) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        if slate_size > num_candidates:
            raise ValueError(f"slate_size {slate_size} exceeds num_candidates {num_candidates}")
        self.config, self.num_candidates = config, num_candidates
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.default_rng(seed).integers(2**31)))
            self.network = ItemQNetwork(user_dim, item_dim, config.hidden_sizes)
        self.optimizer = torch.optim.Adam(self.network.parameters(), lr=config.learning_rate)
        self.normalizer = FeatureNormalizer()
        self.gradient_steps = 0

    @classmethod
    def from_env(
        cls, env: Any, *, config: Any = None, seed: int | None = None
    ) -> BehaviourCloningAgent:
        config = config if config is not None else BCConfig()
        space = getattr(env, "single_observation_space", None) or env.observation_space
        sample = {k: np.asarray(v)[None] for k, v in space.sample().items()}
        user, items = split_features(sample)
        return cls(
            slate_size=slate_size_of(env),
            num_candidates=items.shape[1],
            user_dim=user.shape[1],
            item_dim=items.shape[2],
            config=config,
            seed=seed,
        )

    def _tensors(self, observations: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        user, items = split_features(observations)
        user, items = self.normalizer("user", user), self.normalizer("items", items)
        return (
            torch.from_numpy(np.ascontiguousarray(user, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(items, dtype=np.float32)),
        )

    @torch.no_grad()
    def scores(self, observations: Observation) -> np.ndarray:
        """f(s, i) of every candidate (B, N)."""
        return self.network(*self._tensors(observations)).double().numpy()

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        order = np.argsort(-self.scores(observations), axis=1, kind="stable")
        return order[:, : self.slate_size].astype(np.int64)

    # ----------------------------------------------------------------------------- offline
    def prepare(self, data: OfflineData) -> None:
        if self.config.normalize_inputs and not self.normalizer.frozen:
            user, items = split_features(observations_of(data))
            self.normalizer.update(user=user, items=items)
            self.normalizer.freeze()

    def offline_step(self, data: OfflineData) -> dict[str, float]:
        batch = minibatch(data, self.rng, self.config.batch_size)
        user, items = self._tensors(observations_of(batch))
        loss = plackett_luce_nll(self.network(user, items), torch.from_numpy(batch["slate"]))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.gradient_steps += 1
        return {"loss": loss.item()}

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(
            config=dataclasses.asdict(self.config),
            network=self.network.state_dict(),
            optimizer=self.optimizer.state_dict(),
            normalizer=self.normalizer.state_dict(),
            gradient_steps=self.gradient_steps,
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.normalizer.load_state_dict(state["normalizer"])
        self.gradient_steps = int(state["gradient_steps"])
