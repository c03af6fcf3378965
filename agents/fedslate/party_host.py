"""The party side of FedSlate's parties in separate OS processes: the launcher, which forks one
process per party, and what runs in a party process (its control service and, in the server's
process, the mailbox).

The driver (:mod:`fedrec.agents.fedslate.remote`) starts the launcher with ``subprocess``
(``python -m fedrec.agents.fedslate.party_host``); the launcher imports PyTorch and the parties'
code once and forks one process per JSON line it reads on stdin. Each party process makes its own
control key after the fork, serves its control service (:data:`PARTY_SERVICE`) on a free
loopback port, prints the port and the key on the launcher's stdout (a pipe only the driver
reads), builds its :class:`~fedrec.agents.fedslate.platform.Platform` or
:class:`~fedrec.agents.fedslate.server.FederatedServer` and its own
:class:`~fedrec.federation.channel.Channel` on ``init``, and runs only the methods listed in
:data:`PLATFORM_METHODS` / :data:`SERVER_METHODS`, one call at a time, for the driver only.

The launcher stops its parties when its stdin closes (the driver closed it, or died) or when the
driver dies (a parent-death signal, :mod:`fedrec.federation.supervisor`), and a party is killed
when its launcher dies.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedrec.agents.fedslate.config import FedSlateConfig
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.federation.channel import Channel, Traffic
from fedrec.federation.grpc_auth import AuthenticationError, TLSFiles, new_key
from fedrec.federation.grpc_transport import GrpcTransport, LocalMailboxTransport
from fedrec.federation.mailbox import DRIVER, Mailbox, MailboxServer
from fedrec.federation.messages import SERVER, PrivacyViolation
from fedrec.federation.supervisor import die_with_parent, terminate
from fedrec.federation.wire import dumps, loads

#: The gRPC service of a party process (one method, ``Call``; the driver's key only).
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
    parser = argparse.ArgumentParser(prog="python -m fedrec.agents.fedslate.party_host")
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
    """``python -m fedrec.agents.fedslate.party_host``: the launcher of the party processes."""
    _launch(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
