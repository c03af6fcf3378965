"""SlateQ slate optimisation: top-k, greedy and optimal slates, batched over users.

Under SlateQ's conditional-logit choice model a user shown slate B clicks item i with probability
v_i / (v_null + Σ_{j∈B} v_j) and clicks nothing (the null item, valued 0) otherwise, so the slate's
value is the linear-fractional

    W(s, B) = Σ_{j∈B} v_j q_j / (v_null + Σ_{j∈B} v_j),     q_j = Q̄(s, j).

All functions take ``v`` (B, N) positive choice weights, ``q`` (B, N) item values (any sign),
``v_null`` (B,) (or a scalar) non-negative null weight, the slate size ``k`` and an optional ``mask``
(B, N) bool of allowed candidates, and return (B, k) int64 distinct item indices, ordered by
decreasing v_i q_i within the slate (slot order carries no meaning for W). Every method returns
exactly k items, as RecSim and our environments always show k; see :func:`lp_optimal_slates` for the
"≤ k" versus "= k" question.

Methods (described in ``docs/slateq.md``, "Slate optimisation"): ``topk`` (largest v_i q_i;
unbounded approximation ratio), ``greedy`` (SlateQ's greedy; not submodular, so no guarantee
either), ``optimal`` (exact: the Charnes–Cooper LP solved per user with HiGHS, or Dinkelbach's
method from :mod:`fedrec.agents.assortment`, vectorised and much faster).
:func:`enumerate_optimal_slates` is the brute-force reference for tests.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

import numpy as np
from scipy.optimize import linprog

from fedrec.agents.assortment import optimal_slates as dinkelbach_optimal_slates

Method = Literal["topk", "greedy", "optimal"]
Solver = Literal["lp", "dinkelbach"]

# Largest number of k-subsets per user that the brute force will enumerate.
MAX_ENUMERATED_SUBSETS = 1_000_000
# |x_i - round(x_i)| above this after x = y / t counts as a fractional LP vertex.
INTEGRALITY_TOL = 1e-6


def _validate(
    v: np.ndarray,
    q: np.ndarray,
    v_null: float | np.ndarray | None,
    k: int,
    mask: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Check and convert the common inputs; returns float64 v, q, v_null (B,) and a bool mask."""
    v = np.asarray(v, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if v.ndim != 2 or v.shape != q.shape:
        raise ValueError(f"v {v.shape} and q {q.shape} must both have shape (B, N)")
    n_users, n_items = v.shape
    if n_users == 0 or n_items == 0:
        raise ValueError(f"need at least one user and one item, got shape {v.shape}")
    if isinstance(k, bool) or not isinstance(k, int | np.integer):
        raise ValueError(f"slate size k must be an int, got {k!r}")
    if not 1 <= k <= n_items:
        raise ValueError(f"slate size k={k} must be in [1, N={n_items}]")
    if not np.isfinite(v).all() or not np.isfinite(q).all():
        raise ValueError("v and q must be finite (no NaN or inf)")
    if (v <= 0).any():
        raise ValueError("choice weights v must be positive")
    if v_null is None:
        v_null_arr = np.zeros(n_users)
    else:
        v_null_arr = np.asarray(v_null, dtype=np.float64)
        if v_null_arr.ndim == 0:
            v_null_arr = np.full(n_users, float(v_null_arr))
        if v_null_arr.shape != (n_users,):
            raise ValueError(
                f"v_null {v_null_arr.shape} must be a scalar or have shape ({n_users},)"
            )
        if not np.isfinite(v_null_arr).all() or (v_null_arr < 0).any():
            raise ValueError("null weight v_null must be finite and non-negative")
    if mask is None:
        mask_arr = np.ones(v.shape, dtype=bool)
    else:
        mask_arr = np.asarray(mask)
        if mask_arr.dtype != np.bool_ or mask_arr.shape != v.shape:
            raise ValueError(f"mask must be a bool array of shape {v.shape}")
        short = np.flatnonzero(mask_arr.sum(axis=1) < k)
        if short.size:
            raise ValueError(f"users {short[:5].tolist()} have fewer than k={k} allowed items")
    return v, q, v_null_arr, mask_arr


def _order_by_score(slates: np.ndarray, v: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Reorder each slate by decreasing v_i q_i (ties: lower index first)."""
    slates = np.sort(slates, axis=1)
    scores = np.take_along_axis(v * q, slates, axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(slates, order, axis=1).astype(np.int64)


def slate_values(
    v: np.ndarray, q: np.ndarray, v_null: float | np.ndarray, slates: np.ndarray
) -> np.ndarray:
    """W(s, B) = Σ_{j∈B} v_j q_j / (v_null + Σ_{j∈B} v_j) for each user's slate, shape (B,)."""
    v, q, v_null, _ = _validate(v, q, v_null, 1, None)
    slates = np.asarray(slates)
    if (
        slates.ndim != 2
        or slates.shape[0] != v.shape[0]
        or not np.issubdtype(slates.dtype, np.integer)
    ):
        raise ValueError(f"slates must be an integer array of shape ({v.shape[0]}, k)")
    if slates.size and (slates.min() < 0 or slates.max() >= v.shape[1]):
        raise ValueError(f"slate indices must be in [0, N={v.shape[1]})")
    vs = np.take_along_axis(v, slates, axis=1)
    qs = np.take_along_axis(q, slates, axis=1)
    return (vs * qs).sum(axis=1) / (v_null + vs.sum(axis=1))


def topk_slates(
    v: np.ndarray, q: np.ndarray, k: int, *, mask: np.ndarray | None = None
) -> np.ndarray:
    """The k allowed items with the largest v_i q_i (SlateQ's TS; ties broken by lower index)."""
    v, q, _, mask = _validate(v, q, None, k, mask)
    scores = np.where(mask, v * q, -np.inf)
    n_items = scores.shape[1]
    # O(N) selection with deterministic ties: everything above the k-th largest score, then the
    # lowest-index items equal to it (argpartition alone would break such ties arbitrarily).
    kth = np.partition(scores, n_items - k, axis=1)[:, n_items - k, None]
    above = scores > kth
    tied = scores == kth
    need = k - above.sum(axis=1, keepdims=True)
    selected = above | (tied & (np.cumsum(tied, axis=1) <= need))
    return _order_by_score(np.nonzero(selected)[1].reshape(-1, k), v, q)


def _greedy_fill(
    v: np.ndarray,
    q: np.ndarray,
    v_null: np.ndarray,
    allowed: np.ndarray,
    chosen: np.ndarray,
    steps: int,
) -> np.ndarray:
    """Run ``steps`` rounds of SlateQ's greedy from the sets ``chosen`` (B, N) bool; updates it.

    Each round adds argmax_{i allowed, ∉B} (num + v_i q_i) / (den + v_i) (first index on ties),
    i.e. the item that most increases (or least decreases) W. Vectorised over users.
    """
    vq = v * q
    num = (vq * chosen).sum(axis=1)
    den = v_null + (v * chosen).sum(axis=1)
    rows = np.arange(v.shape[0])
    for _ in range(steps):
        ratio = (num[:, None] + vq) / (den[:, None] + v)
        ratio[chosen | ~allowed] = -np.inf
        pick = ratio.argmax(axis=1)
        chosen[rows, pick] = True
        num += vq[rows, pick]
        den += v[rows, pick]
    return chosen


def greedy_slates(
    v: np.ndarray,
    q: np.ndarray,
    v_null: float | np.ndarray,
    k: int,
    *,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """SlateQ's greedy slate (GS, ``docs/slateq.md``, "Slate optimisation"): k rounds adding the
    item maximising the running W.

    Starts from B = ∅, num = 0, den = v_null; each round picks i* = argmax_{i∉B} (num + v_i q_i) /
    (den + v_i) (lowest index on ties) and updates num, den. With negative q this still adds k items
    (the least harmful ones), as the environment needs k.
    """
    v, q, v_null, mask = _validate(v, q, v_null, k, mask)
    chosen = _greedy_fill(v, q, v_null, mask, np.zeros(v.shape, dtype=bool), k)
    return _order_by_score(np.nonzero(chosen)[1].reshape(-1, k), v, q)


def _lp_one_user(
    v: np.ndarray, q: np.ndarray, v_null: float, k: int, exactly_k: bool
) -> tuple[np.ndarray | None, np.ndarray]:
    """Solve one user's Charnes–Cooper LP over the items given; returns (chosen or None, x)."""
    n = v.size
    if not exactly_k and v_null > 0 and (q <= 0).all():
        # "≤ k" with no positive q: the empty assortment (W = 0) is optimal, as any non-empty one
        # has W ≤ 0. Decided here because its LP vertex y = 0, t = 1/v_null is badly scaled for a
        # tiny v_null (HiGHS then returned a worse non-empty vertex as "optimal").
        return np.zeros(0, dtype=np.int64), np.zeros(n)
    # W is invariant to scaling (v, v_null) together, and the argmax to scaling the objective;
    # scaling keeps t = 1 / (v_null + Σ x v) and the objective O(1) for HiGHS's absolute tolerances.
    scale = v_null + np.sort(v)[-k:].sum()
    vs, vns = v / scale, v_null / scale
    c = vs * q
    c = c / max(np.abs(c).max(), 1e-300)
    # Variables z = (y_1..y_n, t).  maximise c·y  <=>  minimise -c·y.
    objective = np.append(-c, 0.0)
    a_ub = np.hstack([np.eye(n), -np.ones((n, 1))])  # y_i - t <= 0
    b_ub = np.zeros(n)
    card = np.append(np.ones(n), -float(k))  # Σ y_i - k t  (= 0 or <= 0)
    a_eq = np.append(vs, vns)[None, :]  # v_null t + Σ v_i y_i = 1
    b_eq = np.ones(1)
    if exactly_k:
        a_eq, b_eq = np.vstack([a_eq, card]), np.append(b_eq, 0.0)
    else:
        a_ub, b_ub = np.vstack([a_ub, card]), np.append(b_ub, 0.0)
    res = linprog(
        objective, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs"
    )
    if res.status != 0:
        raise RuntimeError(f"slate LP failed: {res.message}")
    y, t = res.x[:n], res.x[n]
    # t > 0 always: t = 0 forces y = 0 (y_i <= t), contradicting v_null t + Σ v y = 1.
    x = y / t
    chosen = np.flatnonzero(x > 0.5)
    size_ok = chosen.size == k if exactly_k else chosen.size <= k
    if np.abs(x - np.round(x)).max() > INTEGRALITY_TOL or not size_ok:
        return None, x
    return chosen, x


def lp_optimal_slates(
    v: np.ndarray,
    q: np.ndarray,
    v_null: float | np.ndarray,
    k: int,
    *,
    mask: np.ndarray | None = None,
    exactly_k: bool = True,
    on_fractional: Literal["dinkelbach", "raise"] = "dinkelbach",
    return_sizes: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The slate maximising W(s, B), via the Charnes–Cooper LP solved per user with HiGHS.

    With t = 1 / (v_null + Σ_j x_j v_j) and y_i = x_i t the 0/1 fractional programme relaxes to the
    LP: max Σ v_i q_i y_i s.t. v_null t + Σ v_i y_i = 1, 0 ≤ y_i ≤ t, Σ y_i (= or ≤) k t; then
    x = y / t. The transform is a bijection between the relaxed polytope {0 ≤ x ≤ 1, Σ x = k}
    (resp. ≤ k) and the LP's feasible set that maps vertices to vertices, and both polytopes
    (uniform-matroid base / independence polytopes) have only 0/1 vertices, so a vertex optimum
    is an integral slate for **both** "= k" and "≤ k". We verified this empirically against
    enumeration (tests/test_slate_selection.py, including ties and negative q).

    **"≤ k" versus "= k".** Under "≤ k" fewer than k items can be optimal: adding an item with q_i
    below the current W dilutes the others (more probability mass on a worse item), and with all
    q < 0 the best "slate" is the empty one (W = 0, the null item). The environment always shows
    exactly k distinct items, so the default ``exactly_k=True`` solves the "= k" LP (the exact
    optimum over k-sets; with negative q it shows the k least harmful items). ``exactly_k=False``
    solves "≤ k" and, to still return k items, puts the LP's m ≤ k items first (by decreasing
    v_i q_i) and fills the other k - m slots greedily with the items that least reduce W (SlateQ's
    greedy step); the padded slate is a feasible k-set, so its W is at most the "= k" optimum, which
    is at most the "≤ k" optimum. ``return_sizes=True`` also returns m per user.

    A fractional LP solution can only come from numerical trouble or a non-vertex solution on an
    optimal face with ties (HiGHS's simplex, and its IPM with crossover, return vertices). It is then
    re-solved exactly by Dinkelbach (``on_fractional="dinkelbach"``) or raises (``"raise"``, used by
    the tests to check integrality). The fallback solves "= k", also when ``exactly_k=False``. No
    fractional solution occurred in our checks (about 3,000 random instances, N ≤ 8, and N up to
    500 against Dinkelbach).
    """
    v, q, v_null, mask = _validate(v, q, v_null, k, mask)
    if on_fractional not in ("dinkelbach", "raise"):
        raise ValueError(f"on_fractional must be 'dinkelbach' or 'raise', got {on_fractional!r}")
    n_users = v.shape[0]
    chosen = np.zeros(v.shape, dtype=bool)
    sizes = np.full(n_users, k, dtype=np.int64)
    fractional: list[int] = []
    for b in range(n_users):
        items = np.flatnonzero(mask[b])
        sel, x = _lp_one_user(v[b, items], q[b, items], float(v_null[b]), k, exactly_k)
        if sel is None:
            if on_fractional == "raise":
                raise RuntimeError(f"slate LP returned a fractional solution for user {b}: x={x}")
            fractional.append(b)
            continue
        chosen[b, items[sel]] = True
        sizes[b] = sel.size
    if fractional:
        rows = np.asarray(fractional)
        fallback = _dinkelbach(v[rows], q[rows], v_null[rows], k, mask[rows])
        chosen[rows[:, None], fallback] = True
        sizes[rows] = k  # the "= k" optimum; only reached under exactly_k=False if the LP failed
    core = chosen.copy()
    for b in np.flatnonzero(sizes < k):
        # "≤ k" optimum with m < k items: pad with the items that least reduce W (greedy steps).
        _greedy_fill(
            v[b : b + 1],
            q[b : b + 1],
            v_null[b : b + 1],
            mask[b : b + 1],
            chosen[b : b + 1],
            k - int(sizes[b]),
        )
    # Order by decreasing v_i q_i, with the LP's own items before any padding (stable sort).
    slates = np.nonzero(chosen)[1].reshape(-1, k)
    padded = ~np.take_along_axis(core, slates, axis=1)
    order = np.lexsort((-np.take_along_axis(v * q, slates, axis=1), padded), axis=1)
    slates = np.take_along_axis(slates, order, axis=1).astype(np.int64)
    return (slates, sizes) if return_sizes else slates


def _dinkelbach(
    v: np.ndarray, q: np.ndarray, v_null: np.ndarray, k: int, mask: np.ndarray
) -> np.ndarray:
    """Exact "= k" optimum via :func:`fedrec.agents.assortment.optimal_slates`, with masking.

    Masked items get q = -M with M large enough that any slate containing one has W below every
    all-allowed slate: those have W ≥ L = min(0, min allowed q) (a convex combination of allowed q
    and the null value 0), while with P = Σ_i v_i max(q_i, 0), D = v_null + Σ_i v_i and M >
    (P + |L| D) / v_min the numerator is negative and W ≤ (P - v_min M) / D < L.
    """
    if not mask.all():
        pos = (v * np.maximum(q, 0.0)).sum(axis=1)
        low = np.abs(np.minimum(0.0, np.where(mask, q, np.inf).min(axis=1)))
        total = v_null + v.sum(axis=1)
        v_min = np.where(mask, np.inf, v).min(axis=1)
        big = 2.0 * (pos + low * total) / v_min + 1.0
        q = np.where(mask, q, -big[:, None])
    slates = dinkelbach_optimal_slates(v, q, k, null_weight=v_null, null_value=0.0)
    if not np.take_along_axis(mask, slates, axis=1).all():  # guards the big-M argument above
        raise RuntimeError("Dinkelbach selected a masked item")
    return slates


def dinkelbach_slates(
    v: np.ndarray,
    q: np.ndarray,
    v_null: float | np.ndarray,
    k: int,
    *,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """The exact "= k" optimal slate by Dinkelbach's method (vectorised; same value as the LP)."""
    v, q, v_null, mask = _validate(v, q, v_null, k, mask)
    return _order_by_score(_dinkelbach(v, q, v_null, k, mask), v, q)


def enumerate_optimal_slates(
    v: np.ndarray,
    q: np.ndarray,
    v_null: float | np.ndarray,
    k: int,
    *,
    mask: np.ndarray | None = None,
    max_subsets: int = MAX_ENUMERATED_SUBSETS,
) -> np.ndarray:
    """Brute-force "= k" optimum over all k-subsets (the reference for tests; small N only).

    Ties go to the lexicographically first subset. Raises ValueError when C(N, k) > max_subsets.
    """
    v, q, v_null, mask = _validate(v, q, v_null, k, mask)
    n_users, n_items = v.shape
    n_subsets = math.comb(n_items, k)
    if n_subsets > max_subsets:
        raise ValueError(
            f"C({n_items}, {k}) = {n_subsets} subsets exceeds max_subsets={max_subsets}"
        )
    combos = np.array(list(itertools.combinations(range(n_items), k)), dtype=np.int64)
    slates = np.empty((n_users, k), dtype=np.int64)
    chunk = max(1, 2_000_000 // (n_subsets * k))  # bound the (rows, subsets, k) temporaries
    vq = v * q
    for lo in range(0, n_users, chunk):
        sl = slice(lo, lo + chunk)
        num = vq[sl][:, combos].sum(axis=2)
        den = v_null[sl, None] + v[sl][:, combos].sum(axis=2)
        value = np.where(mask[sl][:, combos].all(axis=2), num / den, -np.inf)
        slates[sl] = combos[value.argmax(axis=1)]
    return _order_by_score(slates, v, q)


def select_slates(
    method: Method,
    v: np.ndarray,
    q: np.ndarray,
    v_null: float | np.ndarray,
    k: int,
    *,
    mask: np.ndarray | None = None,
    solver: Solver = "lp",
) -> np.ndarray:
    """Dispatch to the slate optimiser named by ``method`` ("topk", "greedy" or "optimal").

    ``solver`` picks the exact method for "optimal": "lp" (the Charnes–Cooper LP, one HiGHS solve per user)
    or "dinkelbach" (vectorised; same optimal value, typically far faster).
    """
    if method == "topk":
        _validate(v, q, v_null, k, mask)
        return topk_slates(v, q, k, mask=mask)
    if method == "greedy":
        return greedy_slates(v, q, v_null, k, mask=mask)
    if method == "optimal":
        if solver == "lp":
            return lp_optimal_slates(v, q, v_null, k, mask=mask)
        if solver == "dinkelbach":
            return dinkelbach_slates(v, q, v_null, k, mask=mask)
        raise ValueError(f"unknown solver {solver!r}; expected 'lp' or 'dinkelbach'")
    raise ValueError(f"unknown method {method!r}; expected 'topk', 'greedy' or 'optimal'")
