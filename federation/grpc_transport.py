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

**Authentication.** Every call carries a key in its gRPC metadata (:data:`KEY_HEADER`), compared
with :func:`hmac.compare_digest` against the service's key table before the request is read; a
call without a valid key gets ``UNAUTHENTICATED`` (:class:`AuthenticationError` on the client).
The mailbox's table maps each key to one party: a party may only take or peek at its own queue
and only send as itself, to another party of the run. **Limits.** The mailbox refuses frames
above :data:`MAX_FRAME_BYTES` (the channel's 64 MiB message limit plus the header), keeps at most
:data:`MAX_QUEUED_BYTES` queued, and bounds a client's wait to :data:`MAX_WAIT_S` (a non-finite
or negative wait is refused). Decoding refuses a header nested deeper than :data:`MAX_DEPTH` or an
integer longer than :data:`MAX_INT_DIGITS` digits. **TLS** (:class:`TLSFiles`): a server with a
certificate and key may bind any interface; without TLS it listens on loopback only.
"""

from __future__ import annotations

import collections
import dataclasses
import hmac
import json
import math
import re
import secrets
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.federation.channel import Transport
from fedrec.federation.messages import (
    DEFAULT_MAX_MESSAGE_BYTES,
    InvalidMessage,
    Message,
    MessageKind,
)

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
#: The only interfaces a server without TLS listens on.
LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: The gRPC metadata entry that carries a caller's key.
KEY_HEADER = "x-fedrec-key"
#: The identity of the run's driver at the mailbox: it may only count what is queued.
DRIVER = "driver"
#: Largest frame the mailbox takes: the channel's message limit plus room for the header.
MAX_FRAME_BYTES = DEFAULT_MAX_MESSAGE_BYTES + (1 << 20)
#: Largest total of queued frames (bytes) the mailbox holds.
MAX_QUEUED_BYTES = 4 * MAX_FRAME_BYTES
#: Longest wait (seconds) a client may ask the mailbox for; longer ones are cut to this.
MAX_WAIT_S = 10.0
#: Deepest nesting of a frame's JSON header (lists and objects).
MAX_DEPTH = 64
#: Longest integer (decimal digits) in a frame's header: 2**256 has 78.
MAX_INT_DIGITS = 80


class WireError(ValueError):
    """A frame that is not a valid encoding (truncated, altered, or with a forbidden type)."""


class AuthenticationError(PermissionError):
    """A call without a valid key, or outside what its key allows."""


@dataclasses.dataclass(frozen=True)
class TLSFiles:
    """TLS for the gRPC services (parties on different hosts).

    :param cert_file: PEM certificate the servers present (its subject alternative names must
        name the host the clients dial, or set ``server_name``).
    :param key_file: PEM private key of ``cert_file`` (servers only).
    :param ca_file: PEM root certificate(s) the clients trust (default ``cert_file``: a
        self-signed certificate trusts itself).
    :param server_name: the name the clients check the certificate against, when it is not the
        dialled host (e.g. ``"localhost"`` for a certificate made for it).
    """

    cert_file: str
    key_file: str = ""
    ca_file: str = ""
    server_name: str = ""

    def server_credentials(self) -> Any:
        """``grpc.ssl_server_credentials`` of the certificate and key."""
        if not self.key_file:
            raise ValueError("TLS for a server needs key_file (the certificate's private key)")
        pair = (_read(self.key_file, "TLS key"), _read(self.cert_file, "TLS certificate"))
        return require_grpc().ssl_server_credentials([pair])

    def channel_credentials(self) -> Any:
        """``grpc.ssl_channel_credentials`` trusting ``ca_file`` (or the certificate)."""
        root = _read(self.ca_file or self.cert_file, "TLS root certificate")
        return require_grpc().ssl_channel_credentials(root_certificates=root)

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read the {what} {path!r}: {error.strerror}") from None


def new_key() -> str:
    """A fresh random key (256 bits, hex) for one caller of one run."""
    return secrets.token_hex(32)


def identify(context: Any, keys: Mapping[str, str]) -> str | None:
    """Whose key the call carries (``keys`` maps key -> identity), or None. Each key is compared
    in constant time (:func:`hmac.compare_digest`)."""
    given = next((v for k, v in context.invocation_metadata() if k == KEY_HEADER), None)
    if not isinstance(given, str):
        return None
    found = None
    for key, who in list(keys.items()):
        if hmac.compare_digest(key.encode(), given.encode()):
            found = who
    return found


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


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _json_depth(text: bytes) -> int:
    """The deepest nesting of lists and objects in JSON ``text`` (strings skipped)."""
    codes = np.frombuffer(_JSON_STRING.sub(b'""', text), dtype=np.uint8)
    if not len(codes):
        return 0
    opens = (codes == ord("[")) | (codes == ord("{"))
    closes = (codes == ord("]")) | (codes == ord("}"))
    return int(np.cumsum(opens.astype(np.int64) - closes).max(initial=0))


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise WireError(f"an integer of {len(text)} digits in a frame (at most {MAX_INT_DIGITS})")
    return int(text)


def _split(data: bytes) -> tuple[dict[str, Any], memoryview, list[int]]:
    view = memoryview(data)
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise WireError("not a fedrec wire frame (bad magic)")
    (size,) = struct.unpack("<I", view[4:8])
    if 8 + size > len(view):
        raise WireError("truncated frame header")
    text = bytes(view[8 : 8 + size])
    depth = _json_depth(text)
    if depth > MAX_DEPTH:
        raise WireError(f"frame header nested {depth} deep (at most {MAX_DEPTH})")
    try:
        header = json.loads(text.decode("utf-8"), parse_int=_parse_int)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
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
        if len(data) != math.prod(shape) * dtype.itemsize:  # Python ints: no overflow
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


def message_route(data: bytes) -> tuple[str, str]:
    """The sender and receiver named in a message frame's header (no payload is decoded)."""
    tree = header_tree(data)
    try:
        fields = tree["o"]  # type: ignore[index]
        sender, receiver = fields["sender"], fields["receiver"]
    except (KeyError, TypeError) as error:
        raise WireError("a message frame without a sender and a receiver") from error
    if not isinstance(sender, str) or not isinstance(receiver, str):
        raise WireError("a message frame's sender or receiver is not a string")
    return sender, receiver


def message_receiver(data: bytes) -> str:
    """The receiver named in a message frame's header (no payload is decoded)."""
    return message_route(data)[1]


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


def _grpc_options(max_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_bytes),
        ("grpc.max_receive_message_length", max_bytes),
    ]


#: ``(request bytes, caller identity) -> reply bytes``: a method of a service here.
Handler = Callable[[bytes, str], bytes]


class MailboxServer:
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
        if host not in LOOPBACK and tls is None:
            raise ValueError(
                f"host {host!r}: without TLS the services listen on loopback only "
                f"({', '.join(LOOPBACK)}); give tls=TLSFiles(cert_file, key_file)"
            )
        grpc_ = require_grpc()
        self.mailbox = mailbox
        handlers = {name: dict(methods) for name, methods in (services or {}).items()}
        tables: dict[str, Mapping[str, str]] = dict(keys or {})
        if mailbox is not None:
            handlers[MAILBOX_SERVICE] = self._mailbox_methods(mailbox)
            tables[MAILBOX_SERVICE] = mailbox.keys
        self.server = grpc_.server(
            futures.ThreadPoolExecutor(max_workers=max_workers),
            options=_grpc_options(max_message_bytes),
            interceptors=[_KeyCheck(tables)],
        )
        for name, methods in handlers.items():
            table = tables.get(name, {})
            generic = grpc_.method_handlers_generic_handler(
                name, {method: _unary(fn, table) for method, fn in methods.items()}
            )
            self.server.add_generic_rpc_handlers((generic,))
        address = f"{host}:{port}"
        if tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, tls.server_credentials())
        if not self.port:
            raise OSError(f"could not bind a gRPC server to {address}")
        self.address = f"{host}:{self.port}"
        self.server.start()

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

    def stop(self, grace: float | None = 0.5) -> None:
        self.server.stop(grace).wait(5.0)


class _KeyCheck:
    """A server interceptor that refuses a call without a valid key before any handler runs
    (its request is discarded undecoded)."""

    def __init__(self, tables: Mapping[str, Mapping[str, str]]) -> None:
        self.tables = tables

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        service = details.method.strip("/").split("/")[0]
        table = self.tables.get(service, {})
        given = next((v for k, v in details.invocation_metadata if k == KEY_HEADER), None)
        ok = isinstance(given, str) and any(
            hmac.compare_digest(key.encode(), given.encode()) for key in list(table)
        )
        return continuation(details) if ok else _REFUSE


def _refuse(request: bytes, context: Any) -> bytes:
    del request
    context.abort(require_grpc().StatusCode.UNAUTHENTICATED, "no valid fedrec key for this call")
    raise AssertionError("unreachable")  # abort raises


_REFUSE = (
    None
    if grpc is None
    else grpc.unary_unary_rpc_method_handler(
        _refuse, request_deserializer=lambda b: b"", response_serializer=None
    )
)


def _unary(handler: Handler, keys: Mapping[str, str]) -> Any:
    """A raw-bytes unary method that finds its caller's identity and maps errors to statuses."""
    grpc_ = require_grpc()
    codes = grpc_.StatusCode

    def method(request: bytes, context: Any) -> bytes:
        who = identify(context, keys)
        if who is None:
            context.abort(codes.UNAUTHENTICATED, "no valid fedrec key for this call")
        try:
            return handler(request, who)
        except AuthenticationError as error:
            context.abort(codes.PERMISSION_DENIED, str(error))
        except LookupError as error:
            context.abort(codes.NOT_FOUND, str(error))
        except (WireError, InvalidMessage, KeyError, TypeError) as error:
            context.abort(codes.INVALID_ARGUMENT, f"undeliverable or malformed request: {error}")
        raise AssertionError("unreachable")  # abort raises

    return grpc_.unary_unary_rpc_method_handler(method)


def open_channel(
    address: str, *, tls: TLSFiles | None = None, max_message_bytes: int = DEFAULT_MAX_GRPC_BYTES
) -> Any:
    """A gRPC channel to ``address`` (TLS when ``tls`` is given)."""
    grpc_ = require_grpc()
    options: list[tuple[str, Any]] = list(_grpc_options(max_message_bytes))
    if tls is None:
        return grpc_.insecure_channel(address, options=options)
    options += tls.channel_options()
    return grpc_.secure_channel(address, tls.channel_credentials(), options=options)


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


def call_unary(
    method: Any,
    request: bytes,
    *,
    timeout_s: float,
    what: str,
    metadata: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """One unary call with a deadline; gRPC errors become ``TimeoutError`` (deadline),
    ``LookupError`` (not found), ``ConnectionError`` (unreachable), :class:`AuthenticationError`
    (no valid key, or a call outside it), ``InvalidMessage`` (refused) or ``RuntimeError``."""
    grpc_ = require_grpc()
    try:
        return method(request, timeout=timeout_s, metadata=metadata)
    except grpc_.RpcError as error:
        code, detail = error.code(), error.details()
        if code == grpc_.StatusCode.DEADLINE_EXCEEDED:
            raise TimeoutError(f"{what}: no answer within {timeout_s:.0f} s") from None
        if code == grpc_.StatusCode.NOT_FOUND:
            raise LookupError(detail) from None
        if code == grpc_.StatusCode.UNAVAILABLE:
            raise ConnectionError(f"{what}: unreachable ({detail})") from None
        if code in (grpc_.StatusCode.UNAUTHENTICATED, grpc_.StatusCode.PERMISSION_DENIED):
            raise AuthenticationError(f"{what}: {detail}") from None
        if code == grpc_.StatusCode.INVALID_ARGUMENT:
            raise InvalidMessage(f"{what}: {detail}") from None
        raise RuntimeError(f"{what}: {code.name}: {detail}") from None
