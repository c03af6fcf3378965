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


class TopAServesBottomB(MultiPlatformAgent):
    """Platform A serves top_x, platform B bottom_x (kale, which raises the shared user's
    satisfaction): a method whose B changes A's return."""

    def act(self, observations):
        n = self.params.slate_size
        x = {p: obs["candidates"][..., 0] for p, obs in observations.items()}
        return {
            "platform_a": np.argsort(-x["platform_a"], axis=1, kind="stable")[:, :n],
            "platform_b": np.argsort(x["platform_b"], axis=1, kind="stable")[:, :n],
        }


def test_one_platform_is_compared_across_methods_with_the_others_held_fixed() -> None:
    def final(method, agent=None):
        config = MultiPlatformTrainConfig(
            method=method, episodes=2, num_users=2, env_kwargs={"num_candidates": 10, "slate_size": 3},
            eval_episodes=64, planner=False, progress=False,
        )  # fmt: skip
        return train_multi_platform(config, agent=agent).final_eval["policies"]

    top = final("top_x")
    mixed = final("mixed", TopAServesBottomB.from_env)
    a = "platform_a"
    # Jointly, B's policy changes A's return although A serves the same slates ...
    assert top["agent"][a]["returns"] != mixed["agent"][a]["returns"]
    # ... alone (B serving the same random slates in both), A's return is the same.
    assert top["agent_alone"][a]["returns"] == mixed["agent_alone"][a]["returns"]
    assert top["agent_alone"][a]["returns"] == top["top_x_alone"][a]["returns"]
