"""LinUCB on slates: a contextual bandit over user-item feature interactions, top-K by UCB.

LinUCB (Li et al., "A Contextual-Bandit Approach to Personalized News Article Recommendation",
WWW 2010, the disjoint-context variant with one shared theta) scores every candidate by
``theta . phi(u, i) + alpha sqrt(phi^T A^-1 phi)`` and serves the K best (the usual top-K slate
extension). ``phi(u, i)`` is the outer product of ``[1, user features]`` and ``[1, x, ...,
x^degree]`` of the item features, both scaled to [0, 1] by the observation space, so the model
holds an item-only part, a user-only part (which ranks nothing) and every user-item interaction.

**Feedback.** The clicked item's target is the step's reward (``target="reward"``: Choc-vs-Kale's
engagement, the logged envs' 1) or 1 (``target="click"``), the other observed items' 0. Which
items are observed: ``feedback="slate"`` (default, position-blind, the usual top-K LinUCB) every
item of the slate, right where the user weighs the whole slate at once (Choc-vs-Kale's MNL choice,
the logged envs' choice of the earliest logged positive); ``feedback="cascade"`` only the items up
to the click, as the cascade agents of :mod:`fedrec.agents.cascade_bandits` read it (all K without
a click), right where the user scans the slate top-down and stops at a click. The click is read from the next observation, as the cascade agents read it; an env
without one, or without item features, is refused in :meth:`from_env` with the reason. Greedy
slates (evaluation) rank by ``theta . phi`` alone; behaviour slates (training) by the UCB.

User features: Choc-vs-Kale's noisy satisfaction reading ``user`` where the env shows it, the
logged envs' ``user_features`` where the data set has them; otherwise ``phi`` is the item part.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np

from fedrec.agents.base import Observation, SlateAgent, Transitions
from fedrec.agents.cascade_bandits import (
    Layout,
    LinearUCBSlateAgent,
    Ridge,
    cascade_feedback,
    clicked_slots,
    layout_of,
    polynomial,
)


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class LinUCBSlateConfig:
    """LinUCB-on-slates hyperparameters."""

    alpha: float = dataclasses.field(
        default=1.0, metadata=_help("exploration: UCB = theta . phi + alpha sqrt(phi^T A^-1 phi)")
    )
    ridge: float = dataclasses.field(
        default=1.0, metadata=_help("ridge prior lambda: A = lambda I + sum phi phi^T")
    )
    degree: int = dataclasses.field(
        default=1, metadata=_help("item part [1, x, ..., x^degree] of every item feature")
    )
    target: Literal["reward", "click"] = dataclasses.field(
        default="reward",
        metadata=_help("the clicked item's regression target: the step's reward, or 1"),
    )
    feedback: Literal["slate", "cascade"] = dataclasses.field(
        default="slate",
        metadata=_help(
            "observed items: the whole slate (position-blind), or the cascade model's, up to "
            "the click"
        ),
    )
    max_dim: int = dataclasses.field(
        default=4096, metadata=_help("refuse an env whose phi has more dimensions than this")
    )

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.ridge <= 0 or self.degree < 1 or self.max_dim < 1:
            raise ValueError(
                "need alpha >= 0, ridge > 0, degree >= 1, max_dim >= 1; got "
                f"{self.alpha}, {self.ridge}, {self.degree}, {self.max_dim}"
            )
        if self.target not in ("reward", "click"):
            raise ValueError(f"target must be reward or click, got {self.target!r}")
        if self.feedback not in ("slate", "cascade"):
            raise ValueError(f"feedback must be slate or cascade, got {self.feedback!r}")


class LinUCBSlateAgent(LinearUCBSlateAgent):
    """LinUCB over user-item feature interactions; the slate is the K highest UCBs."""

    Config = LinUCBSlateConfig

    def __init__(
        self, layout: Layout, *, config: LinUCBSlateConfig | None = None, seed: int | None = None
    ) -> None:
        super().__init__(slate_size=layout.slate_size, seed=seed)
        layout.item_features("linucb_slate")
        self.config = config if config is not None else LinUCBSlateConfig()
        self.layout = layout
        user_dim = 1 + (layout.users.dim if layout.users is not None else 0)
        dim = user_dim * (1 + layout.items.dim * self.config.degree)
        if dim > self.config.max_dim:
            raise ValueError(
                f"linucb_slate: phi would have {dim} dimensions (max_dim={self.config.max_dim}); "
                "raise max_dim if the (dim x dim) matrices fit"
            )
        self.model = Ridge(dim, self.config.ridge)
        self.rounds = 0

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        return cls(layout_of(env, "linucb_slate"), config=config, seed=seed)

    def features(self, observations: Observation) -> np.ndarray:
        """phi(u, i) of every candidate: (B, N, d)."""
        items, users = self.layout.items, self.layout.users
        assert items is not None
        item = polynomial(items.scaled(np.asarray(observations[items.key])), self.config.degree)
        batch = item.shape[0]
        user = np.ones((batch, 1))
        if users is not None:
            seen = users.scaled(np.asarray(observations[users.key]).reshape(batch, -1))
            user = np.concatenate([user, seen], axis=1)
        return (user[:, None, :, None] * item[:, :, None, :]).reshape(*item.shape[:2], -1)

    def learn(self, transitions: Transitions) -> dict[str, float]:
        slates = np.asarray(transitions.slates, dtype=np.int64)
        phi = np.take_along_axis(self.features(transitions.observations), slates[..., None], 1)
        clicked = clicked_slots(transitions.next_observations, self.layout.click_key)
        value = (
            np.asarray(transitions.rewards, dtype=np.float64)
            if self.config.target == "reward"
            else np.ones(len(slates))
        )
        examined, attracted = cascade_feedback(clicked, self.slate_size)
        if self.config.feedback == "slate":
            examined = np.ones_like(examined)
        targets = np.where(attracted, value[:, None], 0.0)
        self.model.update(phi[examined], targets[examined])
        self.rounds += len(slates)
        return {"click_rate": float(np.mean(clicked >= 0)), "rounds": float(self.rounds)}
