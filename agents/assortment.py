"""Exact slate optimisation under a multinomial-logit style choice model.

Choose exactly k of N items to maximise the expected value of the consumed item,

    W(A) = (v_null * q_null + sum_{i in A} v_i q_i) / (v_null + sum_{i in A} v_i),

where v are choice weights and q item values (SlateQ's Q-bar, or expected engagement). This is a
linear-fractional 0/1 programme (assortment optimisation). We solve it exactly with Dinkelbach's
parametric method: for a guess lambda, the best set for ``sum_A v_i (q_i - lambda)`` is the top k of
``v_i (q_i - lambda)``; lambda <- W(that set) increases strictly until it is optimal (finitely many
sets). Every iteration is a vectorised top-k over the whole batch; we hand-write it because SciPy's
LP solver (kept for the general SlateQ LP) would be one solve per user.
"""

from __future__ import annotations

import numpy as np

MAX_ITERATIONS = 100


def slate_value(
    weights: np.ndarray,
    values: np.ndarray,
    slates: np.ndarray,
    *,
    null_weight: float | np.ndarray = 0.0,
    null_value: float | np.ndarray = 0.0,
) -> np.ndarray:
    """W(A) for each row's slate; ``weights`` and ``values`` are (B, N), ``slates`` (B, k)."""
    v = np.take_along_axis(weights, slates, axis=1)
    q = np.take_along_axis(values, slates, axis=1)
    null_weight = np.broadcast_to(np.asarray(null_weight, dtype=np.float64), v.shape[:1])
    null_value = np.broadcast_to(np.asarray(null_value, dtype=np.float64), v.shape[:1])
    numerator = null_weight * null_value + (v * q).sum(axis=1)
    return numerator / (null_weight + v.sum(axis=1))


def _top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row, in descending order of score."""
    if k < scores.shape[1]:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    else:
        part = np.broadcast_to(np.arange(k), scores.shape).copy()
    order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1)


def optimal_slates(
    weights: np.ndarray,
    values: np.ndarray,
    k: int,
    *,
    null_weight: float | np.ndarray = 0.0,
    null_value: float | np.ndarray = 0.0,
) -> np.ndarray:
    """The k-item slate maximising W(A) per row (exact; slot order carries no meaning).

    :param weights: (B, N) positive choice weights v_i.
    :param values: (B, N) item values q_i.
    :param null_weight: v_null (0 when a click always happens), scalar or (B,).
    :param null_value: value of consuming nothing, scalar or (B,).
    :returns: (B, k) int64 indices.
    """
    weights = np.asarray(weights, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if weights.shape != values.shape or weights.ndim != 2:
        raise ValueError(f"weights {weights.shape} and values {values.shape} must both be (B, N)")
    if not 1 <= k <= weights.shape[1]:
        raise ValueError(f"slate size k={k} must be in [1, N={weights.shape[1]}]")
    if (weights <= 0).any():
        raise ValueError("choice weights must be positive")
    slates = _top_k(weights * values, k)  # any feasible start
    ratio = slate_value(weights, values, slates, null_weight=null_weight, null_value=null_value)
    for _ in range(MAX_ITERATIONS):
        candidate = _top_k(weights * (values - ratio[:, None]), k)
        new_ratio = slate_value(
            weights, values, candidate, null_weight=null_weight, null_value=null_value
        )
        improved = new_ratio > ratio + 1e-12 * (1.0 + np.abs(ratio))
        if not improved.any():
            break
        slates[improved] = candidate[improved]
        ratio = np.where(improved, new_ratio, ratio)
    return slates
