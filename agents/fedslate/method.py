"""FedSlate's protocol: the platforms and the server, who sends what and when."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from fedrec.agents.fedslate.config import FedSlateConfig, Observations
from fedrec.agents.fedslate.platform import Platform, platform_state
from fedrec.agents.fedslate.server import FederatedServer
from fedrec.agents.multi_platform import MultiPlatformAgent
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.federation.channel import Transport
from fedrec.federation.messages import PrivacyViolation

if TYPE_CHECKING:  # grpc_auth imports grpcio, an optional dependency only processes need
    from fedrec.federation.grpc_auth import TLSFiles

#: |item value| at or above this counts as saturated at a tanh head's bound of 1.
SATURATION = 0.99
#: Where the parties run: objects in this process, or one OS process each (gRPC on loopback).
PARTIES = ("in-process", "processes")


class FedSlateAgent(MultiPlatformAgent):
    """FedSlate and its labelled variants on the multi-platform agent interface.

    The K platforms and the server, and the protocol that runs them (acting and learning).

    The orchestration below passes no data between parties: each call tells one party to do
    its part, and whatever it needs from another party arrives through the channel.

    :param platforms: platform names in env order; ``feedback`` says which observe responses.
    :param state_dims: each platform's state size (:func:`platform_state`).
    :param parties: ``"in-process"`` (default) or ``"processes"``: the server and every platform
        in its own OS process, messages over gRPC on loopback, the same results and traffic
        (``agents/fedslate/remote.py``; federated methods only). Stop them with :meth:`close`
        or a ``with`` block.
    :param tls: with ``parties="processes"``: serve every party's gRPC with this certificate
        and key and dial them trusting it (:class:`~fedrec.federation.grpc_auth.TLSFiles`);
        default: loopback without TLS. Refused with in-process parties.
    """

    Config = FedSlateConfig

    def __init__(
        self,
        *,
        platforms: Sequence[str],
        feedback: Mapping[str, bool],
        state_dims: Mapping[str, int],
        params: ChocKaleParams,
        config: FedSlateConfig | None = None,
        seed: int = 0,
        transport: Transport | None = None,
        parties: Literal["in-process", "processes"] = "in-process",
        tls: TLSFiles | None = None,
    ) -> None:
        config = config if config is not None else FedSlateConfig()
        if parties not in PARTIES:
            raise ValueError(f"parties must be one of {PARTIES}, got {parties!r}")
        if parties == "processes" and not config.federated:
            raise ValueError(
                f"parties='processes' needs a federated method; {config.method!r} sends nothing "
                "between parties"
            )
        if parties == "processes" and transport is not None:
            raise ValueError("parties='processes' brings its own transport (gRPC); drop transport")
        if tls is not None and parties != "processes":
            raise ValueError(
                f"tls is for the party processes (parties='processes'), not parties={parties!r}"
            )
        super().__init__(
            platforms=platforms, feedback=feedback, params=params, config=config, seed=seed
        )
        if config.method == "fedslate_exp" and self.silent_platforms:
            raise ValueError(
                f"fedslate_exp needs feedback on every platform; {self.silent_platforms} have none"
            )
        if config.federated and self.silent_platforms and not self.feedback_platforms:
            raise ValueError("a platform without feedback needs a feedback platform's label")
        seeds = np.random.SeedSequence(seed).generate_state(len(self.names) + 1)
        #: the party processes (``parties="processes"``), else None
        self.remote = None
        if parties == "processes":
            from fedrec.agents.fedslate.remote import RemoteParties

            self.remote = RemoteParties(
                platforms=self.names,
                feedback=self.feedback,
                state_dims=state_dims,
                params=params,
                config=config,
                seeds=[int(s) for s in seeds],
                tls=tls,
            )
            self.channel, self.server = self.remote.channel, self.remote.server
            self.platforms = self.remote.platforms
        else:
            if config.federated:
                self.make_channel(transport)
            self.platforms = {
                name: Platform(
                    name,
                    feedback=self.feedback[name],
                    state_dim=int(state_dims[name]),
                    params=params,
                    config=config,
                    channel=self.channel,
                    seed=int(seeds[i]),
                )
                for i, name in enumerate(self.names)
            }
            self.server = (
                FederatedServer(
                    self.names,
                    num_candidates=params.num_candidates,
                    config=config,
                    channel=self.channel,
                    seed=int(seeds[-1]),
                )
                if config.federated
                else None
            )
        #: the label each platform without feedback learns from (the first feedback platform)
        self.label_source = self.feedback_platforms[0] if self.feedback_platforms else None
        self.transitions_seen = 0
        self.rounds = 0
        self.target_syncs = 0
        self._train_debt = 0
        self.last_loss: dict[str, float] = {}
        self._diagnostics: dict[str, np.ndarray] | None = None

    @classmethod
    def from_env(
        cls, env: Any, *, config: FedSlateConfig | None = None, seed: int = 0, **kwargs: Any
    ) -> FedSlateAgent:
        """Build for a :class:`~fedrec.envs.multi_platform.ChocKaleMultiPlatformBatchEnv`."""
        config = config if config is not None else FedSlateConfig()
        dims = {}
        for name in env.possible_agents:
            sample = {
                k: np.asarray(v)[None] for k, v in env.observation_spaces[name].sample().items()
            }
            dims[name] = platform_state(sample).shape[1]
        return cls(
            platforms=env.possible_agents,
            feedback=env.feedback,
            state_dims=dims,
            params=env.params,
            config=config,
            seed=seed,
            **kwargs,
        )

    def close(self) -> None:
        """Stop the party processes (``parties="processes"``; otherwise nothing to do)."""
        if self.remote is not None:
            self.remote.close()

    def __enter__(self) -> FedSlateAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ schedule
    @property
    def epsilon(self) -> float:
        c = self.config
        eps = c.epsilon_decay**self.transitions_seen
        return c.epsilon_end if eps < c.epsilon_floor else eps

    @property
    def learning(self) -> bool:
        return self.transitions_seen >= self.config.learning_starts

    # ------------------------------------------------------------------ acting
    def _slates(self, observations: Observations, epsilon: float) -> dict[str, np.ndarray]:
        states = {p: platform_state(observations[p]) for p in self.names}
        if self.channel is not None:
            self.channel.step = self.transitions_seen
            for p in self.names:
                self.platforms[p].send_q_values(states[p])
            self.server.serve()
        slates = {p: self.platforms[p].choose(states[p], epsilon) for p in self.names}
        if self._diagnostics is not None and epsilon == 0.0:
            self._record(states, slates)
        return slates

    # ------------------------------------------------------------------ diagnostics
    def start_diagnostics(self) -> None:
        """Count, over the greedy slates served from now on, how many item values sit at the tanh
        bound and how many slates equal the fixed top-x slate (read by :meth:`diagnostics`)."""
        self._diagnostics = {p: np.zeros(4) for p in self.names}

    def _record(self, states: Mapping[str, np.ndarray], slates: Mapping[str, np.ndarray]) -> None:
        n, size = self.params.num_candidates, self.params.slate_size
        for p in self.names:
            values = np.asarray(self.platforms[p].last_values, dtype=np.float64)
            features = states[p][:, 1 : 1 + n]
            top = np.sort(np.argsort(-features, axis=1, kind="stable")[:, :size], axis=1)
            equal = (np.sort(slates[p], axis=1) == top).all(axis=1)
            counts = self._diagnostics[p]
            counts += [(np.abs(values) >= SATURATION).sum(), values.size, equal.sum(), len(equal)]

    def diagnostics(self) -> dict[str, dict[str, float]]:
        """Per platform since :meth:`start_diagnostics`: ``top_x_slates`` (fraction of greedy
        slates equal, as sets, to the n largest-feature candidates) and, with tanh heads only,
        ``saturated`` (fraction of the item values a greedy slate was chosen on with |value| >=
        0.99, the bound; a linear head has none, and its values of about 10 would all count);
        the counting stops."""
        found = self._diagnostics or {}
        self._diagnostics = None
        tanh = self.config.head == "tanh"
        return {
            p: {"top_x_slates": c[2] / max(c[3], 1)}
            | ({"saturated": c[0] / max(c[1], 1)} if tanh else {})
            for p, c in found.items()
        }

    def explore(self, observations: Observations) -> dict[str, np.ndarray]:
        """Behaviour slates: greedy on federated values, an independent epsilon coin per platform."""
        return self._slates(observations, self.epsilon)

    def act(self, observations: Observations) -> dict[str, np.ndarray]:
        """Greedy slates (evaluation)."""
        return self._slates(observations, 0.0)

    # ------------------------------------------------------------------ learning
    def observe(
        self,
        observations: Observations,
        slates: Mapping[str, np.ndarray],
        rewards: Mapping[str, np.ndarray],
        next_observations: Observations,
        terminated: np.ndarray,
    ) -> dict[str, float]:
        """Store one joint step for U users and run the learning rounds it pays for.

        ``rewards`` holds the platforms *with feedback* only; a reward for a platform without
        feedback is refused (:class:`PrivacyViolation`)."""
        leaked = [p for p in rewards if not self.feedback.get(p, False)]
        if leaked:
            raise PrivacyViolation(f"rewards of platforms without feedback were passed: {leaked}")
        burn_in = not self.learning
        for p in self.names:
            self.platforms[p].store(
                observations[p],
                slates[p],
                next_observations[p],
                terminated,
                rewards.get(p) if self.feedback[p] else None,
                burn_in=burn_in,
            )
        before = self.transitions_seen
        self.transitions_seen += len(terminated)
        interval = self.config.target_update_interval
        syncs = self.transitions_seen // interval - before // interval
        if burn_in and self.learning:
            for platform in self.platforms.values():
                platform.start_learning()
            if self.server is not None:
                self.server.sync_target()
        if self.learning:
            self._train_debt += self.transitions_seen - max(before, self.config.learning_starts)
            while self._train_debt >= self.config.train_frequency:
                self._train_debt -= self.config.train_frequency
                self.learn_round()
        if syncs:
            self.sync_targets()
        return dict(self.last_loss)

    def sync_targets(self) -> None:
        for platform in self.platforms.values():
            platform.sync_target()
        if self.server is not None:
            self.server.sync_target()
        self.target_syncs += 1

    def learn_round(self) -> None:
        """One learning round: every local net updated once, F once per platform (docs/fedslate.md,
        "The official code's learning round")."""
        size = self.platforms[self.names[0]].replay.size
        if size < self.config.batch_size:
            return
        if self.server is None:
            self._local_round()
        else:
            self._federated_round(size)
        self.rounds += 1

    def _local_round(self) -> None:
        for p in self.feedback_platforms:  # a platform without feedback cannot learn alone
            platform = self.platforms[p]
            platform.begin_round()
            platform.compute_label(send=False)
            self.last_loss[p] = platform.local_update()

    def _federated_round(self, size: int) -> None:
        server, platforms = self.server, self.platforms
        self.channel.step = self.transitions_seen
        server.send_indices(size)
        for p in self.names:
            platforms[p].begin_round()
        # Labels of the feedback platforms, from F^- on every platform's target values at s'.
        for p in self.names:
            platforms[p].send_target_q_values()
        server.serve_targets(self.feedback_platforms)
        for p in self.feedback_platforms:
            platforms[p].compute_label(send=bool(self.silent_platforms) and p == self.label_source)
            if self.silent_platforms and p == self.label_source:
                server.receive_label(p)
        # Updates in order: feedback platforms ("A"), then those without feedback ("B").
        for p in self.feedback_platforms + self.silent_platforms:
            if not self.feedback[p]:
                server.forward_label(self.label_source, p)
            fresh = [name for name in self.names if platforms[name].needs_fresh_q]
            for name in fresh:
                platforms[name].send_fresh_q_values()
            server.receive_q_values(fresh)
            server.send_federated(p)
            self.last_loss[p] = platforms[p].send_loss_gradient()
            server.apply_gradient()
            platforms[p].apply_gradient()
        server.end_round()
        if self.channel.transport.pending():
            raise RuntimeError("protocol error: undelivered messages at the end of a round")

    # ------------------------------------------------------------------ bookkeeping
    def state_dict(self) -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(self.config),
            "platforms": {p: self.platforms[p].state_dict() for p in self.names},
            "server": self.server.state_dict() if self.server is not None else None,
            "channel": self.channel.state_dict() if self.channel is not None else None,
            "transitions_seen": self.transitions_seen,
            "rounds": self.rounds,
            "target_syncs": self.target_syncs,
            "train_debt": self._train_debt,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for p in self.names:
            self.platforms[p].load_state_dict(state["platforms"][p])
        if self.server is not None:
            self.server.load_state_dict(state["server"])
        if self.channel is not None:
            self.channel.load_state_dict(state["channel"])
        self.transitions_seen = int(state["transitions_seen"])
        self.rounds = int(state["rounds"])
        self.target_syncs = int(state["target_syncs"])
        self._train_debt = int(state["train_debt"])
