"""The batched state of interaction mode: ``num_envs`` users replaying their logs, stepped with numpy.

:class:`_InteractionCore` holds every slot's user, candidates and what has been recommended and
consumed; each method works on an array of slots at once (no Python loop over slots), so the
single env (one slot) and the vector env (:mod:`fedrec.envs.datasets.logged_interaction`) run the
same code and, for ``num_envs=1``, consume the same random numbers.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from gymnasium import spaces

from fedrec.envs.datasets.core_envs import Observation
from fedrec.envs.datasets.logged_features import feature_observation, feature_spaces
from fedrec.envs.datasets.preprocess import PreparedData
from fedrec.envs.state import StateReader


def _first_distinct(
    values: np.ndarray, accept: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first ``sizes[r]`` distinct accepted ``values`` in column order, -1 padded.

    Returns them as a (R, max(sizes)) array and a mask of the rows that had enough of them.
    Kept in draw order, the distinct accepted values of i.i.d. uniform draws over a universe are
    a uniformly random sample without replacement of its accepted part.
    """
    rows = len(values)
    width = int(sizes.max(initial=0))
    index = np.arange(rows)[:, None]
    order = np.argsort(values, axis=1, kind="stable")
    ordered = values[index, order]
    first = np.ones(values.shape, dtype=bool)
    first[index, order[:, 1:]] = ordered[:, 1:] != ordered[:, :-1]
    keep = first & accept
    rank = np.cumsum(keep, axis=1) - 1  # rank of each kept value among the row's kept ones
    row, col = np.nonzero(keep & (rank < sizes[:, None]))
    out = np.full((rows, width), -1, dtype=np.int64)
    out[row, rank[row, col]] = values[row, col]
    return out, rank[:, -1] + 1 >= sizes


class _InteractionCore:
    """Interaction-mode state of ``num_envs`` slots (one user each), updated for many at once.

    Every method takes an array of slot indices and works on all of them with numpy (no Python
    loop over slots), so the single env (one slot) and the vector env run the same code and,
    for ``num_envs=1``, consume the same random numbers.
    """

    def __init__(
        self,
        data: PreparedData,
        *,
        num_envs: int,
        num_candidates: int,
        slate_size: int,
        positives_per_step: int | None,
        split: Literal["train", "all"],
    ) -> None:
        if split not in ("train", "all"):
            raise ValueError(f"split must be 'train' or 'all', got {split!r}")
        if num_candidates > data.num_items:
            raise ValueError(f"num_candidates={num_candidates} exceeds the {data.num_items} items")
        if positives_per_step is not None and not 0 <= positives_per_step <= num_candidates:
            raise ValueError(f"positives_per_step must be in [0, {num_candidates}] or None")
        self.data = data
        self.num_envs = num_envs
        self.num_candidates = num_candidates
        self.slate_size = slate_size
        self.positives_per_step = positives_per_step
        self.split = split
        self.has_ratings = not np.isnan(data.ratings).all()
        n_items = data.num_items
        self.users = np.zeros(num_envs, dtype=np.int64)
        # chronological rank of each item among the user's positives (-1: not a positive)
        self.chrono = np.full((num_envs, n_items), -1, dtype=np.int64)
        self.recommended = np.zeros((num_envs, n_items), dtype=bool)
        self.consumed = np.zeros((num_envs, n_items), dtype=bool)
        self.candidates = np.zeros((num_envs, num_candidates), dtype=np.int64)
        self.last_slate = np.full((num_envs, slate_size), -1, dtype=np.int64)
        self.last_click = np.zeros((num_envs, slate_size), dtype=np.float32)
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.num_positives = np.zeros(num_envs, dtype=np.int64)  # the user's (train) positives
        self.positives_left = np.zeros(num_envs, dtype=np.int64)  # unrecommended positives
        self.items_left = np.zeros(num_envs, dtype=np.int64)  # unrecommended items

    #: the arrays of the state: name -> dtype and what sets their width (None: one value per slot)
    _STATE_ARRAYS: dict[str, tuple[Any, str | None]] = {
        "users": (np.int64, None),
        "chrono": (np.int64, "items"),
        "recommended": (np.bool_, "items"),
        "consumed": (np.bool_, "items"),
        "candidates": (np.int64, "num_candidates"),
        "last_slate": (np.int64, "slate_size"),
        "last_click": (np.float32, "slate_size"),
        "steps": (np.int64, None),
        "num_positives": (np.int64, None),
        "positives_left": (np.int64, None),
        "items_left": (np.int64, None),
    }

    def state_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key).copy() for key in self._STATE_ARRAYS}

    def read_state(self, read: StateReader) -> dict[str, Any]:
        """Checked copies of the core's arrays (nothing changes yet)."""
        widths = {
            "items": self.data.num_items,
            "num_candidates": self.num_candidates,
            "slate_size": self.slate_size,
        }
        checked = {}
        for key, (dtype, width) in self._STATE_ARRAYS.items():
            shape = (self.num_envs,) if width is None else (self.num_envs, widths[width])
            hint = f"num_envs={self.num_envs}" + ("" if width is None else f", {width}={shape[1]}")
            checked[key] = read.array(key, shape, dtype, hint=hint)
        for key, upper in (("users", self.data.num_users), ("candidates", self.data.num_items)):
            ids = checked[key]
            if ids.size and (ids.min() < 0 or ids.max() >= upper):
                raise read.fail(key, f"holds ids outside [0, {upper})")
        return checked

    def set_state(self, checked: dict[str, Any]) -> None:
        for key, value in checked.items():
            setattr(self, key, value)

    def observation_space(self) -> spaces.Dict:
        d, c, n = self.data, self.num_candidates, self.slate_size
        entries: dict[str, spaces.Space] = {
            "user_id": spaces.Box(0, d.num_users - 1, (1,), np.int64),
            "candidate_ids": spaces.Box(0, d.num_items - 1, (c,), np.int64),
            "last_slate": spaces.Box(-1, d.num_items - 1, (n,), np.int64),
            "last_click": spaces.Box(0.0, 1.0, (n,), np.float32),
        }
        return spaces.Dict({**entries, **feature_spaces(d, c)})

    def reset_slots(
        self,
        rng: np.random.Generator,
        slots: np.ndarray,
        users: np.ndarray | None = None,
        *,
        draw: bool = True,
    ) -> None:
        """Start new episodes in ``slots``: given users, else uniform draws (one per slot).

        ``draw=False`` leaves the candidates to a later :meth:`draw_candidates` call.
        """
        d = self.data
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if users is None:
            users = rng.integers(d.num_users, size=len(slots))
        users = np.asarray(users).reshape(-1)
        if users.shape != slots.shape:
            raise ValueError(f"users must list one user per reset env ({len(slots)})")
        if users.size and (users.min() < 0 or users.max() >= d.num_users):
            raise ValueError(f"user must be in [0, {d.num_users}), got {users.tolist()}")
        users = users.astype(np.int64)
        self.users[slots] = users
        start = d.indptr[users]
        length = d.indptr[users + 1] - start - (1 if self.split == "train" else 0)
        length = np.maximum(length, 0)
        within = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
        owner = np.repeat(slots, length)
        items = d.items[np.repeat(start, length) + within]
        self.chrono[slots] = -1
        self.chrono[owner, items] = within
        self.recommended[slots] = False
        self.consumed[slots] = False
        self.last_slate[slots] = -1
        self.last_click[slots] = 0.0
        self.steps[slots] = 0
        self.num_positives[slots] = length
        self.positives_left[slots] = length
        self.items_left[slots] = d.num_items
        if draw:
            self.draw_candidates(rng, slots)

    def draw_candidates(self, rng: np.random.Generator, slots: np.ndarray) -> None:
        """Fresh candidates: up to ``positives_per_step`` unrecommended positives, rest others.

        Each group is a uniformly random subset of the slot's unrecommended items of that kind,
        drawn for all ``slots`` at once: every slot draws ``2 * c + 16`` items with replacement
        (uniformly from its user's positives, or from all items) and keeps the first distinct
        ones of the right kind (:func:`_first_distinct`); the rare slot left short (few such
        items remain) takes a prefix of a random order of them instead. The candidates are then
        shuffled within each slot.
        """
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        r = len(slots)
        if r == 0:
            return
        d, c, n_items = self.data, self.num_candidates, self.data.num_items
        if self.positives_per_step is None:  # one group: every unrecommended item
            owner, sizes, high = slots, np.full(r, c), np.full(r, n_items)
            from_positives = np.zeros(r, dtype=bool)
        else:  # rows 0..r-1 draw the positives, rows r..2r-1 the other items
            left = self.positives_left[slots]
            k = np.minimum(left, min(self.positives_per_step, c))
            k = np.maximum(k, c - (self.items_left[slots] - left))
            owner, sizes = np.concatenate([slots, slots]), np.concatenate([k, c - k])
            high = np.concatenate([self.num_positives[slots], np.full(r, n_items)])
            from_positives = np.arange(2 * r) < r
        width = int(sizes.max())
        # floor(u * n) with a 53-bit uniform u: uniform on range(n) up to n / 2**53 (negligible),
        # and several times faster than Generator.integers with per-row bounds
        u = rng.random((len(owner), 2 * width + 16))
        items = np.minimum((u * high[:, None]).astype(np.int64), np.maximum(high - 1, 0)[:, None])
        if self.positives_per_step is not None:
            start = d.indptr[self.users[slots]]
            items[:r] = d.items[start[:, None] + items[:r]]
        rows = owner[:, None]
        accept = ~self.recommended[rows, items] & (high > 0)[:, None]
        if self.positives_per_step is not None:
            accept[r:] &= self.chrono[rows[r:], items[r:]] < 0
        chosen, enough = _first_distinct(items, accept, sizes)
        short = np.flatnonzero(~enough)
        if short.size:  # exact fallback: a random order of the allowed items
            allowed = ~self.recommended[owner[short]]
            if self.positives_per_step is not None:
                allowed &= (self.chrono[owner[short]] >= 0) == from_positives[short][:, None]
            keys = rng.random((len(short), n_items))
            keys[~allowed] = np.inf
            best = np.argsort(keys, axis=1)[:, :width]
            chosen[short] = np.where(np.arange(width) < sizes[short][:, None], best, -1)
        if self.positives_per_step is not None:
            chosen = np.concatenate([chosen[:r], chosen[r:]], axis=1)
        self.candidates[slots] = rng.permuted(chosen[chosen >= 0].reshape(r, c), axis=1)

    def exhausted(self, slots: np.ndarray) -> np.ndarray:
        """No unrecommended positive left, or too few items left to fill a candidate set."""
        return (self.positives_left[slots] == 0) | (self.items_left[slots] < self.num_candidates)

    def respond(self, slots: np.ndarray, slates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Consumed slot and item per slot (-1, -1 if none) for slates of candidate indices."""
        rows = slots[:, None]
        items = self.candidates[rows, slates]
        ranks = self.chrono[rows, items]
        fresh = ~self.recommended[rows, items]
        eligible = (ranks >= 0) & ~self.consumed[rows, items]
        self.recommended[rows, items] = True
        self.items_left[slots] -= fresh.sum(axis=1)
        self.positives_left[slots] -= (fresh & (ranks >= 0)).sum(axis=1)
        self.last_slate[slots] = items
        hit = eligible.any(axis=1)
        choice = np.argmin(np.where(eligible, ranks, np.iinfo(np.int64).max), axis=1)
        item = items[np.arange(len(slots)), choice]
        clicks = np.zeros((len(slots), self.slate_size), dtype=np.float32)
        clicks[np.flatnonzero(hit), choice[hit]] = 1.0
        self.last_click[slots] = clicks
        self.consumed[slots[hit], item[hit]] = True
        return np.where(hit, choice, -1), np.where(hit, item, -1)

    def observation(self) -> Observation:
        d = self.data
        obs = {
            "user_id": self.users[:, None].copy(),
            "candidate_ids": self.candidates.copy(),
            "last_slate": self.last_slate.copy(),
            "last_click": self.last_click.copy(),
        }
        return {**obs, **feature_observation(d, self.users, self.candidates)}

    def logged(self, slots: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Logged rating and timestamp of each consumed positive (0.0 and -1 for none)."""
        hit = items >= 0
        rank = self.chrono[slots, np.maximum(items, 0)]
        rows = np.where(hit, self.data.indptr[self.users[slots]] + rank, 0)
        rating = np.where(hit, self.data.ratings[rows], 0.0).astype(np.float64)
        stamp = np.where(hit, self.data.timestamps[rows], -1).astype(np.int64)
        return rating, stamp
