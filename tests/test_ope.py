"""fedrec.eval.ope: hand-computed values, unbiasedness on a synthetic slate bandit with a known
truth, the bias of independent IPS under slot interactions, and every bad input refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedrec.eval import ope
from fedrec.eval.ope import slate as ope_slate

EXACT = 1e-12

# ------------------------------------------------------------------ single step, by hand
# Two contexts, three items. Context 0 logs item 1 (reward 1), context 1 logs item 2 (reward 0.5).
MU = np.array([[0.5, 0.25, 0.25], [0.4, 0.4, 0.2]])
PI = np.array([[0.2, 0.3, 0.5], [0.0, 0.5, 0.5]])
Q_HAT = np.array([[0.1, 0.6, 0.3], [0.2, 0.4, 0.8]])


def bandit() -> ope.LoggedBandit:
    return ope.LoggedBandit(actions=[1, 2], rewards=[1.0, 0.5], behaviour=MU, target=PI)


def test_single_step_estimators_by_hand() -> None:
    data = bandit()
    # w = (0.3 / 0.25, 0.5 / 0.2) = (1.2, 2.5)
    assert data.weights == pytest.approx([1.2, 2.5], abs=EXACT)
    estimate = ope.ips(data)
    assert estimate.value == pytest.approx((1.2 * 1 + 2.5 * 0.5) / 2, abs=EXACT)
    # terms (1.2, 1.25): sd 0.05 / sqrt(2), se = sd / sqrt(2) = 0.025; t_{1, 0.975} = 12.706
    assert estimate.std_error == pytest.approx(0.025, abs=EXACT)
    assert estimate.ci_high - estimate.value == pytest.approx(0.025 * 12.7062047, rel=1e-7)
    assert ope.snips(data).value == pytest.approx(2.45 / 3.7, abs=EXACT)
    # Σ_a π q̂: 0.02 + 0.18 + 0.15 = 0.35 and 0 + 0.2 + 0.4 = 0.6
    assert ope.direct_method(data, Q_HAT).value == pytest.approx(0.475, abs=EXACT)
    # DR: 0.35 + 1.2 (1 − 0.6) = 0.83 and 0.6 + 2.5 (0.5 − 0.8) = −0.15
    assert ope.doubly_robust(data, Q_HAT).value == pytest.approx(0.34, abs=EXACT)
    assert ope.self_normalized_doubly_robust(data, Q_HAT).value == pytest.approx(
        0.475 + (0.48 - 0.75) / 3.7, abs=EXACT
    )
    # Switch-DR with τ = 2 drops the correction of context 1 (w = 2.5).
    assert ope.switch_doubly_robust(data, Q_HAT, threshold=2.0).value == pytest.approx(
        (0.83 + 0.6) / 2, abs=EXACT
    )
    assert ope.switch_doubly_robust(data, Q_HAT, threshold=math.inf).value == pytest.approx(
        0.34, abs=EXACT
    )
    assert ope.switch_doubly_robust(data, Q_HAT, threshold=0.0).value == pytest.approx(
        0.475, abs=EXACT
    )


def test_slate_estimators_by_hand() -> None:
    # One row: slate (2, 0) of 3 items, rewards (1, 0.5).
    data = ope.LoggedSlates(
        slates=[[2, 0]],
        rewards=[[1.0, 0.5]],
        behaviour_slate=[1 / 6],
        target_slate=[0.25],
        behaviour_slot=[[1 / 3, 1 / 3]],
        target_slot=[[0.5, 0.2]],
        behaviour_prefix=[[1 / 3, 1 / 6]],
        target_prefix=[[0.5, 0.25]],
        num_items=3,
    )
    assert ope.slate_ips(data).value == pytest.approx(1.5 * 1.5, abs=EXACT)
    assert ope.independent_ips(data).value == pytest.approx(1.5 * 1 + 0.6 * 0.5, abs=EXACT)
    assert ope.reward_interaction_ips(data).value == pytest.approx(1.5 + 1.5 * 0.5, abs=EXACT)
    # Cascade-DR: w = (1.5, 1.5), previous (1, 1.5); Q̂ = (1.2, 0.4), V̂ = (1.0, 0.3):
    # 1.5 (1 − 1.2) + 1.0 + 1.5 (0.5 − 0.4) + 1.5 · 0.3 = 1.3
    estimate = ope.cascade_doubly_robust(data, [[1.2, 0.4]], [[1.0, 0.3]])
    assert estimate.value == pytest.approx(1.3, abs=EXACT)
    assert math.isnan(estimate.std_error)  # one sample: no interval, never a zero-width one


def test_pseudoinverse_with_one_slot_is_ips() -> None:
    rng = np.random.default_rng(0)
    n, a = 50, 4
    items = rng.integers(0, a, n)
    target = rng.dirichlet(np.ones(a), n)
    rewards = rng.random(n)
    data = ope.LoggedSlates(
        slates=items[:, None],
        rewards=rewards[:, None],
        behaviour_slate=np.full(n, 1 / a),
        target_slate=target[np.arange(n), items],
        target_marginals=target[:, None, :],
    )
    pi = ope.pseudoinverse(data)
    assert pi.value == pytest.approx(ope.slate_ips(data).value, abs=EXACT)
    weights = np.full((n, a), 0.25)
    pl = ope.pseudoinverse(data, logger="plackett_luce", logger_weights=weights)
    assert pl.value == pytest.approx(pi.value, abs=1e-10)


def test_uniform_gamma_closed_form_matches_enumeration() -> None:
    slates = ope.enumerate_slates(5, 3)
    onehots = ope_slate._indicator(slates, 5)
    enumerated = onehots.T @ onehots / len(slates)
    assert np.allclose(ope_slate._uniform_gamma(5, 3), enumerated, atol=EXACT)


def test_plackett_luce_probabilities_sum_to_one() -> None:
    weights = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 0.0, 1.0, 1.0]])
    slates = ope.enumerate_slates(4, 3)
    probability = ope.plackett_luce_slate_probabilities(weights, slates)
    assert probability.sum(axis=1) == pytest.approx([1.0, 1.0], abs=EXACT)
    assert probability[0, 0] == pytest.approx(1 / 10 * 2 / 9 * 3 / 7, abs=EXACT)  # (0, 1, 2)
    assert np.all(probability[1, (slates == 1).any(axis=1)] == 0)
    marginals = ope.slot_marginals(slates, probability, 4)
    assert marginals.sum(axis=2) == pytest.approx(np.ones((2, 3)), abs=EXACT)


def test_sequential_estimators_by_hand() -> None:
    # Two episodes; the second ends after one step.
    data = ope.LoggedEpisodes(
        rewards=[[1.0, 2.0], [3.0, 0.0]],
        behaviour=[[0.5, 0.5], [0.25, 1.0]],
        target=[[0.25, 1.0], [0.5, 1.0]],
        mask=[[True, True], [True, False]],
    )
    # ρ: (0.5, 1.0) and (2.0, 2.0); PDIS with γ = 0.5: (0.5 + 0.5 · 1 · 2, 2 · 3) = (1.5, 6)
    assert ope.per_decision_is(data, gamma=0.5).value == pytest.approx(3.75, abs=EXACT)
    # MIS with a state ratio of 1 at step 0 and 2 at step 1: (0.5 + 0.5 · 2 · 2 · 2, 2 · 3) / 2
    mis = ope.marginalized_is(data, [[1.0, 2.0], [1.0, 1.0]], gamma=0.5)
    assert mis.value == pytest.approx((4.5 + 6.0) / 2, abs=EXACT)
    # WDR, γ = 1, Q̂ = V̂ = 0: Σ_t Σ_i w_it r_it, w_0 = (0.2, 0.8), w_1 = (1/3, 2/3)
    zeros = np.zeros((2, 2))
    wdr = ope.weighted_doubly_robust(data, zeros, zeros)
    assert wdr.value == pytest.approx(0.2 * 1 + 0.8 * 3 + 2 / 3, abs=EXACT)
    # With Q̂ = V̂ = 1 on the real steps (0 on the padded one): step 0 subtracts
    # Σ_i (w_i0 − 1/n) = 0, step 1 subtracts w_01 − w_00 = 1/3 − 0.2 (episode 1 has ended).
    ones = np.array([[1.0, 1.0], [1.0, 0.0]])
    assert ope.weighted_doubly_robust(data, ones, ones).value == pytest.approx(
        wdr.value - (1 / 3 - 0.2), abs=EXACT
    )


# ------------------------------------------------------------------ unbiasedness
NUM_ITEMS, SLATE_SIZE, REPEATS, ROWS = 4, 2, 200, 300
SLATES = ope.enumerate_slates(NUM_ITEMS, SLATE_SIZE)
#: Per-context item attractiveness and the position bias of the additive model.
PHI = np.array([[0.8, 0.5, 0.3, 0.1], [0.1, 0.3, 0.6, 0.9]])
POSITION = np.array([1.0, 0.5])
LOGGER = np.array([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
TARGET = np.array([[6.0, 1.0, 1.0, 0.5], [0.5, 1.0, 2.0, 6.0]])


def expected_slot_rewards(model: str) -> np.ndarray:
    """``E[r_k | x, s]`` (contexts, slates, K) of the additive or the cascade model."""
    phi = PHI[:, SLATES]  # (2, S, K)
    if model == "additive":
        return phi * POSITION
    first = phi[..., 0]
    return np.stack([first, (1 - first) * phi[..., 1]], axis=-1)


def synthetic(model: str, logger: str, seed: int = 0):
    """REPEATS logged data sets of ROWS rows each, the exact target value, and per-row fields."""
    rng = np.random.default_rng(seed)
    logger_weights = np.ones_like(LOGGER) if logger == "uniform" else LOGGER
    mu = ope.plackett_luce_slate_probabilities(logger_weights, SLATES)  # (2, S)
    pi = ope.plackett_luce_slate_probabilities(TARGET, SLATES)
    means = expected_slot_rewards(model)  # (2, S, K)
    truth = float(np.mean(np.sum(pi[..., None] * means, axis=(1, 2))))
    total = REPEATS * ROWS
    contexts = rng.integers(0, 2, total)
    cumulative = np.cumsum(mu[contexts], axis=1)
    chosen = np.minimum((rng.random(total)[:, None] > cumulative).sum(axis=1), len(SLATES) - 1)
    slates = SLATES[chosen]
    if model == "additive":
        rewards = (rng.random((total, SLATE_SIZE)) < means[contexts, chosen]).astype(float)
    else:
        clicks = rng.random((total, SLATE_SIZE)) < PHI[contexts[:, None], slates]
        rewards = np.stack([clicks[:, 0], ~clicks[:, 0] & clicks[:, 1]], axis=1).astype(float)
    mu_marg = ope.slot_marginals(SLATES, mu, NUM_ITEMS)  # (2, K, A)
    pi_marg = ope.slot_marginals(SLATES, pi, NUM_ITEMS)
    first_mu = logger_weights[contexts, slates[:, 0]] / logger_weights[contexts].sum(axis=1)
    first_pi = TARGET[contexts, slates[:, 0]] / TARGET[contexts].sum(axis=1)
    slot = np.arange(SLATE_SIZE)
    fields = {
        "slates": slates,
        "rewards": rewards,
        "behaviour_slate": mu[contexts, chosen],
        "target_slate": pi[contexts, chosen],
        "behaviour_slot": mu_marg[contexts[:, None], slot, slates],
        "target_slot": pi_marg[contexts[:, None], slot, slates],
        "behaviour_prefix": np.stack([first_mu, mu[contexts, chosen]], axis=1),
        "target_prefix": np.stack([first_pi, pi[contexts, chosen]], axis=1),
        "behaviour_marginals": mu_marg[contexts],
        "target_marginals": pi_marg[contexts],
    }
    return truth, fields, logger_weights[contexts]


def repeated(model: str, logger: str, estimators) -> tuple[float, dict[str, np.ndarray]]:
    truth, fields, weights = synthetic(model, logger)
    values: dict[str, list[float]] = {name: [] for name in estimators}
    for repeat in range(REPEATS):
        part = slice(repeat * ROWS, (repeat + 1) * ROWS)
        data = ope.LoggedSlates(**{k: v[part] for k, v in fields.items()}, num_items=NUM_ITEMS)
        for name, estimator in estimators.items():
            values[name].append(estimator(data, weights[part]).value)
    return truth, {name: np.array(v) for name, v in values.items()}


def _within(values: np.ndarray, truth: float, sigmas: float = 3.0) -> bool:
    se = values.std(ddof=1) / math.sqrt(len(values))
    return abs(values.mean() - truth) < sigmas * se


def test_prefix_fields_are_consistent() -> None:
    _, fields, _ = synthetic("additive", "plackett_luce")
    # The first slot's marginal is the first prefix's probability.
    assert fields["behaviour_prefix"][:, 0] == pytest.approx(fields["behaviour_slot"][:, 0])


def test_unbiased_under_additive_rewards() -> None:
    estimators = {
        "slate_ips": lambda d, w: ope.slate_ips(d),
        "iips": lambda d, w: ope.independent_ips(d),
        "pi_pl": lambda d, w: ope.pseudoinverse(d, logger="plackett_luce", logger_weights=w),
    }
    truth, values = repeated("additive", "plackett_luce", estimators)
    for name, v in values.items():
        assert _within(v, truth), (name, v.mean(), truth, v.std(ddof=1) / math.sqrt(REPEATS))
    estimators = {"pi_uniform": lambda d, w: ope.pseudoinverse(d)}
    truth, values = repeated("additive", "uniform", estimators)
    v = values["pi_uniform"]
    assert _within(v, truth), (v.mean(), truth)


def test_unbiased_under_cascade_and_iips_biased() -> None:
    q_constant = np.full((ROWS, SLATE_SIZE), 0.3)
    estimators = {
        "slate_ips": lambda d, w: ope.slate_ips(d),
        "rips": lambda d, w: ope.reward_interaction_ips(d),
        "iips": lambda d, w: ope.independent_ips(d),
        # A constant, wrong Q̂ (0.3 everywhere, so V̂ = 0.3 too): Cascade-DR stays unbiased.
        "cascade_dr": lambda d, w: ope.cascade_doubly_robust(d, q_constant, q_constant),
    }
    truth, values = repeated("cascade", "plackett_luce", estimators)
    for name in ("slate_ips", "rips", "cascade_dr"):
        v = values[name]
        assert _within(v, truth), (name, v.mean(), truth)
    iips = values["iips"]
    se = iips.std(ddof=1) / math.sqrt(REPEATS)
    assert abs(iips.mean() - truth) > 10 * se, (iips.mean(), truth, se)


def test_single_step_ips_and_dr_unbiased() -> None:
    rng = np.random.default_rng(1)
    n = 200 * 100
    mu = np.tile([0.5, 0.3, 0.2], (n, 1))
    pi = np.tile([0.1, 0.3, 0.6], (n, 1))
    means = np.array([0.2, 0.5, 0.9])
    truth = float(pi[0] @ means)
    actions = (rng.random(n)[:, None] > np.cumsum(mu[0])).sum(axis=1)
    rewards = (rng.random(n) < means[actions]).astype(float)
    q_hat = np.tile([0.5, 0.5, 0.5], (n, 1))  # a wrong reward model
    ips_values, dr_values = [], []
    for part in np.split(np.arange(n), 200):
        data = ope.LoggedBandit(actions[part], rewards[part], mu[part], pi[part])
        ips_values.append(ope.ips(data).value)
        dr_values.append(ope.doubly_robust(data, q_hat[part]).value)
    assert _within(np.array(ips_values), truth)
    assert _within(np.array(dr_values), truth)


# ------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"behaviour": [[0.5, 0.0, 0.5], [0.4, 0.4, 0.2]]}, "support outside"),
        ({"behaviour": [[0.5, 0.25, 0.25], [0.4, 0.6, 0.0]]}, "support outside"),
        ({"rewards": [1.0, math.nan]}, "non-finite"),
        ({"rewards": [1.0]}, "shape"),
        ({"actions": [1, 3]}, "actions must be in"),
        ({"actions": [1.0, 2.0]}, "integers"),
        ({"target": [[0.2, 0.3, 0.4], [0.0, 0.5, 0.5]]}, "sum to 1"),
        ({"target": [[1.2, -0.2, 0.0], [0.0, 0.5, 0.5]]}, r"\[0, 1\]"),
        ({"behaviour": None}, "missing"),
        ({"target": [[0.2, 0.3, math.inf], [0.0, 0.5, 0.5]]}, "non-finite"),
    ],
)
def test_bandit_refuses_bad_inputs(change, message) -> None:
    fields = {"actions": [1, 2], "rewards": [1.0, 0.5], "behaviour": MU, "target": PI} | change
    with pytest.raises(ValueError, match=message):
        ope.LoggedBandit(**fields)


def test_bandit_refuses_bad_reward_model_and_threshold() -> None:
    with pytest.raises(ValueError, match="shape"):
        ope.doubly_robust(bandit(), Q_HAT[:, :2])
    with pytest.raises(ValueError, match="non-finite"):
        ope.direct_method(bandit(), np.where(Q_HAT > 0.5, np.nan, Q_HAT))
    with pytest.raises(ValueError, match="threshold"):
        ope.switch_doubly_robust(bandit(), Q_HAT, threshold=math.nan)
    with pytest.raises(ValueError, match="confidence"):
        ope.ips(bandit(), confidence=1.0)


def test_snips_refuses_all_zero_weights() -> None:
    data = ope.LoggedBandit([0, 0], [1.0, 1.0], MU, PI * 0 + [0.0, 0.5, 0.5])
    with pytest.raises(ValueError, match="sum to 0"):
        ope.snips(data)


SLATE_FIELDS = {
    "slates": [[2, 0]],
    "rewards": [[1.0, 0.5]],
    "behaviour_slate": [1 / 6],
    "target_slate": [0.25],
    "behaviour_prefix": [[1 / 3, 1 / 6]],
    "target_prefix": [[0.5, 0.25]],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"behaviour_slate": [0.0]}, "logger could not have produced"),
        ({"behaviour_prefix": [[1 / 3, 0.0]]}, "logger could not have produced"),
        ({"behaviour_slate": [math.nan]}, "non-finite"),
        ({"target_slate": [1.5]}, r"\[0, 1\]"),
        ({"slates": [[1, 1]]}, "distinct"),
        ({"slates": [[-1, 0]]}, "item indices"),
        ({"rewards": [[1.0, 0.5, 0.0]]}, "shape"),
        ({"behaviour_prefix": [[1 / 6, 1 / 3]]}, "must not increase"),
        (
            {
                "behaviour_marginals": [[[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]]],
                "target_marginals": [[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]],
            },
            "support outside",
        ),
    ],
)
def test_slates_refuse_bad_inputs(change, message) -> None:
    with pytest.raises(ValueError, match=message):
        ope.LoggedSlates(**(SLATE_FIELDS | change))


def test_slate_estimators_name_missing_fields() -> None:
    data = ope.LoggedSlates(**SLATE_FIELDS)
    with pytest.raises(ValueError, match="behaviour_slot, target_slot"):
        ope.independent_ips(data)
    with pytest.raises(ValueError, match="target_marginals"):
        ope.pseudoinverse(data)
    with pytest.raises(ValueError, match="plackett_luce"):
        ope.pseudoinverse(
            ope.LoggedSlates(**SLATE_FIELDS, target_marginals=np.full((1, 2, 3), 1 / 3)),
            logger="softmax",
        )
    with pytest.raises(ValueError, match="shape"):
        ope.cascade_doubly_robust(data, [[0.1, 0.2, 0.3]], [[0.1, 0.2]])


def test_pseudoinverse_refuses_target_outside_logger() -> None:
    marginals = np.array([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
    data = ope.LoggedSlates(**SLATE_FIELDS, target_marginals=marginals, num_items=3)
    with pytest.raises(ValueError, match="support outside"):
        ope.pseudoinverse(data, logger="plackett_luce", logger_weights=[[1.0, 0.0, 1.0]])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"behaviour": [[0.5, 0.0], [0.25, 1.0]]}, "logger could not have produced"),
        ({"mask": [[False, True], [True, False]]}, "prefix"),
        ({"rewards": [[1.0, 2.0], [3.0, 1.0]]}, "padded"),
        ({"target": [[0.25, math.nan], [0.5, 1.0]]}, "non-finite"),
        (
            {
                "behaviour_probs": [[[1.0, 0.0]] * 2] * 2,
                "target_probs": [[[0.5, 0.5]] * 2] * 2,
            },
            "support outside",
        ),
        ({"behaviour_probs": [[[1.0, 0.0]] * 2] * 2}, "both"),
    ],
)
def test_episodes_refuse_bad_inputs(change, message) -> None:
    fields = {
        "rewards": [[1.0, 2.0], [3.0, 0.0]],
        "behaviour": [[0.5, 0.5], [0.25, 1.0]],
        "target": [[0.25, 1.0], [0.5, 1.0]],
        "mask": [[True, True], [True, False]],
    } | change
    with pytest.raises(ValueError, match=message):
        ope.LoggedEpisodes(**fields)


def test_sequential_refuses_bad_gamma_and_ratio() -> None:
    data = ope.LoggedEpisodes(rewards=[[1.0]], behaviour=[[0.5]], target=[[0.5]])
    with pytest.raises(ValueError, match="gamma"):
        ope.per_decision_is(data, gamma=1.5)
    with pytest.raises(ValueError, match="non-negative"):
        ope.marginalized_is(data, [[-1.0]])
    zero = ope.LoggedEpisodes(rewards=[[1.0]], behaviour=[[0.5]], target=[[0.0]])
    with pytest.raises(ValueError, match="sum to 0"):
        ope.weighted_doubly_robust(zero, [[0.0]], [[0.0]])
