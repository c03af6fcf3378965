"""A :class:`~fedrec.federation.channel.Transport` over gRPC: the transport classes a FedSlate
party's :class:`~fedrec.federation.channel.Channel` sends through when the parties run as
separate OS processes (``agents/fedslate/remote.py``).

Their messages travel through a **mailbox** (:mod:`fedrec.federation.mailbox`): per-receiver FIFO
queues behind a small gRPC service, hosted by the server party's process.
:class:`GrpcTransport` is the client a party in another process uses; :class:`LocalMailboxTransport`
is the same transport for the process that hosts the mailbox (no network hop). Both have the
semantics of :class:`~fedrec.federation.channel.InProcessTransport`: ``deliver`` appends,
``collect`` / ``take`` remove the oldest message, ``peek`` leaves it queued, ``pending`` counts
what is queued, and an empty queue raises ``LookupError``.

The other jobs live in their own modules, and every public name of them is importable from here
too (the module's earlier API): the wire format, nothing pickled (:mod:`fedrec.federation.wire`),
the mailbox, its limits and its server (:mod:`fedrec.federation.mailbox`), and the authenticated
gRPC plumbing: keys, the key-checking interceptor, TLS, calls with deadlines
(:mod:`fedrec.federation.grpc_auth`).
"""

from __future__ import annotations

from fedrec.federation.channel import Transport
from fedrec.federation.grpc_auth import (
    DEFAULT_MAX_GRPC_BYTES,
    DEFAULT_TIMEOUT_S,
    KEY_HEADER,
    LOOPBACK,
    AuthenticationError,
    Handler,
    ServiceServer,
    TLSFiles,
    call_unary,
    grpc,
    identify,
    new_key,
    open_channel,
    require_grpc,
)
from fedrec.federation.mailbox import (
    DRIVER,
    MAILBOX_SERVICE,
    MAX_FRAME_BYTES,
    MAX_QUEUED_BYTES,
    MAX_WAIT_S,
    Mailbox,
    MailboxServer,
    wait_seconds,
)
from fedrec.federation.messages import InvalidMessage, Message
from fedrec.federation.wire import (
    MAGIC,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    PLAIN_KINDS,
    WireError,
    decode_message,
    dumps,
    encode_message,
    header_tree,
    loads,
    message_receiver,
    message_route,
)

__all__ = [
    "DEFAULT_MAX_GRPC_BYTES",
    "DEFAULT_TIMEOUT_S",
    "DRIVER",
    "KEY_HEADER",
    "LOOPBACK",
    "MAGIC",
    "MAILBOX_SERVICE",
    "MAX_DEPTH",
    "MAX_FRAME_BYTES",
    "MAX_INT_DIGITS",
    "MAX_QUEUED_BYTES",
    "MAX_WAIT_S",
    "PLAIN_KINDS",
    "AuthenticationError",
    "GrpcTransport",
    "Handler",
    "LocalMailboxTransport",
    "Mailbox",
    "MailboxServer",
    "ServiceServer",
    "TLSFiles",
    "WireError",
    "call_unary",
    "decode_message",
    "dumps",
    "encode_message",
    "grpc",
    "header_tree",
    "identify",
    "loads",
    "message_receiver",
    "message_route",
    "new_key",
    "open_channel",
    "require_grpc",
    "wait_seconds",
]


class LocalMailboxTransport(Transport):
    """The transport of the process that hosts the :class:`Mailbox`: the same frames, no hop
    (it sends as ``identity``, the host's party)."""

    def __init__(self, mailbox: Mailbox, identity: str | None = None) -> None:
        self.mailbox, self.identity = mailbox, identity

    def deliver(self, message: Message) -> None:
        self.mailbox.deliver(encode_message(message), sender=self.identity)

    def collect(self, receiver: str) -> Message:
        return decode_message(self.mailbox.take(receiver)[1])

    def peek(self, receiver: str) -> Message:
        try:
            return decode_message(self.mailbox.peek(receiver)[1])
        except InvalidMessage:
            self.mailbox.take(receiver)  # a malformed frame is dropped, never delivered
            raise

    def take(self, receiver: str) -> Message:
        return self.collect(receiver)

    def pending(self) -> int:
        return self.mailbox.pending()


class GrpcTransport(Transport):
    """A :class:`Mailbox` reached over gRPC: what a party in another process sends through.

    :param address: ``host:port`` of the :class:`MailboxServer`.
    :param key: this caller's key (from :meth:`Mailbox.open`), sent with every call.
    :param timeout_s: deadline of every call (``TimeoutError`` when missed).
    :param wait_s: how long ``collect`` / ``peek`` wait for a message before ``LookupError``
        (0, the default, is :class:`~fedrec.federation.channel.InProcessTransport`'s behaviour:
        FedSlate's orchestration sends before it asks anyone to receive; the mailbox cuts it to
        :data:`MAX_WAIT_S`).
    :param tls: dial with TLS, trusting ``tls``'s certificate (:class:`TLSFiles`).
    """

    def __init__(
        self,
        address: str,
        *,
        key: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        wait_s: float = 0.0,
        tls: TLSFiles | None = None,
        max_message_bytes: int = DEFAULT_MAX_GRPC_BYTES,
    ) -> None:
        self.address, self.timeout_s, self.wait_s = address, float(timeout_s), float(wait_s)
        self._channel = open_channel(address, tls=tls, max_message_bytes=max_message_bytes)
        self._metadata = ((KEY_HEADER, key),)
        self._methods = {
            name: self._channel.unary_unary(f"/{MAILBOX_SERVICE}/{name}")
            for name in ("Deliver", "Peek", "Take", "Pending")
        }
        self._peeked: dict[str, tuple[int, Message]] = {}

    def _call(self, method: str, request: bytes) -> bytes:
        return call_unary(
            self._methods[method],
            request,
            timeout_s=self.timeout_s + min(self.wait_s, MAX_WAIT_S),
            what=f"mailbox {method} at {self.address}",
            metadata=self._metadata,
        )

    def deliver(self, message: Message) -> None:
        self._call("Deliver", encode_message(message))

    def collect(self, receiver: str) -> Message:
        reply = loads(self._call("Take", dumps({"receiver": receiver, "wait_s": self.wait_s})))
        self._peeked.pop(receiver, None)
        return decode_message(reply["data"])

    def peek(self, receiver: str) -> Message:
        reply = loads(self._call("Peek", dumps({"receiver": receiver, "wait_s": self.wait_s})))
        try:
            message = decode_message(reply["data"])
        except InvalidMessage:
            self._call("Take", dumps({"receiver": receiver, "id": reply["id"]}))
            raise  # a malformed frame is dropped, never delivered
        self._peeked[receiver] = (reply["id"], message)
        return message

    def take(self, receiver: str) -> Message:
        ident, message = self._peeked.pop(receiver, (None, None))
        reply = loads(self._call("Take", dumps({"receiver": receiver, "id": ident})))
        if reply["data"] is None:  # the head was the message peeked: no payload came back
            assert message is not None
            return message
        return decode_message(reply["data"])

    def pending(self) -> int:
        return int(loads(self._call("Pending", dumps({}))))

    def deliver_raw(self, data: bytes) -> None:
        """Put a frame on the mailbox as is (tests: what a tampered or hostile sender does)."""
        self._call("Deliver", data)

    def request_raw(self, method: str, request: bytes) -> bytes:
        """Call a mailbox method with a hand-made request (tests: what a hostile client does)."""
        return self._call(method, request)

    def close(self) -> None:
        self._channel.close()
