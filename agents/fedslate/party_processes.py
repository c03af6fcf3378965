"""The driver's side of FedSlate's party processes: start the launcher
(:mod:`fedrec.agents.fedslate.party_host`) and wait for its parties, call a party over gRPC with
its control key and a deadline (its error raised here under its own type), and stop them all.

:class:`Launcher` is the launcher process, :class:`PartyProcess` one party's process and the stub
the driver calls it through, and :func:`_stop_processes` ends a run's processes (closing the
launcher's stdin first, so it stops its parties; then SIGTERM / SIGKILL of whatever is left).
The proxies that give the orchestration the in-process objects' methods are in
:mod:`fedrec.agents.fedslate.remote`.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fedrec.agents.fedslate.party_host import HOST, PARTY_SERVICE, READY, TOKEN_VARIABLE
from fedrec.federation.grpc_auth import (
    KEY_HEADER,
    AuthenticationError,
    TLSFiles,
    call_unary,
    open_channel,
)
from fedrec.federation.messages import InvalidMessage, PrivacyViolation
from fedrec.federation.supervisor import alive, terminate
from fedrec.federation.wire import dumps, loads

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


class RemotePartyError(ChildProcessError, RuntimeError):
    """A party process failed in a way that has no matching exception here (or died). An
    ``OSError`` (``ChildProcessError``), so ``fedrec train`` reports it in one line."""


class Launcher:
    """The launcher process (``python -m fedrec.agents.fedslate.party_host``), spawned by the
    driver
    with ``subprocess``; it imports PyTorch and the parties' code once and forks each party from
    there (three imports of PyTorch, each party its own, would triple the start-up's CPU)."""

    def __init__(self) -> None:
        if not hasattr(os, "fork"):
            raise RuntimeError("parties in processes need os.fork (Linux or macOS)")
        self.log = tempfile.TemporaryFile()
        #: in the environment of the launcher and every party: finds them all (tests, ``ps e``)
        self.token = uuid.uuid4().hex
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fedrec.agents.fedslate.party_host"],
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
