"""fedrec.eval.stats: the one t-interval helper, against scipy and for tiny samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fedrec.eval import stats
from fedrec.eval.etror import PolicyEval, mean_curve, regret, t_interval
from fedrec.eval.rollout import ReturnSummary


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
@pytest.mark.parametrize("n", [2, 3, 7, 50])
def test_mean_ci_matches_scipy_t_interval(n: int, confidence: float) -> None:
    values = np.random.default_rng(n).normal(1000, 160, n)
    low, high = scipy_stats.t.interval(
        confidence, n - 1, loc=values.mean(), scale=scipy_stats.sem(values)
    )
    mean, half = stats.mean_ci(values, confidence)
    assert mean == pytest.approx(values.mean())
    assert half == pytest.approx((high - low) / 2, rel=1e-12)


def test_mean_ci_small_samples() -> None:
    assert all(math.isnan(x) for x in stats.mean_ci([]))
    mean, half = stats.mean_ci([5.0])
    assert mean == 5.0 and math.isnan(half)
    mean, half = stats.mean_ci([1.0, 3.0])  # t_{1, 0.975} = 12.706, sem = 1
    assert mean == 2.0 and half == pytest.approx(12.7062047, rel=1e-7)
    assert stats.mean_ci([4.0, 4.0, 4.0]) == (4.0, 0.0)
    with pytest.raises(ValueError, match="confidence"):
        stats.mean_ci([1.0, 2.0], 1.5)


def test_column_mean_ci_ignores_missing_entries() -> None:
    table = np.array(
        [[1.0, 2.0, 5.0, np.nan], [3.0, np.nan, 6.0, np.nan], [2.0, np.nan, 10.0, np.nan]]
    )
    mean, half, count = stats.column_mean_ci(table)
    assert count.tolist() == [3, 1, 3, 0]
    for column in (0, 2):
        expected = stats.mean_ci(table[:, column])
        assert (mean[column], half[column]) == pytest.approx(expected)
    assert mean[1] == 2.0 and math.isnan(half[1])
    assert math.isnan(mean[3]) and math.isnan(half[3])


def test_welch_ci_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(1050, 160, 40), rng.normal(1000, 90, 25)
    low, high = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    difference, half = stats.welch_ci(a, b)
    assert difference == pytest.approx(a.mean() - b.mean())
    assert half == pytest.approx((high - low) / 2, rel=1e-10)
    assert math.isnan(stats.welch_ci([1.0], [1.0, 2.0])[1])
    assert stats.welch_ci([1.0, 1.0], [0.0, 0.0]) == (1.0, 0.0)


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_every_caller_agrees_for_small_n(n: int) -> None:
    """ReturnSummary, t_interval (fedrec eval) and the FedNCF bench give the same interval."""
    from fedrec.experiments.fedncf import mean_ci as fedncf_mean_ci

    values = [0.61, 0.59, 0.65, 0.60, 0.62][:n]
    expected = stats.mean_ci(values)
    estimate = t_interval(values)
    results = [(estimate.mean, estimate.half_width), fedncf_mean_ci(values)]
    if n > 0:
        summary = ReturnSummary(np.asarray(values))
        results.append((summary.mean, summary.half_width))
    for result in results:
        assert result == pytest.approx(expected, nan_ok=True)
    assert math.isnan(expected[1]) == (n < 2)


def test_regret_welch_and_curve_band_use_the_helper() -> None:
    rng = np.random.default_rng(4)
    planner = PolicyEval(0.0, returns=rng.normal(1100, 150, 30))
    agent = PolicyEval(0.0, returns=rng.normal(1000, 150, 40))
    estimate, method = regret(planner, agent)
    assert method == "welch"
    assert estimate.half_width == pytest.approx(stats.welch_ci(planner.returns, agent.returns)[1])
    curves = [(np.array([100, 120]), rng.normal(1000, 10, 2)) for _ in range(4)]
    _, mean, low, high, band = mean_curve(curves)
    table = np.array([c[1] for c in curves])
    expected_mean, expected_half, _ = stats.column_mean_ci(table)
    assert band == "95% CI"
    np.testing.assert_allclose(mean, expected_mean)
    np.testing.assert_allclose(high - mean, expected_half)
    np.testing.assert_allclose(mean - low, expected_half)
