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
server -> platform, and each feedback platform's search update, platform -> server. No
observation, slate, reward, click or return crosses a party boundary as such. **But the update
leaks per-user information by inference**: it is a function of which draws were in the feedback
platform's elite, every platform receives every user's draw, and the smoothing and the floor are
public, so B (and the server) can undo the step, read off the elite's mean and spread, and score
each of its users by how likely their draw was in the elite, i.e. whether that user's episode
return on the feedback platform was in its top ``elite_fraction``
(:mod:`fedrec.eval.elite_inference`; measured in ``docs/fedcem.md``, "What B can infer").

``protection`` bounds that: ``"secure_sum"`` sends the elite's statistics (count, sum of
standardised draws and of their squares) through secure aggregation
(:func:`~fedrec.federation.secagg.secure_sum`), so the server learns only their sum over the
feedback platforms (it needs at least two: one platform's secure sum is its input), and B still
learns whatever the new rule reveals; ``"dp"`` clips each elite user's statistics to
``clip_norm`` and adds Gaussian noise to the sums at the feedback platform, before anything
leaves it, so the rule every other party sees is differentially private in each user's return
(epsilon by the RDP accountant over the run's updates: :meth:`FedCEMAgent.privacy`).

Assumes the multi-platform env's fixed-length, synchronised episodes: the method counts the
steps of the current episode itself (``episode_length`` joint steps; every ``act``/``explore``
call is one step).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
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

#: What a feedback platform's search update may reveal (see the module doc).
PROTECTIONS = ("none", "secure_sum", "dp")
#: Fixed-point fraction bits of the elite statistics in a secure sum (2^-24: far below the noise
#: and the float32 of the broadcast rule).
FRACTION_BITS = 24


@dataclasses.dataclass(frozen=True)
class FedCEMConfig(RuleSearchConfig):
    """The rule and the search (:class:`~fedrec.agents.slate_rule.RuleSearchConfig`) and how the
    feedback platforms' search update is protected."""

    protection: str = dataclasses.field(
        default="none",
        metadata={
            "help": "what leaves a feedback platform per update: none (its new mean and spread), "
            "secure_sum (its elite statistics, summed by secure aggregation over >= 2 feedback "
            "platforms) or dp (clipped elite statistics with Gaussian noise)"
        },
    )
    noise_multiplier: float = dataclasses.field(
        default=3.0,
        metadata={
            "help": "dp: noise std of the elite sums over their sensitivity 2 clip_norm (3: "
            "epsilon 7.3 at delta 1e-5 over 19 updates, a 20,000-episode run of fedcem_dp)"
        },
    )
    clip_norm: float = dataclasses.field(
        default=8.0,
        metadata={
            "help": "dp: L2 bound of one elite user's standardised statistics [u, (u^2-1)/sqrt2] "
            "(about sqrt(2 weights) = 6.3 for 20 weights before clipping)"
        },
    )
    delta: float = dataclasses.field(
        default=1e-5, metadata={"help": "dp: the delta at which epsilon is reported"}
    )
    satisfaction_edges: tuple[float, ...] = dataclasses.field(
        default=(),
        metadata={
            "help": "closed loop: edges of the satisfaction levels with their own weights; each "
            "platform reads the level of the user from its OWN noisy satisfaction readings (the "
            "mean of the last satisfaction_window); empty: the rule reads no observation"
        },
    )
    satisfaction_window: int = dataclasses.field(
        default=15, metadata={"help": "closed loop: readings averaged into the level"}
    )
    episodes_per_rule: int = dataclasses.field(
        default=1,
        metadata={
            "help": "user-episodes each drawn rule is played on (the elite is chosen by its mean "
            "return): users of different hidden types score very differently, whatever the rule"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.protection not in PROTECTIONS:
            raise ValueError(f"protection must be one of {PROTECTIONS}, got {self.protection!r}")
        for name in ("noise_multiplier", "clip_norm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number > 0, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if isinstance(self.delta, bool) or not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        edges = tuple(float(e) for e in self.satisfaction_edges)
        if any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError(f"satisfaction_edges must be increasing, got {edges}")
        object.__setattr__(self, "satisfaction_edges", edges)
        for name in ("satisfaction_window", "episodes_per_rule"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        rules = self.population // self.episodes_per_rule
        if self.elite_fraction * rules < 2:
            raise ValueError(
                f"a population of {self.population} user-episodes at {self.episodes_per_rule} "
                f"per rule is {rules} rules: elite_fraction {self.elite_fraction} keeps < 2"
            )
        if self.protection != "dp":
            defaults = {f.name: f.default for f in dataclasses.fields(FedCEMConfig)}
            changed = [
                name
                for name in ("noise_multiplier", "clip_norm", "delta")
                if getattr(self, name) != defaults[name]
            ]
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} apply only to protection='dp', not "
                    f"protection={self.protection!r}"
                )

    @property
    def contexts(self) -> int:
        """Satisfaction levels with their own weights (1: the rule reads no observation)."""
        return len(self.satisfaction_edges) + 1

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of a platform's elite sums to one user-episode's return: changing it
        swaps at most one user into and one out of the elite, each clipped to ``clip_norm``."""
        return 2.0 * self.clip_norm


def elite_indices(returns: np.ndarray, elite_fraction: float) -> np.ndarray:
    """The population's elite: the ``elite_fraction`` best returns (ties: the earlier draw), as
    :func:`~fedrec.agents.slate_rule.cross_entropy_step` selects it."""
    return np.argsort(-np.asarray(returns), kind="stable")[: int(elite_fraction * len(returns))]


class SearchingPlatform:
    """One platform's party: its copy of the shared rule (mean, spread) and, with feedback, this
    search round's draws and its users' returns. Nothing here is read by another party.

    :param seed: seeds the platform's own noise (``protection="dp"``; unused otherwise).
    """

    def __init__(
        self,
        name: str,
        *,
        channel: Channel,
        config: FedCEMConfig,
        params: ChocKaleParams,
        learns: bool,
        seed: int = 0,
    ) -> None:
        self.name, self.channel, self.config, self.learns = name, channel, config, learns
        self.noise_rng = np.random.default_rng(seed)
        self.statistics: np.ndarray | None = None  # a protected update's elite statistics
        self.slate_size = params.slate_size
        size = config.size
        self.mean = np.zeros(size)
        self.std = np.full(size, config.initial_std)
        self.draws = np.zeros((0, size))  # this episode's theta, one row per user
        self.returns = np.zeros(0)  # this episode's running returns, one per user
        self.population: list[tuple[np.ndarray, np.ndarray]] = []  # (thetas, returns) per batch
        # closed loop: this episode's last satisfaction readings per user, newest last (NaN: none)
        self.readings = np.zeros((0, config.satisfaction_window))

    def context(self, reading: np.ndarray | None, *, first: bool) -> np.ndarray | None:
        """Each user's satisfaction level from this platform's own readings (None: open loop).
        ``first``: a new episode starts (the last one's readings are forgotten)."""
        if self.config.contexts == 1:
            return None
        if reading is None:
            raise ValueError(
                f"{self.name}: the closed-loop rule reads the observed satisfaction ('user'); "
                "use an env with satisfaction_noise_stddev set"
            )
        seen = np.asarray(reading, dtype=np.float64).reshape(len(reading), -1)[:, 0]
        if first or len(self.readings) != len(seen):
            self.readings = np.full((len(seen), self.config.satisfaction_window), np.nan)
        self.readings = np.concatenate([self.readings[:, 1:], seen[:, None]], axis=1)
        level = np.nanmean(self.readings, axis=1)
        return np.searchsorted(self.config.satisfaction_edges, level, side="right")

    def slates(
        self,
        candidates: np.ndarray,
        fraction: float,
        *,
        explore: bool,
        context: np.ndarray | None = None,
    ) -> np.ndarray:
        phi = basis(
            candidates[..., 0],
            fraction,
            self.config.time_bins,
            context=context,
            contexts=self.config.contexts,
        )
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
        """Close the episode; True when the population is complete and the platform has its
        update: without protection the rule moved and the new mean and spread went to the
        server; with protection the elite statistics wait in :attr:`statistics`."""
        if self.learns and len(self.draws):
            self.population.append((self.draws, self.returns))
        self.draws, self.returns = np.zeros((0, len(self.mean))), np.zeros(0)
        if not self.learns or sum(len(r) for _, r in self.population) < self.config.population:
            return False
        thetas = np.concatenate([t for t, _ in self.population])
        returns = np.concatenate([r for _, r in self.population])
        self.population = []
        if self.config.episodes_per_rule > 1:  # a rule's score: the mean over its user-episodes
            thetas, which = np.unique(thetas, axis=0, return_inverse=True)
            returns = np.bincount(which, returns) / np.bincount(which)
        if self.config.protection != "none":
            self.statistics = self.elite_statistics(thetas, returns)
            return True
        self.mean, self.std = cross_entropy_step(self.mean, self.std, thetas, returns, self.config)
        vector = np.concatenate([self.mean, self.std]).astype(np.float32)
        self.channel.send(MessageKind.MODEL_PARAMETERS, self.name, SERVER, vector)
        return True

    def elite_statistics(self, thetas: np.ndarray, returns: np.ndarray) -> np.ndarray:
        """``[k, sum u, sum (u^2 - 1)/sqrt 2]`` over the elite's k draws, u = (theta - mean) / std
        standardised by the current rule (k is public: a fixed fraction of the population).

        The server's update needs only these (the elite's mean is mean + std sum u / k and its
        variance std^2 (sum u^2 / k - (sum u / k)^2)); the offset and scale make each user's
        row about as large in both halves (unit variance under the search distribution). With
        ``protection="dp"`` each row is clipped to ``clip_norm`` and Gaussian noise of std
        ``noise_multiplier * sensitivity`` is added to the sums, here, before they leave.
        """
        elite = thetas[elite_indices(returns, self.config.elite_fraction)]
        u = (elite - self.mean) / self.std
        rows = np.concatenate([u, (u * u - 1.0) / math.sqrt(2.0)], axis=1)
        if self.config.protection == "dp":
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows * np.minimum(1.0, self.config.clip_norm / np.maximum(norms, 1e-12))
        sums = rows.sum(axis=0)
        if self.config.protection == "dp":
            scale = self.config.noise_multiplier * self.config.sensitivity
            sums = sums + scale * self.noise_rng.standard_normal(sums.shape)
        return np.concatenate([[float(len(elite))], sums])

    def take_statistics(self) -> np.ndarray:
        if self.statistics is None:
            raise RuntimeError(f"{self.name}: no elite statistics for this update")
        statistics, self.statistics = self.statistics, None
        return statistics

    def send_statistics(self) -> None:
        """The elite statistics to the server over the channel (one feedback platform: a secure
        sum of one party would be its input)."""
        vector = self.take_statistics().astype(np.float32)
        self.channel.send(MessageKind.MODEL_PARAMETERS, self.name, SERVER, vector)

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
            "noise_rng": self.noise_rng.bit_generator.state,
            "readings": self.readings.copy(),
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
        if "noise_rng" in state:  # absent from checkpoints made before protection existed
            self.noise_rng.bit_generator.state = state["noise_rng"]
        if "readings" in state:  # absent from checkpoints made before the closed-loop rule
            readings = np.asarray(state["readings"], float)
            if readings.ndim != 2 or readings.shape[1] != self.config.satisfaction_window:
                raise ValueError(f"{self.name}: saved readings have shape {readings.shape}")
            self.readings = readings.copy()


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

    def broadcast_draws(self, users: int, per_rule: int = 1) -> None:
        """One rule per ``per_rule`` users (consecutive users share a rule), to every platform."""
        rules = -(-users // per_rule)
        draws = self.mean + self.std * self.rng.standard_normal((rules, len(self.mean)))
        draws = np.repeat(draws, per_rule, axis=0)[:users]
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

    def receive_statistics(self) -> np.ndarray:
        """One feedback platform's elite statistics, sent over the channel."""
        vector = self.channel.receive(SERVER, MessageKind.MODEL_PARAMETERS)
        if vector.shape != (1 + 2 * len(self.mean),):
            raise ValueError(f"expected {1 + 2 * len(self.mean)} statistics, got {vector.shape}")
        return vector.astype(np.float64)

    def update_from_statistics(
        self, total: np.ndarray, config: FedCEMConfig, *, noise_std: float = 0.0
    ) -> None:
        """The cross-entropy step from the feedback platforms' summed elite statistics
        (:meth:`SearchingPlatform.elite_statistics`), then the broadcast of the new rule.

        Without noise and with one feedback platform this is the step of protection "none" (up
        to float32); with several it moves towards their pooled elite. ``noise_std`` is the
        std of the noise in each summed statistic (public): the squared noisy mean overstates
        the squared elite mean by (noise_std / k)^2 on average, which is added back to the
        variance (without it the spread collapses to the floor under noise while the mean
        wanders); a noisy variance below zero counts as zero. The new rule is kept at the
        float32 precision it is broadcast in, so every party standardises the next
        population's draws alike.
        """
        size = len(self.mean)
        count, first, second = total[0], total[1 : 1 + size], total[1 + size :]
        if not count > 0:
            raise ValueError(f"the elite statistics count {count} users")
        shift = first / count
        second_moment = 1.0 + math.sqrt(2.0) * second / count
        variance = np.maximum(second_moment - shift**2 + (noise_std / count) ** 2, 0.0)
        a = config.smoothing
        mean = self.mean + a * self.std * shift
        std = np.maximum((1 - a) * self.std + a * self.std * np.sqrt(variance), config.min_std)
        self.mean = mean.astype(np.float32).astype(np.float64)
        self.std = std.astype(np.float32).astype(np.float64)
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
        if self.config.protection == "secure_sum" and len(self.feedback_platforms) < 2:
            raise ValueError(
                "protection='secure_sum' needs at least 2 platforms with feedback: the secure "
                "sum of one platform's elite statistics is those statistics, so the server "
                "would learn what protection='none' reveals; protection='dp' bounds what one "
                "platform's update reveals"
            )
        self.episode_length = int(episode_length or params.time_budget // len(self.names))
        if self.episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {self.episode_length}")
        channel = self.make_channel(kinds=PARAMETER_SHARING_KINDS)
        # One seed per party, the server's last: the server draws the rules, a platform its
        # noise (protection "dp"; unused otherwise).
        *platform_seeds, server_seed = self.rng.integers(2**31, size=len(self.names) + 1)
        self.platforms = {
            name: SearchingPlatform(
                name,
                channel=channel,
                config=self.config,
                params=params,
                learns=self.feedback[name],
                seed=int(seed),
            )
            for name, seed in zip(self.names, platform_seeds, strict=True)
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
        fraction, first = self.t / self.episode_length, self.t == 0
        if explore and first:  # a training episode starts: one rule per user, everywhere
            users = len(observations[self.names[0]]["candidates"])
            self.server.broadcast_draws(users, self.config.episodes_per_rule)
            for platform in self.platforms.values():
                platform.receive_draws(users)
        self.t = (self.t + 1) % self.episode_length
        return {
            name: platform.slates(
                np.asarray(observations[name]["candidates"]),
                fraction,
                explore=explore,
                # closed loop: the platform's own readings of the user (never another's)
                context=platform.context(observations[name].get("user"), first=first),
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
        metrics = {"search_updates": float(self.updates)}
        privacy = self.privacy()
        if privacy is not None:
            metrics["epsilon"] = privacy["epsilon"]
        return metrics

    def end_episode(self, episodes: int) -> None:
        moved = [platform.end_episode() for platform in self.platforms.values()]
        if any(moved):
            if self.config.protection == "none":
                self.server.aggregate()
            else:
                self.server.update_from_statistics(
                    self._statistics_sum(), self.config, noise_std=self._noise_std()
                )
            self.updates += 1
            self._receive_rule()
        self.t = 0
        super().end_episode(episodes)

    def _statistics_sum(self) -> np.ndarray:
        """The sum of the feedback platforms' elite statistics, as the server obtains it: by
        secure aggregation from two or more platforms (it sees masked uploads and their sum),
        over the channel from a single one."""
        senders = [self.platforms[name] for name in self.feedback_platforms]
        if len(senders) == 1:
            senders[0].send_statistics()
            return self.server.receive_statistics()
        from fedrec.federation.secagg import decode_fixed_point, encode_fixed_point, secure_sum

        words = [
            encode_fixed_point(
                p.take_statistics(), fraction_bits=FRACTION_BITS, num_clients=len(senders)
            )
            for p in senders
        ]
        result = secure_sum(words, round_id=self.updates)
        return decode_fixed_point(result.total, fraction_bits=FRACTION_BITS)

    def _noise_std(self) -> float:
        """Std of the noise in each summed elite statistic: every feedback platform adds its
        own (0 without DP)."""
        if self.config.protection != "dp":
            return 0.0
        scale = self.config.noise_multiplier * self.config.sensitivity
        return scale * math.sqrt(len(self.feedback_platforms))

    def privacy(self) -> dict[str, float] | None:
        """With ``protection="dp"``: (epsilon, delta) of the run's updates so far, for one user's
        episode returns on every feedback platform, by the RDP accountant of
        :mod:`fedrec.federation.privacy` (Opacus). Each update is a Gaussian mechanism on the
        elite sums with sensitivity ``2 clip_norm`` per platform (:attr:`FedCEMConfig.sensitivity`)
        and noise ``noise_multiplier`` times that at each of the P feedback platforms, so on the
        P platforms' sum a noise multiplier of ``noise_multiplier / sqrt(P)``; no subsampling
        (every user-episode of a population is in it). Composed over every update, which is
        the bound for a user who plays in every population; a user-episode that is in one
        population only (each user of the simulator is new every episode) pays one update's
        epsilon (``epsilon_per_update``). None without DP."""
        if self.config.protection != "dp":
            return None
        from fedrec.federation.privacy import epsilon

        z = self.config.noise_multiplier / math.sqrt(len(self.feedback_platforms))
        delta = self.config.delta
        return {
            "epsilon": epsilon(z, 1.0, self.updates, delta),
            "epsilon_per_update": epsilon(z, 1.0, 1, delta),
            "delta": delta,
            "updates": float(self.updates),
            "noise_multiplier": self.config.noise_multiplier,
        }

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
