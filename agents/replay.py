"""A uniform replay buffer of slate transitions, filled B users at a time.

Written for fedrec rather than taken from a library because SlateQ needs two things the usual
DQN buffers lack: the clicked slot of each transition and the *next slate* of the same user
(for SARSA targets), which only becomes known one vector step later. Everything is a NumPy
ring buffer, so :meth:`ReplayBuffer.state_dict` captures it exactly for resumable checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.federation.messages import PrivacyViolation


class ReplayBuffer:
    """Ring buffer of ``(s, A, clicked_slot, r, s', terminated, A')`` for a vector env of B users.

    :param capacity: number of transitions kept (the oldest are overwritten).
    :param num_envs: users per :meth:`add` call; the buffer links each user's consecutive
        transitions to fill in the next slate ``A'``.
    """

    def __init__(self, *, capacity: int, num_envs: int) -> None:
        if capacity < 1 or num_envs < 1:
            raise ValueError(f"capacity and num_envs must be >= 1, got {capacity}, {num_envs}")
        self.capacity, self.num_envs = int(capacity), int(num_envs)
        self.size = 0
        self.cursor = 0
        self.arrays: dict[str, np.ndarray] = {}
        # Index of each user's latest transition, -1 after its episode ended.
        self.last_index = np.full(num_envs, -1, dtype=np.int64)

    def _allocate(self, example: Mapping[str, np.ndarray]) -> None:
        for key, value in example.items():
            value = np.asarray(value)
            self.arrays[key] = np.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype)

    def add(
        self,
        *,
        observations: Mapping[str, np.ndarray],
        slates: np.ndarray,
        clicked_slot: np.ndarray,
        rewards: np.ndarray,
        next_observations: Mapping[str, np.ndarray],
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        """Store one vector step (B transitions) and link each user's previous one to its slate."""
        batch = {f"obs/{k}": np.asarray(v) for k, v in observations.items()}
        batch.update({f"next_obs/{k}": np.asarray(v) for k, v in next_observations.items()})
        slates = np.asarray(slates, dtype=np.int64)
        batch["slate"] = slates
        batch["next_slate"] = np.zeros_like(slates)
        batch["has_next_slate"] = np.zeros(len(slates), dtype=bool)
        batch["clicked_slot"] = np.asarray(clicked_slot, dtype=np.int64)
        batch["reward"] = np.asarray(rewards, dtype=np.float32)
        batch["terminated"] = np.asarray(terminated, dtype=bool)
        if len(slates) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} transitions per add, got {len(slates)}")
        if not self.arrays:
            self._allocate(batch)
        elif set(batch) != set(self.arrays):
            raise ValueError(
                f"transition keys changed: {sorted(batch)} vs {sorted(self.arrays)} (same env?)"
            )
        index = (self.cursor + np.arange(self.num_envs)) % self.capacity
        for key, value in batch.items():
            self.arrays[key][index] = value
        # Link each user's previous transition to this slate (SARSA's A'), unless it was overwritten.
        previous = self.last_index
        linked = previous >= 0
        linked &= ~np.isin(previous, index)
        self.arrays["next_slate"][previous[linked]] = slates[linked]
        self.arrays["has_next_slate"][previous[linked]] = True
        done = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
        self.last_index = np.where(done, -1, index)
        self.cursor = int((self.cursor + self.num_envs) % self.capacity)
        self.size = min(self.size + self.num_envs, self.capacity)

    def sample(
        self, rng: np.random.Generator, batch_size: int, *, need_next_slate: bool = False
    ) -> dict[str, np.ndarray]:
        """A uniform sample (with replacement) of stored transitions.

        With ``need_next_slate`` only transitions whose next slate is known, or that terminated
        (no bootstrap needed), are eligible.
        """
        if self.size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        if need_next_slate:
            eligible = (
                self.arrays["has_next_slate"][: self.size] | self.arrays["terminated"][: self.size]
            )
            candidates = np.flatnonzero(eligible)
            if candidates.size == 0:
                raise ValueError("no transition with a known next slate yet")
            index = candidates[rng.integers(0, candidates.size, batch_size)]
        else:
            index = rng.integers(0, self.size, batch_size)
        return {key: value[index] for key, value in self.arrays.items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "cursor": self.cursor,
            "last_index": self.last_index.copy(),
            "arrays": {k: v[: self.size].copy() for k, v in self.arrays.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.size, self.cursor = int(state["size"]), int(state["cursor"])
        self.last_index = np.asarray(state["last_index"]).copy()
        self.arrays = {}
        for key, value in state["arrays"].items():
            full = np.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype)
            full[: len(value)] = value
            self.arrays[key] = full


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
