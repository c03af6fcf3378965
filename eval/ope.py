"""Off-policy evaluation: estimate a target policy's value from data logged by another policy.

Three input formats (frozen dataclasses, validated on construction), one per kind of problem:

* :class:`LoggedBandit` -- single-step, one action per context, with the full action
  distributions of the logger (behaviour) and the target: :func:`ips`, :func:`snips`,
  :func:`direct_method`, :func:`doubly_robust`, :func:`self_normalized_doubly_robust`,
  :func:`switch_doubly_robust`.
* :class:`LoggedSlates` -- single-step slates of ``K`` slots with per-slot rewards and the
  propensities of the logged slate (whole slate, per slot, per prefix):
  :func:`slate_ips` (standard), :func:`independent_ips`, :func:`reward_interaction_ips`,
  :func:`pseudoinverse` and :func:`cascade_doubly_robust`.
* :class:`LoggedEpisodes` -- trajectories of ``T`` steps with per-step propensities of the logged
  action: :func:`per_decision_is`, :func:`weighted_doubly_robust` and
  :func:`marginalized_is` (with a known state-distribution ratio).

Every estimator returns an :class:`Estimate`: the value, its standard error and a two-sided
confidence interval (Student t with ``n - 1`` degrees of freedom, :func:`fedrec.eval.stats.mean_ci`
for the estimators that are a plain mean of per-sample terms; the delta method for the
self-normalised ones).

**Validation.** Wrong shapes, non-finite values, propensities outside ``[0, 1]``, a logged action
whose behaviour propensity is 0 (the logger could not have produced it), and a target policy that
puts probability where the logger puts none (when the full distributions are given) raise a
:class:`ValueError` that names the field and the first bad row. No estimator returns NaN silently:
an estimator that cannot be computed (e.g. every self-normalisation weight is 0) raises too.

What each estimator assumes and where it fails is in ``docs/ope.md``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from fedrec.eval.stats import mean_ci, t_quantile

__all__ = [
    "Estimate",
    "LoggedBandit",
    "LoggedEpisodes",
    "LoggedSlates",
    "cascade_doubly_robust",
    "direct_method",
    "doubly_robust",
    "enumerate_slates",
    "independent_ips",
    "ips",
    "marginalized_is",
    "per_decision_is",
    "plackett_luce_slate_probabilities",
    "pseudoinverse",
    "reward_interaction_ips",
    "self_normalized_doubly_robust",
    "slate_ips",
    "slot_marginals",
    "snips",
    "switch_doubly_robust",
    "weighted_doubly_robust",
]

#: Largest number of ordered slates the exact enumeration helpers accept.
MAX_ENUMERATED_SLATES = 200_000


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Estimate:
    """An estimated policy value with its standard error and confidence interval."""

    name: str
    value: float
    std_error: float
    """Standard error of ``value`` (``nan`` for fewer than 2 samples)"""
    ci_low: float
    ci_high: float
    n: int
    """Number of logged samples (contexts or episodes)"""
    confidence: float = 0.95

    def __str__(self) -> str:
        return f"{self.name}: {self.value:.4g} ± {(self.ci_high - self.ci_low) / 2:.2g}"


def _mean_estimate(name: str, terms: np.ndarray, confidence: float) -> Estimate:
    """The estimate ``mean(terms)`` of i.i.d. per-sample terms with its t-interval."""
    terms = np.asarray(terms, dtype=np.float64)
    _require_finite_result(name, terms)
    value, half = mean_ci(terms, confidence)
    n = len(terms)
    se = float(np.std(terms, ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return Estimate(name, value, se, value - half, value + half, n, confidence)


def _ratio_estimate(
    name: str, numerators: np.ndarray, weights: np.ndarray, confidence: float, offset: float = 0.0
) -> Estimate:
    """``offset + sum(numerators) / sum(weights)`` with a delta-method standard error."""
    total = float(np.sum(weights))
    if not total > 0:
        raise ValueError(
            f"{name}: the importance weights sum to {total}; self-normalisation is undefined "
            "(the target gives probability 0 to every logged action)"
        )
    ratio = float(np.sum(numerators)) / total
    n = len(weights)
    # Delta method for a ratio of means: Var ≈ mean((num - ratio * w)^2) / (n * mean(w)^2).
    residual = numerators - ratio * weights
    mean_w = total / n
    if n > 1:
        se = float(np.sqrt(np.sum(residual**2) / (n - 1)) / (math.sqrt(n) * mean_w))
        half = t_quantile(confidence, n - 1) * se
    else:
        se = half = math.nan
    value = offset + ratio
    _require_finite_result(name, np.array([value]))
    return Estimate(name, value, se, value - half, value + half, n, confidence)


def _require_finite_result(name: str, terms: np.ndarray) -> None:
    if len(terms) == 0:
        raise ValueError(f"{name}: no logged samples")
    if not np.all(np.isfinite(terms)):
        raise ValueError(f"{name}: non-finite terms (overflowing weights?)")


# --------------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------------


def _array(name: str, value: ArrayLike | None, shape: Sequence[int | None], dtype=np.float64):
    """``value`` as an array of ``shape`` (None: any size), finite; a clear error otherwise."""
    if value is None:
        raise ValueError(f"{name} is missing")
    array = np.asarray(value)
    if array.dtype == object:
        raise ValueError(f"{name} must be numeric, got dtype object")
    if dtype is np.int64:
        if not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
            raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
        array = array.astype(np.int64)
    else:
        if not (np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.bool_)):
            raise ValueError(f"{name} must be numeric, got dtype {array.dtype}")
        array = array.astype(np.float64)
    if array.ndim != len(shape) or any(
        want is not None and got != want for got, want in zip(array.shape, shape, strict=True)
    ):
        wanted = "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name} must have shape {wanted}, got {array.shape}")
    if not np.all(np.isfinite(array)):
        bad = np.argwhere(~np.isfinite(array))[0]
        raise ValueError(f"{name} has a non-finite value at index {tuple(int(i) for i in bad)}")
    return array


def _probabilities(name: str, array: np.ndarray, *, logged: bool) -> None:
    """Probabilities in [0, 1]; a logged behaviour propensity must be > 0."""
    if np.any(array < 0) or np.any(array > 1 + 1e-9):
        bad = np.argwhere((array < 0) | (array > 1 + 1e-9))[0]
        raise ValueError(
            f"{name} must be probabilities in [0, 1]; index {tuple(int(i) for i in bad)} "
            f"is {array[tuple(bad)]}"
        )
    if logged and np.any(array <= 0):
        bad = np.argwhere(array <= 0)[0]
        raise ValueError(
            f"{name} is 0 at index {tuple(int(i) for i in bad)}: the logger could not have "
            "produced that logged action (zero or missing propensity)"
        )


def _distributions(name: str, array: np.ndarray) -> None:
    _probabilities(name, array, logged=False)
    sums = array.sum(axis=-1)
    if not np.allclose(sums, 1.0, atol=1e-6):
        bad = np.argwhere(~np.isclose(sums, 1.0, atol=1e-6))[0]
        raise ValueError(
            f"{name} rows must sum to 1; row {tuple(int(i) for i in bad)} sums to "
            f"{sums[tuple(bad)]}"
        )


def _support(behaviour_name: str, behaviour: np.ndarray, target_name: str, target: np.ndarray):
    outside = (target > 0) & (behaviour <= 0)
    if np.any(outside):
        bad = tuple(int(i) for i in np.argwhere(outside)[0])
        raise ValueError(
            f"the target policy has support outside the logger's: {target_name}{list(bad)} = "
            f"{target[bad]} but {behaviour_name}{list(bad)} = 0; importance sampling cannot "
            "estimate its value (no logged data there)"
        )


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


# --------------------------------------------------------------------------------------------
# Single-step (contextual bandit)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoggedBandit:
    """n logged single-step decisions among A actions.

    ``behaviour[i]`` and ``target[i]`` are the full action distributions of the logger and the
    target in context i (rows sum to 1); ``actions[i]`` was drawn from ``behaviour[i]`` and
    earned ``rewards[i]``. ``contexts`` is optional (only kept for reward models). The target's
    support must lie inside the logger's (checked).
    """

    actions: np.ndarray
    rewards: np.ndarray
    behaviour: np.ndarray
    target: np.ndarray
    contexts: np.ndarray | None = None

    def __post_init__(self) -> None:
        actions = _array("actions", self.actions, (None,), np.int64)
        n = len(actions)
        if n == 0:
            raise ValueError("no logged samples")
        rewards = _array("rewards", self.rewards, (n,))
        behaviour = _array("behaviour", self.behaviour, (n, None))
        num_actions = behaviour.shape[1]
        target = _array("target", self.target, (n, num_actions))
        if np.any((actions < 0) | (actions >= num_actions)):
            raise ValueError(f"actions must be in [0, {num_actions}), got {actions.min()}..")
        _distributions("behaviour", behaviour)
        _distributions("target", target)
        _support("behaviour", behaviour, "target", target)
        for field, value in (
            ("actions", actions),
            ("rewards", rewards),
            ("behaviour", behaviour),
            ("target", target),
        ):
            object.__setattr__(self, field, value)
        if self.contexts is not None and len(self.contexts) != n:
            raise ValueError(f"contexts must have {n} rows, got {len(self.contexts)}")

    @property
    def n(self) -> int:
        return len(self.actions)

    @property
    def num_actions(self) -> int:
        return self.behaviour.shape[1]

    @property
    def weights(self) -> np.ndarray:
        """Importance weights ``w_i = π(a_i | x_i) / μ(a_i | x_i)``."""
        rows = np.arange(self.n)
        return self.target[rows, self.actions] / self.behaviour[rows, self.actions]

    def _reward_model(self, q_hat: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``q̂`` (n, A), ``q̂(x_i, a_i)`` and ``Σ_a π(a|x_i) q̂(x_i, a)``."""
        q = _array("q_hat", q_hat, (self.n, self.num_actions))
        logged = q[np.arange(self.n), self.actions]
        return q, logged, np.sum(self.target * q, axis=1)


def ips(data: LoggedBandit, *, confidence: float = 0.95) -> Estimate:
    """Inverse propensity scoring: ``V̂ = 1/n Σ_i w_i r_i``, ``w_i = π(a_i|x_i) / μ(a_i|x_i)``.

    Assumes the logged propensities are the true ones and ``μ(a|x) > 0`` wherever
    ``π(a|x) > 0`` (checked); then it is unbiased. Variance grows with the weights.
    """
    _check_confidence(confidence)
    return _mean_estimate("IPS", data.weights * data.rewards, confidence)


def snips(data: LoggedBandit, *, confidence: float = 0.95) -> Estimate:
    """Self-normalised IPS: ``V̂ = Σ_i w_i r_i / Σ_i w_i``.

    Consistent (biased, O(1/n)) under the IPS assumptions; bounded by the reward range. The
    standard error is the delta method's.
    """
    _check_confidence(confidence)
    weights = data.weights
    return _ratio_estimate("SNIPS", weights * data.rewards, weights, confidence)


def direct_method(data: LoggedBandit, q_hat: ArrayLike, *, confidence: float = 0.95) -> Estimate:
    """Direct method: ``V̂ = 1/n Σ_i Σ_a π(a|x_i) q̂(x_i, a)`` for a reward model ``q_hat`` (n, A).

    Uses no propensities; unbiased only if the reward model is (its bias passes through). The
    interval reflects the spread over contexts, not the reward model's error.
    """
    _check_confidence(confidence)
    _, _, expected = data._reward_model(q_hat)
    return _mean_estimate("DM", expected, confidence)


def doubly_robust(data: LoggedBandit, q_hat: ArrayLike, *, confidence: float = 0.95) -> Estimate:
    """Doubly robust: ``V̂ = 1/n Σ_i [Σ_a π(a|x_i) q̂(x_i,a) + w_i (r_i − q̂(x_i,a_i))]``.

    Unbiased when the propensities are right (any ``q̂``); when they are wrong, its bias is the
    product of the propensity and reward-model errors.
    """
    _check_confidence(confidence)
    _, logged, expected = data._reward_model(q_hat)
    return _mean_estimate("DR", expected + data.weights * (data.rewards - logged), confidence)


def self_normalized_doubly_robust(
    data: LoggedBandit, q_hat: ArrayLike, *, confidence: float = 0.95
) -> Estimate:
    """SNDR: ``V̂ = 1/n Σ_i Σ_a π q̂(x_i,a) + Σ_i w_i (r_i − q̂(x_i,a_i)) / Σ_i w_i``.

    DR with the correction term self-normalised: consistent, bounded correction, O(1/n) bias.
    The standard error is the delta method's for the correction plus the DM term's spread.
    """
    _check_confidence(confidence)
    _, logged, expected = data._reward_model(q_hat)
    weights = data.weights
    correction = _ratio_estimate(
        "SNDR", weights * (data.rewards - logged), weights, confidence, offset=0.0
    )
    dm = float(np.mean(expected))
    # Linearisation: term_i = dm_i + (w_i (r_i − q̂_i) − c w_i) / mean(w).
    terms = expected + (weights * (data.rewards - logged) - correction.value * weights) / np.mean(
        weights
    )
    value = dm + correction.value
    n = data.n
    if n > 1:
        se = float(np.std(terms, ddof=1) / math.sqrt(n))
        half = t_quantile(confidence, n - 1) * se
    else:
        se = half = math.nan
    return Estimate("SNDR", value, se, value - half, value + half, n, confidence)


def switch_doubly_robust(
    data: LoggedBandit, q_hat: ArrayLike, *, threshold: float, confidence: float = 0.95
) -> Estimate:
    """Switch-DR (Wang et al. 2017, as in Open Bandit Pipeline):
    ``V̂ = 1/n Σ_i [Σ_a π(a|x_i) q̂(x_i,a) + 1{w_i ≤ τ} w_i (r_i − q̂(x_i,a_i))]``.

    DR where the weight is at most ``threshold`` τ, the direct method where it is larger: bias
    (that of ``q̂`` on the actions with large weights) traded for variance. τ = ∞ is DR, τ = 0
    is DM.
    """
    _check_confidence(confidence)
    if not threshold >= 0:  # also refuses NaN
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    _, logged, expected = data._reward_model(q_hat)
    weights = data.weights
    kept = np.where(weights <= threshold, weights, 0.0)
    return _mean_estimate("Switch-DR", expected + kept * (data.rewards - logged), confidence)


# --------------------------------------------------------------------------------------------
# Slates
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoggedSlates:
    """n logged slates of K slots over A items with per-slot rewards.

    Per row i (context ``x_i``) and slot k:

    * ``slates[i, k]`` -- the item at slot k (distinct within a slate), drawn by the logger μ;
    * ``rewards[i, k]`` -- the reward earned at slot k (e.g. a click); the slate's reward is the
      sum over slots;
    * ``behaviour_slate[i]`` / ``target_slate[i]`` -- ``μ(s_i|x_i)`` / ``π(s_i|x_i)`` of the whole
      logged slate (standard slate IPS);
    * ``behaviour_slot[i, k]`` / ``target_slot[i, k]`` -- the slot marginals
      ``μ(a_k = s_ik | x_i)`` / ``π(a_k = s_ik | x_i)`` (independent IPS);
    * ``behaviour_prefix[i, k]`` / ``target_prefix[i, k]`` -- the probability of the logged
      top-(k+1) prefix, ``μ(a_{1:k+1} = s_{i,1:k+1} | x_i)`` (reward-interaction IPS, cascade DR;
      the last column equals the whole slate's);
    * ``behaviour_marginals`` / ``target_marginals`` (n, K, A) -- the full slot-item marginals,
      optional: when both are given the target's slot-level support is checked against the
      logger's. ``target_marginals`` is also what the pseudoinverse estimator needs.

    Fields an estimator does not need may be None; the estimator that needs one says so.
    """

    slates: np.ndarray
    rewards: np.ndarray
    behaviour_slate: np.ndarray | None = None
    target_slate: np.ndarray | None = None
    behaviour_slot: np.ndarray | None = None
    target_slot: np.ndarray | None = None
    behaviour_prefix: np.ndarray | None = None
    target_prefix: np.ndarray | None = None
    behaviour_marginals: np.ndarray | None = None
    target_marginals: np.ndarray | None = None
    num_items: int | None = None
    contexts: np.ndarray | None = None

    def __post_init__(self) -> None:
        slates = _array("slates", self.slates, (None, None), np.int64)
        n, k = slates.shape
        if n == 0 or k == 0:
            raise ValueError(f"slates must be a non-empty (n, K) array, got {slates.shape}")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("slates", slates)
        set_("rewards", _array("rewards", self.rewards, (n, k)))
        num_items = self.num_items
        for name in ("behaviour_marginals", "target_marginals"):
            value = getattr(self, name)
            if value is not None:
                array = _array(name, value, (n, k, num_items))
                num_items = array.shape[2]
                _probabilities(name, array, logged=False)
                sums = array.sum(axis=2)
                if not np.allclose(sums, 1.0, atol=1e-6):
                    raise ValueError(f"{name}: every slot's marginals must sum to 1")
                set_(name, array)
        if num_items is None:
            num_items = int(slates.max()) + 1
        if np.any(slates < 0) or np.any(slates >= num_items):
            raise ValueError(f"slates must hold item indices in [0, {num_items})")
        ordered = np.sort(slates, axis=1)
        if k > 1 and np.any(ordered[:, 1:] == ordered[:, :-1]):
            row = int(np.argwhere(np.any(ordered[:, 1:] == ordered[:, :-1], axis=1))[0, 0])
            raise ValueError(f"slates must hold distinct items; row {row} repeats one")
        set_("num_items", int(num_items))
        shapes = {"_slate": (n,), "_slot": (n, k), "_prefix": (n, k)}
        for suffix, shape in shapes.items():
            for role in ("behaviour", "target"):
                name = role + suffix
                value = getattr(self, name)
                if value is None:
                    continue
                array = _array(name, value, shape)
                _probabilities(name, array, logged=role == "behaviour")
                set_(name, array)
        for role in ("behaviour", "target"):
            prefix = getattr(self, role + "_prefix")
            if prefix is not None and np.any(np.diff(prefix, axis=1) > 1e-12):
                raise ValueError(f"{role}_prefix must not increase along the slate")
        if self.behaviour_marginals is not None and self.target_marginals is not None:
            _support(
                "behaviour_marginals", self.behaviour_marginals,
                "target_marginals", self.target_marginals,
            )  # fmt: skip
        if self.contexts is not None and len(self.contexts) != n:
            raise ValueError(f"contexts must have {n} rows, got {len(self.contexts)}")

    @property
    def n(self) -> int:
        return self.slates.shape[0]

    @property
    def slate_size(self) -> int:
        return self.slates.shape[1]

    def _need(self, estimator: str, *fields: str) -> list[np.ndarray]:
        missing = [f for f in fields if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{estimator} needs {', '.join(missing)} (missing from the data)")
        return [getattr(self, f) for f in fields]


def slate_ips(data: LoggedSlates, *, confidence: float = 0.95) -> Estimate:
    """Standard slate IPS: ``V̂ = 1/n Σ_i π(s_i|x_i)/μ(s_i|x_i) · Σ_k r_ik``.

    Unbiased for any reward structure when ``μ(s|x) > 0`` wherever ``π(s|x) > 0``; its variance
    grows with the number of slates (exponential in K).
    """
    _check_confidence(confidence)
    mu, pi = data._need("slate IPS", "behaviour_slate", "target_slate")
    return _mean_estimate("slate IPS", pi / mu * data.rewards.sum(axis=1), confidence)


def independent_ips(data: LoggedSlates, *, confidence: float = 0.95) -> Estimate:
    """Independent IPS (IIPS): ``V̂ = 1/n Σ_i Σ_k π(a_k=s_ik|x_i)/μ(a_k=s_ik|x_i) · r_ik``.

    Assumes the reward is a sum of per-slot terms, each depending only on that slot's item
    (``E[r_k | x, s] = q_k(x, s_k)``). Biased when slots interact (e.g. a cascade, where a click
    above suppresses the ones below).
    """
    _check_confidence(confidence)
    mu, pi = data._need("independent IPS", "behaviour_slot", "target_slot")
    return _mean_estimate("IIPS", np.sum(pi / mu * data.rewards, axis=1), confidence)


def reward_interaction_ips(data: LoggedSlates, *, confidence: float = 0.95) -> Estimate:
    """Reward-interaction IPS (RIPS, Kiyohara et al. 2022):
    ``V̂ = 1/n Σ_i Σ_k π(s_{i,1:k}|x_i)/μ(s_{i,1:k}|x_i) · r_ik``.

    Assumes the cascade: the reward at slot k depends only on the items at slots 1..k
    (``E[r_k | x, s] = q_k(x, s_{1:k})``). Unbiased then; between IIPS and slate IPS in variance.
    """
    _check_confidence(confidence)
    mu, pi = data._need("RIPS", "behaviour_prefix", "target_prefix")
    return _mean_estimate("RIPS", np.sum(pi / mu * data.rewards, axis=1), confidence)


def cascade_doubly_robust(
    data: LoggedSlates,
    q_hat: ArrayLike,
    q_hat_target: ArrayLike,
    *,
    confidence: float = 0.95,
) -> Estimate:
    """Cascade-DR (Kiyohara et al., WSDM 2022):
    ``V̂ = 1/n Σ_i Σ_k [w_{i,1:k} (r_ik − Q̂_k(x_i, s_{i,1:k})) + w_{i,1:k−1} V̂_k(x_i, s_{i,1:k−1})]``.

    ``w_{i,1:k}`` is the prefix weight ``π(s_{1:k}|x)/μ(s_{1:k}|x)`` (``w_{1:0} = 1``);
    ``q_hat[i, k] = Q̂_k(x_i, s_{i,1:k})`` estimates the reward from slot k down,
    ``E[Σ_{l≥k} r_l | x, s_{1:k}]``, and ``q_hat_target[i, k] = V̂_k =
    E_{a ~ π(·|x_i, s_{i,1:k−1})} Q̂_k(x_i, s_{i,1:k−1}, a)`` is its expectation under the
    target's choice at slot k given the logged items above. Under the cascade assumption it is
    unbiased for any ``Q̂`` (and the variance shrinks as ``Q̂`` improves); with a perfect ``Q̂``
    only the first slot's term is random.
    """
    _check_confidence(confidence)
    mu, pi = data._need("Cascade-DR", "behaviour_prefix", "target_prefix")
    n, k = data.slates.shape
    q = _array("q_hat", q_hat, (n, k))
    v = _array("q_hat_target", q_hat_target, (n, k))
    weights = pi / mu
    previous = np.concatenate([np.ones((n, 1)), weights[:, :-1]], axis=1)
    terms = np.sum(weights * (data.rewards - q) + previous * v, axis=1)
    return _mean_estimate("Cascade-DR", terms, confidence)


def enumerate_slates(num_items: int, slate_size: int) -> np.ndarray:
    """All ordered slates of ``slate_size`` distinct items out of ``num_items``: (S, K) int64."""
    if not 1 <= slate_size <= num_items:
        raise ValueError(f"need 1 <= slate_size <= num_items, got {slate_size}, {num_items}")
    count = math.perm(num_items, slate_size)
    if count > MAX_ENUMERATED_SLATES:
        raise ValueError(
            f"{count:,} ordered slates of {slate_size} out of {num_items} items: more than "
            f"{MAX_ENUMERATED_SLATES:,}, too many to enumerate exactly"
        )
    return np.array(list(itertools.permutations(range(num_items), slate_size)), dtype=np.int64)


def plackett_luce_slate_probabilities(weights: ArrayLike, slates: ArrayLike) -> np.ndarray:
    """``P(s | weights)`` of slates drawn by sampling without replacement proportionally to
    ``weights`` (Plackett–Luce): slot 1 ∝ w, slot 2 ∝ w over the items left, and so on.

    ``weights`` (n, A) non-negative with a positive sum per row; ``slates`` (S, K). Returns
    (n, S). Prefix probabilities are the same with ``slates[:, :k]``.
    """
    w = _array("weights", weights, (None, None))
    if np.any(w < 0):
        raise ValueError("weights must be non-negative")
    s = _array("slates", slates, (None, None), np.int64)
    total = w.sum(axis=1, keepdims=True)
    if np.any(total <= 0):
        raise ValueError("every row of weights needs a positive sum")
    probability = np.ones((w.shape[0], s.shape[0]))
    left = np.broadcast_to(total, probability.shape).copy()
    for slot in range(s.shape[1]):
        chosen = w[:, s[:, slot]]
        with np.errstate(divide="ignore", invalid="ignore"):
            probability *= np.where(left > 0, chosen / np.where(left > 0, left, 1), 0.0)
        left = left - chosen
    return probability


def slot_marginals(slates: np.ndarray, probabilities: np.ndarray, num_items: int) -> np.ndarray:
    """Slot-item marginals ``P(a_k = j)`` (n, K, A) of slate distributions (n, S) over
    ``slates`` (S, K)."""
    n = probabilities.shape[0]
    size = slates.shape[1]
    marginals = np.zeros((n, size, num_items))
    for slot in range(size):
        for item in range(num_items):
            marginals[:, slot, item] = probabilities[:, slates[:, slot] == item].sum(axis=1)
    return marginals


def _indicator(slates: np.ndarray, num_items: int) -> np.ndarray:
    """One-hot slot-item indicators 1_s ∈ {0,1}^{K·A} of (S, K) slates: (S, K·A)."""
    count, size = slates.shape
    indicator = np.zeros((count, size * num_items))
    indicator[np.arange(count)[:, None], np.arange(size) * num_items + slates] = 1.0
    return indicator


def _uniform_gamma(num_items: int, size: int) -> np.ndarray:
    """Closed form of ``Γ = E[1_s 1_s^T]`` for uniformly random slates without replacement.

    ``P(a_k=j) = 1/A``; ``P(a_k=j, a_l=j') = 1/(A(A−1))`` for k ≠ l, j ≠ j'; 0 for k ≠ l, j = j'
    and for k = l, j ≠ j'.
    """
    a = num_items
    slot_same = np.eye(size)
    item_same = np.eye(a)
    pair = 1.0 / (a * (a - 1)) if a > 1 else 0.0
    gamma = np.kron(1 - slot_same, (1 - item_same) * pair) + np.kron(slot_same, item_same / a)
    return gamma


def pseudoinverse(
    data: LoggedSlates,
    *,
    logger: str = "uniform",
    logger_weights: ArrayLike | None = None,
    confidence: float = 0.95,
) -> Estimate:
    """PseudoInverse estimator (Swaminathan et al., NeurIPS 2017):
    ``V̂ = 1/n Σ_i (Σ_k r_ik) · q_π(x_i)^T Γ_μ(x_i)^† 1_{s_i}``.

    ``1_s`` ∈ {0,1}^{K·A} marks the (slot, item) pairs of slate s, ``q_π(x) = E_π[1_s | x]`` the
    target's slot-item marginals (``data.target_marginals``) and ``Γ_μ(x) = E_μ[1_s 1_s^T | x]``
    the logger's pairwise marginals; ``†`` is the Moore–Penrose pseudoinverse.

    Assumes an additive slate reward, ``E[Σ_k r_k | x, s] = Σ_k φ_x(k, s_k)``, and that ``q_π``
    lies in the span of the logger's indicators; then it is unbiased. Biased when the slots
    interact. Supported loggers:

    * ``logger="uniform"`` -- uniformly random slates without replacement (closed-form ``Γ``);
    * ``logger="plackett_luce"`` -- sampling without replacement with per-context item weights
      ``logger_weights`` (n, A): ``Γ`` computed exactly by enumerating the ordered slates (up to
      :data:`MAX_ENUMERATED_SLATES`), once per distinct weight row.
    """
    _check_confidence(confidence)
    (q_pi,) = data._need("pseudoinverse", "target_marginals")
    n, size = data.slates.shape
    a = data.num_items
    indicator = _indicator(data.slates, a)  # (n, K·A)
    q = q_pi.reshape(n, size * a)
    if logger == "uniform":
        if logger_weights is not None:
            raise ValueError("logger_weights is only for logger='plackett_luce'")
        behaviour = np.full((n, size, a), 1.0 / a)
        _support("uniform logger marginals", behaviour, "target_marginals", q_pi)
        projected = q @ np.linalg.pinv(_uniform_gamma(a, size))  # (n, K·A)
    elif logger == "plackett_luce":
        w = _array("logger_weights", logger_weights, (n, a))
        if np.any(w < 0) or np.any(w.sum(axis=1) <= 0):
            raise ValueError("logger_weights must be non-negative with a positive sum per row")
        all_slates = enumerate_slates(a, size)
        onehots = _indicator(all_slates, a)
        unique, inverse = np.unique(w, axis=0, return_inverse=True)
        probability = plackett_luce_slate_probabilities(unique, all_slates)  # (U, S)
        marginals = slot_marginals(all_slates, probability, a)[inverse.reshape(-1)]
        _support("logger marginals", marginals, "target_marginals", q_pi)
        pinvs = np.stack(
            [np.linalg.pinv(onehots.T @ (onehots * row[:, None])) for row in probability]
        )
        projected = np.einsum("nd,nde->ne", q, pinvs[inverse.reshape(-1)])
    else:
        raise ValueError(f"logger must be 'uniform' or 'plackett_luce', got {logger!r}")
    weights = np.sum(projected * indicator, axis=1)
    return _mean_estimate("PseudoInverse", weights * data.rewards.sum(axis=1), confidence)


# --------------------------------------------------------------------------------------------
# Sequential
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoggedEpisodes:
    """n logged episodes padded to T steps.

    ``rewards[i, t]``, ``behaviour[i, t] = μ(a_t|s_t)`` and ``target[i, t] = π(a_t|s_t)`` of the
    logged action at step t (for a slate action: the whole slate's probability). ``mask[i, t]``
    is True for the steps that happened (a prefix of each row); padded steps must have reward 0
    and count as weight 1. Optional ``behaviour_probs`` / ``target_probs`` (n, T, A): the full
    per-step action distributions, for a support check.
    """

    rewards: np.ndarray
    behaviour: np.ndarray
    target: np.ndarray
    mask: np.ndarray | None = None
    behaviour_probs: np.ndarray | None = None
    target_probs: np.ndarray | None = None

    def __post_init__(self) -> None:
        rewards = _array("rewards", self.rewards, (None, None))
        n, horizon = rewards.shape
        if n == 0 or horizon == 0:
            raise ValueError(f"rewards must be a non-empty (n, T) array, got {rewards.shape}")
        mask = (
            np.ones((n, horizon), dtype=bool)
            if self.mask is None
            else _array("mask", self.mask, (n, horizon)).astype(bool)
        )
        if np.any(mask[:, 1:] & ~mask[:, :-1]):
            raise ValueError("mask must mark a prefix of every episode (no gaps)")
        if np.any(rewards[~mask] != 0):
            raise ValueError("rewards of padded steps (mask False) must be 0")
        behaviour = _array("behaviour", self.behaviour, (n, horizon))
        target = _array("target", self.target, (n, horizon))
        _probabilities("behaviour", np.where(mask, behaviour, 1.0), logged=True)
        _probabilities("target", np.where(mask, target, 1.0), logged=False)
        object.__setattr__(self, "rewards", rewards)
        object.__setattr__(self, "mask", mask)
        object.__setattr__(self, "behaviour", np.where(mask, behaviour, 1.0))
        object.__setattr__(self, "target", np.where(mask, target, 1.0))
        if (self.behaviour_probs is None) != (self.target_probs is None):
            raise ValueError("give both behaviour_probs and target_probs, or neither")
        if self.behaviour_probs is not None:
            b = _array("behaviour_probs", self.behaviour_probs, (n, horizon, None))
            t = _array("target_probs", self.target_probs, (n, horizon, b.shape[2]))
            _distributions("behaviour_probs", b[mask])
            _distributions("target_probs", t[mask])
            _support("behaviour_probs", np.where(mask[..., None], b, 1), "target_probs", t)

    @property
    def n(self) -> int:
        return self.rewards.shape[0]

    def cumulative_weights(self) -> np.ndarray:
        """``ρ_{0:t} = Π_{t'≤t} π(a_t'|s_t')/μ(a_t'|s_t')`` (n, T)."""
        return np.cumprod(self.target / self.behaviour, axis=1)

    def discounts(self, gamma: float) -> np.ndarray:
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        return gamma ** np.arange(self.rewards.shape[1])


def per_decision_is(
    data: LoggedEpisodes, *, gamma: float = 1.0, confidence: float = 0.95
) -> Estimate:
    """Per-decision importance sampling (Precup et al. 2000):
    ``V̂ = 1/n Σ_i Σ_t γ^t ρ_{i,0:t} r_it``.

    Unbiased when the propensities are right and the logger covers the target; the weight of a
    reward only includes the decisions before it. Variance grows exponentially with the horizon.
    """
    _check_confidence(confidence)
    terms = np.sum(data.discounts(gamma) * data.cumulative_weights() * data.rewards, axis=1)
    return _mean_estimate("PDIS", terms, confidence)


def weighted_doubly_robust(
    data: LoggedEpisodes,
    q_hat: ArrayLike,
    v_hat: ArrayLike,
    *,
    gamma: float = 1.0,
    confidence: float = 0.95,
) -> Estimate:
    """Weighted doubly robust (Thomas & Brunskill 2016):
    ``V̂ = Σ_i Σ_t γ^t [w_it r_it − (w_it Q̂(s_it, a_it) − w_{i,t−1} V̂(s_it))]``.

    ``w_it = ρ_{i,0:t} / Σ_j ρ_{j,0:t}`` are the per-step self-normalised weights
    (``w_{i,−1} = 1/n``), ``q_hat[i, t] = Q̂^π(s_it, a_it)`` and ``v_hat[i, t] = V̂^π(s_it) =
    E_{a~π} Q̂^π(s_it, a)`` (0 on padded steps). Consistent (biased, O(1/n)) under the IS
    assumptions; lower variance than DR when the weights are heavy. The standard error is the
    spread of the per-episode contributions ``n · Σ_t γ^t [...]_i`` (a linearisation).
    """
    _check_confidence(confidence)
    n, horizon = data.rewards.shape
    q = np.where(data.mask, _array("q_hat", q_hat, (n, horizon)), 0.0)
    v = np.where(data.mask, _array("v_hat", v_hat, (n, horizon)), 0.0)
    rho = data.cumulative_weights()
    totals = rho.sum(axis=0)
    if np.any(totals <= 0):
        step = int(np.argmax(totals <= 0))
        raise ValueError(
            f"WDR: the weights of step {step} sum to 0 (the target gives probability 0 to every "
            "logged trajectory up to there): self-normalisation is undefined"
        )
    w = rho / totals
    previous = np.concatenate([np.full((n, 1), 1.0 / n), w[:, :-1]], axis=1)
    discounts = data.discounts(gamma)
    per_episode = np.sum(discounts * (w * data.rewards - (w * q - previous * v)), axis=1)
    value = float(per_episode.sum())
    contributions = n * per_episode
    se = float(np.std(contributions, ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    half = t_quantile(confidence, n - 1) * se if n > 1 else math.nan
    _require_finite_result("WDR", np.array([value]))
    return Estimate("WDR", value, se, value - half, value + half, n, confidence)


def marginalized_is(
    data: LoggedEpisodes,
    state_ratio: ArrayLike,
    *,
    gamma: float = 1.0,
    confidence: float = 0.95,
) -> Estimate:
    """Marginalised importance sampling with a known state-distribution ratio:
    ``V̂ = 1/n Σ_i Σ_t γ^t (d_t^π(s_it) / d_t^μ(s_it)) · (π(a_it|s_it) / μ(a_it|s_it)) · r_it``.

    ``state_ratio[i, t] = d_t^π(s_it) / d_t^μ(s_it)``, the ratio of the step-t state
    distributions of the target and the logger, is given (e.g. computed from a known tabular
    model); estimating it (Xie et al. 2019; DualDICE) is not implemented. Unbiased when the ratio
    and the propensities are exact; its variance does not grow exponentially with the horizon.
    """
    _check_confidence(confidence)
    n, horizon = data.rewards.shape
    ratio = _array("state_ratio", state_ratio, (n, horizon))
    if np.any(ratio[data.mask] < 0):
        raise ValueError("state_ratio must be non-negative")
    step = data.target / data.behaviour
    terms = np.sum(data.discounts(gamma) * np.where(data.mask, ratio, 0) * step * data.rewards, 1)
    return _mean_estimate("MIS", terms, confidence)
