"""FedSlate's parties in separate OS processes, talking over gRPC on loopback.

``FedSlateAgent(..., parties="processes")`` runs the server and each platform in its own
process. The driver starts a launcher with ``subprocess`` (``python -m
fedrec.agents.fedslate.remote``); the launcher imports PyTorch and the parties' code once and
forks one process per party. Each party process holds its own
:class:`~fedrec.agents.fedslate.platform.Platform` or
:class:`~fedrec.agents.fedslate.server.FederatedServer` and its own
:class:`~fedrec.federation.channel.Channel`, so validation and byte counting happen where the
party is. Their messages go through a mailbox hosted by the server's process
(:mod:`fedrec.federation.grpc_transport`). The agent keeps the orchestration: it calls one party
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

**Keys.** Every call is authenticated (:mod:`fedrec.federation.grpc_transport`). Each party
makes its own control key after it is forked and tells it only to the driver, through the
launcher's stdout pipe: only the driver can call a party (``state_dict``, ``load_state_dict``,
any method). The server's mailbox makes one key per party and one for the driver when it is
initialised; the driver hands each platform its key in the platform's ``init`` call. A mailbox
key lets its party take only its own messages and send only as itself. No key is in argv, the
environment or a file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedrec.agents.fedslate.config import FedSlateConfig
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.federation.channel import Channel, Traffic
from fedrec.federation.grpc_transport import (
    DEFAULT_TIMEOUT_S,
    DRIVER,
    KEY_HEADER,
    AuthenticationError,
    GrpcTransport,
    LocalMailboxTransport,
    Mailbox,
    MailboxServer,
    TLSFiles,
    call_unary,
    dumps,
    loads,
    new_key,
    open_channel,
    require_grpc,
)
from fedrec.federation.messages import SERVER, InvalidMessage, PrivacyViolation
from fedrec.federation.supervisor import alive, die_with_parent, terminate

PARTY_SERVICE = "fedrec.Party"
#: The line a party process prints on stdout once its gRPC server listens (name, pid, port and
#: its control key: the launcher's stdout is a pipe only the driver reads).
READY = "FEDREC_PARTY_READY"
#: The environment variable that marks the launcher and its parties (a token per agent).
TOKEN_VARIABLE = "FEDREC_PARTIES_TOKEN"
#: The line the launcher prints once it has imported the parties' code.
LAUNCHER_READY = "FEDREC_LAUNCHER_READY"
#: Loopback only: the parties never listen on another interface.
HOST = "127.0.0.1"
#: Exceptions a party's error is raised as in the driver (others: :class:`RemotePartyError`).
ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        PrivacyViolation,
        InvalidMessage,
        ValueError,
        TypeError,
        KeyError,
        LookupError,
        IndexError,
        RuntimeError,
        TimeoutError,
        AuthenticationError,
    )
}
#: What the driver may ask each role to do (the party side refuses anything else).
PLATFORM_METHODS = frozenset(
    {
        "send_q_values",
        "choose",
        "store",
        "start_learning",
        "sync_target",
        "begin_round",
        "send_target_q_values",
        "compute_label",
        "send_fresh_q_values",
        "send_loss_gradient",
        "apply_gradient",
        "state_dict",
        "load_state_dict",
    }
)
SERVER_METHODS = frozenset(
    {
        "serve",
        "send_indices",
        "serve_targets",
        "receive_q_values",
        "receive_label",
        "forward_label",
        "send_federated",
        "apply_gradient",
        "end_round",
        "sync_target",
        "state_dict",
        "load_state_dict",
    }
)


class RemotePartyError(ChildProcessError, RuntimeError):
    """A party process failed in a way that has no matching exception here (or died). An
    ``OSError`` (``ChildProcessError``), so ``fedrec train`` reports it in one line."""


# ====================================================================== party side
class _PartyHost:
    """What runs in a party process: builds the party on ``init`` and runs the driver's calls,
    one at a time, on it."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.party: Any = None
        self.channel: Channel | None = None
        self.mailbox: Any = None
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def handle(self, request: bytes, caller: str) -> bytes:
        """Run one driver call (the server let it through with the driver's key only)."""
        if caller != DRIVER:
            raise AuthenticationError(f"only the driver calls a party, not {caller!r}")
        with self.lock:
            try:
                call = loads(request)
                method, kwargs = call["method"], call["kwargs"]
                if self.channel is not None:
                    self.channel.step = int(call["step"])
                result = self._dispatch(method, kwargs)
                return dumps({"result": result, "status": self._status()})
            except Exception as error:  # reported to the driver, which raises it there
                return dumps({"error": [type(error).__name__, str(error)]})

    def _status(self) -> dict[str, Any]:
        party = self.party
        if party is None:
            return {}
        status = {"updates": int(party.updates)}
        if self.role == "platform":
            status |= {"needs_fresh_q": party.needs_fresh_q, "replay_size": party.replay.size}
        return status

    def _dispatch(self, method: str, kwargs: dict[str, Any]) -> Any:
        if method == "init":
            if self.party is not None:
                raise RuntimeError(f"the {self.role} party is already initialised")
            return self._init(**kwargs)
        if method == "shutdown":
            self.stopped.set()
            return None
        if method == "ping":
            return os.getpid()
        if self.party is None:
            raise RuntimeError(f"the {self.role} party is not initialised (call init first)")
        if method == "take_traffic":
            return self._take_traffic()
        if method == "last_values" and self.role == "platform":
            values = self.party.last_values
            return None if values is None else np.asarray(values)
        allowed = PLATFORM_METHODS if self.role == "platform" else SERVER_METHODS
        if method not in allowed:
            raise PrivacyViolation(f"a {self.role} party does not run {method!r}")
        return getattr(self.party, method)(**kwargs)

    def _take_traffic(self) -> dict[str, dict[str, Any]]:
        channel = self.channel
        assert channel is not None
        counters = {p: vars(t) | {"by_kind": dict(t.by_kind)} for p, t in channel.current.items()}
        channel.current = {p: Traffic() for p in channel.parties}
        return counters

    def _init(
        self,
        *,
        platforms: list[str],
        config: dict[str, Any],
        params: dict[str, Any],
        seed: int,
        torch_threads: int,
        timeout_s: float,
        name: str = SERVER,
        feedback: bool = False,
        state_dim: int = 0,
        mailbox: str = "",
        mailbox_key: str = "",
        tls: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        import torch

        from fedrec.agents.fedslate.platform import Platform
        from fedrec.agents.fedslate.server import FederatedServer

        torch.set_num_threads(int(torch_threads))
        fed_config = FedSlateConfig(**config)
        chock_params = ChocKaleParams(**params)
        keys: dict[str, str] = {}
        if self.role == "server":
            keys = self.mailbox.open([SERVER, *platforms])
            transport: Any = LocalMailboxTransport(self.mailbox, SERVER)
        else:
            transport = GrpcTransport(
                mailbox,
                key=mailbox_key,
                timeout_s=timeout_s,
                tls=None if tls is None else TLSFiles(**tls),
            )
        self.channel = Channel(
            platforms, num_candidates=chock_params.num_candidates, transport=transport
        )
        if self.role == "server":
            self.party = FederatedServer(
                platforms,
                num_candidates=chock_params.num_candidates,
                config=fed_config,
                channel=self.channel,
                seed=seed,
            )
        else:
            self.party = Platform(
                name,
                feedback=feedback,
                state_dim=state_dim,
                params=chock_params,
                config=fed_config,
                channel=self.channel,
                seed=seed,
            )
        return {"pid": os.getpid(), "mailbox_keys": keys}


def _run_party(role: str, name: str, launcher_pid: int, tls: TLSFiles | None) -> None:
    """A party process (forked by the launcher): make its control key, serve the control
    service (and, for the server, the mailbox) on a free loopback port, print the port and the
    key to the driver, and run until told to stop, or until the launcher is gone (the kernel
    kills it then: parent-death signal)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    die_with_parent(launcher_pid, signal.SIGKILL)
    host, key = _PartyHost(role), new_key()  # made after the fork: no other party has it
    server = MailboxServer(
        host=HOST,
        services={PARTY_SERVICE: {"Call": host.handle}},
        keys={PARTY_SERVICE: {key: DRIVER}},
        mailbox=Mailbox() if role == "server" else None,
        tls=tls,
    )
    host.mailbox = server.mailbox
    os.write(1, f"{READY} {name} {os.getpid()} {server.port} {key}\n".encode())
    while not host.stopped.wait(0.2):
        if os.getppid() != launcher_pid:  # the launcher died: nobody can reach us any more
            break
    server.stop(0.5)


def _launch(argv: Sequence[str] | None = None) -> None:
    """The launcher: import the parties' code once, then fork one process per JSON line
    ``{"role": ROLE, "name": NAME, "tls": {...} | null}`` read on stdin. When stdin closes
    (the driver closed it, or died) or the driver dies (parent-death signal) it stops its
    parties and exits."""
    parser = argparse.ArgumentParser(prog="python -m fedrec.agents.fedslate.remote")
    parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it stops us
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # parties that exit are reaped at once
    driver, children = os.getppid(), []

    def parent_died(signum: int, frame: object) -> None:
        # PR_SET_PDEATHSIG fires when the driver's *thread* that started us exits: act only
        # when the driver process itself is gone (we were re-parented).
        if os.getppid() != driver:
            terminate(children, grace_s=2.0)
            os._exit(1)

    signal.signal(signal.SIGUSR1, parent_died)
    die_with_parent(driver, signal.SIGUSR1)
    # PyTorch and the parties' code are imported (this module's imports); the first optimiser
    # imports torch._dynamo (seconds), so one is built here, once, for every fork. Nothing here
    # starts a thread: the launcher stays single-threaded, which keeps fork safe.
    import torch

    from fedrec.agents.fedslate.networks import _adam

    torch.set_num_threads(1)
    _adam([torch.zeros(1, requires_grad=True)], 1e-3)
    me = os.getpid()
    os.write(1, f"{LAUNCHER_READY}\n".encode())
    for line in sys.stdin:
        try:
            command = json.loads(line)
            role, name = command["role"], command["name"]
            tls = None if command.get("tls") is None else TLSFiles(**command["tls"])
            if role not in ("server", "platform") or not isinstance(name, str):
                raise ValueError(role)
        except (ValueError, KeyError, TypeError):
            print(f"launcher: ignored command {line.strip()[:200]!r}", file=sys.stderr, flush=True)
            continue
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _run_party(role, name, me, tls)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        children.append(pid)
    terminate(children, grace_s=5.0)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedrec.agents.fedslate.remote``: the launcher of the party processes."""
    _launch(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ====================================================================== driver side
class Launcher:
    """The launcher process (``python -m fedrec.agents.fedslate.remote``), spawned by the driver
    with ``subprocess``; it imports PyTorch and the parties' code once and forks each party from
    there (three imports of PyTorch, each party its own, would triple the start-up's CPU)."""

    def __init__(self) -> None:
        if not hasattr(os, "fork"):
            raise RuntimeError("parties in processes need os.fork (Linux or macOS)")
        self.log = tempfile.TemporaryFile()
        #: in the environment of the launcher and every party: finds them all (tests, ``ps e``)
        self.token = uuid.uuid4().hex
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fedrec.agents.fedslate.remote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            close_fds=True,
            env=os.environ | {TOKEN_VARIABLE: self.token},
        )
        self.ready = False  # every party asked for has started
        self._text = b""

    def stderr_tail(self, size: int = 2000) -> str:
        self.log.seek(0)
        return self.log.read()[-size:].decode("utf-8", "replace").strip()

    def log_note(self) -> str:
        tail = self.stderr_tail()
        return f"; the parties' stderr ends with:\n{tail}" if tail else ""

    def spawn(self, role: str, name: str, tls: TLSFiles | None = None) -> None:
        assert self.proc.stdin is not None
        command = {"role": role, "name": name, "tls": None if tls is None else vars(tls)}
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()

    def wait_ready(self, names: Sequence[str], timeout_s: float) -> dict[str, tuple[int, int, str]]:
        """``{name: (pid, port, control key)}`` of the named parties, once each has printed its
        port (a bounded wait)."""
        assert self.proc.stdout is not None
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + timeout_s
        while True:
            found = {}
            for line in self._text.decode("utf-8", "replace").splitlines(keepends=True):
                words = line.split()
                if line.endswith("\n") and len(words) == 5 and words[0] == READY:
                    found[words[1]] = (int(words[2]), int(words[3]), words[4])
            if all(name in found for name in names):
                self.ready = True
                return {name: found[name] for name in names}
            if self.proc.poll() is not None:
                raise RemotePartyError(
                    f"the party launcher exited during start-up (code {self.proc.returncode})"
                    f"{self.log_note()}"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [name for name in names if name not in found]
                raise TimeoutError(
                    f"party processes {missing} did not start within {timeout_s:.0f} s"
                    f"{self.log_note()}"
                )
            ready, _, _ = select.select([fd], [], [], min(left, 0.2))
            if ready:
                self._text += os.read(fd, 65536)


class PartyProcess:
    """One party's OS process (a child of the launcher) and the stub the driver calls it
    through."""

    def __init__(
        self,
        name: str,
        *,
        pid: int,
        port: int,
        key: str,
        timeout_s: float,
        launcher: Launcher,
        tls: TLSFiles | None = None,
    ) -> None:
        self.name, self.pid, self.timeout_s = name, pid, float(timeout_s)
        self.address = f"{HOST}:{int(port)}"
        self._launcher = launcher
        self._metadata = ((KEY_HEADER, key),)
        self._channel = open_channel(self.address, tls=tls)
        self._call = self._channel.unary_unary(f"/{PARTY_SERVICE}/Call")

    def alive(self) -> bool:
        return alive(self.pid)

    def call(self, method: str, *, step: int = 0, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Run ``method`` on the party; its exception is raised here, named after the party."""
        what = f"{self.name} ({method})"
        try:
            reply = loads(
                call_unary(
                    self._call,
                    dumps({"method": method, "step": int(step), "kwargs": kwargs}),
                    timeout_s=self.timeout_s,
                    what=what,
                    metadata=self._metadata,
                )
            )
        except (ConnectionError, TimeoutError, RuntimeError) as error:
            deadline = time.monotonic() + 1.0  # a reset may come just before the exit shows
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            if not self.alive():
                raise RemotePartyError(
                    f"{self.name}'s process (pid {self.pid}) exited during {method}"
                    f"{self._launcher.log_note()}"
                ) from error
            raise
        if "error" in reply:
            kind, text = reply["error"]
            raise ERRORS.get(kind, RemotePartyError)(f"{self.name}: {kind}: {text}")
        return reply["result"], reply["status"]

    def close(self) -> None:
        self._channel.close()


def _stop_processes(
    launchers: list[Launcher], processes: list[PartyProcess], closables: list[Any]
) -> None:
    """Close stdin of the launcher (it stops the parties and exits), wait for it, then kill
    whatever is left: the launcher, and any party that outlived it."""
    for closable in [*closables, *processes]:
        try:
            closable.close()
        except Exception:  # best effort: the processes go below whatever happens here
            pass
    pids = [party.pid for party in processes]
    for launcher in launchers:
        proc = launcher.proc
        if proc.stdin is not None and not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        # A ready launcher stops its parties on EOF; one still importing would first fork them.
        grace = 10.0 if launcher.ready else 0.0
        for stop, wait in ((None, grace), (proc.terminate, 2.0), (proc.kill, 5.0)):
            if stop is not None and proc.poll() is None:
                stop()
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        if proc.stdout is not None:
            proc.stdout.close()
        launcher.log.close()
    terminate(pids, grace_s=2.0)  # only if the launcher could not stop them
    launchers.clear()
    processes.clear()
    closables.clear()


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
