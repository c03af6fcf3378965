"""The one channel every FedSlate message goes through: validation, transport and accounting.

:class:`Channel` validates each message (:meth:`fedrec.federation.messages.Message.make`), hands
it to a :class:`Transport` and counts the bytes each party sends and receives. The transport is an
interface: :class:`InProcessTransport` (FIFO queues in this process) is the default, and a real
engine (gRPC, MPI, ...) implements the same two methods to carry the same messages.

Validation cannot be bypassed: a refused send raises before any counter changes or anything is
queued; a ``Message`` can only be built by ``Message.make``; and :meth:`Channel.receive`
validates what the transport hands over again (a message put on the transport directly, or
altered on the way, is refused with :class:`InvalidMessage` and dropped). Every message is limited
in size (``max_message_bytes``, ``max_message_rows``; defaults
:data:`~fedrec.federation.messages.DEFAULT_MAX_MESSAGE_BYTES` = 64 MiB and
:data:`~fedrec.federation.messages.DEFAULT_MAX_MESSAGE_ROWS` = 65,536 rows, far above the
largest message of the built-in FedSlate). A receive that expects another kind than the next
message's raises :class:`InvalidMessage` and leaves that message queued.

Accounting is per party and per episode: :meth:`Channel.end_episode` closes the current episode's
counters (``episodes`` user-episodes were played in it: a batched env plays several users at
once), and :meth:`Channel.table` prints mean bytes and messages per user-episode and party.
"""

from __future__ import annotations

import abc
import collections
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from fedrec.federation.messages import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_MESSAGE_ROWS,
    FEDSLATE_KINDS,
    SERVER,
    InvalidMessage,
    Message,
    MessageKind,
    PrivacyViolation,
)


class Transport(abc.ABC):
    """Carries validated messages from sender to receiver (in order per receiver)."""

    @abc.abstractmethod
    def deliver(self, message: Message) -> None:
        """Send ``message`` to ``message.receiver``."""

    @abc.abstractmethod
    def collect(self, receiver: str) -> Message:
        """The oldest undelivered message for ``receiver`` (raise ``LookupError`` if none)."""

    def pending(self) -> int:
        """Messages sent but not yet collected (0 for transports that cannot tell)."""
        return 0

    def peek(self, receiver: str) -> Message:
        """The oldest undelivered message for ``receiver``, left for :meth:`take` (raise
        ``LookupError`` if none).

        The default collects it and holds it back in this object until :meth:`take`; a
        transport that can look at its queue without removing from it overrides both.
        """
        held: dict[str, Message] = self.__dict__.setdefault("_held_back", {})
        if receiver not in held:
            held[receiver] = self.collect(receiver)
        return held[receiver]

    def take(self, receiver: str) -> Message:
        """Remove and return the oldest undelivered message for ``receiver`` (what
        :meth:`peek` returned)."""
        held: dict[str, Message] | None = self.__dict__.get("_held_back")
        if held and receiver in held:
            return held.pop(receiver)
        return self.collect(receiver)


class InProcessTransport(Transport):
    """FIFO queues per receiver, in this process (the default)."""

    def __init__(self) -> None:
        self.queues: dict[str, collections.deque[Message]] = collections.defaultdict(
            collections.deque
        )

    def deliver(self, message: Message) -> None:
        self.queues[message.receiver].append(message)

    def collect(self, receiver: str) -> Message:
        queue = self.queues.get(receiver)
        if not queue:
            raise LookupError(f"no message waiting for {receiver!r}")
        return queue.popleft()

    def peek(self, receiver: str) -> Message:
        queue = self.queues.get(receiver)
        if not queue:
            raise LookupError(f"no message waiting for {receiver!r}")
        return queue[0]

    def take(self, receiver: str) -> Message:
        return self.collect(receiver)

    def pending(self) -> int:
        return sum(len(q) for q in self.queues.values())


@dataclass
class Traffic:
    """Counters of one party."""

    sent_bytes: int = 0
    received_bytes: int = 0
    sent_messages: int = 0
    received_messages: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def add(self, other: Traffic) -> None:
        self.sent_bytes += other.sent_bytes
        self.received_bytes += other.received_bytes
        self.sent_messages += other.sent_messages
        self.received_messages += other.received_messages
        for kind, nbytes in other.by_kind.items():
            self.by_kind[kind] = self.by_kind.get(kind, 0) + nbytes


class Channel:
    """Validated, accounted messaging between the server and the named platforms.

    :param platforms: the platform parties (the server is :data:`SERVER`).
    :param num_candidates: N, checked against the trailing size of every Q-like payload.
    :param transport: how messages travel (default :class:`InProcessTransport`).
    :param max_message_bytes: the largest payload of one message, in bytes (default
        :data:`~fedrec.federation.messages.DEFAULT_MAX_MESSAGE_BYTES`, 64 MiB: 67x the largest
        message of the built-in FedSlate, Q values of 500 candidates for a 500-user evaluation
        batch; ``None``: no limit).
    :param max_message_rows: the most rows (users, replay rows) of one payload (default
        :data:`~fedrec.federation.messages.DEFAULT_MAX_MESSAGE_ROWS`, 65,536; ``None``: no
        limit). A larger message is refused with :class:`InvalidMessage`.
    :param kinds: the contract: the message kinds this channel carries (default
        :data:`~fedrec.federation.messages.FEDSLATE_KINDS`); any other kind is refused with
        :class:`PrivacyViolation`, when sent and again when received.
    """

    def __init__(
        self,
        platforms: Iterable[str],
        *,
        num_candidates: int,
        transport: Transport | None = None,
        max_message_bytes: int | None = DEFAULT_MAX_MESSAGE_BYTES,
        max_message_rows: int | None = DEFAULT_MAX_MESSAGE_ROWS,
        kinds: Iterable[MessageKind] = FEDSLATE_KINDS,
    ) -> None:
        self.kinds = frozenset(kinds)
        if not self.kinds or not all(isinstance(k, MessageKind) for k in self.kinds):
            raise ValueError(f"kinds must be a non-empty set of MessageKind, got {kinds!r}")
        self.platforms = list(platforms)
        self.parties = [SERVER, *self.platforms]
        self.num_candidates = int(num_candidates)
        for name, limit in (
            ("max_message_bytes", max_message_bytes),
            ("max_message_rows", max_message_rows),
        ):
            if limit is not None and (
                isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
            ):
                raise ValueError(f"{name} must be a positive int or None, got {limit!r}")
        self.max_message_bytes = max_message_bytes
        self.max_message_rows = max_message_rows
        self.transport = transport if transport is not None else InProcessTransport()
        self.current: dict[str, Traffic] = {p: Traffic() for p in self.parties}
        self.total: dict[str, Traffic] = {p: Traffic() for p in self.parties}
        self.episodes = 0
        self.closed_periods = 0
        self.step = 0

    def send(self, kind: MessageKind, sender: str, receiver: str, payload: object) -> Message:
        """Validate, account and deliver one message; returns it (already delivered)."""
        self._check_contract(kind)
        for who in (sender, receiver):
            if who not in self.current:
                raise InvalidMessage(f"{kind!r}: unknown party {who!r}; parties are {self.parties}")
        message = Message.make(
            kind,
            sender=sender,
            receiver=receiver,
            step=self.step,
            payload=payload,
            num_candidates=self.num_candidates,
            max_bytes=self.max_message_bytes,
            max_rows=self.max_message_rows,
        )
        out, into = self.current[sender], self.current[receiver]
        out.sent_bytes += message.nbytes
        out.sent_messages += 1
        out.by_kind[kind.name] = out.by_kind.get(kind.name, 0) + message.nbytes
        into.received_bytes += message.nbytes
        into.received_messages += 1
        self.transport.deliver(message)
        return message

    def receive(self, receiver: str, kind: MessageKind) -> np.ndarray:
        """The payload of ``receiver``'s next message, which must be of ``kind`` (read-only).

        The message is validated again here (whatever the transport): one that is not a valid
        :class:`Message` for ``receiver`` is taken off the queue and refused with
        :class:`InvalidMessage`. A valid message of another kind is refused with
        :class:`InvalidMessage` and stays queued (the protocol is out of order; nothing is lost).
        Raises ``LookupError`` when no message is waiting.
        """
        message = self.transport.peek(receiver)
        try:
            if not isinstance(message, Message):
                raise InvalidMessage(
                    f"{receiver!r} was handed a {type(message).__name__}, not a Message"
                )
            message.validate(
                num_candidates=self.num_candidates,
                max_bytes=self.max_message_bytes,
                max_rows=self.max_message_rows,
            )
            self._check_contract(message.kind)
            if message.receiver != receiver or message.sender not in self.current:
                raise InvalidMessage(
                    f"{receiver!r} was handed a message from {message.sender!r} to "
                    f"{message.receiver!r}"
                )
        except (InvalidMessage, PrivacyViolation):
            self.transport.take(receiver)  # drop the invalid message: it is never delivered
            raise
        if message.kind is not kind:
            raise InvalidMessage(
                f"{receiver!r} expected {kind.name} but the next message is {message.kind.name} "
                f"from {message.sender!r} (protocol out of order; it stays queued)"
            )
        self.transport.take(receiver)
        return message.payload

    def _check_contract(self, kind: object) -> None:
        if isinstance(kind, MessageKind) and kind not in self.kinds:
            allowed = sorted(k.name for k in self.kinds)
            raise PrivacyViolation(
                f"{kind.name} is outside this channel's contract; it carries only {allowed}"
            )

    def end_episode(self, episodes: int = 1) -> None:
        """Close the counters of one (batched) episode that played ``episodes`` user-episodes."""
        for party, traffic in self.current.items():
            self.total[party].add(traffic)
        self.current = {p: Traffic() for p in self.parties}
        self.episodes += int(episodes)
        self.closed_periods += 1

    def per_episode(self) -> dict[str, dict[str, float]]:
        """Mean bytes and messages per user-episode, per party, over the closed episodes."""
        n = max(self.episodes, 1)
        return {
            party: {
                "sent_bytes": t.sent_bytes / n,
                "received_bytes": t.received_bytes / n,
                "sent_messages": t.sent_messages / n,
                "received_messages": t.received_messages / n,
            }
            for party, t in self.total.items()
        }

    def table(self) -> str:
        """A plain-text table of :meth:`per_episode`."""
        rows = [f"{'party':<12} {'sent kB/ep':>12} {'recv kB/ep':>12} {'sent msg/ep':>12}"]
        for party, t in self.per_episode().items():
            rows.append(
                f"{party:<12} {t['sent_bytes'] / 1e3:>12.1f} {t['received_bytes'] / 1e3:>12.1f} "
                f"{t['sent_messages']:>12.1f}"
            )
        return "\n".join(rows)

    def state_dict(self) -> dict:
        def dump(traffic: dict[str, Traffic]) -> dict:
            return {p: vars(t).copy() | {"by_kind": dict(t.by_kind)} for p, t in traffic.items()}

        return {
            "current": dump(self.current),
            "total": dump(self.total),
            "episodes": self.episodes,
            "closed_periods": self.closed_periods,
            "step": self.step,
        }

    def load_state_dict(self, state: dict) -> None:
        self.current = {p: Traffic(**v) for p, v in state["current"].items()}
        self.total = {p: Traffic(**v) for p, v in state["total"].items()}
        self.episodes = int(state["episodes"])
        self.closed_periods = int(state["closed_periods"])
        self.step = int(state["step"])
