"""The seeded sweep over users that evaluation-mode and Taobao episodes take their users from.

A sweep is a permutation of all users (drawn by :meth:`UserSweep.shuffle`) and a cursor: each
new episode takes the next user, so U episodes visit every user exactly once. The single env
(one slot, :class:`SweepEnv`) and the vector env (B slots) take users from the same sweep in the
same order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedrec.envs.state import StateReader


class UserSweep:
    """Mixin of a core with ``data.num_users``: the sweep's ``order`` and ``cursor``."""

    data: object
    order: np.ndarray
    cursor: int

    def shuffle(self, rng: np.random.Generator) -> None:
        """A new sweep: a permutation of the users drawn from ``rng``, from its start."""
        self.order = rng.permutation(self.data.num_users)
        self.cursor = 0

    def next_users(self, count: int) -> np.ndarray:
        """The next ``count`` users of the sweep (it wraps around), advancing the cursor."""
        take = (self.cursor + np.arange(count)) % self.data.num_users
        users = self.order[take]
        self.cursor = (self.cursor + count) % self.data.num_users
        return users


class SweepEnv:
    """Mixin of a single env whose core is a :class:`UserSweep` (attribute ``_core``)."""

    _core: UserSweep
    _shuffled: bool

    def _reset_sweep(self, seed: int | None, options: dict[str, Any] | None) -> Any:
        """The start of ``reset``: seed the generator, begin a new sweep on a seeded or the first
        reset, and return the user ``options`` asks for (None: the next user of the sweep)."""
        super().reset(seed=seed)  # type: ignore[misc]
        if seed is not None or not self._shuffled:
            self._core.shuffle(self.np_random)  # type: ignore[attr-defined]
            self._shuffled = True
        return None if options is None else options.get("user")


def read_order(read: StateReader, key: str, size: int) -> np.ndarray:
    """A permutation of ``range(size)`` (a sweep's order) from a state being loaded."""
    order = read.array(key, (size,), np.int64, hint=f"{size} users in the data set")
    if not np.array_equal(np.sort(order), np.arange(size)):
        raise read.fail(key, f"is not a permutation of the {size} users")
    return order
