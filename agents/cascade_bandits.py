"""Cascading bandits: CascadeUCB1 and CascadeLinUCB, single-platform slate agents.

The cascade model (Kveton et al., "Cascading Bandits: Learning to Rank in the Cascade Model",
ICML 2015): the user examines the slate from the top and clicks the first attractive item, item e
being attractive with an unknown probability w(e) independently of the others. A click at position
k therefore says: the k items above it were examined and not attractive, the clicked one is
attractive, the items below were not examined (no observation). No click: all K were examined and
none is attractive. The best slate is the K items of highest w, in any order.

* :class:`CascadeUCB1Agent` (``cascade_ucb1``, Kveton et al. 2015, Algorithm 1 with UCB1): one
  empirical attraction mean per item, slate = the K highest UCBs ``w(e) + sqrt(c log t / T(e))``.
* :class:`CascadeLinUCBAgent` (``cascade_linucb``, Zong et al., "Cascading Bandits for Large-Scale
  Recommendation Problems", UAI 2016): w(e) = theta . phi(e), linear in the item's features;
  ridge regression on the cascade feedback, slate = the K highest ``theta . phi + alpha sqrt(phi^T A^-1 phi)``.

**What they read.** Only the observation (never ``infos``): the candidates (ids or features) and
the click of the last slate, which is part of the next observation (``response_click``'s newest
row on Choc-vs-Kale, ``last_click`` on the logged-data envs in interaction mode). An env without a
click in its observation (a logged env in ``mode="evaluation"``, a platform without feedback,
``fedrec/TaobaoAds-v0``, which scores one ad instead of ranking candidates) is refused in
:meth:`from_env` with the reason.

**Item identity** (CascadeUCB1 keeps one estimate per item). The logged-data envs name their
candidates (``candidate_ids``): an item is its id. Choc-vs-Kale draws a new candidate set every
step, so no candidate is ever seen twice; there an item is the *bin of its features*: each
feature's observation-space range cut into ``feature_bins`` equal-width bins (``candidates`` x in
[0, 1] with 10 bins: x in [0, 0.1) is one item, ..., [0.9, 1] another), so all candidates of a bin
share one estimate; only the bins that occur are kept (a one-hot topic is one item per topic).
``identity`` forces one or the other.

The greedy slates (:meth:`act_batch`, evaluation) rank by the estimate alone; the behaviour slates
(:meth:`explore_batch`, training) by the UCB. Ties go to the lower candidate index. Every
batch of B users is B rounds of the bandit. The shared pieces (:func:`layout_of`,
:func:`clicked_slots`, :class:`Ridge`) are used by :mod:`fedrec.agents.linucb_slate` too.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from fedrec.agents.base import Info, Observation, SlateAgent, Transitions, slate_size_of

#: Observation keys of the last slate's click, in the order looked for: Choc-vs-Kale's response
#: history (H, n) (newest row last) and the logged-data envs' one-hot (n,).
CLICK_KEYS = ("response_click", "last_click")
#: Observation keys of the candidates' features (N, D).
ITEM_FEATURE_KEYS = ("candidates", "candidate_features")
#: Observation keys of public user features (D,) (Choc-vs-Kale's noisy satisfaction reading).
USER_FEATURE_KEYS = ("user", "user_features")
#: Observation key of the candidates' stable ids (N,).
ID_KEY = "candidate_ids"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


# --------------------------------------------------------------------------- what an env shows
@dataclasses.dataclass(frozen=True)
class Box:
    """One observation entry's per-feature bounds (the last axis of its space)."""

    key: str
    low: np.ndarray
    high: np.ndarray

    @property
    def dim(self) -> int:
        return len(self.low)

    def scaled(self, x: np.ndarray) -> np.ndarray:
        """Features mapped to [0, 1] by the space's bounds (a feature with an infinite or empty
        range is left as it is)."""
        x = np.asarray(x, dtype=np.float64)
        width = self.high - self.low
        ok = np.isfinite(width) & (width > 0)
        return np.where(ok, (x - np.where(ok, self.low, 0.0)) / np.where(ok, width, 1.0), x)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a bandit finds the click, the items and the user in an env's observation."""

    slate_size: int
    num_candidates: int
    click_key: str
    items: Box | None
    """candidate features (None: the env has none)"""
    users: Box | None
    """public user features (None: the env has none)"""
    num_ids: int | None
    """number of distinct ``candidate_ids`` (None: candidates have no ids)"""

    def item_features(self, agent: str) -> Box:
        """The candidates' feature box, or a ``ValueError`` for an ``agent`` that needs it."""
        if self.items is None:
            raise ValueError(
                f"{agent} needs item features ('candidates' or 'candidate_features'); the "
                "env's candidates have only ids: use cascade_ucb1"
            )
        return self.items


def _bounds(space: Any, key: str) -> Box:
    low = np.asarray(space.low, dtype=np.float64).reshape(-1, space.shape[-1])
    high = np.asarray(space.high, dtype=np.float64).reshape(-1, space.shape[-1])
    return Box(key, low.min(axis=0), high.max(axis=0))


def layout_of(env: Any, agent: str) -> Layout:
    """Read ``env``'s observation layout for ``agent`` (a name, for the error messages); a
    ``ValueError`` says why an env cannot be used (no click in the observation, no candidates)."""
    space = getattr(env, "single_observation_space", None) or env.observation_space
    spaces = getattr(space, "spaces", None)
    name = getattr(getattr(env, "spec", None), "id", None) or type(env).__name__
    if not isinstance(spaces, Mapping):
        raise ValueError(f"{agent} needs a Dict observation; {name} has {space!r}")
    click_key = next((key for key in CLICK_KEYS if key in spaces), None)
    if click_key is None:
        raise ValueError(
            f"{agent} learns from which slot of its slate was clicked, read from the next "
            f"observation ({' or '.join(CLICK_KEYS)}); {name} observes no click (keys "
            f"{sorted(spaces)}): a logged-data env in mode='evaluation', a platform without "
            "feedback and fedrec/TaobaoAds-v0 (one ad scored, no slate) cannot train it"
        )
    item_key = next((key for key in ITEM_FEATURE_KEYS if key in spaces), None)
    user_key = next((key for key in USER_FEATURE_KEYS if key in spaces), None)
    if item_key is None and ID_KEY not in spaces:
        raise ValueError(
            f"{agent} needs the candidates ({ID_KEY!r} or one of {ITEM_FEATURE_KEYS}); {name} "
            f"observes {sorted(spaces)}"
        )
    num_candidates = (spaces[item_key] if item_key else spaces[ID_KEY]).shape[0]
    num_ids = int(np.max(spaces[ID_KEY].high)) + 1 if ID_KEY in spaces else None
    return Layout(
        slate_size=slate_size_of(env),
        num_candidates=int(num_candidates),
        click_key=click_key,
        items=_bounds(spaces[item_key], item_key) if item_key else None,
        users=_bounds(spaces[user_key], user_key) if user_key else None,
        num_ids=num_ids,
    )


def clicked_slots(next_observations: Observation, click_key: str) -> np.ndarray:
    """The clicked slot of each user's last slate, -1 for none: (B,) int64."""
    clicks = np.asarray(next_observations[click_key])
    if clicks.ndim == 3:  # a response history (B, H, n): the newest row is the last slate's
        clicks = clicks[:, -1, :]
    return np.where(clicks.max(axis=1) > 0, clicks.argmax(axis=1), -1).astype(np.int64)


def cascade_feedback(clicked: np.ndarray, slate_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The cascade model's reading of a click at slot k (-1: none), per slot of a slate:
    ``examined`` (B, K) -- slots up to and including k (all K without a click) -- and
    ``attracted`` (B, K) -- slot k only."""
    slots = np.arange(slate_size)[None, :]
    last = np.where(clicked < 0, slate_size - 1, clicked)[:, None]
    return slots <= last, slots == clicked[:, None]


def top_slates(scores: np.ndarray, k: int) -> np.ndarray:
    """The k best-scored candidates per row (ties: the lower index first)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.int64)


def polynomial(x: np.ndarray, degree: int) -> np.ndarray:
    """[1, x, x^2, ..., x^degree] of every feature of x (..., D) -> (..., 1 + D * degree)."""
    powers = [x**p for p in range(1, degree + 1)]
    return np.concatenate([np.ones((*x.shape[:-1], 1)), *powers], axis=-1)


# --------------------------------------------------------------------------- ridge regression
class Ridge:
    """Ridge regression y ~ theta . x (prior ``ridge * I``) with its inverse Gram matrix.

    Kept exactly as data: the Gram matrix ``gram = ridge I + sum x x^T``, ``b = sum y x`` and
    ``a_inv``, updated by the Woodbury identity for a batch smaller than the dimension and
    re-inverted otherwise.
    """

    def __init__(self, dim: int, ridge: float) -> None:
        self.gram = np.eye(dim) * ridge
        self.a_inv = np.eye(dim) / ridge
        self.b = np.zeros(dim)
        self.theta = np.zeros(dim)

    def update(self, x: np.ndarray, y: np.ndarray) -> None:
        """Add the rows x (m, d) with targets y (m,)."""
        if len(x) == 0:
            return
        self.gram += x.T @ x
        self.b += x.T @ y
        if len(x) < len(self.b):  # A^-1 - A^-1 X^T (I + X A^-1 X^T)^-1 X A^-1
            ax = x @ self.a_inv
            self.a_inv = self.a_inv - ax.T @ np.linalg.solve(np.eye(len(x)) + ax @ x.T, ax)
        else:
            self.a_inv = np.linalg.inv(self.gram)
        self.theta = self.a_inv @ self.b

    def mean(self, x: np.ndarray) -> np.ndarray:
        return x @ self.theta

    def width(self, x: np.ndarray) -> np.ndarray:
        """sqrt(x^T A^-1 x) of every row of x (..., d)."""
        return np.sqrt(np.maximum(np.einsum("...d,de,...e->...", x, self.a_inv, x), 0.0))

    def state_dict(self) -> dict[str, Any]:
        return {"gram": self.gram.copy(), "a_inv": self.a_inv.copy(), "b": self.b.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        gram, a_inv, b = (np.array(state[k], dtype=np.float64) for k in ("gram", "a_inv", "b"))
        if gram.shape != self.gram.shape or a_inv.shape != self.a_inv.shape:
            raise ValueError(f"saved ridge model has dimension {len(b)}, expected {len(self.b)}")
        self.gram, self.a_inv, self.b = gram, a_inv, b
        self.theta = self.a_inv @ self.b


# --------------------------------------------------------------------------- linear UCB slates
class LinearUCBSlateAgent(SlateAgent):
    """A slate of the K highest scores of a ridge model over per-candidate features: greedy
    acts on the mean, exploration on the upper confidence bound (``config.alpha`` widths). A
    subclass sets ``layout``, ``config``, ``model`` (a :class:`Ridge`) and ``rounds`` and
    gives :meth:`features` and ``learn``."""

    layout: Layout
    model: Ridge
    rounds: int

    @abc.abstractmethod
    def features(self, observations: Observation) -> np.ndarray:
        """phi of every candidate: (B, N, d)."""

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        return top_slates(self.model.mean(self.features(observations)), self.slate_size)

    def explore_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        phi = self.features(observations)
        ucb = self.model.mean(phi) + self.config.alpha * self.model.width(phi)
        return top_slates(ucb, self.slate_size)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "model": self.model.state_dict(), "rounds": self.rounds}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        super().load_state_dict(state)
        self.rounds = int(state["rounds"])


# --------------------------------------------------------------------------- CascadeUCB1
@dataclasses.dataclass(frozen=True)
class CascadeUCB1Config:
    """CascadeUCB1 hyperparameters."""

    exploration: float = dataclasses.field(
        default=1.5, metadata=_help("c in the UCB radius sqrt(c log t / T(e)) (the paper: 1.5)")
    )
    identity: Literal["auto", "ids", "bins"] = dataclasses.field(
        default="auto",
        metadata=_help(
            "what an item is: its candidate id, the bin of its features, or auto (ids where the "
            "env has them)"
        ),
    )
    feature_bins: int = dataclasses.field(
        default=10, metadata=_help("equal-width bins per feature when items are feature bins")
    )

    max_items: int = dataclasses.field(
        default=100_000, metadata=_help("the most items (ids or distinct feature bins) kept")
    )

    def __post_init__(self) -> None:
        if self.max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {self.max_items}")
        if self.exploration < 0:
            raise ValueError(f"exploration must be >= 0, got {self.exploration}")
        if self.identity not in ("auto", "ids", "bins"):
            raise ValueError(f"identity must be auto, ids or bins, got {self.identity!r}")
        if self.feature_bins < 1:
            raise ValueError(f"feature_bins must be >= 1, got {self.feature_bins}")


class CascadeUCB1Agent(SlateAgent):
    """CascadeUCB1 (Kveton et al., ICML 2015): per-item UCB1 on the attraction probability,
    updated from the cascade reading of each click (see the module doc for item identity).

    Items that are feature bins are numbered in the order :meth:`learn` first meets them (only
    the bins that occur are kept: one-hot features of D topics are D items, not 2^D); a bin not
    met yet counts as never examined.
    """

    Config = CascadeUCB1Config

    def __init__(
        self, layout: Layout, *, config: CascadeUCB1Config | None = None, seed: int | None = None
    ) -> None:
        super().__init__(slate_size=layout.slate_size, seed=seed)
        self.config = config if config is not None else CascadeUCB1Config()
        self.layout = layout
        c = self.config
        self.use_ids = c.identity == "ids" or (c.identity == "auto" and layout.num_ids is not None)
        if self.use_ids and layout.num_ids is None:
            raise ValueError("identity='ids': the env's candidates have no ids")
        if not self.use_ids:
            items = layout.items
            if items is None:
                raise ValueError("identity='bins': the env's candidates have no features")
            if not (np.isfinite(items.low).all() and np.isfinite(items.high).all()):
                raise ValueError(
                    f"cannot bin {items.key!r}: its observation space is unbounded (no stable "
                    "item identity); use an env whose candidates have ids or bounded features"
                )
        if self.use_ids and layout.num_ids > c.max_items:
            raise ValueError(f"{layout.num_ids} item ids exceed max_items={c.max_items}")
        size = layout.num_ids if self.use_ids else 0
        self.clicks = np.zeros(size)  # per item: times attractive
        self.examined = np.zeros(size)  # per item: times examined, T(e)
        self.bins = np.zeros((0, layout.items.dim if layout.items else 0), np.int64)  # per item
        self._bin_index: dict[bytes, int] = {}  # a bin's bytes -> its item
        self.rounds = 0  # t: user-steps learned from

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        return cls(layout_of(env, "cascade_ucb1"), config=config, seed=seed)

    def item_ids(self, observations: Observation, *, add: bool = False) -> np.ndarray:
        """Each candidate's item (B, N) int64: its id, or the item of its feature bin (-1: a bin
        not met yet; ``add``: number it now)."""
        if self.use_ids:
            return np.asarray(observations[ID_KEY], dtype=np.int64)
        items, bins = self.layout.items, self.config.feature_bins
        assert items is not None
        x = items.scaled(np.asarray(observations[items.key]))
        cells = np.clip((x * bins).astype(np.int64), 0, bins - 1)  # (B, N, D)
        unique, inverse = np.unique(cells.reshape(-1, items.dim), axis=0, return_inverse=True)
        if add:
            new = [row for row in unique if row.tobytes() not in self._bin_index]
            if len(self.bins) + len(new) > self.config.max_items:
                raise ValueError(
                    f"more than max_items={self.config.max_items} distinct feature bins: lower "
                    "feature_bins or raise max_items"
                )
            for row in new:
                self._bin_index[row.tobytes()] = len(self._bin_index)
            if new:
                self.bins = np.concatenate([self.bins, np.stack(new)])
                self.clicks = np.concatenate([self.clicks, np.zeros(len(new))])
                self.examined = np.concatenate([self.examined, np.zeros(len(new))])
        known = np.array([self._bin_index.get(row.tobytes(), -1) for row in unique], np.int64)
        return known[inverse.reshape(-1)].reshape(cells.shape[:2])

    def _statistics(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(attraction mean, times examined) of each candidate (0, 0 for an unknown item)."""
        known = ids >= 0
        safe = np.where(known, ids, 0)
        if len(self.examined) == 0:
            return np.zeros(ids.shape), np.zeros(ids.shape)
        seen = np.where(known, self.examined[safe], 0.0)
        clicks = np.where(known, self.clicks[safe], 0.0)
        return clicks / np.maximum(seen, 1.0), seen

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        means, _ = self._statistics(self.item_ids(observations))
        return top_slates(means, self.slate_size)

    def explore_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        means, seen = self._statistics(self.item_ids(observations))
        log_t = np.log(max(self.rounds, 1))
        radius = np.sqrt(self.config.exploration * log_t / np.maximum(seen, 1.0))
        ucb = np.where(seen > 0, means + radius, np.inf)  # unseen items first
        return top_slates(ucb, self.slate_size)

    def learn(self, transitions: Transitions) -> dict[str, float]:
        slates = np.asarray(transitions.slates, dtype=np.int64)
        ids = self.item_ids(transitions.observations, add=True)
        shown = np.take_along_axis(ids, slates, axis=1)
        clicked = clicked_slots(transitions.next_observations, self.layout.click_key)
        examined, attracted = cascade_feedback(clicked, self.slate_size)
        np.add.at(self.examined, shown[examined], 1.0)
        np.add.at(self.clicks, shown[attracted], 1.0)
        self.rounds += len(slates)
        return {"click_rate": float(np.mean(clicked >= 0)), "rounds": float(self.rounds)}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "clicks": self.clicks.copy(),
            "examined": self.examined.copy(),
            "bins": self.bins.copy(),
            "rounds": self.rounds,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        clicks, bins = np.array(state["clicks"], np.float64), np.array(state["bins"], np.int64)
        expected = (self.layout.num_ids,) if self.use_ids else (len(bins),)
        if clicks.shape != expected or bins.shape[1:] != self.bins.shape[1:]:
            raise ValueError(
                f"saved estimates of {clicks.shape} items with bins {bins.shape} do not fit this "
                f"agent ({'ids' if self.use_ids else 'feature bins'} of {self.bins.shape[1]} "
                "features)"
            )
        super().load_state_dict(state)
        self.clicks = clicks
        self.examined = np.array(state["examined"], dtype=np.float64)
        self.bins = bins
        self._bin_index = {row.tobytes(): i for i, row in enumerate(bins)}
        self.rounds = int(state["rounds"])


# --------------------------------------------------------------------------- CascadeLinUCB
@dataclasses.dataclass(frozen=True)
class CascadeLinUCBConfig:
    """CascadeLinUCB hyperparameters."""

    alpha: float = dataclasses.field(
        default=1.0, metadata=_help("exploration: UCB = theta . phi + alpha sqrt(phi^T A^-1 phi)")
    )
    ridge: float = dataclasses.field(
        default=1.0, metadata=_help("ridge prior lambda (the paper's sigma^2): A = lambda I + ...")
    )
    degree: int = dataclasses.field(
        default=1,
        metadata=_help(
            "phi = [1, x, x^2, ..., x^degree] of the item features scaled to [0, 1] by the "
            "observation space"
        ),
    )

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.ridge <= 0 or self.degree < 1:
            raise ValueError(
                f"need alpha >= 0, ridge > 0, degree >= 1; got {self.alpha}, {self.ridge}, "
                f"{self.degree}"
            )


class CascadeLinUCBAgent(LinearUCBSlateAgent):
    """CascadeLinUCB (Zong et al., UAI 2016): attraction linear in the item features, ridge
    regression on the cascade feedback (examined items above the click: 0, the clicked: 1)."""

    Config = CascadeLinUCBConfig

    def __init__(
        self, layout: Layout, *, config: CascadeLinUCBConfig | None = None, seed: int | None = None
    ) -> None:
        super().__init__(slate_size=layout.slate_size, seed=seed)
        layout.item_features("cascade_linucb")
        self.config = config if config is not None else CascadeLinUCBConfig()
        self.layout = layout
        self.model = Ridge(1 + layout.items.dim * self.config.degree, self.config.ridge)
        self.rounds = 0

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        return cls(layout_of(env, "cascade_linucb"), config=config, seed=seed)

    def features(self, observations: Observation) -> np.ndarray:
        """phi of every candidate: (B, N, d)."""
        items = self.layout.items
        assert items is not None
        return polynomial(items.scaled(np.asarray(observations[items.key])), self.config.degree)

    def learn(self, transitions: Transitions) -> dict[str, float]:
        slates = np.asarray(transitions.slates, dtype=np.int64)
        phi = np.take_along_axis(self.features(transitions.observations), slates[..., None], 1)
        clicked = clicked_slots(transitions.next_observations, self.layout.click_key)
        examined, attracted = cascade_feedback(clicked, self.slate_size)
        self.model.update(phi[examined], attracted[examined].astype(np.float64))
        self.rounds += len(slates)
        return {"click_rate": float(np.mean(clicked >= 0)), "rounds": float(self.rounds)}
