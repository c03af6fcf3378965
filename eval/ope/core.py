"""Off-policy evaluation's shared pieces: the :class:`Estimate` every estimator returns, and the
input checks every logged-data format runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from fedrec.eval.stats import mean_ci, t_quantile

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
