"""The cascade click model over Choc-vs-Kale items: parameters, attraction, the exact optimum.

Kveton et al. (2015), "Cascading bandits": the user scans the slate from the top and clicks the
first item that attracts them; item i attracts independently with probability ``a_i``. Here
``a_i`` is a fixed function of the candidate's Choc-vs-Kale feature x (its clickbait score):
a logistic of a quadratic, :func:`attraction_probabilities`. The click probability of a slate is
``1 - prod(1 - a_i)`` whatever the order, so the slate of the ``slate_size`` most attractive
candidates (in decreasing order, which also makes the click come earliest) is optimal:
:func:`optimal_slates` is the exact planner that cascading bandits' regret is measured against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedrec.envs.choc_kale_model import ChocKaleModel, ChocKaleParams
from fedrec.envs.state import StateReader

#: Logit coefficients (c0, c1, c2) of the attraction a(x) = sigmoid(c0 + c1 x + c2 x^2): a peak of
#: about 0.32 at x = 0.75, 0.047 at x = 0 and 0.27 at x = 1 (moderate clickbait attracts most).
DEFAULT_ATTRACTION = (-3.0, 6.0, -4.0)
#: The hidden info keys of the cascade envs (ground truth for the oracle and for regret).
HIDDEN_STATE_KEYS = frozenset(
    {"candidate_attraction", "slate_click_probability", "optimal_click_probability"}
)


def attraction_probabilities(
    features: np.ndarray, coefficients: tuple[float, float, float] = DEFAULT_ATTRACTION
) -> np.ndarray:
    """Attraction probability of each item: ``sigmoid(c0 + c1 x + c2 x^2)`` of its feature x.

    ``features`` is any array of features in [0, 1] (a trailing axis of size 1, as in the
    ``candidates`` observation, is kept); returns float64 of the same shape.
    """
    x = np.asarray(features, dtype=np.float64)
    c0, c1, c2 = coefficients
    return 1.0 / (1.0 + np.exp(-(c0 + x * (c1 + c2 * x))))


def optimal_slates(attraction: np.ndarray, slate_size: int) -> np.ndarray:
    """The exact optimal slates: the ``slate_size`` most attractive candidates, most attractive
    first (ties by lower index). ``attraction`` has shape (..., N); returns int64 (..., n)."""
    order = np.argsort(-np.asarray(attraction), axis=-1, kind="stable")
    return order[..., :slate_size].astype(np.int64)


def click_probability(slate_attraction: np.ndarray) -> np.ndarray:
    """Probability of a click on a slate with attraction probabilities (..., n): 1 - prod(1 - a)."""
    return 1.0 - np.prod(1.0 - np.asarray(slate_attraction, dtype=np.float64), axis=-1)


@dataclass(frozen=True, kw_only=True)
class CascadeParams:
    """All parameters of the cascade-click env."""

    num_candidates: int = 10
    """N, Choc-vs-Kale candidates per step."""
    slate_size: int = 3
    """n, distinct candidates per slate (the positions the user scans)."""
    time_budget: int = 60
    """Steps per episode."""
    attraction_coefficients: tuple[float, float, float] = DEFAULT_ATTRACTION
    """(c0, c1, c2) of :func:`attraction_probabilities`."""
    resample_candidates: bool = True
    """True: a fresh candidate set every step (as Choc-vs-Kale; a contextual cascading bandit);
    False: one candidate set per episode (the fixed items of Kveton et al.)."""

    def __post_init__(self) -> None:
        # the Choc-vs-Kale parameters check num_candidates, slate_size and time_budget
        ChocKaleParams(
            num_candidates=self.num_candidates,
            slate_size=self.slate_size,
            time_budget=self.time_budget,
        )
        coefficients = self.attraction_coefficients
        try:
            values = tuple(float(c) for c in coefficients)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"attraction_coefficients must be three floats, got {coefficients!r}"
            ) from error
        if len(values) != 3 or not all(math.isfinite(v) for v in values):
            raise ValueError(f"attraction_coefficients must be three finite floats, got {values}")
        object.__setattr__(self, "attraction_coefficients", values)
        if not isinstance(self.resample_candidates, bool | np.bool_):
            raise ValueError(
                f"resample_candidates must be a bool, got {self.resample_candidates!r}"
            )


def make_params(kwargs: dict[str, Any]) -> CascadeParams:
    """Validated parameters; an unknown keyword is a ValueError that lists the valid ones."""
    known = CascadeParams.__dataclass_fields__
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(f"unknown cascade argument(s) {unknown}; valid: {sorted(known)}")
    return CascadeParams(**kwargs)


class CascadeSimulator:
    """B cascade users, stepped with whole-array NumPy operations.

    Random draws, in this order: at a reset of m users their candidates (the Choc-vs-Kale
    sampler: ``random((m, N), float32)``); at a step of m active users ``random((m, n))`` (one
    attraction coin per position), then (``resample_candidates``) their next candidates.
    """

    def __init__(self, params: CascadeParams, *, num_users: int) -> None:
        if num_users < 1:
            raise ValueError(f"num_users must be >= 1, got {num_users}")
        self.params = params
        self.num_users = num_users
        self._sampler = ChocKaleModel(
            ChocKaleParams(num_candidates=params.num_candidates, slate_size=params.slate_size)
        )
        b, n, s = num_users, params.num_candidates, params.slate_size
        self.features = np.zeros((b, n), dtype=np.float32)
        self.budget = np.zeros(b, dtype=np.int64)
        self.response_click = np.zeros((b, s), dtype=np.float32)
        self.played = np.zeros(b)  # click probability of the last slate
        self.best = np.zeros(b)  # click probability of the optimal slate of the last step
        self._rows = np.arange(b)

    def attraction(self) -> np.ndarray:
        """(B, N) attraction probabilities of the current candidates."""
        return attraction_probabilities(self.features, self.params.attraction_coefficients)

    def reset(self, rng: np.random.Generator, mask: np.ndarray | None = None) -> None:
        """Start new episodes for the users in ``mask`` (all when None)."""
        users: Any = slice(None) if mask is None else mask
        count = self.num_users if mask is None else int(mask.sum())
        if count == 0:
            return
        self.features[users] = self._sampler.sample_documents(rng, count)
        self.budget[users] = self.params.time_budget
        self.response_click[users] = 0.0
        self.played[users] = 0.0
        self.best[users] = 0.0

    def step(
        self, rng: np.random.Generator, slates: np.ndarray, active: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every active user with steps left scans its slate (B, n). Returns the clicked slot
        (-1: none or inactive) and which users stepped."""
        p, b = self.params, self.num_users
        stepped = self.budget > 0
        if active is not None:
            stepped &= active
        clicked_slot = np.full(b, -1)
        if not stepped.any():
            return clicked_slot, stepped
        rows = np.flatnonzero(stepped)
        m = len(rows)
        attraction = self.attraction()[rows]
        slate_attraction = np.take_along_axis(attraction, slates[rows], axis=1)
        coins = rng.random((m, p.slate_size))
        if p.resample_candidates:
            next_features = self._sampler.sample_documents(rng, m)
        attracted = coins < slate_attraction
        clicked = attracted.any(axis=1)
        slot = np.where(clicked, attracted.argmax(axis=1), -1)
        clicked_slot[rows] = slot
        click_row = np.zeros((m, p.slate_size), dtype=np.float32)
        click_row[np.flatnonzero(clicked), slot[clicked]] = 1.0
        self.response_click[rows] = click_row
        self.played[rows] = click_probability(slate_attraction)
        best = optimal_slates(attraction, p.slate_size)  # the oracle's slate, in its order
        self.best[rows] = click_probability(np.take_along_axis(attraction, best, axis=1))
        self.budget[rows] -= 1
        if p.resample_candidates:
            self.features[rows] = next_features
        return clicked_slot, stepped

    def observation(self) -> dict[str, np.ndarray]:
        """All users' observations (copies, leading batch axis; float32)."""
        return {
            "candidates": self.features[:, :, None].copy(),
            "response_click": self.response_click.copy(),
        }

    def oracle_state(self) -> dict[str, np.ndarray]:
        """Hidden ground truth (:data:`HIDDEN_STATE_KEYS`)."""
        return {
            "candidate_attraction": self.attraction(),
            "slate_click_probability": self.played.copy(),
            "optimal_click_probability": self.best.copy(),
        }

    def state_dict(self) -> dict[str, Any]:
        """The users' state as plain data (copies)."""
        return {
            "features": self.features.copy(),
            "budget": self.budget.copy(),
            "response_click": self.response_click.copy(),
            "played": self.played.copy(),
            "best": self.best.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (checked first: ``ValueError`` and nothing changes)."""
        read = StateReader(state, type(self).__name__)
        p, b = self.params, self.num_users
        hint = f"num_users={b}, num_candidates={p.num_candidates}, slate_size={p.slate_size}"
        features = read.array("features", (b, p.num_candidates), np.float32, hint=hint)
        budget = read.array("budget", (b,), np.int64, hint=hint)
        response_click = read.array("response_click", (b, p.slate_size), np.float32, hint=hint)
        played = read.array("played", (b,), np.float64, hint=hint)
        best = read.array("best", (b,), np.float64, hint=hint)
        read.finish()
        if budget.min() < 0 or budget.max() > p.time_budget:
            raise read.fail("budget", f"must lie in [0, time_budget={p.time_budget}]")
        if not ((features >= 0) & (features <= 1)).all():
            raise read.fail("features", "must lie in [0, 1]")
        self.features, self.budget, self.response_click = features, budget, response_click
        self.played, self.best = played, best
