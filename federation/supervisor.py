"""One supervisor for fedrec's child processes: start them so they die with fedrec, tell whether
they still run, stop them (grace, then kill), and stop them on SIGINT / SIGTERM / SIGHUP.

FedSlate's party processes (``agents/fedslate/remote.py``), a loopback Flower deployment
(``federation/flower_deploy.py``) and a Flower simulation (``federation/flower_common.py``) use
it, so they agree on what "alive" means (an exited process that its parent has not reaped yet,
a zombie, is dead) and on how a run is stopped.

* :func:`spawn` starts a command through a tiny exec shim (this file run as a script with
  ``python -I -S``, no fedrec import) that asks Linux for a *parent-death signal*
  (``prctl(PR_SET_PDEATHSIG)``) and then ``exec``\\ s the command: if fedrec is SIGKILLed, the
  kernel signals the child. :func:`die_with_parent` does the same from inside a Python child.
* :class:`Watchdog` is a separate small process holding a pipe from fedrec; when the pipe closes
  without a goodbye (fedrec died, even by SIGKILL) it stops every process it was told about and
  every process whose environment carries a given ``NAME=token`` mark (grandchildren that a
  parent-death signal does not reach: Flower's SuperExec and app processes, Ray's daemons) and
  every member of the process groups it was given, then removes the folders it was given.
* :func:`stop_on_signals` turns SIGINT / SIGTERM / SIGHUP into a :class:`Stopped` exception, so
  ``finally`` blocks stop the children and a command line reports one line instead of dying.

Everything here is the standard library only: the file runs as a script before anything else.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

#: ``prctl`` option that sets the signal a process gets when its parent dies (Linux).
PR_SET_PDEATHSIG = 1
#: The signals :func:`stop_on_signals` turns into :class:`Stopped`.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """The process got SIGINT, SIGTERM or SIGHUP inside :func:`stop_on_signals` (a
    ``KeyboardInterrupt``: no ``except Exception`` swallows it, and ``fedrec`` reports it as
    "interrupted")."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"stopped by {signal.Signals(self.signum).name}")

    @property
    def exit_code(self) -> int:
        """The shell's status for a death by this signal (128 + its number)."""
        return 128 + self.signum


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``signum`` to this process when the thread that started it exits
    (Linux ``PR_SET_PDEATHSIG``); if ``parent`` is already gone, signal ourselves now.

    Returns False where the platform has no ``prctl`` (macOS: rely on a :class:`Watchdog` or a
    pipe). The signal is sent when the *thread* that forked us exits, so a child of a
    short-lived thread should use a handled signal and check :func:`os.getppid` in the handler.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before the request: nobody will signal us
        os.kill(os.getpid(), signum)
    return True


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs. A zombie (exited, not yet reaped) does not; a process of
    another user does (it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:  # it went away between the two checks
        return False
    except (OSError, IndexError):  # no /proc (macOS): os.kill said it exists
        return True


def marked(variable: str, token: str) -> list[int]:
    """Pids of the live processes whose environment holds ``variable=token`` (Linux ``/proc``;
    an empty list elsewhere), this process excluded."""
    needle = f"{variable}={token}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):
            if needle in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
    return [pid for pid in found if pid != os.getpid() and alive(pid)]


def group_members(pgid: int) -> list[int]:
    """Pids of the live processes of process group ``pgid`` (Linux ``/proc``; elsewhere
    ``[pgid]`` while the group's leader runs), this process excluded."""
    if pgid <= 1:  # no real group of a child (0 would name our own)
        return []
    stats = list(Path("/proc").glob("[0-9]*/stat"))
    if not stats:
        return [pgid] if pgid != os.getpid() and alive(pgid) else []
    found = []
    for stat in stats:
        with contextlib.suppress(OSError, ValueError, IndexError):
            # after the command's closing parenthesis: state, ppid, pgrp
            if int(stat.read_bytes().rpartition(b")")[2].split()[2]) == pgid:
                found.append(int(stat.parent.name))
    return [pid for pid in found if pid != os.getpid() and alive(pid)]


def _reap(pids: Iterable[int]) -> None:
    """Collect the exit status of those of ``pids`` that are our exited children."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def terminate(
    pids: Iterable[int],
    *,
    grace_s: float,
    kill_wait_s: float = 5.0,
    also: Callable[[], Iterable[int]] | None = None,
) -> bool:
    """SIGTERM ``pids`` (and whatever ``also()`` lists at each step), then SIGKILL what is left
    after ``grace_s`` (a ``grace_s`` of 0 or less: SIGKILL at once). Returns whether everything
    is gone."""
    fixed = list(pids)

    def members() -> list[int]:
        extra = list(also()) if also is not None else []
        return sorted({pid for pid in [*fixed, *extra] if alive(pid)})

    steps = [(signal.SIGTERM, grace_s)] if grace_s > 0 else []
    for signum, wait in [*steps, (signal.SIGKILL, kill_wait_s)]:
        for pid in members():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait
        while True:
            _reap(fixed)
            if not members():
                return True
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
    return not members()


def spawn(
    command: Sequence[str], *, death_signal: int = signal.SIGTERM, **popen: object
) -> subprocess.Popen:
    """``subprocess.Popen(command, **popen)`` through the exec shim: the child gets
    ``death_signal`` when this process dies (Linux; elsewhere it is a plain start). The shim is
    this file run with ``python -I -S``; it never imports fedrec, so it costs milliseconds."""
    shim = [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "exec"]
    argv = [*shim, str(os.getpid()), str(int(death_signal)), "--", *command]
    return subprocess.Popen(argv, **popen)  # type: ignore[call-overload]


class Watchdog:
    """A small process that stops a run's processes if this one dies without saying goodbye.

    :param variable: with ``token``: the environment mark of the run's processes (see
        :func:`marked`); the watchdog is given them through its stdin, never argv or a file.
    :param grace_s: SIGTERM, then SIGKILL after this many seconds (0: SIGKILL at once).

    :meth:`watch` adds a pid, :meth:`watch_group` a process group, :meth:`remove` a folder to
    remove once they are stopped; :meth:`close` says goodbye (the processes were stopped by the
    caller) and waits for the watchdog to exit.
    """

    def __init__(self, variable: str = "", token: str = "", *, grace_s: float = 5.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).resolve()), "watch", str(grace_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the terminal's group does not reach it
            close_fds=True,
        )
        self._lock = threading.Lock()
        self._send(f"mark {variable} {token}" if variable and token else "nomark")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        with self._lock:
            self.proc.stdin.write(f"{line}\n".encode())
            self.proc.stdin.flush()

    def watch(self, pid: int) -> None:
        """Stop ``pid`` too if this process dies."""
        self._send(f"pid {int(pid)}")

    def watch_group(self, pgid: int) -> None:
        """Stop every process of group ``pgid`` too if this process dies (a child started in a
        session of its own, and what it started there)."""
        self._send(f"group {int(pgid)}")

    def remove(self, path: str | os.PathLike[str]) -> None:
        """Remove the folder ``path`` (once the processes are stopped) if this process dies."""
        self._send(f"remove {os.fsencode(Path(path).resolve()).hex()}")

    def close(self) -> None:
        """Goodbye: the watchdog exits without stopping anything (idempotent)."""
        stdin = self.proc.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                self._send("bye")
            with contextlib.suppress(OSError):
                stdin.close()
        try:
            self.proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5.0)


def _watch(grace_s: float) -> int:
    """The watchdog's loop (see :class:`Watchdog`): read commands until goodbye or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    variable = token = ""
    pids: list[int] = []
    groups: list[int] = []
    folders: list[str] = []
    for raw in sys.stdin.buffer:
        words = raw.decode("utf-8", "replace").split()
        if words[:1] == ["bye"]:
            return 0
        if words[:1] == ["mark"] and len(words) == 3:
            variable, token = words[1], words[2]
        elif words[:1] == ["pid"] and len(words) == 2 and words[1].isdigit():
            pids.append(int(words[1]))
        elif words[:1] == ["group"] and len(words) == 2 and words[1].isdigit():
            groups.append(int(words[1]))
        elif words[:1] == ["remove"] and len(words) == 2:
            with contextlib.suppress(ValueError):
                folders.append(os.fsdecode(bytes.fromhex(words[1])))
    # EOF without goodbye: the parent died (maybe by SIGKILL). Stop what it ran.

    def also() -> list[int]:
        found = marked(variable, token) if variable else []
        for pgid in groups:
            found += group_members(pgid)
        return found

    terminate(pids, grace_s=grace_s, also=also if variable or groups else None)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


@contextlib.contextmanager
def stop_on_signals(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Inside the block, SIGINT / SIGTERM / SIGHUP raise :class:`Stopped` (so ``finally``
    stops the children); the previous handlers come back after it. Outside the main thread,
    where Python cannot set handlers, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        del frame
        for sig in signals:  # a second signal while stopping must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def signals_ignored(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Ignore SIGINT / SIGTERM / SIGHUP inside the block (while children are being stopped);
    outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _exec(parent: int, signum: int, command: Sequence[str]) -> int:
    """The exec shim: parent-death signal, then become ``command``."""
    die_with_parent(parent, signum)
    try:
        os.execvp(command[0], list(command))
    except OSError as error:
        print(f"cannot start {command[0]}: {error.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - execvp does not return


def main(argv: Sequence[str] | None = None) -> int:
    """``python -I -S supervisor.py exec PARENT SIGNAL -- COMMAND...`` or ``... watch GRACE``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) >= 5 and args[0] == "exec" and args[3] == "--":
        return _exec(int(args[1]), int(args[2]), args[4:])
    if len(args) == 2 and args[0] == "watch":
        return _watch(float(args[1]))
    print("usage: supervisor.py exec PARENT SIGNAL -- COMMAND... | watch GRACE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
