"""Slate optimisation (agents/slate_selection.py): exactness against enumeration, greedy and top-k
against slow references, output format, masking, negative values and input validation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedrec.agents import slate_selection as ss
from fedrec.agents.assortment import slate_value
from fedrec.agents.slate_selection import (
    dinkelbach_slates,
    enumerate_optimal_slates,
    greedy_slates,
    lp_optimal_slates,
    select_slates,
    slate_values,
    topk_slates,
)

SCENARIOS = ("normal", "negative", "ties", "tiny_null", "zero_null")


def make_instance(rng: np.random.Generator, scenario: str, users: int, n: int):
    """Random (v, q, v_null) covering the hard cases: negative q, exact ties, tiny v_null."""
    v = np.exp(rng.normal(size=(users, n)))
    q = rng.normal(size=(users, n))
    v_null = np.exp(2.0 * rng.normal(size=users))
    if scenario == "negative":
        q = -np.abs(q)
        q[: users // 2, 0] = 0.3  # half the users have a single positive item
    elif scenario == "ties":
        v = rng.integers(1, 3, size=(users, n)).astype(float)
        q = rng.integers(-2, 3, size=(users, n)).astype(float)
        v_null = rng.integers(1, 3, size=users).astype(float)
    elif scenario == "tiny_null":
        v_null = np.full(users, 1e-9)
    elif scenario == "zero_null":
        v_null = np.zeros(users)
    return v, q, v_null


def assert_valid(slates: np.ndarray, users: int, k: int, n: int, mask=None) -> None:
    assert slates.shape == (users, k)
    assert slates.dtype == np.int64
    assert ((slates >= 0) & (slates < n)).all()
    assert (np.diff(np.sort(slates, axis=1), axis=1) > 0).all(), "items must be distinct"
    if mask is not None:
        assert np.take_along_axis(mask, slates, axis=1).all(), "masked item selected"


def reference_greedy(v, q, v_null, k, mask=None):
    """SlateQ's greedy (docs/slateq.md, "Slate optimisation"), one user at a time in plain Python."""
    out = []
    for b in range(v.shape[0]):
        chosen, num, den = [], 0.0, float(v_null[b])
        for _ in range(k):
            best, best_ratio = -1, -np.inf
            for i in range(v.shape[1]):
                if i in chosen or (mask is not None and not mask[b, i]):
                    continue
                ratio = (num + v[b, i] * q[b, i]) / (den + v[b, i])
                if ratio > best_ratio:
                    best, best_ratio = i, ratio
            chosen.append(best)
            num += v[b, best] * q[b, best]
            den += v[b, best]
        out.append(sorted(chosen))
    return np.array(out)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_lp_optimum_equals_enumeration(scenario: str, k: int) -> None:
    rng = np.random.default_rng([k, SCENARIOS.index(scenario)])
    for n in range(k, 9):
        v, q, v_null = make_instance(rng, scenario, 12, n)
        brute = slate_values(v, q, v_null, enumerate_optimal_slates(v, q, v_null, k))
        # on_fractional="raise": the "= k" LP's vertex must be integral, no silent fallback.
        lp = lp_optimal_slates(v, q, v_null, k, on_fractional="raise")
        assert_valid(lp, 12, k, n)
        np.testing.assert_allclose(slate_values(v, q, v_null, lp), brute, rtol=1e-9, atol=1e-12)
        dk = dinkelbach_slates(v, q, v_null, k)
        assert_valid(dk, 12, k, n)
        np.testing.assert_allclose(slate_values(v, q, v_null, dk), brute, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lp_and_dinkelbach_agree_on_larger_instances(scenario: str) -> None:
    rng = np.random.default_rng(SCENARIOS.index(scenario) + 100)
    v, q, v_null = make_instance(rng, scenario, 20, 40)
    mask = rng.random((20, 40)) < 0.7
    mask[:, :6] = True
    for m in (None, mask):
        lp = select_slates("optimal", v, q, v_null, 6, mask=m)
        dk = select_slates("optimal", v, q, v_null, 6, mask=m, solver="dinkelbach")
        assert_valid(lp, 20, 6, 40, m)
        assert_valid(dk, 20, 6, 40, m)
        np.testing.assert_allclose(
            slate_values(v, q, v_null, lp), slate_values(v, q, v_null, dk), rtol=1e-9, atol=1e-12
        )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_at_most_k_lp_is_integral_and_optimal(scenario: str) -> None:
    """ "≤ k" LP: optimum over all subsets of size ≤ k (possibly empty), padded to k items."""
    rng = np.random.default_rng(SCENARIOS.index(scenario) + 200)
    k, n = 3, 7
    v, q, v_null = make_instance(rng, scenario, 30, n)
    slates, sizes = lp_optimal_slates(
        v, q, v_null, k, exactly_k=False, on_fractional="raise", return_sizes=True
    )
    assert_valid(slates, 30, k, n)
    exact_k = slate_values(v, q, v_null, enumerate_optimal_slates(v, q, v_null, k))
    for b in range(30):
        subsets = [c for r in range(k + 1) for c in itertools.combinations(range(n), r)]
        values = [
            sum(v[b, j] * q[b, j] for j in c) / (v_null[b] + sum(v[b, j] for j in c))
            if c or v_null[b] > 0
            else -np.inf
            for c in subsets
        ]
        core = slates[b, : sizes[b]]
        core_value = (v[b, core] * q[b, core]).sum() / (v_null[b] + v[b, core].sum())
        assert core_value == pytest.approx(max(values), rel=1e-9, abs=1e-12)
    padded = slate_values(v, q, v_null, slates)
    assert (padded <= exact_k + 1e-12).all()  # the padded k-set cannot beat the "= k" optimum
    if scenario == "negative":
        assert (sizes[15:] == 0).all()  # all q < 0: the empty assortment (null item) is optimal
        assert (sizes[:15] == 1).all()  # one positive item: show it alone


def test_fewer_than_k_can_be_optimal_under_at_most_k() -> None:
    # Item 0 is excellent, item 1 poor: adding item 1 dilutes the click probability of item 0.
    v, q, v_null = np.array([[1.0, 1.0, 1.0]]), np.array([[1.0, 0.1, 0.05]]), np.array([1.0])
    slates, sizes = lp_optimal_slates(v, q, v_null, 2, exactly_k=False, return_sizes=True)
    assert sizes.tolist() == [1] and slates[0, 0] == 0
    assert lp_optimal_slates(v, q, v_null, 2).tolist() == [[0, 1]]


def test_greedy_matches_slow_reference() -> None:
    rng = np.random.default_rng(3)
    for scenario in SCENARIOS:
        for n, k in ((5, 1), (8, 3), (20, 5)):
            v, q, v_null = make_instance(rng, scenario, 15, n)
            mask = rng.random((15, n)) < 0.8
            mask[:, :k] = True
            for m in (None, mask):
                got = greedy_slates(v, q, v_null, k, mask=m)
                assert_valid(got, 15, k, n, m)
                np.testing.assert_array_equal(
                    np.sort(got, axis=1), reference_greedy(v, q, v_null, k, m)
                )


def test_topk_matches_sorting() -> None:
    rng = np.random.default_rng(4)
    for scenario in SCENARIOS:
        v, q, _ = make_instance(rng, scenario, 30, 12)
        got = topk_slates(v, q, 4)
        assert_valid(got, 30, 4, 12)
        expected = np.array(
            [sorted(range(12), key=lambda i, b=b: -v[b, i] * q[b, i])[:4] for b in range(30)]
        )
        np.testing.assert_array_equal(got, expected)  # same ties rule: lower index first


@pytest.mark.parametrize("method", ["topk", "greedy", "optimal", "dinkelbach", "enumerate"])
def test_format_order_and_mask(method: str) -> None:
    rng = np.random.default_rng(5)
    v, q, v_null = make_instance(rng, "normal", 40, 8)
    mask = rng.random((40, 8)) < 0.6
    mask[np.arange(40), rng.integers(0, 8, 40)] = True
    mask[np.arange(40), (np.arange(40) + 3) % 8] = True
    mask[np.arange(40), (np.arange(40) + 5) % 8] = True
    run = {
        "topk": lambda m: select_slates("topk", v, q, v_null, 2, mask=m),
        "greedy": lambda m: select_slates("greedy", v, q, v_null, 2, mask=m),
        "optimal": lambda m: select_slates("optimal", v, q, v_null, 2, mask=m),
        "dinkelbach": lambda m: select_slates(
            "optimal", v, q, v_null, 2, mask=m, solver="dinkelbach"
        ),
        "enumerate": lambda m: enumerate_optimal_slates(v, q, v_null, 2, mask=m),
    }[method]
    for m in (None, mask):
        slates = run(m)
        assert_valid(slates, 40, 2, 8, m)
        score = np.take_along_axis(v * q, slates, axis=1)
        assert (np.diff(score, axis=1) <= 0).all(), "slots ordered by decreasing v q"
    if method in ("optimal", "dinkelbach"):  # the masked optimum is the masked enumeration's
        brute = slate_values(v, q, v_null, enumerate_optimal_slates(v, q, v_null, 2, mask=mask))
        np.testing.assert_allclose(slate_values(v, q, v_null, run(mask)), brute, rtol=1e-9)


def test_negative_values_still_show_k_items() -> None:
    v = np.array([[1.0, 2.0, 1.0, 4.0]])
    q = np.array([[-1.0, -0.5, -3.0, -0.2]])
    for method in ("topk", "greedy", "optimal"):
        assert_valid(select_slates(method, v, q, 1.0, 2), 1, 2, 4)
    # "= k" optimum: the pair with the least negative W, here {1, 3}: (-1 - 0.8) / 7.
    best = select_slates("optimal", v, q, 1.0, 2)
    assert sorted(best[0].tolist()) == [1, 3]
    assert slate_values(v, q, 1.0, best)[0] == pytest.approx(-1.8 / 7)


def test_slate_values_matches_assortment() -> None:
    rng = np.random.default_rng(6)
    v, q, v_null = make_instance(rng, "normal", 10, 6)
    slates = np.array([rng.permutation(6)[:3] for _ in range(10)])
    np.testing.assert_allclose(
        slate_values(v, q, v_null, slates), slate_value(v, q, slates, null_weight=v_null)
    )
    assert slate_values(np.ones((1, 2)), np.array([[2.0, 4.0]]), 2.0, np.array([[0, 1]]))[0] == 1.5


class _FakeResult:
    def __init__(self, x, status=0):
        self.x, self.status, self.message = x, status, "fake"


def test_fractional_lp_falls_back_to_dinkelbach(monkeypatch) -> None:
    rng = np.random.default_rng(7)
    v, q, v_null = make_instance(rng, "normal", 5, 6)

    def fractional_linprog(c, **kwargs):
        n = c.size - 1
        return _FakeResult(np.append(np.full(n, 0.25), 1.0))  # t = 1, x_i = 0.25

    monkeypatch.setattr(ss, "linprog", fractional_linprog)
    with pytest.raises(RuntimeError, match="fractional"):
        lp_optimal_slates(v, q, v_null, 2, on_fractional="raise")
    got = lp_optimal_slates(v, q, v_null, 2)
    brute = slate_values(v, q, v_null, enumerate_optimal_slates(v, q, v_null, 2))
    np.testing.assert_allclose(slate_values(v, q, v_null, got), brute, rtol=1e-9)
    monkeypatch.setattr(ss, "linprog", lambda c, **kw: _FakeResult(None, status=2))
    with pytest.raises(RuntimeError, match="LP failed"):
        lp_optimal_slates(v, q, v_null, 2)


@pytest.mark.parametrize(
    ("v", "q", "v_null", "k", "mask", "match"),
    [
        (np.ones(4), np.ones(4), 1.0, 2, None, r"shape \(B, N\)"),
        (np.ones((2, 4)), np.ones((2, 3)), 1.0, 2, None, r"shape \(B, N\)"),
        (np.ones((2, 4)), np.ones((2, 4)), 1.0, 5, None, "k=5"),
        (np.ones((2, 4)), np.ones((2, 4)), 1.0, 0, None, "k=0"),
        (np.ones((2, 4)), np.ones((2, 4)), 1.0, 1.5, None, "int"),
        (np.array([[1.0, 0.0]]), np.ones((1, 2)), 1.0, 1, None, "positive"),
        (np.array([[1.0, -1.0]]), np.ones((1, 2)), 1.0, 1, None, "positive"),
        (np.array([[1.0, np.nan]]), np.ones((1, 2)), 1.0, 1, None, "finite"),
        (np.ones((1, 2)), np.array([[1.0, np.nan]]), 1.0, 1, None, "finite"),
        (np.ones((1, 2)), np.array([[1.0, np.inf]]), 1.0, 1, None, "finite"),
        (np.ones((1, 2)), np.ones((1, 2)), np.nan, 1, None, "v_null"),
        (np.ones((1, 2)), np.ones((1, 2)), -1.0, 1, None, "v_null"),
        (np.ones((2, 2)), np.ones((2, 2)), np.ones(3), 1, None, "v_null"),
        (np.ones((1, 3)), np.ones((1, 3)), 1.0, 2, np.array([[True, False, False]]), "fewer"),
        (np.ones((1, 3)), np.ones((1, 3)), 1.0, 2, np.ones((1, 3), dtype=int), "bool"),
        (np.ones((1, 3)), np.ones((1, 3)), 1.0, 2, np.ones((1, 2), dtype=bool), "bool"),
    ],
)
def test_bad_inputs_raise(v, q, v_null, k, mask, match) -> None:
    calls = [
        lambda: select_slates("topk", v, q, v_null, k, mask=mask),
        lambda: greedy_slates(v, q, v_null, k, mask=mask),
        lambda: lp_optimal_slates(v, q, v_null, k, mask=mask),
        lambda: dinkelbach_slates(v, q, v_null, k, mask=mask),
        lambda: enumerate_optimal_slates(v, q, v_null, k, mask=mask),
    ]
    if v_null is not None and np.ndim(v_null) == 0 and np.isfinite(v_null) and v_null >= 0:
        calls.append(lambda: topk_slates(v, q, k, mask=mask))
    for call in calls:
        with pytest.raises(ValueError, match=match):
            call()


def test_other_errors() -> None:
    v, q = np.ones((1, 4)), np.ones((1, 4))
    with pytest.raises(ValueError, match="unknown method"):
        select_slates("best", v, q, 1.0, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown solver"):
        select_slates("optimal", v, q, 1.0, 2, solver="cplex")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_subsets"):
        enumerate_optimal_slates(np.ones((1, 30)), np.ones((1, 30)), 1.0, 10)
    with pytest.raises(ValueError, match="slate indices"):
        slate_values(v, q, 1.0, np.array([[0, 4]]))
    with pytest.raises(ValueError, match="integer array"):
        slate_values(v, q, 1.0, np.array([0, 1]))
    with pytest.raises(ValueError, match="on_fractional"):
        lp_optimal_slates(v, q, 1.0, 2, on_fractional="ignore")  # type: ignore[arg-type]
