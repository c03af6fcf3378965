"""The wire format of fedrec's processes: encode a tree of plain data, arrays and tensors as
bytes without pickle, decode it back under limits, and put a FedSlate message on the wire.

:func:`dumps` / :func:`loads` encode a tree of ``None``, bools, ints, floats, strings, bytes,
lists, tuples, dicts, NumPy arrays and scalars and PyTorch tensors as a JSON header followed by
the arrays' raw bytes (dtype and shape in the header; plain numeric dtypes only). Decoding builds
data and never runs code: an object or structured dtype, a size that does not match, a header
nested deeper than :data:`MAX_DEPTH`, an integer longer than :data:`MAX_INT_DIGITS` digits, or a
malformed frame is refused with :class:`WireError`. A message is re-made with
:meth:`~fedrec.federation.messages.Message.make` where it is decoded
(:func:`decode_message`), and the receiving channel validates it again, so the contract holds on
every hop. :func:`message_route` reads a message frame's sender and receiver without decoding its
payload (what the mailbox routes on).
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
from typing import Any

import numpy as np

from fedrec.federation.messages import InvalidMessage, Message, MessageKind

#: The frame's first bytes: a format tag and version.
MAGIC = b"FRW1"
#: Deepest nesting of a frame's JSON header (lists and objects).
MAX_DEPTH = 64
#: Longest integer (decimal digits) in a frame's header: 2**256 has 78.
MAX_INT_DIGITS = 80


class WireError(ValueError):
    """A frame that is not a valid encoding (truncated, altered, or with a forbidden type)."""


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
