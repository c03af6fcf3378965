"""Cross-platform OPE (fedrec.eval.ope.cross_platform): the logs hold what each platform may see,
the propensities are exact, the target's branch leaves the logged run unchanged, transfer IPS is
unbiased for A's value and B's in the matched setting, the model travels only under the
parameter-sharing contract, and the transfer assumption's failure shows on a mismatched B."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedrec.eval.ope import cross_platform as cp
from fedrec.federation.messages import FEDSLATE_KINDS, PrivacyViolation


@pytest.fixture(scope="module")
def run() -> cp.SimulatedRun:
    return cp.simulate(200, seed=3, target="top_x")


def test_logs_hold_what_each_platform_sees(run: cp.SimulatedRun) -> None:
    a, b = run.logs["platform_a"], run.logs["platform_b"]
    assert a.n == b.n == 200 * 61 and a.slate_size == 3
    assert a.feedback and not b.feedback
    assert b.rewards is None and b.clicked_slot is None
    assert np.all(a.rewards > 0) and np.all(a.clicked_slot >= 0)  # MNL without a null item
    greedy = cp.RULES["top_x"](a.candidates, 3)
    match = np.all(a.slates == greedy, axis=1)
    assert np.allclose(a.propensities[match], 0.5 + 0.5 / 720)
    assert np.allclose(a.propensities[~match], 0.5 / 720)
    assert 0.45 < match.mean() < 0.55
    assert run.target_engagement is not None and len(run.target_engagement) == b.n


def test_target_branch_leaves_the_logged_run_unchanged(run: cp.SimulatedRun) -> None:
    plain = cp.simulate(200, seed=3)
    for agent in ("platform_a", "platform_b"):
        np.testing.assert_array_equal(plain.logs[agent].slates, run.logs[agent].slates)
        np.testing.assert_array_equal(plain.logs[agent].candidates, run.logs[agent].candidates)
    np.testing.assert_array_equal(plain.logs["platform_a"].rewards, run.logs["platform_a"].rewards)
    with pytest.raises(ValueError, match="no target engagement"):
        cp.true_value(plain)


def test_transfer_ips_is_unbiased_for_a_and_b_in_the_matched_setting() -> None:
    """Over 40 logged datasets of 100 users, transfer IPS / DR for top_x are within 3 standard
    errors of V_A and of V_B (truths over 4,000 users)."""
    truth_b = cp.true_value(cp.simulate(4000, seed=10**6, target="top_x"))
    truth_a = cp.true_value(
        cp.simulate(4000, seed=10**6, target="top_x", target_platform="platform_a")
    )
    ips, dr = [], []
    for d in range(40):
        log_a = cp.simulate(100, seed=d).logs["platform_a"]
        ips.append(cp.transfer_ips(log_a, "top_x").value)
        dr.append(cp.transfer_dr(log_a, "top_x", cp.fit_reward_model(log_a)).value)
    for values in (np.array(ips), np.array(dr)):
        se = math.hypot(values.std(ddof=1) / math.sqrt(len(values)), truth_a.std_error)
        assert abs(values.mean() - truth_a.value) < 3 * se
        se_b = math.hypot(values.std(ddof=1) / math.sqrt(len(values)), truth_b.std_error)
        assert abs(values.mean() - truth_b.value) < 3 * se_b
    # the naive baseline is the logger's value, far from the target's
    naive = cp.naive(log_a)
    assert naive.ci_high < truth_b.value


def test_reward_model_recovers_the_choice_slope(run: cp.SimulatedRun) -> None:
    model = cp.fit_reward_model(run.logs["platform_a"])
    assert abs(model.choice_slope - 1.0) < 0.05  # the env's logit is 1 - x
    assert 0.9 < model.residual_variance < 1.1  # log-engagement scale 1
    again = cp.RewardModel.from_parameters(model.parameters())
    assert again.choice_slope == pytest.approx(model.choice_slope, rel=1e-6)
    with pytest.raises(ValueError, match="needs a log with feedback"):
        cp.fit_reward_model(run.logs["platform_b"])


def test_model_travels_only_under_the_parameter_sharing_contract(run: cp.SimulatedRun) -> None:
    model = cp.fit_reward_model(run.logs["platform_a"])
    carried = cp.carry_reward_model(model, num_candidates=10)
    np.testing.assert_array_equal(carried.parameters(), model.parameters())
    with pytest.raises(PrivacyViolation, match="MODEL_PARAMETERS"):
        cp.carry_reward_model(model, num_candidates=10, kinds=FEDSLATE_KINDS)
    estimate = cp.federated_dm(run.logs["platform_b"], "top_x", carried)
    truth = cp.true_value(run)
    assert abs(estimate.value - truth.value) < 0.05 * truth.value


def test_estimators_that_need_feedback_refuse_b(run: cp.SimulatedRun) -> None:
    b = run.logs["platform_b"]
    for estimator in (cp.naive, lambda log: cp.transfer_ips(log, "top_x")):
        with pytest.raises(ValueError, match="needs a log with feedback"):
            estimator(b)


def test_transfer_fails_on_a_reversed_catalogue() -> None:
    """B's items mean the opposite (semantics='prose'): transfer IPS from A's logs is off B's
    value by far more than its interval."""
    log_a = cp.simulate(300, seed=1).logs["platform_a"]
    truth_b = cp.true_value(
        cp.simulate(2000, seed=2, target="top_x", env_kwargs={"semantics": "prose"})
    )
    estimate = cp.transfer_ips(log_a, "top_x")
    assert estimate.ci_low > truth_b.ci_high + 2.0


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        cp.EpsilonLogger("top_x", 1.5)
    with pytest.raises(ValueError, match="unknown logging rule"):
        cp.EpsilonLogger("best")
    log = cp.simulate(5, seed=0).logs["platform_a"]
    with pytest.raises(ValueError, match="unknown target rule"):
        cp.transfer_ips(log, "best")
    with pytest.raises(ValueError, match="distinct"):
        cp.transfer_ips(log, lambda x, u: np.zeros((len(x), 3), dtype=np.int64))
    with pytest.raises(ValueError, match="propensities"):
        cp.PlatformLog(
            candidates=np.zeros((2, 4)), reading=np.zeros(2), slates=[[0, 1], [1, 2]],
            propensities=[0.5, 0.0], users=[0, 1],
        )  # fmt: skip
    with pytest.raises(ValueError, match="loggers must be keyed"):
        cp.simulate(2, seed=0, loggers={"a": cp.EpsilonLogger()})
    with pytest.raises(ValueError, match="first with feedback"):
        cp.simulate(2, seed=0, env_kwargs={"feedback": (True, True)})


def test_bootstrap_replicates_widen_the_federated_dm_interval(run: cp.SimulatedRun) -> None:
    a, b = run.logs["platform_a"], run.logs["platform_b"]
    model = cp.fit_reward_model(a)
    replicates = cp.bootstrap_reward_models(a, 5, seed=0)
    assert len(replicates) == 5
    again = cp.bootstrap_reward_models(a, 5, seed=0)
    np.testing.assert_array_equal(replicates[2].parameters(), again[2].parameters())
    plain = cp.federated_dm(b, "top_x", model)
    wide = cp.federated_dm(b, "top_x", model, replicates=replicates)
    assert wide.value == plain.value and wide.std_error > 3 * plain.std_error
    assert wide.name == "federated DM (bootstrap)"
    with pytest.raises(ValueError, match="at least 2"):
        cp.federated_dm(b, "top_x", model, replicates=replicates[:1])
    with pytest.raises(ValueError, match="replicates must be an integer"):
        cp.bootstrap_reward_models(a, 1, seed=0)
