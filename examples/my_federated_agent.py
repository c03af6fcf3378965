"""A federated slate method in its own file: platform A learns, the server relays its scores to B.

Platform A (with feedback) learns the mean engagement of a clicked item per feature bin from its
own clicks and rewards. Every step it scores its candidates and sends the scores to the server
through the channel; the server relays them to every platform without feedback, which serves the
best-scored candidates. Nothing else crosses a party boundary: B never sees a reward, a click or
A's bin table. The relay assumes both platforms show the same candidates (``shared_catalogue=True``).

    fedrec train examples/my_federated_agent.py:ScoreRelay --env fedrec/ChocKaleMultiPlatform-v0 \\
        --env-kwarg shared_catalogue=True --episodes 400
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedrec.agents.multi_platform import MultiPlatformAgent
from fedrec.federation import SERVER, MessageKind


@dataclasses.dataclass(frozen=True)
class ScoreRelayConfig:
    bins: int = dataclasses.field(default=10, metadata={"help": "feature bins of A's table"})
    epsilon: float = dataclasses.field(default=0.1, metadata={"help": "exploration rate"})


class Learner:
    """A platform with feedback: its bin table is its own and never leaves it."""

    def __init__(self, name, channel, bins):
        self.name, self.channel, self.bins = name, channel, bins
        self.total, self.count = np.zeros(bins), np.ones(bins)

    def _bin(self, candidates):
        return np.clip((candidates[..., 0] * self.bins).astype(int), 0, self.bins - 1)

    def scores(self, observation):
        return (self.total / self.count)[self._bin(observation["candidates"])].astype(np.float32)

    def send_scores(self, observation):
        self.channel.send(MessageKind.Q_VALUES, self.name, SERVER, self.scores(observation))

    def learn(self, observation, slate, reward, next_observation):
        users, slots = np.nonzero(next_observation["response_click"][:, -1])
        bins = self._bin(observation["candidates"][users, slate[users, slots]])
        np.add.at(self.total, bins, reward[users])
        np.add.at(self.count, bins, 1)


class Relay:
    """The server: forwards the first feedback platform's scores to the platforms without one."""

    def __init__(self, channel, senders, receivers):
        self.channel, self.senders, self.receivers = channel, senders, receivers

    def relay(self):
        scores = [self.channel.receive(SERVER, MessageKind.Q_VALUES) for _ in self.senders]
        for receiver in self.receivers:
            self.channel.send(MessageKind.FEDERATED_Q_VALUES, SERVER, receiver, scores[0])


class ScoreRelay(MultiPlatformAgent):
    Config = ScoreRelayConfig
    REQUIRES = {"shared_catalogue": True}  # checked before training: B must see A's candidates

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        channel = self.make_channel()  # validated, byte-counted; the loop reports its traffic
        self.learners = {p: Learner(p, channel, self.config.bins) for p in self.feedback_platforms}
        self.relay = Relay(channel, self.feedback_platforms, self.silent_platforms)

    def _top(self, scores):
        return np.argsort(-scores, axis=1, kind="stable")[:, : self.params.slate_size]

    def act(self, observations):
        for name, learner in self.learners.items():
            learner.send_scores(observations[name])
        self.relay.relay()
        slates = {p: self._top(self.learners[p].scores(observations[p])) for p in self.learners}
        for p in self.silent_platforms:
            slates[p] = self._top(self.channel.receive(p, MessageKind.FEDERATED_Q_VALUES))
        return slates

    def explore(self, observations):
        slates = self.act(observations)
        n, k = self.params.num_candidates, self.params.slate_size
        for p, slate in slates.items():
            users = len(slate)
            random = np.argsort(self.rng.random((users, n)), axis=1)[:, :k]
            explore = self.rng.random(users) < self.config.epsilon
            slates[p] = np.where(explore[:, None], random, slate)
        return slates

    def observe(self, observations, slates, rewards, next_observations, terminated):
        for name, learner in self.learners.items():  # rewards: the feedback platforms' only
            learner.learn(observations[name], slates[name], rewards[name], next_observations[name])
        return {}

    def state_dict(self):
        tables = {p: {"total": x.total, "count": x.count} for p, x in self.learners.items()}
        return {**super().state_dict(), "learners": tables}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        for p, learner in self.learners.items():
            learner.total = state["learners"][p]["total"].copy()
            learner.count = state["learners"][p]["count"].copy()
