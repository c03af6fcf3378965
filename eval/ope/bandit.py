"""Single-step (contextual bandit) off-policy estimators on :class:`LoggedBandit`: IPS, SNIPS,
DM, DR, SNDR and Switch-DR.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from numpy.typing import ArrayLike

from fedrec.eval.ope.core import (
    Estimate,
    _array,
    _check_confidence,
    _distributions,
    _mean_estimate,
    _ratio_estimate,
    _support,
)
from fedrec.eval.stats import t_quantile

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
