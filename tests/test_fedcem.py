"""FedCEM: the platform without feedback learns to serve from the feedback platform's search,
under a parameter-sharing contract that the channel enforces."""

from __future__ import annotations

import numpy as np
import pytest
from resume_helpers import play_episodes, resumed_copy

from fedrec.agents.fedcem import FedCEMAgent, FedCEMConfig
from fedrec.agents.registry import build_multi_platform_agent
from fedrec.agents.slate_rule import basis, top_slates
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.federation import SERVER, MessageKind, PrivacyViolation
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

SMALL = {"num_candidates": 10, "slate_size": 3}


def _train(sensitivity: float, *, method: str = "fedcem", episodes: int = 1280, seed: int = 1):
    config = MultiPlatformTrainConfig(
        method=method, episodes=episodes, num_users=16, seed=seed,
        env_kwargs={**SMALL, "sensitivity": sensitivity}, agent_kwargs={"population": 32},
        eval_episodes=64, planner=False, progress=False,
    )  # fmt: skip
    return train_multi_platform(config, out_dir=None).final_eval["policies"]


@pytest.mark.parametrize(
    ("sensitivity", "best", "worst"), [(0.05, "bottom_x", "top_x"), (0.01, "top_x", "bottom_x")]
)
def test_the_platform_without_feedback_learns_what_each_setting_rewards(
    sensitivity: float, best: str, worst: str
) -> None:
    """Under long-term dynamics kale pays (bottom-x), in the paper's setting chocolate (top-x):
    B, which never sees a reward, ends near the right heuristic and far above random and the
    wrong one, from A's feedback alone."""
    policies = _train(sensitivity)
    for platform in ("platform_a", "platform_b"):
        agent = policies["agent"][platform]["mean"]
        assert agent > policies["random"][platform]["mean"] + 50
        assert agent > policies[worst][platform]["mean"] + 100
        assert agent > 0.97 * policies[best][platform]["mean"]


def test_without_feedback_anywhere_it_refuses_to_build() -> None:
    env = ChocKaleMultiPlatformBatchEnv(4, **SMALL, feedback=[False, False])
    with pytest.raises(ValueError, match="at least one platform with feedback"):
        FedCEMAgent.from_env(env, seed=0)


class Spy:
    """Records every message the channel delivers."""

    def __init__(self, channel) -> None:
        self.messages = []
        original = channel.transport.deliver

        def deliver(message):
            self.messages.append(message)
            original(message)

        channel.transport.deliver = deliver


def test_only_rule_weights_cross_and_never_a_per_user_value() -> None:
    users = 8
    env = ChocKaleMultiPlatformBatchEnv(users, **SMALL)
    agent = build_multi_platform_agent("fedcem", env, seed=0, population=16)
    spy = Spy(agent.channel)
    play_episodes(agent, env, 4)
    d = 2 * agent.config.time_bins  # weights of one rule
    assert agent.updates == 2 and spy.messages
    assert {m.kind for m in spy.messages} == {MessageKind.MODEL_PARAMETERS}
    from_platforms = [m for m in spy.messages if m.sender != SERVER]
    # Platforms send only the updated search distribution, and only A (B has nothing to learn
    # from): mean and spread, 2 d floats per update, never a per-user array.
    assert {m.sender for m in from_platforms} == {"platform_a"}
    assert all(m.payload.shape == (2 * d,) for m in from_platforms)
    # The server sends the rule and each episode's draws (random numbers, no user data).
    assert {m.payload.shape for m in spy.messages if m.sender == SERVER} == {(2 * d,), (users * d,)}
    # Anything else is refused by the channel: e.g. FedSlate's per-user Q values.
    with pytest.raises(PrivacyViolation, match="outside this channel's contract"):
        agent.channel.send(
            MessageKind.Q_VALUES, "platform_a", SERVER, np.zeros((1, 10), np.float32)
        )


def test_every_platform_serves_the_same_rule_and_the_silent_one_follows_the_feedback_one() -> None:
    env = ChocKaleMultiPlatformBatchEnv(8, **SMALL, sensitivity=0.05)
    agent = build_multi_platform_agent("fedcem", env, seed=0, population=16)
    play_episodes(agent, env, 20)
    a, b = agent.platforms["platform_a"], agent.platforms["platform_b"]
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(agent.server.mean, a.mean.astype(np.float32))
    observations, _ = env.reset(seed=5)
    same = {"platform_a": observations["platform_a"], "platform_b": observations["platform_a"]}
    slates = agent.act(same)
    np.testing.assert_array_equal(slates["platform_a"], slates["platform_b"])


def test_basis_and_rule_shapes() -> None:
    x = np.array([[0.1, 0.9, 0.5]])
    phi = basis(x, 0.55, 4)  # the third of four parts of the episode
    assert phi.shape == (1, 3, 8)
    np.testing.assert_allclose(phi[0, 1], [0, 0, 0.9, 0, 0, 0, 0.81, 0])
    np.testing.assert_allclose(basis(x, 0.999, 4)[0, 0], [0, 0, 0, 0.1, 0, 0, 0, 0.01])
    np.testing.assert_array_equal(top_slates(np.array([[0.0, 2.0, 1.0]]), 2), [[1, 2]])
    with pytest.raises(ValueError, match="elite_fraction"):
        FedCEMConfig(population=4, elite_fraction=0.25)
    with pytest.raises(ValueError, match="time_bins"):
        FedCEMConfig(time_bins=0)


def test_state_round_trips_through_plain_data_and_continues_identically() -> None:
    def fresh():
        env = ChocKaleMultiPlatformBatchEnv(8, **SMALL, sensitivity=0.05)
        return env, build_multi_platform_agent("fedcem", env, seed=3, population=16)

    # mid-population after 3 episodes: one episode of draws is pending
    agent, agent2 = resumed_copy(fresh, 3, 1)
    np.testing.assert_array_equal(
        agent.platforms["platform_b"].mean, agent2.platforms["platform_b"].mean
    )
    assert agent.updates == agent2.updates == 2


# --------------------------------------------------------------------------- closed loop


def _types_env(users: int) -> ChocKaleMultiPlatformBatchEnv:
    from fedrec.registration import MULTI_PLATFORM_USER_TYPES_KWARGS

    return ChocKaleMultiPlatformBatchEnv(users, **MULTI_PLATFORM_USER_TYPES_KWARGS)


def test_the_closed_loop_rule_reads_each_platforms_own_readings_only() -> None:
    env = _types_env(4)
    agent = build_multi_platform_agent("fedcem_adaptive", env, seed=0, population=64)
    assert agent.config.contexts == 3 and agent.config.size == 2 * 10 * 3
    observations, _ = env.reset(seed=0)
    # B's level comes from B's readings: move them and only B's context changes
    b_high = {**observations["platform_b"], "user": np.full((4, 1), 0.9, np.float32)}
    a_low = {**observations["platform_a"], "user": np.full((4, 1), 0.1, np.float32)}
    agent.act({"platform_a": a_low, "platform_b": b_high})
    levels = {
        name: np.nanmean(platform.readings, axis=1) for name, platform in agent.platforms.items()
    }
    np.testing.assert_allclose(levels["platform_a"], 0.1, rtol=1e-6)
    np.testing.assert_allclose(levels["platform_b"], 0.9, rtol=1e-6)
    assert (agent.platforms["platform_b"].context(np.full((4, 1), 0.9), first=False) == 2).all()
    with pytest.raises(ValueError, match="observed satisfaction"):
        agent.platforms["platform_b"].context(None, first=True)


def test_each_drawn_rule_is_played_on_several_users_and_scored_by_their_mean() -> None:
    env = _types_env(16)
    agent = build_multi_platform_agent(
        "fedcem_adaptive", env, seed=0, population=64, episodes_per_rule=8
    )
    observations, _ = env.reset(seed=0)
    agent.explore(observations)
    draws = agent.platforms["platform_a"].draws
    assert len(np.unique(draws, axis=0)) == 2  # 16 users, 8 per rule
    np.testing.assert_array_equal(draws, agent.platforms["platform_b"].draws)
    with pytest.raises(ValueError, match="rules: elite_fraction"):
        FedCEMConfig(population=16, episodes_per_rule=8)


def test_closed_loop_state_round_trips_and_continues_identically() -> None:
    def fresh():
        env = _types_env(8)
        return env, build_multi_platform_agent(
            "fedcem_adaptive", env, seed=3, population=32, episodes_per_rule=4
        )

    agent, agent2 = resumed_copy(fresh, 3, 2)
    for name in ("platform_a", "platform_b"):
        np.testing.assert_array_equal(agent.platforms[name].mean, agent2.platforms[name].mean)
        np.testing.assert_array_equal(
            agent.platforms[name].readings, agent2.platforms[name].readings
        )
    assert agent.updates == agent2.updates >= 1
