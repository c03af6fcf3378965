"""A round's inputs, checked and encoded as the integers the protocols add.

Reals become two's-complement fixed point (:func:`encode_fixed_point`, :func:`decode_fixed_point`);
a client's vector is checked to be 1-d integers (:func:`client_words`, :func:`word_matrix`: a
float is refused, never cast); :class:`WordRows` holds all clients' plaintexts as rows of 64- and
32-bit segments; :func:`client_positions` checks the dropout sets a round is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from fedrec.federation.secagg.outcome import MalformedContribution


def encode_fixed_point(
    values: np.ndarray, *, fraction_bits: int, num_clients: int, word_bits: int = 64
) -> np.ndarray:
    """Reals as two's-complement integers ``round(x · 2^fraction_bits)`` in Z_{2^word_bits}
    (uint64 words, or uint32 words for ``word_bits=32``).

    :raises ValueError: for NaN or inf, or if a sum of ``num_clients`` such values could
        overflow 2^(word_bits − 1) (values are never clipped).
    """
    if word_bits not in (32, 64):
        raise ValueError(f"word_bits must be 32 or 64, got {word_bits}")
    values = np.asarray(values, dtype=np.float64)
    if not np.isfinite(values).all():
        raise ValueError("NaN or inf values cannot be encoded in fixed point")
    scaled = np.rint(values * 2.0**fraction_bits)
    limit = 2.0 ** (word_bits - 1) / max(num_clients, 1)
    if not np.all(np.abs(scaled) < limit):
        raise ValueError(
            f"fixed-point overflow: |x| up to {np.abs(values).max():.3g} with {fraction_bits} "
            f"fraction bits and {num_clients} clients exceeds 2^{word_bits - 1} (encodable: "
            f"|x| < {limit / 2.0**fraction_bits:.3g}); lower fraction_bits"
        )
    if word_bits == 32:
        return scaled.astype(np.int32).view(np.uint32)
    return scaled.astype(np.int64).view(np.uint64)


def decode_fixed_point(words: np.ndarray, *, fraction_bits: int) -> np.ndarray:
    """The reals (float64) of two's-complement fixed-point words (e.g. a sum): uint64 words,
    or uint32 words (32-bit fixed point)."""
    words = np.asarray(words)
    signed = np.int32 if words.dtype == np.uint32 else np.int64
    if words.dtype not in (np.uint32, np.uint64):
        words = words.astype(np.uint64)
    return words.view(signed).astype(np.float64) / 2.0**fraction_bits


def client_words(vector: object, position: int) -> np.ndarray:
    """Client ``position``'s input as uint64 words: a 1-d array of an integer dtype (signed
    values are taken modulo 2^64, i.e. two's complement). Anything else -- floats (never cast:
    encode reals with :func:`encode_fixed_point` first), bools, objects, other shapes -- raises
    :class:`MalformedContribution`."""
    if isinstance(vector, (list, tuple)) and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in vector
    ):  # Python ints, converted exactly (NumPy would make [0, 2**63] float64)
        if not all(-(2**63) <= int(x) < 2**64 for x in vector):
            raise MalformedContribution(
                f"client {position}: an integer outside [-2^63, 2^64) does not fit a 64-bit word"
            )
        return np.array([int(x) % 2**64 for x in vector], dtype=np.uint64)
    try:
        array = np.asarray(vector)
    except (ValueError, TypeError, OverflowError) as error:  # ragged or not array-like
        raise MalformedContribution(f"client {position}: input is not an array ({error})") from None
    if array.dtype.kind not in "iu":
        raise MalformedContribution(
            f"client {position}: input of dtype {array.dtype}; secure sums are exact sums of "
            "integers modulo 2^64 (encode reals in fixed point first, as MF-SecAvg does)"
        )
    if array.ndim != 1:
        raise MalformedContribution(
            f"client {position}: input must be a 1-d vector, got shape {array.shape}"
        )
    return array.astype(np.uint64)


#: The word widths a :class:`WordRows` segment may have: sums modulo 2^64 or 2^32.
WORD_DTYPES = {"<u8": np.dtype("<u8"), "<u4": np.dtype("<u4")}


@dataclass(frozen=True)
class WordRows:
    """n clients' integer plaintexts as the rows of one (n, B) byte buffer, each row a run of
    segments of 64-bit or 32-bit little-endian words (``layout``: (dtype, words) per segment,
    dtype "<u8" or "<u4"). A segment's sum is taken modulo 2^64 or 2^32.

    SecAgg+ masks a row with AES keystreams of B bytes, added segment by segment, so a part of
    the plaintext whose sum fits 32 bits costs half the mask bytes of 64-bit words (MF-SecAvg's
    item part, :func:`mf_secavg_rows`). One buffer for the whole round lets the rows be encoded
    and masked in place, without copies.
    """

    buffer: np.ndarray
    """(n, B) uint8, C-contiguous."""
    layout: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if any(dtype not in WORD_DTYPES or count < 0 for dtype, count in self.layout):
            raise ValueError(f"layout entries are ('<u8' or '<u4', words >= 0), got {self.layout}")
        buffer = self.buffer
        if (
            not isinstance(buffer, np.ndarray)
            or buffer.dtype != np.uint8
            or buffer.ndim != 2
            or not buffer.flags.c_contiguous
            or buffer.shape[1] != self.row_bytes(self.layout)
        ):
            raise ValueError("buffer must be a C-contiguous (n, B) uint8 array matching layout")

    @staticmethod
    def row_bytes(layout: Sequence[tuple[str, int]]) -> int:
        """Bytes of one row of ``layout``."""
        if any(str(dtype) not in WORD_DTYPES or int(count) < 0 for dtype, count in layout):
            raise ValueError(f"layout entries are ('<u8' or '<u4', words >= 0), got {layout}")
        return sum(WORD_DTYPES[str(dtype)].itemsize * int(count) for dtype, count in layout)

    @classmethod
    def zeros(cls, n: int, layout: Sequence[tuple[str, int]]) -> WordRows:
        layout = tuple((str(d), int(c)) for d, c in layout)
        return cls(np.zeros((n, cls.row_bytes(layout)), dtype=np.uint8), layout)

    @property
    def num_rows(self) -> int:
        return self.buffer.shape[0]

    @property
    def offsets(self) -> list[tuple[np.dtype, int, int]]:
        """(dtype, byte offset in a row, words) of each segment."""
        out, offset = [], 0
        for dtype, count in self.layout:
            out.append((WORD_DTYPES[dtype], offset, count))
            offset += WORD_DTYPES[dtype].itemsize * count
        return out

    def segments(self) -> list[np.ndarray]:
        """(n, words) views of each segment (writable when the buffer is)."""
        return [
            self.buffer[:, offset : offset + dtype.itemsize * count].view(dtype)
            for dtype, offset, count in self.offsets
        ]

    def unpack(self, row: np.ndarray) -> list[np.ndarray]:
        """The segments of one byte row (e.g. a sum) as word arrays (views)."""
        row = np.ascontiguousarray(row, dtype=np.uint8)
        return [row[o : o + d.itemsize * c].view(d) for d, o, c in self.offsets]

    def copy(self) -> WordRows:
        return WordRows(self.buffer.copy(), self.layout)

    def widened(self) -> np.ndarray:
        """The rows as (n, Σ words) uint64: every segment's words zero-extended (a sum of the
        widened rows, reduced modulo each segment's 2^bits, is the segments' sum)."""
        parts = [segment.astype(np.uint64) for segment in self.segments()]
        return np.concatenate(parts, axis=1) if parts else np.zeros((self.num_rows, 0), np.uint64)

    def narrowed(self, total: np.ndarray) -> np.ndarray:
        """The byte row of a sum of :meth:`widened` rows: each segment reduced to its width."""
        out, start = [], 0
        for dtype, _, count in self.offsets:
            out.append(np.asarray(total[start : start + count]).astype(dtype).view(np.uint8))
            start += count
        return np.concatenate(out) if out else np.zeros(0, np.uint8)


def client_positions(name: str, clients: Iterable[int], n: int) -> set[int]:
    """The distinct client positions in ``clients``, each checked to be an int in [0, n)."""
    chosen = set()
    for k in clients:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < n:
            raise ValueError(f"{name}: client positions must be ints in [0, {n}), got {k!r}")
        chosen.add(int(k))
    return chosen


def word_matrix(vectors: Sequence[object] | np.ndarray) -> np.ndarray:
    """The round's inputs as an (n, L) uint64 matrix (each row checked by :func:`client_words`;
    a 2-d integer array is taken as it is)."""
    if isinstance(vectors, np.ndarray) and vectors.ndim == 2 and vectors.dtype.kind in "iu":
        return np.ascontiguousarray(vectors.astype(np.uint64, copy=False))
    words = [client_words(v, k) for k, v in enumerate(vectors)]
    length = len(words[0]) if words else 0
    for k, w in enumerate(words):
        if len(w) != length:
            raise MalformedContribution(
                f"client {k}: input has {len(w)} words, the round's vectors have {length}"
            )
    return np.stack(words) if words else np.zeros((0, 0), dtype=np.uint64)
