"""Sequential off-policy estimators on :class:`LoggedEpisodes`: per-decision IS, weighted doubly
robust and marginalised IS.
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
    _probabilities,
    _require_finite_result,
    _support,
)
from fedrec.eval.stats import t_quantile

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
