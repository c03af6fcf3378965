"""A :class:`~fedrec.federation.channel.Transport` over gRPC on loopback, and its wire codec.

FedSlate's parties can run as separate OS processes (``agents/fedslate/remote.py``). Their
messages then travel through a **mailbox**: per-receiver FIFO queues behind a small gRPC service
(:class:`MailboxServer`), hosted by the server party's process. Every FedSlate message goes
between a platform and the server, so the mailbox only ever holds what its host sends or
receives anyway. :class:`GrpcTransport` is the client a party's
:class:`~fedrec.federation.channel.Channel` uses; :class:`LocalMailboxTransport` is the same
transport for the process that hosts the mailbox (no network hop). Both have the semantics of
:class:`~fedrec.federation.channel.InProcessTransport`: ``deliver`` appends, ``collect`` /
``take`` remove the oldest message, ``peek`` leaves it queued, ``pending`` counts what is queued,
and an empty queue raises ``LookupError``.

The services use gRPC's generic handlers with raw-bytes methods, so no ``.proto`` file or
generated code is needed. **Nothing is pickled.** :func:`dumps` / :func:`loads` encode a tree of
``None``, bools, ints, floats, strings, bytes, lists, tuples, dicts, NumPy arrays and scalars and
PyTorch tensors as a JSON header followed by the arrays' raw bytes (dtype and shape in the
header; plain numeric dtypes only). Decoding builds data and never runs code: an object or
structured dtype, a size that does not match, or a malformed frame is refused with
:class:`WireError`. A message is re-made with
:meth:`~fedrec.federation.messages.Message.make` where it is decoded, and the receiving channel
validates it again, so the contract holds on every hop.

Every remote call has a deadline (``timeout_s``); a call that misses it raises ``TimeoutError``
naming the service, the method and the address.
"""

from __future__ import annotations

import collections
import json
import struct
import sys
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

import numpy as np

from fedrec.federation.channel import Transport
from fedrec.federation.messages import InvalidMessage, Message, MessageKind

try:
    import grpc
except ImportError:  # pragma: no cover - grpcio comes with the flower extra
    grpc = None

#: The frame's first bytes: a format tag and version.
MAGIC = b"FRW1"
#: Largest gRPC message (both ways) by default: above the channel's 64 MiB message limit, and
#: enough for a party's state_dict (replay included) at the built-in settings.
DEFAULT_MAX_GRPC_BYTES = 1 << 30
#: Default deadline of one remote call, in seconds.
DEFAULT_TIMEOUT_S = 60.0
MAILBOX_SERVICE = "fedrec.Mailbox"
#: The only interfaces a server here listens on.
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class WireError(ValueError):
    """A frame that is not a valid encoding (truncated, altered, or with a forbidden type)."""


def require_grpc() -> Any:
    """The ``grpc`` module, or an ``ImportError`` saying how to install it."""
    if grpc is None:
        raise ImportError("parties in separate processes need grpcio: pip install 'fedrec[flower]'")
    return grpc


# ---------------------------------------------------------------------- codec
def dumps(value: object) -> bytes:
    """Encode ``value`` (a tree of plain data, arrays and tensors) without pickle.

    Frame: ``MAGIC``, the header's length (uint32, little-endian), the JSON header
    ``{"tree": ..., "blobs": [sizes]}``, then the blobs. In the tree a JSON list is a list and
    every JSON object is tagged: ``{"o": {...}}`` a dict with str keys, ``{"d": [[k, v], ...]}``
    any other dict, ``{"t": [...]}`` a tuple, ``{"b": i}`` bytes (``i`` indexes the blobs), and
    ``{"a": [i, dtype, shape]}`` an ndarray (``"s"`` a NumPy scalar, ``"T"`` a torch tensor):
    its raw C-order bytes, of a plain numeric dtype only (bool, int, uint, float, complex).
    """
    blobs: list[bytes] = []
    tree = _encode(value, blobs)
    header = json.dumps({"tree": tree, "blobs": [len(b) for b in blobs]}).encode("utf-8")
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *blobs])


#: Array element kinds that cross a process: bool, signed/unsigned int, float, complex.
PLAIN_KINDS = frozenset("biufc")


def _array_node(tag: str, array: np.ndarray, blobs: list[bytes]) -> dict[str, list[Any]]:
    """An array as raw C-order bytes plus its dtype and shape in the header."""
    if array.dtype.kind not in PLAIN_KINDS or array.dtype.fields is not None:
        raise WireError(
            f"only plain numeric arrays cross a process, not dtype {array.dtype} (object and "
            "structured arrays are not data that loads without running code)"
        )
    blobs.append(np.ascontiguousarray(array).tobytes())
    return {tag: [len(blobs) - 1, array.dtype.str, list(array.shape)]}


def _encode(value: object, blobs: list[bytes]) -> object:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)) and type(value) in (int, float):
        return value
    if isinstance(value, np.ndarray):
        return _array_node("a", value, blobs)
    if isinstance(value, np.generic):
        return _array_node("s", np.asarray(value), blobs)
    if isinstance(value, bytes):
        blobs.append(bytes(value))
        return {"b": len(blobs) - 1}
    if isinstance(value, list):
        return [_encode(v, blobs) for v in value]
    if isinstance(value, tuple):
        return {"t": [_encode(v, blobs) for v in value]}
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {"o": {k: _encode(v, blobs) for k, v in value.items()}}
        return {"d": [[_encode(k, blobs), _encode(v, blobs)] for k, v in value.items()]}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _array_node("T", value.detach().cpu().numpy(), blobs)
    raise WireError(
        f"cannot encode {type(value).__name__}: only None, bool, int, float, str, bytes, "
        "list, tuple, dict, numpy arrays/scalars and torch tensors cross a process"
    )


def _split(data: bytes) -> tuple[dict[str, Any], memoryview, list[int]]:
    view = memoryview(data)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise WireError("not a fedrec wire frame (bad magic)")
    (size,) = struct.unpack("<I", view[4:8])
    if 8 + size > len(view):
        raise WireError("truncated frame header")
    try:
        header = json.loads(bytes(view[8 : 8 + size]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WireError(f"malformed frame header: {error}") from error
    if not isinstance(header, dict) or not isinstance(header.get("blobs"), list):
        raise WireError("malformed frame header: no blob table")
    sizes = header["blobs"]
    if not all(type(s) is int and s >= 0 for s in sizes):
        raise WireError("malformed frame header: bad blob sizes")
    if 8 + size + sum(sizes) != len(view):
        raise WireError(f"frame is {len(view)} bytes, its header announces {8 + size + sum(sizes)}")
    return header, view[8 + size :], sizes


def header_tree(data: bytes) -> object:
    """The JSON tree of a frame without decoding its blobs (what a mailbox routes on)."""
    return _split(data)[0].get("tree")


def loads(data: bytes) -> Any:
    """Decode a frame made by :func:`dumps`: JSON and raw numeric buffers, so it never runs code
    (no pickle); anything else raises :class:`WireError`."""
    header, body, sizes = _split(data)
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).tolist()

    def blob(index: object) -> memoryview:
        if type(index) is not int or not 0 <= index < len(sizes):
            raise WireError(f"blob index {index!r} out of range")
        return body[offsets[index] : offsets[index + 1]]

    def array(spec: object) -> np.ndarray:
        if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[1], str)):
            raise WireError(f"malformed array node {spec!r}")
        index, dtype_text, shape = spec
        try:
            dtype = np.dtype(dtype_text)
        except TypeError as error:
            raise WireError(f"unknown dtype {dtype_text!r}") from error
        if dtype.kind not in PLAIN_KINDS or dtype.fields is not None:
            raise WireError(f"refused dtype {dtype_text!r}: only plain numeric arrays load")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise WireError(f"malformed shape {shape!r}")
        data = blob(index)
        if len(data) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise WireError(f"blob {index} has {len(data)} bytes, not a {dtype} array {shape}")
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()

    def decode(node: object) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [decode(v) for v in node]
        if not isinstance(node, dict) or len(node) != 1:
            raise WireError(f"malformed node {str(node)[:80]}")
        ((tag, inner),) = node.items()
        if tag == "o" and isinstance(inner, dict):
            return {k: decode(v) for k, v in inner.items()}
        if tag == "d" and isinstance(inner, list):
            pairs = [decode(p) for p in inner]
            if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise WireError("malformed dict node")
            return {k: v for k, v in pairs}
        if tag == "t" and isinstance(inner, list):
            return tuple(decode(v) for v in inner)
        if tag == "a":
            return array(inner)
        if tag == "s":
            return array(inner)[()]
        if tag == "b":
            return bytes(blob(inner))
        if tag == "T":
            import torch

            return torch.from_numpy(array(inner))
        raise WireError(f"unknown node tag {tag!r}")

    return decode(header.get("tree"))


# ---------------------------------------------------------------------- messages on the wire
def encode_message(message: Message) -> bytes:
    """A validated :class:`Message` as a frame: its kind, parties, step and payload."""
    return dumps(
        {
            "kind": message.kind.value,
            "sender": message.sender,
            "receiver": message.receiver,
            "step": message.step,
            "payload": np.asarray(message.payload),
        }
    )


def decode_message(data: bytes) -> Message:
    """Re-make a :class:`Message` from a frame (validated by :meth:`Message.make`; the receiving
    channel validates it again against its own limits). Raises :class:`InvalidMessage`."""
    try:
        fields = loads(data)
        kind = MessageKind(fields["kind"])
        return Message.make(
            kind,
            sender=fields["sender"],
            receiver=fields["receiver"],
            step=fields["step"],
            payload=fields["payload"],
            max_bytes=None,
            max_rows=None,
        )
    except (WireError, KeyError, TypeError, ValueError) as error:
        if isinstance(error, InvalidMessage):
            raise
        raise InvalidMessage(f"a message on the wire is malformed: {error}") from error


def message_receiver(data: bytes) -> str:
    """The receiver named in a message frame's header (no payload is decoded)."""
    tree = header_tree(data)
    try:
        receiver = tree["o"]["receiver"]  # type: ignore[index]
    except (KeyError, TypeError) as error:
        raise WireError("a message frame without a receiver") from error
    if not isinstance(receiver, str):
        raise WireError("a message frame's receiver is not a string")
    return receiver


# ---------------------------------------------------------------------- the mailbox
class Mailbox:
    """Per-receiver FIFO queues of encoded messages, safe to use from several threads.

    Each queued frame gets an id, so a ``take`` after a ``peek`` removes the message that was
    peeked (and says so when another one is at the head)."""

    def __init__(self) -> None:
        self.queues: dict[str, collections.deque[tuple[int, bytes]]] = collections.defaultdict(
            collections.deque
        )
        self._next_id = 0
        self._ready = threading.Condition()

    def deliver(self, data: bytes) -> None:
        receiver = message_receiver(data)
        with self._ready:
            self.queues[receiver].append((self._next_id, data))
            self._next_id += 1
            self._ready.notify_all()

    def _head(self, receiver: str, wait_s: float) -> tuple[int, bytes]:
        with self._ready:
            if not self._ready.wait_for(lambda: bool(self.queues.get(receiver)), wait_s):
                raise LookupError(f"no message waiting for {receiver!r}")
            return self.queues[receiver][0]

    def peek(self, receiver: str, wait_s: float = 0.0) -> tuple[int, bytes]:
        return self._head(receiver, wait_s)

    def take(self, receiver: str, wait_s: float = 0.0) -> tuple[int, bytes]:
        with self._ready:
            self._head(receiver, wait_s)
            return self.queues[receiver].popleft()

    def pending(self) -> int:
        with self._ready:
            return sum(len(q) for q in self.queues.values())


def _grpc_options(max_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_bytes),
        ("grpc.max_receive_message_length", max_bytes),
    ]


def _unary(handler: Callable[[bytes, Any], bytes]) -> Any:
    """A raw-bytes unary method (no (de)serializers: requests and replies are bytes)."""
    return require_grpc().unary_unary_rpc_method_handler(handler)


class MailboxServer:
    """A gRPC server on loopback hosting a :class:`Mailbox` (and any extra generic services).

    :param host: the loopback interface to bind (any other is refused: nothing here has TLS or
        authentication); a ``port`` of 0 lets the OS pick a free one.
    :param services: extra ``{service name: {method: handler(request bytes, context) -> bytes}}``
        served on the same port (a party's control service).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        services: dict[str, dict[str, Callable[[bytes, Any], bytes]]] | None = None,
        max_message_bytes: int = DEFAULT_MAX_GRPC_BYTES,
        max_workers: int = 4,
        mailbox: bool = True,
    ) -> None:
        if host not in LOOPBACK:
            raise ValueError(
                f"host {host!r}: the mailbox has no TLS and no authentication, so it listens on "
                f"loopback only ({', '.join(LOOPBACK)})"
            )
        grpc_ = require_grpc()
        self.mailbox = Mailbox() if mailbox else None
        self.server = grpc_.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            options=_grpc_options(max_message_bytes),
        )
        handlers = dict(services or {})
        if self.mailbox is not None:
            handlers[MAILBOX_SERVICE] = self._mailbox_methods()
        for name, methods in handlers.items():
            generic = grpc_.method_handlers_generic_handler(
                name, {method: _unary(fn) for method, fn in methods.items()}
            )
            self.server.add_generic_rpc_handlers((generic,))
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise OSError(f"could not bind a gRPC server to {host}:{port}")
        self.address = f"{host}:{self.port}"
        self.server.start()

    def _mailbox_methods(self) -> dict[str, Callable[[bytes, Any], bytes]]:
        box = self.mailbox
        assert box is not None
        not_found = require_grpc().StatusCode.NOT_FOUND
        invalid = require_grpc().StatusCode.INVALID_ARGUMENT

        def guarded(fn: Callable[[dict[str, Any]], object]) -> Callable[[bytes, Any], bytes]:
            def handler(request: bytes, context: Any) -> bytes:
                try:
                    return dumps(fn(loads(request)))
                except LookupError as error:
                    context.abort(not_found, str(error))
                except (WireError, KeyError, TypeError) as error:
                    context.abort(invalid, f"bad mailbox request: {error}")
                raise AssertionError("unreachable")  # abort raises

            return handler

        def deliver(request: bytes, context: Any) -> bytes:
            try:
                box.deliver(request)
            except WireError as error:
                context.abort(invalid, f"undeliverable frame: {error}")
            return b""

        def take(r: dict[str, Any]) -> dict[str, Any]:
            ident, data = box.take(r["receiver"], r.get("wait_s", 0.0))
            return {"id": ident, "data": None if ident == r.get("id") else data}

        return {
            "Deliver": deliver,
            "Peek": guarded(
                lambda r: dict(
                    zip(("id", "data"), box.peek(r["receiver"], r.get("wait_s", 0.0)), strict=True)
                )
            ),
            "Take": guarded(take),
            "Pending": guarded(lambda r: box.pending()),
        }

    def stop(self, grace: float | None = 0.5) -> None:
        self.server.stop(grace).wait(5.0)


class LocalMailboxTransport(Transport):
    """The transport of the process that hosts the :class:`Mailbox`: the same frames, no hop."""

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox

    def deliver(self, message: Message) -> None:
        self.mailbox.deliver(encode_message(message))

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
    :param timeout_s: deadline of every call (``TimeoutError`` when missed).
    :param wait_s: how long ``collect`` / ``peek`` wait for a message before ``LookupError``
        (0, the default, is :class:`~fedrec.federation.channel.InProcessTransport`'s behaviour:
        FedSlate's orchestration sends before it asks anyone to receive).
    """

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        wait_s: float = 0.0,
        max_message_bytes: int = DEFAULT_MAX_GRPC_BYTES,
    ) -> None:
        grpc_ = require_grpc()
        self.address, self.timeout_s, self.wait_s = address, float(timeout_s), float(wait_s)
        self._channel = grpc_.insecure_channel(address, options=_grpc_options(max_message_bytes))
        self._methods = {
            name: self._channel.unary_unary(f"/{MAILBOX_SERVICE}/{name}")
            for name in ("Deliver", "Peek", "Take", "Pending")
        }
        self._peeked: dict[str, tuple[int, Message]] = {}

    def _call(self, method: str, request: bytes) -> bytes:
        return call_unary(
            self._methods[method],
            request,
            timeout_s=self.timeout_s + self.wait_s,
            what=f"mailbox {method} at {self.address}",
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

    def close(self) -> None:
        self._channel.close()


def call_unary(method: Any, request: bytes, *, timeout_s: float, what: str) -> bytes:
    """One unary call with a deadline; gRPC errors become ``TimeoutError`` (deadline),
    ``LookupError`` (not found), ``ConnectionError`` (unreachable) or ``RuntimeError``."""
    grpc_ = require_grpc()
    try:
        return method(request, timeout=timeout_s)
    except grpc_.RpcError as error:
        code, detail = error.code(), error.details()
        if code == grpc_.StatusCode.DEADLINE_EXCEEDED:
            raise TimeoutError(f"{what}: no answer within {timeout_s:.0f} s") from None
        if code == grpc_.StatusCode.NOT_FOUND:
            raise LookupError(detail) from None
        if code == grpc_.StatusCode.UNAVAILABLE:
            raise ConnectionError(f"{what}: unreachable ({detail})") from None
        if code == grpc_.StatusCode.INVALID_ARGUMENT:
            raise InvalidMessage(f"{what}: {detail}") from None
        raise RuntimeError(f"{what}: {code.name}: {detail}") from None
