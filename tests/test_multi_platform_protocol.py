"""The multi-platform agent protocol as the training loop enforces it: a platform without feedback
never receives a reward or a response, and what a method sends between parties is accounted."""

from __future__ import annotations

import numpy as np
import pytest

from fedrec.agents import MultiPlatformAgent
from fedrec.federation import SERVER, MessageKind, PrivacyViolation
from fedrec.train import MultiPlatformTrainConfig, train_multi_platform

SMALL = {"num_candidates": 10, "slate_size": 3, "num_platforms": 3, "feedback": [True, False, True]}


class Spy(MultiPlatformAgent):
    """Records what the loop hands it; sends one Q-value message per step through the server."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.make_channel()
        self.reward_keys: set[str] = set()
        self.observation_keys: dict[str, set[str]] = {}

    def act(self, observations):
        first, silent = self.feedback_platforms[0], self.silent_platforms[0]
        users = len(observations[first]["candidates"])
        scores = np.zeros((users, self.params.num_candidates), np.float32)
        self.channel.send(MessageKind.Q_VALUES, first, SERVER, scores)
        relayed = self.channel.receive(SERVER, MessageKind.Q_VALUES)
        self.channel.send(MessageKind.FEDERATED_Q_VALUES, SERVER, silent, np.array(relayed))
        self.channel.receive(silent, MessageKind.FEDERATED_Q_VALUES)
        for platform, obs in observations.items():
            self.observation_keys.setdefault(platform, set()).update(obs)
        return {p: np.tile(np.arange(self.params.slate_size), (users, 1)) for p in self.names}

    def observe(self, observations, slates, rewards, next_observations, terminated):
        self.reward_keys.update(rewards)
        return {}


def test_only_feedback_platforms_receive_rewards_and_responses() -> None:
    spies: list[Spy] = []

    def build(env):
        spies.append(Spy.from_env(env, seed=0))
        return spies[-1]

    config = MultiPlatformTrainConfig(
        method="spy", episodes=4, num_users=2, env_kwargs=SMALL, eval_episodes=2,
        planner=False, progress=False,
    )  # fmt: skip
    result = train_multi_platform(config, agent=build)
    spy = spies[0]
    assert spy.reward_keys == {"platform_a", "platform_c"}  # never platform_b's
    assert "response_engagement" in spy.observation_keys["platform_a"]
    assert spy.observation_keys["platform_b"] == {"candidates", "user"}
    # every message went through the channel and is reported per user-episode and party
    assert result.traffic["platform_a"]["sent_bytes"] > 0
    assert result.traffic["platform_b"]["received_bytes"] == result.traffic["server"]["sent_bytes"]


def test_the_channel_refuses_what_may_not_cross_a_party_boundary() -> None:
    from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv

    spy = Spy.from_env(ChocKaleMultiPlatformBatchEnv(2, **SMALL), seed=0)
    with pytest.raises(PrivacyViolation):
        spy.channel.send(MessageKind.Q_VALUES, "platform_a", SERVER, {"reward": np.ones(2)})
    with pytest.raises(PrivacyViolation):
        spy.channel.send(
            MessageKind.FEDERATED_Q_VALUES, "platform_a", SERVER, np.ones((2, 10), np.float32)
        )
