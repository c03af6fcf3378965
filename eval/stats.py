"""Confidence intervals of means: the one t-interval helper every table in fedrec uses.

All intervals are two-sided Student-t intervals built on :mod:`scipy.stats`. They are returned as
``(centre, half_width)`` pairs, so that a table prints ``centre ± half_width``.

**Small samples.** A t-interval needs at least two values (the sample standard deviation has
n - 1 degrees of freedom). With fewer, the half-width is ``nan``, never ``0``: a single seed has
*no* interval, not a zero-width one. With no values at all the mean is ``nan`` too. Callers that
print a table show a mean without ``±`` when the half-width is ``nan``.

* :func:`mean_ci`: mean of a sample and the half-width of its t-interval.
* :func:`column_mean_ci`: the same for every column of a table, ignoring NaN entries (seeds of
  different length, aligned on a common axis).
* :func:`welch_ci`: difference of two independent means with Welch's t-interval.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

__all__ = ["column_mean_ci", "mean_ci", "t_quantile", "welch_ci"]


def t_quantile(confidence: float, dof: ArrayLike) -> float | np.ndarray:
    """The t quantile that a two-sided ``confidence`` interval with ``dof`` degrees of freedom
    multiplies the standard error by (1.96 for large ``dof`` at 95%)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    quantile = stats.t.ppf(0.5 + confidence / 2, dof)
    return float(quantile) if np.ndim(quantile) == 0 else quantile


def mean_ci(values: ArrayLike, confidence: float = 0.95) -> tuple[float, float]:
    """``(mean, half_width)`` of the two-sided t confidence interval of the mean of ``values``.

    The interval is ``mean ± t_{n-1} · s / √n`` (``scipy.stats.sem`` with ``ddof=1``), the same as
    ``scipy.stats.t.interval(confidence, n - 1, loc=mean, scale=sem)``. The half-width is ``nan``
    for fewer than 2 values and the mean is ``nan`` for none. NaN values are not dropped (they
    make the result NaN); use :func:`column_mean_ci` to ignore them.
    """
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    n = len(array)
    if n == 0:
        return math.nan, math.nan
    mean = float(array.mean())
    if n < 2:
        return mean, math.nan
    sem = float(stats.sem(array, ddof=1))
    return mean, t_quantile(confidence, n - 1) * sem


def column_mean_ci(
    table: ArrayLike, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of a 2-D ``table``: ``(mean, half_width, count)`` over its finite entries.

    Rows are samples (e.g. seeds) and columns are points (e.g. logged episodes); NaN and inf
    entries (a seed without that point) are ignored. ``count`` is the number of finite entries;
    the mean is ``nan`` where it is 0 and the half-width is ``nan`` where it is below 2. Each
    column equals :func:`mean_ci` of its finite entries.
    """
    array = np.asarray(table, dtype=np.float64)
    if array.ndim != 2:
        raise ValueError(f"expected a 2-D table (samples x columns), got shape {array.shape}")
    finite = np.isfinite(array)
    count = finite.sum(axis=0)
    safe = np.maximum(count, 1)
    mean = np.where(finite, array, 0.0).sum(axis=0) / safe
    squares = np.where(finite, (array - mean) ** 2, 0.0).sum(axis=0)
    sem = np.sqrt(squares / np.maximum(count - 1, 1)) / np.sqrt(safe)
    half = np.asarray(t_quantile(confidence, np.maximum(count - 1, 1))) * sem
    mean = np.where(count > 0, mean, np.nan)
    half = np.where(count >= 2, half, np.nan)
    return mean, half, count


def welch_ci(a: ArrayLike, b: ArrayLike, confidence: float = 0.95) -> tuple[float, float]:
    """``(mean(a) - mean(b), half_width)`` of Welch's t-interval for two independent samples.

    Degrees of freedom from the Welch–Satterthwaite equation; the interval equals
    ``scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(confidence)``. The
    half-width is ``nan`` when either sample has fewer than 2 values, and 0 when both samples
    are constant (no spread: scipy's interval is undefined there).
    """
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if len(a) == 0 or len(b) == 0:
        return math.nan, math.nan
    difference = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return difference, math.nan
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return difference, 0.0
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return difference, t_quantile(confidence, dof) * se
