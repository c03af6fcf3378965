"""FedCEM: federated cross-entropy policy search over one shared slate-scoring rule; a platform
without feedback serves with the rule that the feedback platforms found on their users.

Why it exists: in FedSlate a platform without feedback can only calibrate the *level* of its
values (its loss never involves the items it served; ``docs/fedslate.md``), so it cannot learn
which items to serve. Here every platform ranks its own candidates by the same linear score
theta . phi(x_i, tau) of a candidate's feature x_i and the fraction tau of the episode played:
phi holds x and x^2 in the slot of tau's part of the episode (``time_bins`` equal parts), so the
rule has its own weights per part of the episode. It serves the n best-scored candidates. The
rule can express "kale first, chocolate at the end", the shape of the optimal plan under
long-term dynamics; top-x and bottom-x are two of its points.

Learning is a policy search, not a gradient. The server keeps a Gaussian search distribution
N(mu, diag sigma^2) over theta; at the start of every training episode it draws one rule per user
and sends the draws to every platform, so a user meets the same rule on every platform (each
rule is tried as a joint policy: the user is shared, and one platform's return depends mostly on
what the *other* serves). After ``population`` (256) user-episodes each platform with feedback
moves mu and sigma towards the draws of its ``elite_fraction`` best episode returns (the
cross-entropy method), by its own rewards, and sends the new (mu, sigma) to the server, which
averages them (FedAvg) and sends the average to every platform. In evaluation every platform
serves the greedy rule mu. Why not a per-step policy gradient: from the random policy the local
gradient of the return points to the myopic top-x slate under long-term dynamics (what pays
now), a local optimum that REINFORCE did not leave in our measurements (``docs/fedcem.md``).

Privacy contract (enforced by the channel, opened with
:data:`~fedrec.federation.messages.PARAMETER_SHARING_KINDS`): only ``MODEL_PARAMETERS``
messages travel: the rule (mu, sigma) and each episode's draws (random numbers, no user data),
server -> platform, and the updated (mu, sigma), feedback platform -> server. No per-user value
derived from a user crosses a party boundary: no observations, slates, rewards, clicks or
returns. The weights reveal the feedback platforms' preferred rule over (item feature, time in
the episode), aggregated over their users' episodes. This is a different contract from
FedSlate's, which shares per-user, per-candidate Q values and no weights.

Assumes the multi-platform env's fixed-length, synchronised episodes: the method counts the
steps of the current episode itself (``episode_length`` joint steps; every ``act``/``explore``
call is one step).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedrec.agents.multi_platform import (
    MultiPlatformAgent,
    Observations,
    Slates,
    episode_length_of,
)
from fedrec.agents.slate_rule import RuleSearchConfig, basis, cross_entropy_step, top_slates
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.federation import SERVER, Channel, MessageKind
from fedrec.federation.messages import PARAMETER_SHARING_KINDS


@dataclasses.dataclass(frozen=True)
class FedCEMConfig(RuleSearchConfig):
    """The rule and the search (:class:`~fedrec.agents.slate_rule.RuleSearchConfig`)."""


class SearchingPlatform:
    """One platform's party: its copy of the shared rule (mean, spread) and, with feedback, this
    search round's draws and its users' returns. Nothing here is read by another party."""

    def __init__(
        self,
        name: str,
        *,
        channel: Channel,
        config: FedCEMConfig,
        params: ChocKaleParams,
        learns: bool,
    ) -> None:
        self.name, self.channel, self.config, self.learns = name, channel, config, learns
        self.slate_size = params.slate_size
        size = config.size
        self.mean = np.zeros(size)
        self.std = np.full(size, config.initial_std)
        self.draws = np.zeros((0, size))  # this episode's theta, one row per user
        self.returns = np.zeros(0)  # this episode's running returns, one per user
        self.population: list[tuple[np.ndarray, np.ndarray]] = []  # (thetas, returns) per batch

    def slates(self, candidates: np.ndarray, fraction: float, *, explore: bool) -> np.ndarray:
        phi = basis(candidates[..., 0], fraction, self.config.time_bins)
        if not explore:
            return top_slates(phi @ self.mean, self.slate_size)
        if len(self.draws) != len(candidates):
            raise RuntimeError(
                f"{self.name}: no rule draws for this episode's {len(candidates)} users"
            )
        return top_slates(np.einsum("und,ud->un", phi, self.draws), self.slate_size)

    def receive_draws(self, users: int) -> None:
        """This episode's rules, one per user, drawn by the server (the same on every platform)."""
        vector = self.channel.receive(self.name, MessageKind.MODEL_PARAMETERS)
        if vector.shape != (users * len(self.mean),):
            raise ValueError(f"{self.name}: expected {users} rules, got {vector.shape} values")
        self.draws = vector.reshape(users, len(self.mean)).astype(np.float64)
        self.returns = np.zeros(users)

    def record(self, rewards: np.ndarray) -> None:
        self.returns = self.returns + np.asarray(rewards, dtype=np.float64)

    def end_episode(self) -> bool:
        """Close the episode; True when the population is complete and the rule moved (then the
        new mean and spread go to the server)."""
        if self.learns and len(self.draws):
            self.population.append((self.draws, self.returns))
        self.draws, self.returns = np.zeros((0, len(self.mean))), np.zeros(0)
        if not self.learns or sum(len(r) for _, r in self.population) < self.config.population:
            return False
        thetas = np.concatenate([t for t, _ in self.population])
        returns = np.concatenate([r for _, r in self.population])
        self.mean, self.std = cross_entropy_step(self.mean, self.std, thetas, returns, self.config)
        self.population = []
        vector = np.concatenate([self.mean, self.std]).astype(np.float32)
        self.channel.send(MessageKind.MODEL_PARAMETERS, self.name, SERVER, vector)
        return True

    def receive_rule(self) -> None:
        vector = self.channel.receive(self.name, MessageKind.MODEL_PARAMETERS)
        size = len(self.mean)
        if vector.shape != (2 * size,):
            raise ValueError(f"{self.name}: expected {2 * size} parameters, got {vector.shape}")
        self.mean, self.std = vector[:size].astype(np.float64), vector[size:].astype(np.float64)

    def state_dict(self) -> dict[str, Any]:
        if len(self.draws):
            raise RuntimeError("FedCEM saves its state between episodes, not inside one")
        return {
            "mean": self.mean.copy(),
            "std": self.std.copy(),
            "population_thetas": [t.copy() for t, _ in self.population],
            "population_returns": [r.copy() for _, r in self.population],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mean, std = np.asarray(state["mean"], float), np.asarray(state["std"], float)
        if mean.shape != self.mean.shape or std.shape != self.std.shape:
            raise ValueError(
                f"{self.name}: saved rule has {mean.shape}, expected {self.mean.shape}"
            )
        self.mean, self.std = mean.copy(), std.copy()
        self.population = [
            (np.asarray(t, float).copy(), np.asarray(r, float).copy())
            for t, r in zip(state["population_thetas"], state["population_returns"], strict=True)
        ]


class SearchServer:
    """Holds the global search distribution: draws each episode's rules (one per user, sent to
    every platform) and averages the feedback platforms' updated distributions (FedAvg)."""

    def __init__(
        self,
        channel: Channel,
        *,
        senders: Sequence[str],
        receivers: Sequence[str],
        size: int,
        initial_std: float,
        seed: int,
    ) -> None:
        self.channel, self.senders, self.receivers = channel, list(senders), list(receivers)
        self.mean, self.std = np.zeros(size), np.full(size, initial_std)
        self.rng = np.random.default_rng(seed)

    def broadcast_rule(self) -> None:
        vector = np.concatenate([self.mean, self.std]).astype(np.float32)
        for receiver in self.receivers:
            self.channel.send(MessageKind.MODEL_PARAMETERS, SERVER, receiver, vector)

    def broadcast_draws(self, users: int) -> None:
        draws = self.mean + self.std * self.rng.standard_normal((users, len(self.mean)))
        vector = draws.reshape(-1).astype(np.float32)
        for receiver in self.receivers:
            self.channel.send(MessageKind.MODEL_PARAMETERS, SERVER, receiver, vector)

    def aggregate(self) -> None:
        received = [
            self.channel.receive(SERVER, MessageKind.MODEL_PARAMETERS) for _ in self.senders
        ]
        average = np.mean(received, axis=0, dtype=np.float64)
        self.mean, self.std = average[: len(self.mean)], average[len(self.mean) :]
        self.broadcast_rule()

    def state_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean.copy(),
            "std": self.std.copy(),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], float).copy()
        self.std = np.asarray(state["std"], float).copy()
        self.rng.bit_generator.state = state["rng"]


class FedCEMAgent(MultiPlatformAgent):
    """Federated cross-entropy search over a shared slate-scoring rule (see the module doc).

    :param episode_length: joint steps per episode (default: the env's time budget divided
        among the platforms, as in the multi-platform env).
    """

    Config = FedCEMConfig

    def __init__(
        self,
        *,
        platforms: Sequence[str],
        feedback: Mapping[str, bool],
        params: ChocKaleParams,
        config: FedCEMConfig | None = None,
        seed: int | None = None,
        episode_length: int | None = None,
    ) -> None:
        super().__init__(
            platforms=platforms, feedback=feedback, params=params, config=config, seed=seed
        )
        if not self.feedback_platforms:
            raise ValueError("FedCEM needs at least one platform with feedback to learn from")
        self.episode_length = int(episode_length or params.time_budget // len(self.names))
        if self.episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {self.episode_length}")
        channel = self.make_channel(kinds=PARAMETER_SHARING_KINDS)
        # One seed per party, the server's last; only the server draws (the platforms' are unused).
        *_, server_seed = self.rng.integers(2**31, size=len(self.names) + 1)
        self.platforms = {
            name: SearchingPlatform(
                name, channel=channel, config=self.config, params=params, learns=self.feedback[name]
            )
            for name in self.names
        }
        self.server = SearchServer(
            channel,
            senders=self.feedback_platforms,
            receivers=self.names,
            size=self.config.size,
            initial_std=self.config.initial_std,
            seed=int(server_seed),
        )
        self.t = 0
        self.updates = 0
        self.server.broadcast_rule()  # every platform starts from the same rule
        self._receive_rule()

    @classmethod
    def from_env(
        cls, env: Any, *, config: Any = None, seed: int | None = None
    ) -> MultiPlatformAgent:
        return cls(
            platforms=env.possible_agents,
            feedback=env.feedback,
            params=env.params,
            config=config,
            seed=seed,
            episode_length=episode_length_of(env),
        )

    def _receive_rule(self) -> None:
        for platform in self.platforms.values():
            platform.receive_rule()

    def _slates(self, observations: Observations, *, explore: bool) -> Slates:
        fraction = self.t / self.episode_length
        if explore and self.t == 0:  # a training episode starts: one rule per user, everywhere
            users = len(observations[self.names[0]]["candidates"])
            self.server.broadcast_draws(users)
            for platform in self.platforms.values():
                platform.receive_draws(users)
        self.t = (self.t + 1) % self.episode_length
        return {
            name: platform.slates(
                np.asarray(observations[name]["candidates"]), fraction, explore=explore
            )
            for name, platform in self.platforms.items()
        }

    def act(self, observations: Observations) -> Slates:
        return self._slates(observations, explore=False)

    def explore(self, observations: Observations) -> Slates:
        return self._slates(observations, explore=True)

    def observe(
        self,
        observations: Observations,
        slates: Mapping[str, np.ndarray],
        rewards: Mapping[str, np.ndarray],
        next_observations: Observations,
        terminated: np.ndarray,
    ) -> dict[str, float]:
        for name in self.feedback_platforms:  # rewards: the feedback platforms' only
            self.platforms[name].record(rewards[name])
        return {"search_updates": float(self.updates)}

    def end_episode(self, episodes: int) -> None:
        moved = [platform.end_episode() for platform in self.platforms.values()]
        if any(moved):
            self.updates += 1
            self.server.aggregate()
            self._receive_rule()
        self.t = 0
        super().end_episode(episodes)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "t": self.t,
            "updates": self.updates,
            "server": self.server.state_dict(),
            "platforms": {name: p.state_dict() for name, p in self.platforms.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.t, self.updates = int(state["t"]), int(state["updates"])
        self.server.load_state_dict(state["server"])
        for name, platform in self.platforms.items():
            platform.load_state_dict(state["platforms"][name])
