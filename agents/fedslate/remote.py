"""FedSlate's parties in separate OS processes, the driver's view: :class:`RemoteParties` starts
them and gives the agent's orchestration proxies with the in-process objects' methods
(:class:`RemotePlatform`, :class:`RemoteServer`) and a channel that gathers the parties' traffic
(:class:`GatheredChannel`).

The other jobs are in their own modules, and their public names are importable from here too:
the party processes' side (the launcher, a party's control service, the allowed methods) in
:mod:`fedrec.agents.fedslate.party_host`; starting, calling and stopping the processes from the
driver (:class:`Launcher`, :class:`PartyProcess`, :class:`RemotePartyError`) in
:mod:`fedrec.agents.fedslate.party_processes`.

``FedSlateAgent(..., parties="processes")`` runs the server and each platform in its own
process. The driver starts a launcher with ``subprocess`` (``python -m
fedrec.agents.fedslate.party_host``); the launcher imports PyTorch and the parties' code once and
forks one process per party. Each party process holds its own
:class:`~fedrec.agents.fedslate.platform.Platform` or
:class:`~fedrec.agents.fedslate.server.FederatedServer` and its own
:class:`~fedrec.federation.channel.Channel`, so validation and byte counting happen where the
party is. Their messages go through a mailbox hosted by the server's process
(:mod:`fedrec.federation.mailbox`). The agent keeps the orchestration: it calls one party
at a time through a proxy (:class:`RemotePlatform`, :class:`RemoteServer`) with the same methods
as the in-process objects. A control call carries only what the env gives that party (its own
states, slates, rewards) and the protocol's step; a party runs only the methods listed in
:data:`PLATFORM_METHODS` / :data:`SERVER_METHODS`; everything is encoded without pickle.

The agent's channel (:class:`GatheredChannel`) sends nothing itself: at the end of every episode
(and for a ``state_dict``) it gathers the counters of the parties' channels, so the traffic table
is the in-process run's, byte for byte.

Processes bind to 127.0.0.1 on a port the OS picks (port 0), every call has a deadline, and the
processes are stopped by :meth:`RemoteParties.close` (also from the agent's ``close`` / ``with``
block, when the object is collected, and at interpreter exit). The launcher stops its parties
when its stdin closes (the driver closed it, or died) or when the driver dies (a parent-death
signal, :mod:`fedrec.federation.supervisor`), and a party is killed when its launcher dies.

**Keys.** Every call is authenticated (:mod:`fedrec.federation.grpc_auth`). Each party
makes its own control key after it is forked and tells it only to the driver, through the
launcher's stdout pipe: only the driver can call a party (``state_dict``, ``load_state_dict``,
any method). The server's mailbox makes one key per party and one for the driver when it is
initialised; the driver hands each platform its key in the platform's ``init`` call. A mailbox
key lets its party take only its own messages and send only as itself. No key is in argv, the
environment or a file.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedrec.agents.fedslate.config import FedSlateConfig
from fedrec.agents.fedslate.party_host import (
    HOST,
    LAUNCHER_READY,
    PARTY_SERVICE,
    PLATFORM_METHODS,
    READY,
    SERVER_METHODS,
    TOKEN_VARIABLE,
    main,
)
from fedrec.agents.fedslate.party_processes import (
    ERRORS,
    Launcher,
    PartyProcess,
    RemotePartyError,
    _stop_processes,
)
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.federation.channel import Channel, Traffic
from fedrec.federation.grpc_auth import DEFAULT_TIMEOUT_S, TLSFiles, require_grpc
from fedrec.federation.grpc_transport import GrpcTransport
from fedrec.federation.mailbox import DRIVER
from fedrec.federation.messages import SERVER

__all__ = [
    "ERRORS",
    "HOST",
    "LAUNCHER_READY",
    "PARTY_SERVICE",
    "PLATFORM_METHODS",
    "READY",
    "SERVER_METHODS",
    "TOKEN_VARIABLE",
    "GatheredChannel",
    "Launcher",
    "PartyProcess",
    "RemoteParties",
    "RemotePartyError",
    "RemotePlatform",
    "RemoteServer",
    "main",
]


class _Proxy:
    """Calls one party process; keeps the small status the party returns with every reply."""

    def __init__(self, process: PartyProcess, parties: RemoteParties) -> None:
        self._process, self._parties = process, parties
        self._status: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        return self._process.pid

    def _call(self, method: str, **kwargs: Any) -> Any:
        result, status = self._process.call(method, step=self._parties.step, **kwargs)
        self._status.update(status)
        return result

    @property
    def updates(self) -> int:
        """Optimiser steps the party has taken."""
        return int(self._status.get("updates", 0))

    def take_traffic(self) -> dict[str, dict[str, Any]]:
        """The party channel's counters since the last call (which resets them)."""
        return self._call("take_traffic")

    def sync_target(self) -> None:
        self._call("sync_target")

    def state_dict(self) -> dict[str, Any]:
        """The party's state, as the in-process object's (tensors come back as tensors)."""
        return self._call("state_dict")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._call("load_state_dict", state=dict(state))


class _ReplaySize:
    def __init__(self, proxy: RemotePlatform) -> None:
        self._proxy = proxy

    @property
    def size(self) -> int:
        return int(self._proxy._status.get("replay_size", 0))


class RemotePlatform(_Proxy):
    """A :class:`~fedrec.agents.fedslate.platform.Platform` in its own process: the methods the
    orchestration calls, each carrying only this platform's own data."""

    def __init__(self, process: PartyProcess, parties: RemoteParties, *, feedback: bool) -> None:
        super().__init__(process, parties)
        self.name, self.feedback = process.name, feedback
        self.replay = _ReplaySize(self)

    def send_q_values(self, state: np.ndarray) -> None:
        self._call("send_q_values", state=np.asarray(state))

    def choose(self, state: np.ndarray, epsilon: float) -> np.ndarray:
        return self._call("choose", state=np.asarray(state), epsilon=float(epsilon))

    def store(
        self,
        observations: Mapping[str, np.ndarray],
        slates: np.ndarray,
        next_observations: Mapping[str, np.ndarray],
        terminated: np.ndarray,
        reward: np.ndarray | None = None,
        *,
        burn_in: bool,
    ) -> None:
        self._call(
            "store",
            observations={k: np.asarray(v) for k, v in observations.items()},
            slates=np.asarray(slates),
            next_observations={k: np.asarray(v) for k, v in next_observations.items()},
            terminated=np.asarray(terminated),
            reward=None if reward is None else np.asarray(reward),
            burn_in=bool(burn_in),
        )

    def start_learning(self) -> None:
        self._call("start_learning")

    def begin_round(self, index: np.ndarray | None = None) -> None:
        self._call("begin_round", index=None if index is None else np.asarray(index))

    def send_target_q_values(self) -> None:
        self._call("send_target_q_values")

    def compute_label(self, *, send: bool) -> None:
        self._call("compute_label", send=bool(send))

    def send_fresh_q_values(self) -> None:
        self._call("send_fresh_q_values")

    @property
    def needs_fresh_q(self) -> bool:
        """As the party said in its last reply (every change of it happens in a call)."""
        return bool(self._status.get("needs_fresh_q", True))

    def send_loss_gradient(self) -> float:
        return float(self._call("send_loss_gradient"))

    def apply_gradient(self) -> None:
        self._call("apply_gradient")

    @property
    def last_values(self) -> np.ndarray | None:
        """The item values of the platform's last choice (diagnostics)."""
        return self._call("last_values")


class RemoteServer(_Proxy):
    """The :class:`~fedrec.agents.fedslate.server.FederatedServer` in its own process."""

    def serve(self, platforms: Sequence[str] | None = None) -> None:
        self._call("serve", platforms=None if platforms is None else list(platforms))

    def send_indices(self, size: int) -> None:
        self._call("send_indices", size=int(size))

    def serve_targets(self, receivers: Sequence[str]) -> None:
        self._call("serve_targets", receivers=list(receivers))

    def receive_q_values(self, senders: Sequence[str]) -> None:
        self._call("receive_q_values", senders=list(senders))

    def receive_label(self, sender: str) -> None:
        self._call("receive_label", sender=sender)

    def forward_label(self, source: str, receiver: str) -> None:
        self._call("forward_label", source=source, receiver=receiver)

    def send_federated(self, platform: str) -> None:
        self._call("send_federated", platform=platform)

    def apply_gradient(self) -> None:
        self._call("apply_gradient")

    def end_round(self) -> None:
        self._call("end_round")


class GatheredChannel(Channel):
    """The agent's view of the parties' channels: it sends nothing, and its counters are the
    sum of theirs (gathered at every :meth:`end_episode` and :meth:`state_dict`). Setting
    :attr:`step` stamps the step every later party call carries."""

    def __init__(
        self,
        platforms: Sequence[str],
        *,
        num_candidates: int,
        transport: GrpcTransport,
        parties: RemoteParties,
    ) -> None:
        self._parties = parties
        super().__init__(platforms, num_candidates=num_candidates, transport=transport)

    @property
    def step(self) -> int:  # type: ignore[override]
        return self._parties.step

    @step.setter
    def step(self, value: int) -> None:
        self._parties.step = int(value)

    def gather(self) -> None:
        """Add the parties' counters since the last gather to :attr:`current`."""
        for proxy in self._parties.proxies():
            for party, counters in proxy.take_traffic().items():
                self.current[party].add(Traffic(**counters))

    def end_episode(self, episodes: int = 1) -> None:
        self.gather()
        super().end_episode(episodes)

    def state_dict(self) -> dict:
        self.gather()
        return super().state_dict()

    def load_state_dict(self, state: dict) -> None:
        for proxy in self._parties.proxies():
            proxy.take_traffic()  # the loaded counters replace whatever the parties hold
        super().load_state_dict(state)

    def send(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the driver holds no party's channel: parties send from their process")

    def receive(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the driver holds no party's channel: parties receive in their process")


class RemoteParties:
    """The server and the platforms of a FedSlate agent, each in its own process.

    :param platforms: platform names in env order; ``feedback`` and ``state_dims`` per platform.
    :param seeds: one seed per platform, then the server's (as the in-process agent draws them).
    :param timeout_s: deadline of every call to a party (and of the parties' mailbox calls).
    :param startup_timeout_s: how long each process may take to start listening.
    :param tls: serve every party's gRPC with this certificate and key, and dial them trusting
        it (:class:`~fedrec.federation.grpc_transport.TLSFiles`); default: loopback without
        TLS (the calls are authenticated either way).
    """

    def __init__(
        self,
        *,
        platforms: Sequence[str],
        feedback: Mapping[str, bool],
        state_dims: Mapping[str, int],
        params: ChocKaleParams,
        config: FedSlateConfig,
        seeds: Sequence[int],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        startup_timeout_s: float = 120.0,
        tls: TLSFiles | None = None,
    ) -> None:
        require_grpc()
        import torch

        self.names = list(platforms)
        self.step = 0
        self._launchers: list[Launcher] = []
        self._processes: list[PartyProcess] = []
        self._closables: list[Any] = []
        self._finalizer = weakref.finalize(
            self, _stop_processes, self._launchers, self._processes, self._closables
        )
        try:
            launcher = Launcher()
            self._launchers.append(launcher)
            roles = {SERVER: "server"} | {name: "platform" for name in self.names}
            for name, role in roles.items():
                launcher.spawn(role, name, tls)
            ready = launcher.wait_ready(list(roles), startup_timeout_s)
            for name, (pid, port, key) in ready.items():
                self._processes.append(
                    PartyProcess(
                        name,
                        pid=pid,
                        port=port,
                        key=key,
                        timeout_s=timeout_s,
                        launcher=launcher,
                        tls=tls,
                    )
                )
            server, *platform_processes = self._processes
            common = {
                "platforms": self.names,
                "config": {
                    f.name: getattr(config, f.name) for f in dataclasses.fields(FedSlateConfig)
                },
                "params": {f.name: getattr(params, f.name) for f in dataclasses.fields(params)},
                "torch_threads": torch.get_num_threads(),
                "timeout_s": float(timeout_s),
            }
            (init, _) = server.call("init", seed=int(seeds[-1]), **common)
            keys = init["mailbox_keys"]
            tls_fields = None if tls is None else vars(tls)
            for i, (name, process) in enumerate(zip(self.names, platform_processes, strict=True)):
                process.call(
                    "init",
                    name=name,
                    feedback=bool(feedback[name]),
                    state_dim=int(state_dims[name]),
                    seed=int(seeds[i]),
                    mailbox=server.address,
                    mailbox_key=keys[name],
                    tls=tls_fields,
                    **common,
                )
            self.server = RemoteServer(server, self)
            self.platforms = {
                name: RemotePlatform(process, self, feedback=bool(feedback[name]))
                for name, process in zip(self.names, platform_processes, strict=True)
            }
            transport = GrpcTransport(
                server.address, key=keys[DRIVER], timeout_s=timeout_s, tls=tls
            )
            self._closables.append(transport)
            self.channel = GatheredChannel(
                self.names,
                num_candidates=params.num_candidates,
                transport=transport,
                parties=self,
            )
        except BaseException:
            self.close()
            raise

    def proxies(self) -> list[_Proxy]:
        """The server's proxy, then the platforms' in order."""
        return [self.server, *self.platforms.values()]

    @property
    def pids(self) -> dict[str, int]:
        """Process id of each party (empty once closed)."""
        return {p.name: p.pid for p in self._processes}

    @property
    def token(self) -> str | None:
        """The token in the environment of the launcher and every party (None once closed)."""
        return self._launchers[0].token if self._launchers else None

    @property
    def launcher_pid(self) -> int | None:
        """Process id of the launcher the parties were forked from (None once closed)."""
        return self._launchers[0].proc.pid if self._launchers else None

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Stop every party process (idempotent; also runs at interpreter exit)."""
        self._finalizer()

    def __enter__(self) -> RemoteParties:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    raise SystemExit(main())
