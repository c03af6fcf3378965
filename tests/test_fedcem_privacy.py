"""FedCEM's privacy: what the platform without feedback infers from the search update, and the
protected variants (secure sum, DP) that bound it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from resume_helpers import play_episodes, resumed_copy
from scipy import optimize, stats

from fedrec.agents.fedcem import FedCEMAgent, FedCEMConfig, SearchingPlatform
from fedrec.agents.registry import build_multi_platform_agent
from fedrec.agents.slate_rule import cross_entropy_step
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.eval.elite_inference import (
    EliteAudit,
    elite_mask,
    elite_scores,
    play_population,
    roc_auc,
)
from fedrec.federation import SERVER
from fedrec.federation.privacy import epsilon

SMALL = {"num_candidates": 10, "slate_size": 3}


def _agent(users: int = 16, *, seed: int = 0, env: dict | None = None, **config):
    env = ChocKaleMultiPlatformBatchEnv(users, **(env or SMALL))
    return build_multi_platform_agent("fedcem", env, seed=seed, **config)


def _mean_auc(audit: EliteAudit, method: str = "least_squares") -> float:
    return float(np.mean([r.auc[method] for r in audit.results()]))


def _user_only(seed: int):
    rng = np.random.default_rng(seed)
    return lambda draws: rng.normal(size=len(draws))  # a user effect; the rule does not matter


def test_roc_auc_and_the_elite() -> None:
    members = np.array([True, False, True, False])
    assert roc_auc(np.array([3.0, 1.0, 2.0, 0.0]), members) == 1.0
    assert roc_auc(np.array([0.0, 1.0, 2.0, 3.0]), members) == 0.25
    assert roc_auc(np.zeros(4), members) == 0.5  # ties count half
    np.testing.assert_array_equal(elite_mask(np.array([1.0, 5.0, 5.0, 0.0]), 0.5), [0, 1, 1, 0])
    with pytest.raises(ValueError, match="both members and non-members"):
        roc_auc(np.zeros(2), np.array([True, True]))


def test_the_update_reveals_the_elite_exactly_when_the_population_is_small() -> None:
    """With no more draws than equations, the minimum-norm solution is the elite itself."""
    rng = np.random.default_rng(0)
    config = FedCEMConfig(time_bins=10, population=32, elite_fraction=0.25)
    mean, std = rng.normal(size=20), np.full(20, 0.7)
    thetas = mean + std * rng.standard_normal((32, 20))
    returns = rng.normal(size=32)
    new_mean, new_std = cross_entropy_step(mean, std, thetas, returns, config)
    scores = elite_scores(
        thetas, mean, std, new_mean, new_std, smoothing=config.smoothing, min_std=config.min_std
    )
    members = elite_mask(returns, config.elite_fraction)
    np.testing.assert_allclose(scores * members.sum(), members.astype(float), atol=1e-8)


@pytest.mark.parametrize(
    ("regime", "least"),
    [("user", 0.7), ("rule", 0.95)],
)
def test_b_infers_the_elite_well_above_chance_without_protection(regime: str, least: float) -> None:
    """B scores its users by "was in A's top quarter" from what it receives: far above chance
    when returns depend only on the user (a per-user fact about A's feedback) and almost
    perfectly when they depend on the rule."""
    agent = _agent()
    audit = EliteAudit(agent)
    w = np.random.default_rng(5).normal(size=agent.config.size)
    returns = _user_only(1) if regime == "user" else (lambda draws: draws @ w)
    for _ in range(6):
        play_population(agent, returns, users=16)
    assert len(audit.results()) == 6
    assert _mean_auc(audit) > least
    assert _mean_auc(audit, "likelihood") > least - 0.1


def test_strong_dp_noise_takes_the_attack_to_chance() -> None:
    aucs = {}
    for z in (None, 50.0):
        config = {} if z is None else {"protection": "dp", "noise_multiplier": z}
        agent = _agent(**config)
        audit = EliteAudit(agent)
        for _ in range(8):
            play_population(agent, _user_only(1), users=16)
        aucs[z] = _mean_auc(audit)
    assert aucs[None] > 0.7
    assert abs(aucs[50.0] - 0.5) < 0.04


def test_the_attack_reads_what_b_receives_during_real_training() -> None:
    """Through the channel, on the env: the observer's populations are A's draws (checked by
    the audit) and the elite shows."""
    env = ChocKaleMultiPlatformBatchEnv(16, **SMALL, sensitivity=0.05)
    agent = build_multi_platform_agent("fedcem", env, seed=2, population=128)
    audit = EliteAudit(agent)
    play_episodes(agent, env, 32, seed=3)
    results = audit.results()
    assert len(results) == agent.updates == 4
    assert all(r.population == 128 and r.elite == 32 for r in results)
    assert _mean_auc(audit) > 0.7


def test_dp_with_negligible_noise_and_no_clipping_is_the_plain_update() -> None:
    """The statistics the protected variants send carry exactly the plain step's information."""
    plain = _agent(seed=4, population=32)
    dp = _agent(seed=4, population=32, protection="dp", noise_multiplier=1e-12, clip_norm=1e6)
    for agent in (plain, dp):
        for _ in range(3):
            play_population(agent, _user_only(7), users=16)
    np.testing.assert_allclose(dp.server.mean, plain.server.mean, atol=1e-5)
    np.testing.assert_allclose(dp.server.std, plain.server.std, atol=1e-5)


def _platform(**config) -> SearchingPlatform:
    """A feedback platform on its own (its statistics need no channel)."""
    params = ChocKaleMultiPlatformBatchEnv(1, **SMALL).params
    return SearchingPlatform(
        "a",
        channel=None,  # type: ignore[arg-type]
        config=FedCEMConfig(protection="dp", population=64, **config),
        params=params,
        learns=True,
    )


def test_dp_clips_each_user_and_adds_noise_of_the_stated_scale() -> None:
    platform = _platform(noise_multiplier=0.5, clip_norm=3.0)
    rng = np.random.default_rng(1)
    thetas, returns = 2.0 * rng.standard_normal((64, 20)), rng.normal(size=64)
    stats_ = np.array([platform.elite_statistics(thetas, returns) for _ in range(4000)])
    assert np.all(stats_[:, 0] == 16)  # the elite's size: public, never noised
    noise = stats_[:, 1:] - stats_[:, 1:].mean(axis=0)
    assert noise.std() == pytest.approx(0.5 * 2 * 3.0, rel=0.02)  # z times the sensitivity
    # Without noise: the sums of rows clipped to norm 3; one user's return moves them by at
    # most the sensitivity 2 clip_norm (one user in, one out).
    quiet = _platform(noise_multiplier=1e-12, clip_norm=3.0)
    base = quiet.elite_statistics(thetas, returns)[1:]
    assert np.linalg.norm(base) <= 16 * 3.0 + 1e-6
    worst = 0.0
    for user in range(64):
        for value in (-10.0, 10.0):
            changed = returns.copy()
            changed[user] = value
            worst = max(worst, np.linalg.norm(quiet.elite_statistics(thetas, changed)[1:] - base))
    assert 3.0 < worst <= 2 * 3.0 + 1e-6


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon at delta of a mu-GDP mechanism (Dong, Roth & Su): T Gaussian
    mechanisms of noise multiplier z compose to mu = sqrt(T) / z."""

    def excess(eps: float) -> float:
        normal = stats.norm.cdf
        return normal(-eps / mu + mu / 2) - math.exp(eps) * normal(-eps / mu - mu / 2) - delta

    return optimize.brentq(excess, 0.0, 100.0)


def test_dp_epsilon_is_accounted_over_the_updates_and_bounds_are_respected() -> None:
    agent = _agent(protection="dp", noise_multiplier=3.0, delta=1e-5)
    assert agent.privacy()["epsilon"] == 0.0
    for _ in range(4):
        play_population(agent, _user_only(0), users=16)
    privacy = agent.privacy()
    assert privacy["updates"] == 4 and privacy["delta"] == 1e-5
    assert privacy["epsilon"] == pytest.approx(epsilon(3.0, 1.0, 4, 1e-5))
    # The RDP accountant's epsilon lies between the exact Gaussian one (tight) and the classic
    # RDP conversion min_a T a / (2 z^2) + log(1/delta) / (a - 1).
    exact = _gaussian_epsilon(math.sqrt(4) / 3.0, 1e-5)
    classic = min(
        4 * a / (2 * 9.0) + math.log(1e5) / (a - 1) for a in np.linspace(1.01, 200, 20000)
    )
    assert exact <= privacy["epsilon"] <= classic
    assert privacy["epsilon_per_update"] < privacy["epsilon"]
    # Reported in training metrics, and absent without DP.
    agent.server.broadcast_draws(16)
    for platform in agent.platforms.values():
        platform.receive_draws(16)
    metrics = agent.observe({}, {}, {"platform_a": np.zeros(16)}, {}, np.zeros(16, bool))
    assert metrics["epsilon"] == privacy["epsilon"]
    assert _agent().privacy() is None


def test_secure_sum_gives_the_pooled_elite_and_no_platform_message_crosses_the_channel() -> None:
    env = {**SMALL, "num_platforms": 3, "feedback": [True, True, False]}
    agent = _agent(8, env=env, population=16, protection="secure_sum")
    sent = []
    deliver = agent.channel.transport.deliver
    agent.channel.transport.deliver = lambda m: (sent.append(m), deliver(m))
    mean, std = agent.server.mean.copy(), agent.server.std.copy()
    rng = np.random.default_rng(3)
    thetas, returns = [], {name: [] for name in agent.feedback_platforms}
    for _ in range(2):
        agent.server.broadcast_draws(8)
        for platform in agent.platforms.values():
            platform.receive_draws(8)
        thetas.append(agent.platforms["platform_a"].draws)
        for name in agent.feedback_platforms:
            returns[name].append(rng.normal(size=8))
            agent.platforms[name].record(returns[name][-1])
        agent.end_episode(8)
    assert agent.updates == 1
    draws = np.concatenate(thetas)
    elite = np.concatenate(
        [draws[elite_mask(np.concatenate(r), 0.25)] for r in returns.values()]
    )  # the two platforms' elites, pooled
    np.testing.assert_allclose(agent.server.mean, 0.5 * mean + 0.5 * elite.mean(0), atol=1e-6)
    np.testing.assert_allclose(
        agent.server.std, np.maximum(0.5 * std + 0.5 * elite.std(0), 0.05), atol=1e-6
    )
    assert sent and all(m.sender == SERVER for m in sent)  # uploads went through the secure sum


def test_dp_with_one_feedback_platform_sends_only_its_noisy_statistics() -> None:
    agent = _agent(8, population=16, protection="dp")
    sent = []
    deliver = agent.channel.transport.deliver
    agent.channel.transport.deliver = lambda m: (sent.append(m), deliver(m))
    play_population(agent, _user_only(0), users=8)
    uploads = [m for m in sent if m.sender != SERVER]
    assert [m.sender for m in uploads] == ["platform_a"]
    assert uploads[0].payload.shape == (1 + 2 * agent.config.size,)


def test_the_protected_variant_resumes_exactly() -> None:
    def fresh():
        env = ChocKaleMultiPlatformBatchEnv(8, **SMALL, sensitivity=0.05)
        return env, build_multi_platform_agent("fedcem_dp", env, seed=3, population=16)

    # one update done, one episode of the next population pending; then two more updates, each
    # with fresh noise
    agent, agent2 = resumed_copy(fresh, 3, 3)
    assert agent.updates == agent2.updates == 3
    np.testing.assert_array_equal(agent.server.mean, agent2.server.mean)
    np.testing.assert_array_equal(agent.server.std, agent2.server.std)
    assert agent.privacy() == agent2.privacy()
    # The noise is the platform's own draw: another seed, another rule.
    env3, agent3 = fresh()
    agent3.platforms["platform_a"].noise_rng = np.random.default_rng(99)
    play_episodes(agent3, env3, 6)
    assert not np.array_equal(agent3.server.mean, agent.server.mean)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"protection": "secure"}, "protection must be one of"),
        ({"protection": "dp", "noise_multiplier": 0.0}, "noise_multiplier must be a finite"),
        ({"protection": "dp", "noise_multiplier": math.nan}, "noise_multiplier must be a finite"),
        ({"protection": "dp", "clip_norm": -1.0}, "clip_norm must be a finite"),
        ({"protection": "dp", "clip_norm": "8"}, "clip_norm must be a number"),
        ({"protection": "dp", "delta": 1.0}, r"delta must be in \(0, 1\)"),
        ({"noise_multiplier": 2.0}, "noise_multiplier apply only to protection='dp'"),
        (
            {"protection": "secure_sum", "clip_norm": 2.0, "delta": 1e-6},
            "clip_norm, delta apply only to protection='dp'",
        ),
    ],
)
def test_config_errors_are_clear(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FedCEMConfig(**kwargs)


def test_a_secure_sum_of_one_platform_is_refused() -> None:
    env = ChocKaleMultiPlatformBatchEnv(4, **SMALL)
    with pytest.raises(ValueError, match="needs at least 2 platforms with feedback"):
        FedCEMAgent.from_env(env, config=FedCEMConfig(protection="secure_sum"), seed=0)
