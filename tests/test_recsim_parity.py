"""Statistical parity of ``fedrec/ChocKale-v0`` with RecSim's ``long_term_satisfaction`` env.

RecSim's own environment (``recsim-no-tf``, a test-only dependency) and fedrec's env are rolled
out with the same policies at (N, n) = (10, 3), and their mean episode returns are compared with
Welch's two-sample t-test; each side is also compared with a reference computed here from the
equations of RecSim's library env in ``docs/choc_kale.md`` ("RecSim's library env (A)"; its
"Random-policy reference values" gives the random-policy value, 948.37).

Policies (the return depends only on what the policy puts in slot 0: ``docs/choc_kale.md``,
"Choice: slot 0"):

- ``random``: a uniformly random slate. Slot 0 is a U(0, 1) document; E[return] = 948.37.
- ``max``: the "max clickbait" policy, candidates by decreasing feature (slot 0 ~ Beta(N, 1)).
  Clickbait lowers the exposure, so satisfaction drifts *down* to about 0.493.
- ``min``: candidates by increasing feature; satisfaction drifts *up* to about 0.507.

Statistics. Every test uses ``ALPHA = 0.001`` (two-sided); there are 10 mean tests, so the
chance that a correct implementation fails at a new seed is at most 1 % (Bonferroni). Seeds are
fixed, so the outcome is deterministic. Per-episode standard deviations are about 163
(random), 189 (max) and 133 (min). With ``RECSIM_EPISODES = 2000`` and ``FEDREC_EPISODES =
20000`` the standard error of the difference is about 3.8 / 4.4 / 3.1, and the smallest effect
detected with 99 % power at this alpha, (z_{1-alpha/2} + z_{0.99}) * s.e. = 5.6 s.e., is about
21 / 25 / 17. The bugs this must catch, computed by ``reference_return`` below:

| bug | random | max | min |
|---|---|---|---|
| ``+2(c - 1/2)`` in the exposure update (the docstring's sign) | 0 | +72.9 | -40.4 |
| reward clipped at 100 (like the observation) | -29.2 | -45.3 | -15.4 |

So a sign error is caught by ``max`` and ``min`` (invisible to ``random``), and a clipped
reward by ``random`` and ``max``; ``test_power`` re-checks this with the measured deviations.
The comparison with the reference is sharper still (s.e. about 1.2-1.3 on the fedrec side).
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
from scipy import special, stats

import fedrec  # noqa: F401  (registers the environments)

# Importing recsim imports old gym, which prints a "Gym has been unmaintained" notice to stderr.
with contextlib.redirect_stderr(io.StringIO()):
    lts = pytest.importorskip("recsim.environments.long_term_satisfaction")

NUM_CANDIDATES, SLATE_SIZE, EPISODE_LENGTH = 10, 3, 60
ALPHA = 0.001
POWER = 0.99
RECSIM_EPISODES = 2000
FEDREC_EPISODES = 20000
SINGLE_EPISODES = 1000  # the single env (gymnasium.make), max policy only: guards its fast path
SEED = 20240

Policy = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def random_policy(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random slates of distinct candidates; ``x`` has shape (B, N)."""
    return np.argsort(rng.random(x.shape), axis=1)[:, :SLATE_SIZE]


def max_policy(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Candidates by decreasing feature (clickbait score) first."""
    return np.argsort(-x, axis=1, kind="stable")[:, :SLATE_SIZE]


def min_policy(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Candidates by increasing feature first."""
    return np.argsort(x, axis=1, kind="stable")[:, :SLATE_SIZE]


POLICIES: dict[str, Policy] = {"random": random_policy, "max": max_policy, "min": min_policy}


def slot0_density(policy: str, c: np.ndarray, n: int = NUM_CANDIDATES) -> np.ndarray:
    """Density of the slot-0 feature: U(0,1), the max of N uniforms, or the min of N uniforms."""
    if policy == "random":
        return np.ones_like(c)
    if policy == "max":
        return n * c ** (n - 1)
    return n * (1.0 - c) ** (n - 1)


def reference_return(
    policy: str, *, exposure_sign: float = -1.0, clip: float | None = None
) -> float:
    """Expected episode return from the library env's equations (``docs/choc_kale.md``, "RecSim's
    library env (A)"; library defaults), by quadrature.

    The mean exposure follows m_{t+1} = beta m_t + sign * 2 (E[c] - 1/2) exactly (linear), and
    the step's expected engagement is taken at sat = sigmoid(tau m_t): E_c[exp((4 + c) sat + 1/2)].
    Ignoring the spread of the exposure around m_t is a second-order error of about
    (loc * tau)^2 Var / 32 < 1e-4 relative (< 0.1 here); 200k-episode Monte Carlo runs of the
    fedrec env agree within 1 s.e. (948.08 +- 0.36, 1116.42 +- 0.42, 785.91 +- 0.30).
    ``exposure_sign=+1`` and ``clip`` compute the effect of the bugs this test must catch.
    """
    beta, tau, horizon = 0.7, 0.01, EPISODE_LENGTH
    c = np.linspace(0.0, 1.0, 20001)
    weight = slot0_density(policy, c)
    mean_c = float(np.trapezoid(weight * c, c))
    exposure, total = 0.0, 0.0
    for _ in range(horizon):
        loc = (4.0 + c) * special.expit(tau * exposure)
        if clip is None:
            engagement = np.exp(loc + 0.5)
        else:  # E[min(X, K)] for log X ~ N(loc, 1)
            log_k = math.log(clip)
            engagement = np.exp(loc + 0.5) * stats.norm.cdf(
                log_k - loc - 1.0
            ) + clip * stats.norm.sf(log_k - loc)
        total += float(np.trapezoid(weight * engagement, c))
        exposure = beta * exposure + exposure_sign * 2.0 * (mean_c - 0.5)
    return total


@dataclass
class Rollouts:
    """Episode returns and step-level facts of one side (RecSim or fedrec) under one policy."""

    returns: np.ndarray
    lengths: np.ndarray
    max_step_reward: float
    steps_over_100: int
    max_observed_engagement: float


def rollout_recsim(policy: Policy, episodes: int, seed: int) -> Rollouts:
    """Episodes of RecSim's own env in a plain loop (old gym 4-tuple API).

    RecSim ignores the config seed (``docs/choc_kale.md``, "Random number streams"): its
    samplers use fixed ``RandomState(0)`` streams that continue across the episodes of one env
    instance, and the global ``np.random`` drives the Gaussian noise. We seed the global RNG and
    restore its state afterwards.
    """
    saved = np.random.get_state()  # noqa: NPY002  (RecSim draws from the global RNG)
    np.random.seed(seed)  # noqa: NPY002
    rng = np.random.default_rng(seed)
    try:
        env = lts.create_environment(
            {
                "num_candidates": NUM_CANDIDATES,
                "slate_size": SLATE_SIZE,
                "resample_documents": True,
                "seed": seed,
            }
        )
        returns = np.zeros(episodes)
        lengths = np.zeros(episodes, dtype=np.int64)
        max_reward, over, max_observed = 0.0, 0, 0.0
        for episode in range(episodes):
            obs, done, total, steps = env.reset(), False, 0.0, 0
            while not done:
                x = np.fromiter((doc[0] for doc in obs["doc"].values()), float, NUM_CANDIDATES)
                slate = policy(x[None, :], rng)[0]
                obs, reward, done, _ = env.step(slate)
                total += reward
                steps += 1
                max_reward = max(max_reward, reward)
                over += reward > 100.0
                max_observed = max(max_observed, float(obs["response"][0]["engagement"]))
            returns[episode], lengths[episode] = total, steps
    finally:
        np.random.set_state(saved)  # noqa: NPY002
    return Rollouts(returns, lengths, max_reward, int(over), max_observed)


def rollout_fedrec(policy: Policy, episodes: int, seed: int) -> Rollouts:
    """One episode per user of the native batched env, all users stepped together."""
    env = gym.make_vec(
        "fedrec/ChocKale-v0",
        num_envs=episodes,
        num_candidates=NUM_CANDIDATES,
        slate_size=SLATE_SIZE,
    )
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    returns = np.zeros(episodes)
    lengths = np.zeros(episodes, dtype=np.int64)
    alive = np.ones(episodes, dtype=bool)
    max_reward, over, max_observed = 0.0, 0, 0.0
    # One step past the horizon: with NEXT_STEP autoreset that step resets, and must not count.
    for _ in range(EPISODE_LENGTH + 1):
        slates = policy(obs["candidates"][:, :, 0], rng)
        obs, rewards, terminated, truncated, _ = env.step(slates)
        returns += np.where(alive, rewards, 0.0)
        lengths += alive
        max_reward = max(max_reward, float(rewards[alive].max(initial=0.0)))
        over += int((rewards[alive] > 100.0).sum())
        max_observed = max(max_observed, float(obs["response_engagement"].max()))
        alive &= ~(terminated | truncated)
    env.close()
    return Rollouts(returns, lengths, max_reward, over, max_observed)


def rollout_single(policy: Policy, episodes: int, seed: int) -> Rollouts:
    """Episodes of the single env through ``gymnasium.make`` (with the standard wrappers)."""
    env = gym.make("fedrec/ChocKale-v0", num_candidates=NUM_CANDIDATES, slate_size=SLATE_SIZE)
    rng = np.random.default_rng(seed)
    returns = np.zeros(episodes)
    lengths = np.zeros(episodes, dtype=np.int64)
    max_reward, over, max_observed = 0.0, 0, 0.0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed if episode == 0 else None)
        done, total, steps = False, 0.0, 0
        while not done:
            slate = policy(obs["candidates"][None, :, 0], rng)[0]
            obs, reward, terminated, truncated, _ = env.step(slate)
            done = terminated or truncated
            total += reward
            steps += 1
            max_reward = max(max_reward, reward)
            over += reward > 100.0
            max_observed = max(max_observed, float(obs["response_engagement"].max()))
        returns[episode], lengths[episode] = total, steps
    env.close()
    return Rollouts(returns, lengths, max_reward, int(over), max_observed)


@pytest.fixture(scope="module")
def rollouts() -> dict[tuple[str, str], Rollouts]:
    """All rollouts, keyed by (side, policy); computed once for the module (about 20 s)."""
    out: dict[tuple[str, str], Rollouts] = {}
    for k, (name, policy) in enumerate(POLICIES.items()):
        out["recsim", name] = rollout_recsim(policy, RECSIM_EPISODES, SEED + k)
        out["fedrec", name] = rollout_fedrec(policy, FEDREC_EPISODES, SEED + 100 + k)
    out["single", "max"] = rollout_single(max_policy, SINGLE_EPISODES, SEED + 200)
    return out


def describe(sample: np.ndarray) -> str:
    """Mean and 95 % confidence interval of a sample of returns."""
    se = sample.std(ddof=1) / math.sqrt(len(sample))
    return f"{sample.mean():.2f} ± {1.96 * se:.2f} (95 % CI, n={len(sample)})"


SIDES = [("fedrec", name) for name in POLICIES] + [("single", "max")]


@pytest.mark.parametrize(("side", "policy"), SIDES)
def test_mean_return_matches_recsim(
    rollouts: dict[tuple[str, str], Rollouts], side: str, policy: str
) -> None:
    ours, theirs = rollouts[side, policy].returns, rollouts["recsim", policy].returns
    result = stats.ttest_ind(ours, theirs, equal_var=False)
    diff = ours.mean() - theirs.mean()
    se = math.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    assert result.pvalue > ALPHA, (
        f"{side} vs RecSim, {policy} policy: {describe(ours)} vs {describe(theirs)}; "
        f"difference {diff:+.2f} ± {1.96 * se:.2f}, Welch p = {result.pvalue:.2g} < {ALPHA}"
    )


@pytest.mark.parametrize(("side", "policy"), [*SIDES, *(("recsim", name) for name in POLICIES)])
def test_mean_return_matches_reference(
    rollouts: dict[tuple[str, str], Rollouts], side: str, policy: str
) -> None:
    sample = rollouts[side, policy].returns
    reference = reference_return(policy)
    result = stats.ttest_1samp(sample, reference)
    assert result.pvalue > ALPHA, (
        f"{side}, {policy} policy: {describe(sample)} vs reference {reference:.2f}, "
        f"p = {result.pvalue:.2g} < {ALPHA}"
    )


def test_reference_matches_the_closed_form() -> None:
    # docs/choc_kale.md, "Random-policy reference values": 60 e^{2.5} 2 (e^{1/2} - 1) = 948.37 for
    # the random policy (sat frozen at 0.5).
    closed_form = 60 * math.exp(2.5) * 2 * (math.exp(0.5) - 1)
    assert reference_return("random") == pytest.approx(closed_form, abs=0.01)
    assert closed_form == pytest.approx(948.37, abs=0.005)
    # The random policy's mean exposure stays at 0, so the sign of the update cannot matter.
    assert reference_return("random", exposure_sign=+1.0) == pytest.approx(closed_form, abs=0.01)


@pytest.mark.parametrize(
    ("policy", "bug"), [("max", "sign"), ("min", "sign"), ("random", "clip"), ("max", "clip")]
)
def test_power(rollouts: dict[tuple[str, str], Rollouts], policy: str, bug: str) -> None:
    """The sample sizes detect the bugs of the module docstring with >= 99 % power."""
    correct = reference_return(policy)
    buggy = reference_return(policy, exposure_sign=+1.0) if bug == "sign" else None
    if bug == "clip":
        buggy = reference_return(policy, clip=100.0)
    effect = abs(buggy - correct)
    ours, theirs = rollouts["fedrec", policy].returns, rollouts["recsim", policy].returns
    se = math.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    detectable = (stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(POWER)) * se
    assert effect > detectable, f"{bug} bug ({effect:.1f}) below detectable {detectable:.1f}"


@pytest.mark.parametrize("side", ["recsim", "fedrec", "single"])
def test_episode_length(rollouts: dict[tuple[str, str], Rollouts], side: str) -> None:
    for (who, policy), run in rollouts.items():
        if who == side:
            assert (run.lengths == EPISODE_LENGTH).all(), (side, policy, np.unique(run.lengths))


@pytest.mark.parametrize("side", ["recsim", "fedrec", "single"])
def test_reward_unclipped_observation_clipped(
    rollouts: dict[tuple[str, str], Rollouts], side: str
) -> None:
    runs = [run for (who, _), run in rollouts.items() if who == side]
    steps = sum(int(run.lengths.sum()) for run in runs)
    over = sum(run.steps_over_100 for run in runs)
    # About 1-2 % of step rewards exceed 100 (docs/choc_kale.md, "Reward and observation");
    # clipping would make this 0.
    assert over > 0.002 * steps, f"{side}: only {over} of {steps} step rewards exceed 100"
    assert max(run.max_step_reward for run in runs) > 200.0
    # Only the observed engagement (the response) is clipped to [0, 100].
    assert max(run.max_observed_engagement for run in runs) <= 100.0
