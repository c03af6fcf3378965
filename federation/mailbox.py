"""The mailbox of a FedSlate run: per-receiver FIFO queues of encoded messages
(:class:`Mailbox`), with their limits and who may read and write what, and the gRPC server that
hosts it next to a party's own services (:class:`MailboxServer`).

Every FedSlate message goes between a platform and the server, so the mailbox, hosted by the
server party's process, only ever holds what its host sends or receives anyway. Its key table
maps each key to one party: a party may only take or peek at its own queue and only send as
itself, to another party of the run; the run's :data:`DRIVER` may only count what is queued.
**Limits.** The mailbox refuses frames above :data:`MAX_FRAME_BYTES` (the channel's 64 MiB
message limit plus the header), keeps at most :data:`MAX_QUEUED_BYTES` queued, and bounds a
client's wait to :data:`MAX_WAIT_S` (a non-finite or negative wait is refused).
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from fedrec.federation.grpc_auth import (
    DEFAULT_MAX_GRPC_BYTES,
    AuthenticationError,
    Handler,
    ServiceServer,
    TLSFiles,
    new_key,
)
from fedrec.federation.messages import DEFAULT_MAX_MESSAGE_BYTES
from fedrec.federation.wire import WireError, dumps, loads, message_route

#: The gRPC service name of the mailbox.
MAILBOX_SERVICE = "fedrec.Mailbox"
#: The identity of the run's driver at the mailbox: it may only count what is queued.
DRIVER = "driver"
#: Largest frame the mailbox takes: the channel's message limit plus room for the header.
MAX_FRAME_BYTES = DEFAULT_MAX_MESSAGE_BYTES + (1 << 20)
#: Largest total of queued frames (bytes) the mailbox holds.
MAX_QUEUED_BYTES = 4 * MAX_FRAME_BYTES
#: Longest wait (seconds) a client may ask the mailbox for; longer ones are cut to this.
MAX_WAIT_S = 10.0


def wait_seconds(value: object) -> float:
    """A client's requested wait, checked (finite, >= 0) and cut to :data:`MAX_WAIT_S`."""
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise WireError(f"wait_s must be a finite number >= 0, got {value!r}")
    return min(float(value), MAX_WAIT_S)


# ---------------------------------------------------------------------- the mailbox
class Mailbox:
    """Per-receiver FIFO queues of encoded messages, safe to use from several threads.

    Each queued frame gets an id, so a ``take`` after a ``peek`` removes the message that was
    peeked (and says so when another one is at the head). Until :meth:`open` names the run's
    parties, it takes nothing; then it takes frames only between two of them, of at most
    ``max_frame_bytes``, while the queues hold less than ``max_queued_bytes``.
    """

    def __init__(
        self,
        parties: Iterable[str] = (),
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self.queues: dict[str, collections.deque[tuple[int, bytes]]] = collections.defaultdict(
            collections.deque
        )
        self.parties: frozenset[str] = frozenset(parties)
        #: ``{key: identity}`` of the callers allowed over gRPC (see :meth:`open`)
        self.keys: dict[str, str] = {}
        self.max_frame_bytes, self.max_queued_bytes = int(max_frame_bytes), int(max_queued_bytes)
        self.queued_bytes = 0
        self._next_id = 0
        self._ready = threading.Condition()

    def open(self, parties: Iterable[str]) -> dict[str, str]:
        """Name the run's parties and make one key per party and one for :data:`DRIVER`;
        returns ``{identity: key}`` (hand each to its owner only)."""
        with self._ready:
            self.parties = frozenset(parties)
            issued = {who: new_key() for who in sorted(self.parties | {DRIVER})}
            self.keys.clear()
            self.keys.update({key: who for who, key in issued.items()})
            return issued

    def _check_receiver(self, receiver: object) -> str:
        if not isinstance(receiver, str) or receiver not in self.parties:
            raise WireError(f"{str(receiver)[:80]!r} is not a party of this run")
        return receiver

    def deliver(self, data: bytes, *, sender: str | None = None) -> None:
        """Queue ``data`` for its receiver; ``sender`` (a remote caller's identity) must be the
        frame's sender. Raises :class:`WireError` for a frame it does not take."""
        if len(data) > self.max_frame_bytes:
            raise WireError(
                f"a frame of {len(data)} bytes is above the mailbox's limit of "
                f"{self.max_frame_bytes} (the channel's message limit plus the header)"
            )
        named, receiver = message_route(data)
        self._check_receiver(receiver)
        self._check_receiver(named)
        if sender is not None and named != sender:
            raise AuthenticationError(f"{sender!r} may not send as {named!r}")
        if named == receiver:
            raise WireError(f"{named!r} sends a message to itself")
        with self._ready:
            if self.queued_bytes + len(data) > self.max_queued_bytes:
                raise WireError(
                    f"the mailbox holds {self.queued_bytes} bytes; {len(data)} more would pass "
                    f"its limit of {self.max_queued_bytes}"
                )
            self.queues[receiver].append((self._next_id, data))
            self.queued_bytes += len(data)
            self._next_id += 1
            self._ready.notify_all()

    def _head(self, receiver: str, wait_s: float) -> tuple[int, bytes]:
        self._check_receiver(receiver)
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self.queues.get(receiver)), wait_s):
                raise LookupError(f"no message waiting for {receiver!r}")
            return self.queues[receiver][0]

    def peek(self, receiver: str, wait_s: float = 0.0) -> tuple[int, bytes]:
        return self._head(receiver, wait_seconds(wait_s))

    def take(self, receiver: str, wait_s: float = 0.0) -> tuple[int, bytes]:
        with self._ready:
            self._head(receiver, wait_seconds(wait_s))
            ident, data = self.queues[receiver].popleft()
            self.queued_bytes -= len(data)
            return ident, data

    def pending(self) -> int:
        with self._ready:
            return sum(len(q) for q in self.queues.values())


class MailboxServer(ServiceServer):
    """A gRPC server hosting a :class:`Mailbox` and any extra services, every call authenticated.

    :param host: the interface to bind; without ``tls`` loopback only. A ``port`` of 0 lets the
        OS pick a free one.
    :param services: extra ``{service name: {method: handler(request, identity) -> bytes}}``
        served on the same port (a party's control service).
    :param keys: ``{service name: {key: identity}}``: who may call each extra service (a
        service without a table refuses every call). The mailbox's table is ``mailbox.keys``.
    :param mailbox: the :class:`Mailbox` to serve, or None for none.
    :param tls: serve TLS with this certificate and key (:class:`TLSFiles`).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        services: Mapping[str, Mapping[str, Handler]] | None = None,
        keys: Mapping[str, Mapping[str, str]] | None = None,
        mailbox: Mailbox | None = None,
        tls: TLSFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_GRPC_BYTES,
        max_workers: int = 8,
    ) -> None:
        self.mailbox = mailbox
        handlers = {name: dict(methods) for name, methods in (services or {}).items()}
        tables: dict[str, Mapping[str, str]] = dict(keys or {})
        if mailbox is not None:
            handlers[MAILBOX_SERVICE] = self._mailbox_methods(mailbox)
            tables[MAILBOX_SERVICE] = mailbox.keys  # the live table: open() fills it later
        super().__init__(
            host=host,
            port=port,
            services=handlers,
            keys=tables,
            tls=tls,
            max_message_bytes=max_message_bytes,
            max_workers=max_workers,
        )

    @staticmethod
    def _mailbox_methods(box: Mailbox) -> dict[str, Handler]:
        def own(request: dict[str, Any], who: str) -> str:
            receiver = request["receiver"]
            if receiver != who:
                raise AuthenticationError(f"{who!r} may not read {str(receiver)[:80]!r}'s queue")
            return receiver

        def deliver(request: bytes, who: str) -> bytes:
            box.deliver(request, sender=who)
            return b""

        def peek(request: bytes, who: str) -> bytes:
            r = loads(request)
            ident, data = box.peek(own(r, who), r.get("wait_s", 0.0))
            return dumps({"id": ident, "data": data})

        def take(request: bytes, who: str) -> bytes:
            r = loads(request)
            ident, data = box.take(own(r, who), r.get("wait_s", 0.0))
            return dumps({"id": ident, "data": None if ident == r.get("id") else data})

        return {
            "Deliver": deliver,
            "Peek": peek,
            "Take": take,
            "Pending": lambda request, who: dumps(box.pending()),
        }
