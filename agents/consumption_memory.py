"""An agent-side memory of what each user consumed, to make a partly observed state Markov.

The Choc-vs-Kale observation shows the current candidates, a noisy satisfaction reading and the
last clicks and engagements, but not *what* the user consumed. The user's latent exposure is a
discounted sum of the consumed items' features, so a recommender that remembers its own slates
can track it. This is what a production recommender does with its own logs: the memory uses
nothing but the agent's own past slates and the observed clicks.

The memory is ``[decay-discounted sum of consumed item features, steps since episode start]``
per user. It is added to the observation under :data:`MEMORY_KEY`, so a network that reads every
user key (SlateQ) picks it up without other changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

#: Observation key under which the agent's memory is added.
MEMORY_KEY = "agent_memory"


class ConsumptionMemory:
    """Per-user memory for a batch of users; updated once per step from the latest response."""

    def __init__(self, *, decay: float, item_dim: int) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"memory decay must be in (0, 1], got {decay}")
        self.decay, self.item_dim = float(decay), int(item_dim)
        self.memory = np.zeros((0, item_dim + 1), np.float32)
        self.shown = np.zeros((0, 0, item_dim), np.float32)  # features of the last slate shown
        self.has_shown = np.zeros(0, bool)
        self.acted: np.ndarray | None = None  # the memory the last act used (state s)

    @property
    def dim(self) -> int:
        return self.item_dim + 1

    def begin(self, mask: np.ndarray) -> None:
        """Clear the users in ``mask``; a new batch size (a fresh rollout) must reset everyone."""
        mask = np.asarray(mask, dtype=bool)
        if len(mask) != len(self.memory):
            if not mask.all():
                raise ValueError(
                    f"begin_episodes got {len(mask)} users but the memory holds {len(self.memory)}"
                )
            self.memory = np.zeros((len(mask), self.dim), np.float32)
            self.shown = np.zeros((len(mask), 0, self.item_dim), np.float32)
            self.has_shown = np.zeros(len(mask), bool)
            self.acted = None
        self.memory[mask] = 0.0
        self.has_shown[mask] = False

    def _advance(self, memory: np.ndarray, clicks: np.ndarray, shown: np.ndarray) -> np.ndarray:
        consumed = (np.asarray(clicks, np.float32)[..., None] * shown).sum(axis=1)
        advanced = memory.copy()
        advanced[:, :-1] = self.decay * memory[:, :-1] + consumed
        advanced[:, -1] += 1.0
        return advanced

    def observe(self, observations: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Fold the users' latest responses into the memory; the observation with the memory."""
        batch = len(np.asarray(observations["candidates"]))
        if len(self.memory) == 0:  # first use without begin_episodes: everyone starts now
            self.begin(np.ones(batch, bool))
        if len(self.memory) != batch:
            raise ValueError(
                f"{batch} users but the memory holds {len(self.memory)}: call begin_episodes first"
            )
        rows = self.has_shown
        if rows.any():
            clicks = np.asarray(observations["response_click"])[rows, -1, :]
            self.memory[rows] = self._advance(self.memory[rows], clicks, self.shown[rows])
        return {**observations, MEMORY_KEY: self.memory.copy()}

    def record(self, observations: Mapping[str, np.ndarray], slates: np.ndarray) -> None:
        """Remember the slates just shown (their features) and the memory the act used."""
        candidates = np.asarray(observations["candidates"], np.float32)
        self.shown = np.take_along_axis(candidates, np.asarray(slates)[..., None], axis=1)
        self.has_shown = np.ones(len(slates), bool)
        self.acted = self.memory.copy()

    def transition(
        self,
        observations: Mapping[str, np.ndarray],
        next_observations: Mapping[str, np.ndarray],
        slates: np.ndarray,
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(s, s') with the memory: the one the act used, and that one after this step's click."""
        if self.acted is None or len(self.acted) != len(slates):
            raise ValueError("learn() must follow explore_batch()/act_batch() on the same users")
        candidates = np.asarray(observations["candidates"], np.float32)
        shown = np.take_along_axis(candidates, np.asarray(slates)[..., None], axis=1)
        clicks = np.asarray(next_observations["response_click"])[:, -1, :]
        following = self._advance(self.acted, clicks, shown)
        return {**observations, MEMORY_KEY: self.acted.copy()}, {
            **next_observations,
            MEMORY_KEY: following,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "memory": self.memory.copy(),
            "shown": self.shown.copy(),
            "has_shown": self.has_shown.copy(),
            "acted": None if self.acted is None else self.acted.copy(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.memory = np.array(state["memory"])
        self.shown = np.array(state["shown"])
        self.has_shown = np.array(state["has_shown"])
        self.acted = None if state["acted"] is None else np.array(state["acted"])
