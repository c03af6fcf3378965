"""MF-SecAvg: MF-FedAvg computed by secure aggregation, so the server only sees masked uploads.

Two protocols compute the same exact sum. :class:`MFSecAvg` uses **SecAgg+** by default
(:mod:`fedrec.federation.secagg_plus`: masks and shares only between neighbours of a sparse
random graph, long-term pair keys, AES masks; docs/secure_aggregation.md), sized by a
bounded-fraction threat model. This module holds the **complete-graph protocol** it builds on
(``MFSecAvg(graph="complete", key_reuse=False)``, and :func:`secure_sum`'s default): every pair
of a round's clients masks, with fresh keys every round and a global threshold, which costs
O(n^2) key agreements and PRG streams and O(n^3) secret-sharing work per round.

The complete-graph protocol is the semi-honest version of Bonawitz et al., "Practical Secure
Aggregation for Privacy-Preserving Machine Learning" (CCS 2017), with its dropout recovery:

0. **AdvertiseKeys.** Every client k of the round makes two fresh X25519 key pairs, (c_k) for
   encrypting shares and (s_k) for masks, and sends the public halves; the server relays them.
1. **ShareKeys.** k draws a random 32-byte self-mask seed b_k and Shamir-shares (threshold t) both
   b_k and its mask private key s_k^SK among the round's clients. Each share is encrypted with
   ChaCha20-Poly1305 under HKDF(X25519(c_k, c_j)) and relayed by the server, who cannot read it.
2. **MaskedInputCollection.** k encodes its plaintext vector x_k in fixed point in Z_{2^64} and
   uploads y_k = x_k + PRG(b_k) + Σ_{j>k} PRG(s_kj) − Σ_{j<k} PRG(s_kj) (mod 2^64), where
   s_kj = HKDF(X25519(s_k, s_j), round, pair) and PRG is the ChaCha20 keystream. A single y_k
   is uniformly distributed whatever x_k is, zero entries included.
3. **Unmasking.** The server announces the survivors U3 (whose y_k arrived) and the dropped
   clients. Each responding survivor sends its share of b_k for every survivor and of s_d^SK for
   every dropped d (never both for one client). With t shares the server rebuilds them, removes
   the survivors' self masks and the dropped clients' dangling pairwise masks, and is left with
   exactly Σ_{k∈U3} x_k. With fewer than t survivors or responders it **aborts the round**
   (:class:`SecAggAborted`): the global model is kept, never a wrong aggregate.

Clients may drop out at every stage (:func:`secure_sum`'s ``dropped_before_keys``,
``dropped_before_sharing``, ``dropped_after_sharing`` and ``silent_in_unmasking``): the result is
the exact sum of the survivors' inputs, or, with fewer than t clients left at any stage, the
abort. A malformed contribution -- a vector that is not a 1-d integer array of the round's length
(floats are refused, never cast), or for MF-SecAvg an update with NaN/inf, the wrong shape or
dtype, or values outside the fixed-point range -- aborts the round too
(:class:`MalformedContribution`, a :class:`SecAggAborted`), before any key is made.

The MF-SecAvg plaintext of client k (docs/fedncf.md §4) is two segments of one
:class:`WordRows` row: 64-bit words ``[n_k θ_k | n_k]`` and, in 32-bit words by default,
``[d_k | MP_k]``, where d_k = rint(Q_k · 2^f) − rint(Q · 2^f) on the rows k touched (zero
elsewhere; Q is the global table, which the server knows) and MP_k is packed four 0/1 flags to
a word. The server obtains Σ n_k θ_k, N, the per-item sums Σ d_k and the per-item counts c_i,
and nothing per client; it decodes Q[i] ← (rint(Q[i] 2^f) + Σ d_k[i] / c_i) / 2^f. Fixed
point: the network part is scaled by 2^fraction_bits; the item deltas by 2^f with
f = :func:`item_fraction_bits` (``fraction_bits`` capped so that n deltas below ``delta_bound``
cannot wrap 32 bits: f = 23 for 20 clients); integers (n_k, MP_k) are sent as they are. Sums
are exact modulo 2^64 and 2^32, so the secure aggregate equals MF-FedAvg up to the rounding of
each client's values (≤ 2^-(f+1) per item value, ≤ C · 2^-(fraction_bits+1) per network
weight). A value outside the encodable range is never clipped: the round aborts with a
:class:`MalformedContribution` naming the client and the part. The quantisation happens in
:func:`mf_secavg_vector` (the per-client reference, through :func:`encode_fixed_point`) and
:func:`mf_secavg_rows` (all clients at once, the same bytes); :func:`secure_sum` itself only
adds integers.
"""

from __future__ import annotations

import hmac
import math
import secrets
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedrec.federation.aggregators import Aggregator, ClientUpdates

if TYPE_CHECKING:
    from fedrec.federation.secagg_plus import KeyDirectory, ThreatModel

#: Shamir's field: the Mersenne prime 2^521 − 1 (larger than the 256-bit secrets shared).
FIELD_PRIME = 2**521 - 1
_RAW = serialization.Encoding.Raw
_WORD_BYTES = 8


class SecAggAborted(RuntimeError):
    """The round was aborted: too few clients survived to unmask the sum, or a client's
    contribution was malformed (no aggregate; the caller keeps its global model)."""


class MalformedContribution(SecAggAborted):
    """A client's input cannot enter the secure sum (wrong dtype or shape, NaN/inf, out of the
    fixed-point range): the round is aborted before it starts."""


# ------------------------------------------------------------------------------------------------
# Primitives


def shamir_split(secret: int, *, num_shares: int, threshold: int) -> list[tuple[int, int]]:
    """``num_shares`` Shamir shares (x = 1..n) of ``secret`` over GF(2^521 − 1), any ``threshold``
    of which rebuild it.

    Hand-written because ``cryptography`` has no secret sharing; it is the textbook scheme (a
    random degree t−1 polynomial with constant term ``secret``, coefficients from ``secrets``).
    """
    if not 1 <= threshold <= num_shares:
        raise ValueError(f"need 1 <= threshold <= num_shares, got {threshold} and {num_shares}")
    if not 0 <= secret < FIELD_PRIME:
        raise ValueError("secret must be an integer in [0, 2^521 - 1)")
    coefficients = [secret] + [secrets.randbelow(FIELD_PRIME) for _ in range(threshold - 1)]
    shares = []
    for x in range(1, num_shares + 1):
        y = 0
        for coefficient in reversed(coefficients):  # Horner
            y = (y * x + coefficient) % FIELD_PRIME
        shares.append((x, y))
    return shares


def shamir_combine(shares: Sequence[tuple[int, int]]) -> int:
    """The secret from shares (x, y) with distinct x (Lagrange interpolation at 0)."""
    xs = [x for x, _ in shares]
    if len(set(xs)) != len(xs):
        raise ValueError("shares must have distinct x coordinates")
    secret = 0
    for i, (xi, yi) in enumerate(shares):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % FIELD_PRIME
                den = den * (xj - xi) % FIELD_PRIME
        secret = (secret + yi * num * pow(den, -1, FIELD_PRIME)) % FIELD_PRIME
    return secret


def prg(seed: bytes, length: int) -> np.ndarray:
    """``length`` pseudorandom uint64 words: the ChaCha20 keystream under key ``seed``."""
    if len(seed) != 32:
        raise ValueError("PRG seeds are 32 bytes")
    encryptor = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(_WORD_BYTES * length)), dtype="<u8").copy()


def _hkdf(secret: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def _pair_info(label: bytes, round_id: int, a: int, b: int) -> bytes:
    return b"fedrec-secagg/" + label + struct.pack("<QII", round_id, min(a, b), max(a, b))


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


# ------------------------------------------------------------------------------------------------
# The parties


@dataclass(frozen=True)
class PublicKeys:
    """What a client advertises in round 0."""

    cipher: bytes
    """X25519 public key for encrypting shares (32 bytes)."""
    mask: bytes
    """X25519 public key for pairwise mask agreement (32 bytes)."""


class SecAggClient:
    """One client of a secure-aggregation round (holds its plaintext and secrets).

    ``position`` is the client's index 0..n−1 in the round (its Shamir x is position + 1).
    """

    def __init__(self, position: int, vector: np.ndarray, *, round_id: int) -> None:
        self.position = position
        self.round_id = round_id
        self._vector = client_words(vector, position)
        self._cipher_key = X25519PrivateKey.generate()
        self._mask_key = X25519PrivateKey.generate()
        self._self_seed = secrets.token_bytes(32)
        self._roster: dict[int, PublicKeys] = {}
        self._held: dict[int, tuple[int, int]] = {}  # owner -> (share of s^SK, share of b)
        self._revealed: dict[int, str] = {}

    def advertise_keys(self) -> PublicKeys:
        return PublicKeys(
            self._cipher_key.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw),
            self._mask_key.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw),
        )

    def _aead(self, other: int) -> ChaCha20Poly1305:
        shared = self._cipher_key.exchange(
            X25519PublicKey.from_public_bytes(self._roster[other].cipher)
        )
        return ChaCha20Poly1305(
            _hkdf(shared, _pair_info(b"share-key", self.round_id, self.position, other))
        )

    def share_keys(self, roster: dict[int, PublicKeys], *, threshold: int) -> dict[int, bytes]:
        """Encrypted shares of (s^SK, b) for every other client of ``roster`` (round 1)."""
        self._roster = dict(roster)
        members = sorted(roster)
        if self.position not in roster or len(members) < threshold:
            raise ValueError("the roster must include this client and at least `threshold` clients")
        mask_secret = int.from_bytes(self._mask_key.private_bytes_raw(), "little")
        seed_secret = int.from_bytes(self._self_seed, "little")
        n = max(members) + 1
        s_shares = shamir_split(mask_secret, num_shares=n, threshold=threshold)
        b_shares = shamir_split(seed_secret, num_shares=n, threshold=threshold)
        self._held[self.position] = (s_shares[self.position][1], b_shares[self.position][1])
        out = {}
        for other in members:
            if other == self.position:
                continue
            payload = struct.pack("<II", self.position, other) + (
                s_shares[other][1].to_bytes(66, "little")
                + b_shares[other][1].to_bytes(66, "little")
            )
            nonce = struct.pack("<I", self.position) + bytes(8)
            out[other] = nonce + self._aead(other).encrypt(
                nonce, payload, struct.pack("<Q", self.round_id)
            )
        return out

    def receive_shares(self, ciphertexts: dict[int, bytes]) -> None:
        """Decrypt the shares other clients sent to this one (relayed by the server)."""
        for sender, blob in ciphertexts.items():
            nonce, body = blob[:12], blob[12:]
            payload = self._aead(sender).decrypt(nonce, body, struct.pack("<Q", self.round_id))
            owner, receiver = struct.unpack("<II", payload[:8])
            if owner != sender or receiver != self.position:
                raise ValueError("a share was relayed to the wrong client")
            self._held[owner] = (
                int.from_bytes(payload[8:74], "little"),
                int.from_bytes(payload[74:140], "little"),
            )

    def pair_seed(self, other: int) -> bytes:
        shared = self._mask_key.exchange(
            X25519PublicKey.from_public_bytes(self._roster[other].mask)
        )
        return _hkdf(shared, _pair_info(b"mask", self.round_id, self.position, other))

    def masked_input(self, committed: Iterable[int]) -> np.ndarray:
        """y_k: the plaintext plus the self mask and the pairwise masks with ``committed`` (round 2)."""
        length = len(self._vector)
        masked = self._vector + prg(self._self_seed, length)
        for other in committed:
            if other == self.position:
                continue
            mask = prg(self.pair_seed(other), length)
            if self.position < other:
                masked += mask
            else:
                masked -= mask
        return masked

    def unmask(
        self, survivors: set[int], dropped: set[int], *, threshold: int
    ) -> dict[int, tuple[str, int]]:
        """Shares for the server (round 3): of b_k for survivors, of s_d^SK for dropped clients.

        Refuses (ValueError) to reveal both secrets of one client, or to help when fewer than
        ``threshold`` survived (the server could otherwise unmask an individual input).
        """
        if survivors & dropped:
            raise ValueError("a client cannot be both a survivor and dropped")
        if len(survivors) < threshold:
            raise ValueError("fewer survivors than the threshold: refusing to unmask")
        out: dict[int, tuple[str, int]] = {}
        for owner in survivors | dropped:
            kind = "b" if owner in survivors else "s"
            if self._revealed.setdefault(owner, kind) != kind:
                raise ValueError(f"client {owner}: asked for both of its secrets")
            s_share, b_share = self._held[owner]
            out[owner] = (kind, b_share if kind == "b" else s_share)
        return out


@dataclass
class SecureSumResult:
    """The unmasked sum of the survivors' plaintext vectors, and what the round cost."""

    total: np.ndarray
    """Σ_{k∈survivors} x_k in Z_{2^64} (uint64)."""
    survivors: list[int]
    """positions of the clients whose inputs are in the sum."""
    dropped: list[int]
    """positions that dropped after sharing keys (their masks were recovered)."""
    client_seconds: float
    """wall time of all clients' work (keys, shares, masking), summed over clients."""
    server_seconds: float
    """wall time of the server's unmasking."""
    upload_bytes_per_client: int
    """bytes one client uploads: public keys, encrypted shares, masked vector, unmask shares."""
    masked: dict[int, np.ndarray] = field(default_factory=dict)
    """the masked uploads the server received (kept for tests and inspection)."""
    absent: list[int] = field(default_factory=list)
    """positions that dropped before sharing their keys (nobody masked with them)."""
    protocol: str = "secagg (complete graph)"
    """which protocol ran: the complete-graph protocol or SecAgg+ (:mod:`.secagg_plus`)."""
    degree: int | None = None
    """SecAgg+: neighbours per client (None: the complete-graph protocol, n − 1)."""
    threshold: int | None = None
    """Shamir threshold: per neighbourhood for SecAgg+, over all clients otherwise."""
    neighbours: np.ndarray | None = None
    """SecAgg+: (n, degree) each client's neighbours in the round's graph."""
    graph_seed: bytes | None = None
    """SecAgg+: the public randomness the graph's labelling was drawn from."""
    key_agreements: int = 0
    """X25519 exchanges computed in the round (SecAgg+ reuses long-term pair keys)."""
    prg_streams: int = 0
    """full-length PRG streams expanded by clients and server (SecAgg+)."""
    parts: list[np.ndarray] = field(default_factory=list)
    """SecAgg+: the sum of each segment of the rows (one uint64 segment for word vectors; for a
    :class:`WordRows`, its segments' sums, of which ``total`` is the byte row)."""


def client_positions(name: str, clients: Iterable[int], n: int) -> set[int]:
    """The distinct client positions in ``clients``, each checked to be an int in [0, n)."""
    chosen = set()
    for k in clients:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < n:
            raise ValueError(f"{name}: client positions must be ints in [0, {n}), got {k!r}")
        chosen.add(int(k))
    return chosen


def secure_sum(
    vectors: Sequence[np.ndarray] | np.ndarray | WordRows,
    *,
    round_id: int,
    threshold: int | None = None,
    graph: str = "complete",
    keys: KeyDirectory | None = None,
    threat: ThreatModel | None = None,
    degree: int | None = None,
    graph_seed: bytes | None = None,
    client_ids: Sequence[int] | None = None,
    per_client: bool = False,
    dropped_before_keys: Iterable[int] = (),
    dropped_before_sharing: Iterable[int] = (),
    dropped_after_sharing: Iterable[int] = (),
    silent_in_unmasking: Iterable[int] = (),
) -> SecureSumResult:
    """Run one secure-aggregation round over ``vectors`` (1-d integer arrays, one per client).

    By default this is the complete-graph protocol of Bonawitz et al. (the module docstring):
    every pair of clients masks, fresh keys every round, a global ``threshold``. With
    ``graph="harary"`` (a sparse random graph sized by ``threat`` or ``degree``), or with
    long-term ``keys`` (a :class:`~fedrec.federation.secagg_plus.KeyDirectory`), the round runs
    SecAgg+ instead (:func:`~fedrec.federation.secagg_plus.secure_sum_plus`, where ``threshold``
    is per neighbourhood; see its docstring for ``client_ids``, ``graph_seed``, ``per_client``).
    A Harary round of n clients whose threat model needs the complete graph anyway runs the
    complete-graph protocol.

    ``vectors`` may also be a :class:`WordRows` (segments of 64- and 32-bit words): the result's
    ``total`` is then the byte row of the segments' sums and ``parts`` the sums themselves. The
    complete-graph protocol runs it on the rows widened to 64-bit words and reduces each
    segment's sum to its width (its ``masked`` uploads are then the widened rows).
    """
    drops = {
        "dropped_before_keys": dropped_before_keys,
        "dropped_before_sharing": dropped_before_sharing,
        "dropped_after_sharing": dropped_after_sharing,
        "silent_in_unmasking": silent_in_unmasking,
    }
    rows = vectors if isinstance(vectors, WordRows) else None
    n = rows.num_rows if rows is not None else len(vectors)
    plus = _plus_graph(n, graph=graph, keys=keys, threat=threat, degree=degree)
    if plus is None and rows is not None:  # 64-bit words; each segment's sum reduced after
        result = _secure_sum_complete(
            list(rows.widened()), round_id=round_id, threshold=threshold, **drops
        )
        result.total = rows.narrowed(result.total)
        result.parts = rows.unpack(result.total)
        return result
    if plus is None:
        return _secure_sum_complete(vectors, round_id=round_id, threshold=threshold, **drops)
    from fedrec.federation.secagg_plus import secure_sum_plus

    return secure_sum_plus(
        vectors,
        round_id=round_id,
        client_ids=client_ids,
        keys=keys,
        graph=plus,
        threat=threat,
        degree=degree,
        threshold=threshold,
        graph_seed=graph_seed,
        per_client=per_client,
        **drops,
    )


def _plus_graph(
    n: int,
    *,
    graph: str,
    keys: KeyDirectory | None,
    threat: ThreatModel | None,
    degree: int | None,
) -> str | None:
    """The graph SecAgg+ runs on for a round of ``n`` clients, or None for the complete-graph
    protocol: a Harary graph asked for but too dense for n (the threat model needs the complete
    graph), a complete graph without long-term keys, or fewer than 3 clients."""
    if graph not in ("complete", "harary"):
        raise ValueError(f"graph must be 'complete' or 'harary', got {graph!r}")
    if graph == "complete" and degree is not None:
        raise ValueError("degree sets the Harary graph's; the complete graph has n - 1")
    if n < 3:
        return None
    if graph == "harary":
        from fedrec.federation.secagg_plus import ThreatModel as _Threat

        sparse = degree is not None or not (threat or _Threat()).parameters(n).complete
        return "harary" if sparse else None
    return "complete" if keys is not None else None


def _secure_sum_complete(
    vectors: Sequence[np.ndarray],
    *,
    round_id: int,
    threshold: int | None = None,
    dropped_before_keys: Iterable[int] = (),
    dropped_before_sharing: Iterable[int] = (),
    dropped_after_sharing: Iterable[int] = (),
    silent_in_unmasking: Iterable[int] = (),
) -> SecureSumResult:
    """One round of the complete-graph protocol (Bonawitz et al. 2017; fresh keys every round).

    The sum is of integers only, exact modulo 2^64 (signed inputs are two's complement): a
    float vector is refused, never cast -- reals are quantised before, by
    :func:`encode_fixed_point` (which MF-SecAvg's :func:`mf_secavg_vector` calls).

    Dropouts, one set per stage of the protocol (a client drops at the first stage it is
    listed in): ``dropped_before_keys``: never advertises its keys (round 0), so nobody masks
    with it; ``dropped_before_sharing``: advertised its keys but never sent its shares (round 1),
    so nobody masks with it either; ``dropped_after_sharing``: shared its keys (others masked
    with them) but its masked input never arrives (round 2), so its masks are recovered;
    ``silent_in_unmasking``: a survivor whose input is in the sum but who does not answer the
    unmasking request (round 3). ``threshold`` defaults to a majority, ⌊n/2⌋ + 1.

    :returns: the exact sum of the inputs of the clients whose masked input arrived.
    :raises SecAggAborted: with fewer than ``threshold`` clients left at any stage, or
        (:class:`MalformedContribution`) when a client's vector is not a 1-d integer array of
        the round's length.
    :raises ValueError: for a bad call (fewer than 2 clients, threshold or positions out of
        range), which is the caller's error, not a client's.
    """
    n = len(vectors)
    if n < 2:
        raise ValueError("secure aggregation needs at least 2 clients")
    if isinstance(round_id, bool) or not isinstance(round_id, (int, np.integer)):
        raise ValueError(f"round_id must be an integer, got {round_id!r}")
    if not 0 <= round_id < 2**64:
        raise ValueError(f"round_id must be in [0, 2^64), got {round_id}")
    threshold = n // 2 + 1 if threshold is None else threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)):
        raise ValueError(f"threshold must be an integer, got {threshold!r}")
    if not 2 <= threshold <= n:
        raise ValueError(f"threshold must be in [2, {n}], got {threshold}")
    absent_keys = client_positions("dropped_before_keys", dropped_before_keys, n)
    absent_shares = (
        client_positions("dropped_before_sharing", dropped_before_sharing, n) - absent_keys
    )
    dropped = client_positions("dropped_after_sharing", dropped_after_sharing, n)
    silent = client_positions("silent_in_unmasking", silent_in_unmasking, n)
    words = [client_words(v, k) for k, v in enumerate(vectors)]  # before any key is made
    length = len(words[0])
    for k, w in enumerate(words):
        if len(w) != length:
            raise MalformedContribution(
                f"client {k}: input has {len(w)} words, the round's vectors have {length}"
            )
    clock = time.perf_counter
    client_seconds = 0.0

    def abort(stage: str, left: int) -> SecAggAborted:
        return SecAggAborted(
            f"round {round_id}: {left} of {n} clients {stage}, below the threshold "
            f"{threshold}; the round is aborted and the global model kept"
        )

    start = clock()
    clients = [SecAggClient(k, w, round_id=round_id) for k, w in enumerate(words)]
    # Round 0, AdvertiseKeys: U1 = the clients whose public keys arrived.
    roster = {c.position: c.advertise_keys() for c in clients if c.position not in absent_keys}
    if len(roster) < threshold:
        raise abort("advertised their keys", len(roster))
    # Round 1, ShareKeys: U2 = the clients of U1 whose encrypted shares arrived.
    shared = sorted(set(roster) - absent_shares)
    if len(shared) < threshold:
        raise abort("shared their keys", len(shared))
    mailbox: dict[int, dict[int, bytes]] = {k: {} for k in roster}
    share_bytes = 0
    for k in shared:  # the server only relays ciphertexts
        for receiver, blob in clients[k].share_keys(roster, threshold=threshold).items():
            mailbox[receiver][k] = blob
            share_bytes += len(blob)
    for k in shared:
        clients[k].receive_shares(mailbox[k])
    # Round 2, MaskedInputCollection: U3 = the clients of U2 whose masked input arrived.
    dropped &= set(shared)
    masked = {k: clients[k].masked_input(shared) for k in shared if k not in dropped}
    client_seconds += clock() - start

    survivors = set(masked)
    if len(survivors) < threshold:
        raise abort("survived to upload a masked input", len(survivors))
    # Round 3, Unmasking: the survivors that answer send their shares.
    start = clock()
    responses = {
        k: clients[k].unmask(survivors, dropped, threshold=threshold)
        for k in sorted(survivors - silent)
    }
    client_seconds += clock() - start
    if len(responses) < threshold:
        raise abort("answered the unmasking request", len(responses))

    start = clock()
    total = np.zeros(length, dtype=np.uint64)
    for y in masked.values():
        total += y
    helpers = sorted(responses)[:threshold]
    for owner in sorted(survivors):
        seed = shamir_combine([(h + 1, responses[h][owner][1]) for h in helpers])
        total -= prg(seed.to_bytes(32, "little"), length)
    for owner in sorted(dropped):
        secret = shamir_combine([(h + 1, responses[h][owner][1]) for h in helpers])
        key = X25519PrivateKey.from_private_bytes(secret.to_bytes(32, "little"))
        for k in sorted(survivors):
            shared_key = key.exchange(X25519PublicKey.from_public_bytes(roster[k].mask))
            mask = prg(_hkdf(shared_key, _pair_info(b"mask", round_id, owner, k)), length)
            if k < owner:  # k added +PRG(s_k,owner); undo it
                total -= mask
            else:
                total += mask
    server_seconds = clock() - start
    keys_bytes = 64
    unmask_bytes = (len(survivors) + len(dropped)) * 67
    upload = keys_bytes + share_bytes // len(shared) + length * _WORD_BYTES + unmask_bytes
    return SecureSumResult(
        total=total,
        survivors=sorted(survivors),
        dropped=sorted(dropped),
        client_seconds=client_seconds,
        server_seconds=server_seconds,
        upload_bytes_per_client=upload,
        masked=masked,
        absent=sorted(set(range(n)) - set(shared)),
        threshold=threshold,
        key_agreements=(
            len(shared) * (len(roster) - 1)  # encrypting shares
            + len(shared) * (len(shared) - 1)  # decrypting them
            + len(survivors) * (len(shared) - 1)  # pairwise mask seeds
            + len(dropped) * len(survivors)  # the server's recovery of dangling masks
        ),
        prg_streams=len(survivors) * (len(shared) + 1) + len(dropped) * len(survivors),
    )


# ------------------------------------------------------------------------------------------------
# MF-SecAvg as an aggregator


_FLOAT_DTYPES = (torch.float16, torch.float32, torch.float64)


def check_updates(
    updates: ClientUpdates,
    *,
    num_items: int | None = None,
    item_width: int | None = None,
    network_size: int | None = None,
) -> None:
    """Check a round's uploads before MF-SecAvg encodes them: tensors of a float dtype and of
    the global model's shapes (when given), item ids in range and distinct per client, sample
    counts that are positive integers. Raises :class:`MalformedContribution` (an abort)."""

    def bad(message: str) -> MalformedContribution:
        return MalformedContribution(f"malformed client update: {message}; round aborted")

    c = updates.num_clients
    for name in ("network", "item_rows"):
        value = getattr(updates, name)
        if not isinstance(value, torch.Tensor) or value.dtype not in _FLOAT_DTYPES:
            kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
            raise bad(f"{name} must be a float16/32/64 tensor, got {kind}")
        if value.ndim != 2:
            raise bad(f"{name} must be 2-d, got shape {tuple(value.shape)}")
    for name in ("row_client", "row_item"):
        value = getattr(updates, name)
        if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.ndim != 1:
            kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
            raise bad(f"{name} must be a 1-d int64 tensor, got {kind}")
    if network_size is not None and updates.network.shape[1] != network_size:
        raise bad(
            f"network rows of {updates.network.shape[1]} weights, the model has {network_size}"
        )
    if num_items is not None and updates.num_items != num_items:
        raise bad(f"num_items {updates.num_items}, the item table has {num_items} rows")
    if item_width is not None and updates.item_rows.shape[1] != item_width:
        raise bad(f"item rows of width {updates.item_rows.shape[1]}, the table's is {item_width}")
    rows_client, rows_item = updates.row_client.numpy(), updates.row_item.numpy()
    if len(rows_client) and not (0 <= rows_client.min() and rows_client.max() < c):
        raise bad(f"row_client outside [0, {c})")
    if len(rows_item) and not (0 <= rows_item.min() and rows_item.max() < updates.num_items):
        raise bad(f"row_item outside [0, {updates.num_items})")
    pairs = rows_client.astype(np.int64) * max(updates.num_items, 1) + rows_item
    seen = np.zeros(c * max(updates.num_items, 1), dtype=bool)
    seen[pairs] = True
    if np.count_nonzero(seen) != len(pairs):
        raise bad("a client uploaded the same item row twice")
    samples = np.asarray(updates.num_samples)
    if samples.shape != (c,) or samples.dtype.kind not in "iuf":
        raise bad(f"num_samples must be {c} numbers, got {samples.dtype} of shape {samples.shape}")
    if not (np.isfinite(samples).all() and (samples == np.rint(samples)).all()):
        raise bad("num_samples must be whole numbers")
    if not ((samples >= 1).all() and float(samples.astype(np.float64).sum()) < 2.0**62):
        raise bad("num_samples must be >= 1 and their sum below 2^62")


def item_fraction_bits(
    num_clients: int, *, fraction_bits: int, item_bits: int = 32, delta_bound: float = 8.0
) -> int:
    """Fraction bits of MF-SecAvg's item part for a round of ``num_clients``: ``fraction_bits``
    in 64-bit words; in 32-bit words the most, up to ``fraction_bits``, with which the sum of
    ``num_clients`` deltas of magnitude below ``delta_bound`` cannot wrap:
    f = 31 − ⌈log2 n⌉ − ⌈log2 delta_bound⌉ (so n · delta_bound · 2^f ≤ 2^31). A public
    function of n, never of the data."""
    if item_bits == 64:
        return fraction_bits
    if item_bits != 32:
        raise ValueError(f"item_bits must be 32 or 64, got {item_bits}")
    headroom = math.ceil(math.log2(max(num_clients, 1))) + math.ceil(math.log2(delta_bound))
    bits = min(fraction_bits, 31 - headroom)
    if bits < 8:
        raise ValueError(
            f"{num_clients} clients with item deltas up to {delta_bound} leave {bits} fraction "
            "bits in 32-bit words (fewer than 8); use item_bits=64 or a smaller delta_bound"
        )
    return bits


def count_lane_dtype(num_clients: int) -> np.dtype:
    """The unsigned lane that holds a per-item count c_i ≤ ``num_clients`` in MF-SecAvg's
    packed count words: 8 bits below 256 clients, 16 below 65,536, else 32."""
    bits = 8 if num_clients < 2**8 else 16 if num_clients < 2**16 else 32
    return np.dtype(f"<u{bits // 8}")


def mf_secavg_layout(
    *,
    network_size: int,
    num_items: int,
    item_width: int,
    item_bits: int = 32,
    num_clients: int = 255,
) -> tuple[tuple[str, int], ...]:
    """The :class:`WordRows` layout of an MF-SecAvg plaintext: 64-bit ``[n_k θ_k | n_k]``, then
    ``[MP_k ⊙ (Q_k − Q) | MP_k]`` in ``item_bits``-bit words, MP_k packed in lanes of
    :func:`count_lane_dtype` (four 0/1 flags per 32-bit word below 256 clients: a word's sum
    modulo 2^32 is exact lane by lane while no lane's sum reaches 2^8, so the counts cost a
    quarter of the words)."""
    word = 4 if item_bits == 32 else 8
    lane = count_lane_dtype(num_clients).itemsize
    count_words = -(-num_items * lane // word)
    narrow = "<u4" if item_bits == 32 else "<u8"
    return (("<u8", network_size + 1), (narrow, num_items * item_width + count_words))


def _count_lanes(words: np.ndarray, num_items: int, num_clients: int) -> np.ndarray:
    """The first ``num_items`` count lanes of packed count words (..., W) (a view)."""
    lanes = words.view(np.uint8).view(count_lane_dtype(num_clients))
    return lanes[..., :num_items]


def fixed_point_rows(values: np.ndarray, fraction_bits: int) -> np.ndarray:
    """``rint(x · 2^fraction_bits)`` of float32 or float64 rows, as floats. Exact in the rows' own
    float type: scaling by a power of two is exact, and a float32 value that is not an integer
    is below 2^23, so its nearest integer is a float32 too. So float32 rows cost half the
    memory traffic and give the bits a float64 computation gives (``mf_secavg_vector`` computes
    in float64; the tests compare the two encodings byte for byte)."""
    values = np.asarray(values)
    if values.dtype not in (np.float32, np.float64):
        values = values.astype(np.float32)
    scaled = values * values.dtype.type(2.0**fraction_bits)
    return np.rint(scaled, out=scaled)


def _encoding_error(position: int, part: str, error: ValueError) -> MalformedContribution:
    return MalformedContribution(
        f"client {position}: its update cannot be encoded ({part}: {error}); round aborted"
    )


def mf_secavg_vector(
    updates: ClientUpdates,
    position: int,
    *,
    fraction_bits: int,
    items: torch.Tensor | None = None,
    item_bits: int = 32,
    delta_bound: float = 8.0,
) -> np.ndarray:
    """Client ``position``'s plaintext as one byte row of :func:`mf_secavg_layout`: 64-bit
    ``[n_k θ_k | n_k]`` (``fraction_bits``), then ``[d_k | MP_k]`` in ``item_bits``-bit words:
    on its touched rows d_k = rint(Q_k · 2^f) − rint(Q · 2^f), the delta from the global table
    ``items`` (zeros when None) in fixed point with f = :func:`item_fraction_bits`, zero
    elsewhere.

    The reference per-client encoding (:func:`mf_secavg_rows` encodes all clients at once, the
    same bytes). Reals go through :func:`encode_fixed_point`; NaN/inf or values outside the
    fixed-point range raise :class:`MalformedContribution` naming the client and the part (the
    round's abort; never clipped); :func:`check_updates` checks the uploads' types and shapes.
    """
    c = updates.num_clients
    num_items, width = updates.num_items, updates.item_rows.shape[1]
    bits = item_fraction_bits(
        c, fraction_bits=fraction_bits, item_bits=item_bits, delta_bound=delta_bound
    )
    n_k = int(updates.num_samples[position])
    rows = updates.row_client == position
    row_items = updates.row_item[rows].numpy()
    reference = (
        np.zeros((num_items, width))
        if items is None
        else np.rint(items.detach().numpy().astype(np.float64) * 2.0**bits)
    )
    table = np.zeros((num_items, width), dtype=np.float64)
    own = np.rint(updates.item_rows[rows].numpy().astype(np.float64) * 2.0**bits)
    table[row_items] = own - reference[row_items]  # exact: integers below 2^53
    network = updates.network[position].numpy().astype(np.float64) * n_k
    try:
        encoded_network = encode_fixed_point(network, fraction_bits=fraction_bits, num_clients=c)
    except ValueError as error:
        raise _encoding_error(position, "network", error) from error
    try:  # the integers d_k = rint(Q_k 2^f) − rint(Q 2^f), encoded with scale 1
        encoded_table = encode_fixed_point(
            table.reshape(-1), fraction_bits=0, num_clients=c, word_bits=item_bits
        )
    except ValueError as error:
        raise _encoding_error(position, f"item deltas (Q_k − Q) · 2^{bits}", error) from error
    layout = mf_secavg_layout(
        network_size=len(network),
        num_items=num_items,
        item_width=width,
        item_bits=item_bits,
        num_clients=c,
    )
    touched = np.zeros(layout[1][1] - num_items * width, dtype=encoded_table.dtype)
    _count_lanes(touched, num_items, c)[row_items] = 1
    wide = np.concatenate([encoded_network, np.array([n_k], dtype=np.uint64)])
    return np.concatenate(
        [wide.view(np.uint8), encoded_table.view(np.uint8), touched.view(np.uint8)]
    )


def mf_secavg_rows(
    updates: ClientUpdates,
    *,
    fraction_bits: int,
    items: torch.Tensor | None = None,
    item_bits: int = 32,
    delta_bound: float = 8.0,
) -> WordRows:
    """All clients' plaintexts at once: row k of the result equals :func:`mf_secavg_vector`
    ``(updates, k, ...)`` (the same encoding with whole-array operations on the R uploaded rows
    only; it expects uploads that passed :func:`check_updates`). A value that cannot be encoded
    raises the same :class:`MalformedContribution` as the per-client encoding, for the first
    such client."""
    c = updates.num_clients
    num_items, width = updates.num_items, updates.item_rows.shape[1]
    size = updates.network.shape[1]
    bits = item_fraction_bits(
        c, fraction_bits=fraction_bits, item_bits=item_bits, delta_bound=delta_bound
    )
    samples = np.asarray(updates.num_samples).astype(np.int64)
    network = updates.network.numpy().astype(np.float64)
    network *= (samples * 2.0**fraction_bits)[:, None]  # exact: a power of two times n_k
    np.rint(network, out=network)
    rows_client, rows_item = updates.row_client.numpy(), updates.row_item.numpy()
    signed = np.int32 if item_bits == 32 else np.int64
    own = fixed_point_rows(updates.item_rows.numpy(), bits)  # rint(Q_k 2^f), exact
    # one range test covers NaN/inf too (max/min are NaN then, and fail it); the per-client
    # encoding then raises the documented error for the first client concerned
    limit, item_limit = 2.0**63 / max(c, 1), 2.0 ** (item_bits - 1) / max(c, 1)
    ok = -limit < network.min(initial=0.0) <= network.max(initial=0.0) < limit
    ok = ok and -(2.0**62) < own.min(initial=0.0) <= own.max(initial=0.0) < 2.0**62
    if ok:
        deltas = own.astype(np.int64)
        if items is not None:  # d_k = rint(Q_k 2^f) − rint(Q 2^f), exact integers
            reference = fixed_point_rows(items.detach().numpy(), bits)
            ok = -(2.0**62) < reference.min(initial=0.0) <= reference.max(initial=0.0) < 2.0**62
            deltas -= np.take(reference.astype(np.int64), rows_item, axis=0)
        ok = ok and -item_limit < deltas.min(initial=0) <= deltas.max(initial=0) < item_limit
    if not ok:
        for k in range(c):
            mf_secavg_vector(
                updates,
                k,
                fraction_bits=fraction_bits,
                items=items,
                item_bits=item_bits,
                delta_bound=delta_bound,
            )
        raise MalformedContribution("an update cannot be encoded in fixed point; round aborted")
    layout = mf_secavg_layout(
        network_size=size,
        num_items=num_items,
        item_width=width,
        item_bits=item_bits,
        num_clients=c,
    )
    plain = WordRows.zeros(c, layout)
    wide, narrow = plain.segments()
    wide[:, :size] = network.astype(np.int64).view(np.uint64)
    wide[:, size] = samples.astype(np.uint64)
    encoded = deltas.astype(signed).view(narrow.dtype)
    if width:  # each uploaded row is written as one record of E words (a fast scatter)
        record = np.dtype((np.void, narrow.dtype.itemsize * width))
        table = narrow[:, : num_items * width].reshape(c, num_items, width)  # a view
        table.view(record)[:, :, 0][rows_client, rows_item] = encoded.view(record)[:, 0]
    _count_lanes(narrow[:, num_items * width :], num_items, c)[rows_client, rows_item] = 1
    return plain


@dataclass(frozen=True)
class SecureTables:
    """A pair of tables that MF-SecAvg aggregates like the weights: the global ``items`` (I, W)
    and ``network`` (N,), the clients' uploads of them, and the fixed point of their encoding
    (:meth:`MFSecAvg.aggregate_with`)."""

    items: torch.Tensor
    network: torch.Tensor
    updates: ClientUpdates
    fraction_bits: int
    """fraction bits of the network part and, in 64-bit words, of the item deltas."""

    def __post_init__(self) -> None:
        if not 8 <= self.fraction_bits <= 48:
            raise ValueError(f"fraction_bits must be in [8, 48], got {self.fraction_bits}")


class MFSecAvg(Aggregator):
    """MF-FedAvg on masked uploads (see the module docstring); equal to MF-FedAvg up to rounding.

    The protocol is SecAgg+ by default (:mod:`fedrec.federation.secagg_plus`): a random Harary
    graph sized by ``threat`` (default :class:`~fedrec.federation.secagg_plus.ThreatModel`: an
    honest-but-curious server colluding with at most 5% of a round's clients, at most 10%
    dropouts; privacy failure ≤ 2^-40), long-term pair keys held for the aggregator's lifetime
    (``key_reuse``), and AES counter-mode masks. ``graph="complete", key_reuse=False`` is the
    complete-graph protocol of Bonawitz et al. with fresh keys every round and a global
    threshold (the module docstring). A round too small for a sparse graph (the threat model
    asks for the complete graph, e.g. five clients or fewer by default) runs the complete-graph
    protocol. ``degree`` overrides the graph's degree; ``threshold`` is per neighbourhood for
    SecAgg+ and over all clients for the complete-graph protocol. ``per_client``: simulate each
    client's key derivation and masks separately (a deployment's cost) instead of once per pair.

    ``dropout``: probability that each client drops after sharing its keys (seeded by ``seed``),
    to exercise recovery during training; the graph's public randomness is drawn from the same
    seeded generator. Aborted rounds raise :class:`SecAggAborted`: too few survivors or
    answering neighbours, a disconnected survivors' graph, a round smaller than ``threshold``,
    or a malformed update (NaN/inf, wrong shape or dtype, out of the fixed-point range:
    :class:`MalformedContribution`), so the caller keeps its global model.
    """

    name = "mf-secavg"

    def __init__(
        self,
        *,
        fraction_bits: int = 24,
        threshold: int | None = None,
        dropout: float = 0.0,
        seed: int = 0,
        graph: Literal["harary", "complete"] = "harary",
        key_reuse: bool = True,
        threat: ThreatModel | None = None,
        degree: int | None = None,
        per_client: bool = False,
        item_bits: Literal[32, 64] = 32,
        delta_bound: float = 8.0,
    ) -> None:
        from fedrec.federation.secagg_plus import KeyDirectory
        from fedrec.federation.secagg_plus import ThreatModel as _Threat

        if not 8 <= fraction_bits <= 48:
            raise ValueError(f"fraction_bits must be in [8, 48], got {fraction_bits}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if threshold is not None and threshold < 2:
            raise ValueError(f"threshold must be >= 2, got {threshold}")
        if graph not in ("harary", "complete"):
            raise ValueError(f"graph must be 'harary' or 'complete', got {graph!r}")
        if item_bits not in (32, 64):
            raise ValueError(f"item_bits must be 32 or 64, got {item_bits!r}")
        if not (math.isfinite(delta_bound) and delta_bound > 0):
            raise ValueError(f"delta_bound must be a positive number, got {delta_bound!r}")
        self.fraction_bits = fraction_bits
        self.item_bits = item_bits
        self.delta_bound = float(delta_bound)
        self.threshold = threshold
        self.dropout = dropout
        self.rng = np.random.default_rng(seed)
        self._graph_key = self.rng.bytes(32)
        """public randomness of the run's graphs: one graph per distinct set of clients."""
        self.graph = graph
        self.threat = threat or _Threat()
        self.degree = degree
        self.per_client = per_client
        self.keys = KeyDirectory() if key_reuse else None
        """the clients' long-term keys (None: fresh keys every round)."""
        self.rounds = 0
        self.last: SecureSumResult | None = None

    @property
    def protocol(self) -> str:
        """A label of the configured protocol (for tables)."""
        if self.graph == "complete" and self.keys is None:
            return "secagg (complete graph, per-round keys)"
        graph = "Harary graph" if self.graph == "harary" else "complete graph"
        keys = "long-term keys" if self.keys is not None else "per-round keys"
        return f"secagg+ ({graph}, {keys})"

    def aggregate(
        self, *, items: torch.Tensor, network: torch.Tensor, updates: ClientUpdates
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._secure_round([SecureTables(items, network, updates, self.fraction_bits)])[0]

    def aggregate_with(
        self,
        *,
        items: torch.Tensor,
        network: torch.Tensor,
        updates: ClientUpdates,
        companion: SecureTables,
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """MF-SecAvg of the weights and of ``companion`` in **one** protocol run: the two
        plaintexts are the segments of one row per client, masked with one keystream per pair
        and unmasked with one set of shares, so the companion costs its mask bytes and nothing
        else, and a client that drops drops from both. The companion's item part is in 64-bit
        words with its own ``fraction_bits`` (e.g. Adam's second moments, far below the weights'
        fixed-point step). Returns ((items, network), (companion items, companion network)).
        The companion's uploads must come from the same clients touching the same rows."""
        theirs = companion.updates
        if not (
            np.array_equal(np.asarray(theirs.clients), np.asarray(updates.clients))
            and np.array_equal(np.asarray(theirs.num_samples), np.asarray(updates.num_samples))
            and torch.equal(theirs.row_client, updates.row_client)
            and torch.equal(theirs.row_item, updates.row_item)
        ):
            raise ValueError(
                "the companion's uploads must come from the same clients, with the same sample "
                "counts and the same touched rows, as the weights'"
            )
        weights = SecureTables(items, network, updates, self.fraction_bits)
        main, extra = self._secure_round([weights, companion])
        return main, extra

    def _secure_round(
        self, tables: Sequence[SecureTables]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One protocol run over the concatenated plaintexts of ``tables`` (the first in
        ``item_bits``-bit item words, the others in 64-bit ones); their decoded aggregates."""
        updates = tables[0].updates
        c = updates.num_clients
        round_id = self.rounds
        self.rounds += 1
        if c == 1:
            raise SecAggAborted("a round with one client cannot be aggregated securely")
        if self.threshold is not None and self.threshold > c:
            raise SecAggAborted(
                f"a round of {c} clients is below the threshold {self.threshold}; round aborted"
            )
        start = time.perf_counter()
        plains, item_bits = [], [self.item_bits] + [64] * (len(tables) - 1)
        for part, bits in zip(tables, item_bits, strict=True):
            check_updates(
                part.updates,
                num_items=part.items.shape[0],
                item_width=part.items.shape[1],
                network_size=part.network.numel(),
            )
            plains.append(
                mf_secavg_rows(
                    part.updates,
                    fraction_bits=part.fraction_bits,
                    items=part.items,
                    item_bits=bits,
                    delta_bound=self.delta_bound,
                )
            )
        plain = plains[0]
        if len(plains) > 1:  # one row per client: the plaintexts side by side
            plain = WordRows(
                np.concatenate([p.buffer for p in plains], axis=1),
                tuple(entry for p in plains for entry in p.layout),
            )
        encode_seconds = time.perf_counter() - start
        dropped = np.flatnonzero(self.rng.random(c) < self.dropout) if self.dropout else []
        ids = np.asarray(updates.clients).astype(np.int64)
        plus = _plus_graph(
            c, graph=self.graph, keys=self.keys, threat=self.threat, degree=self.degree
        )
        if plus is None:  # 64-bit words throughout; each segment's sum reduced to its width
            result = secure_sum(
                plain, round_id=round_id, threshold=self.threshold, dropped_after_sharing=dropped
            )
        else:
            from fedrec.federation.secagg_plus import secure_sum_plus

            result = secure_sum_plus(
                plain,
                round_id=round_id,
                client_ids=ids.tolist(),
                keys=self.keys,
                graph=plus,
                threat=self.threat,
                degree=self.degree,
                threshold=self.threshold,
                graph_seed=self.graph_seed(ids),
                per_client=self.per_client,
                overwrite_input=True,
                dropped_after_sharing=dropped,
            )
        result.client_seconds += encode_seconds
        self.last = result
        start = time.perf_counter()
        decoded, at = [], 0
        for part, p, bits in zip(tables, plains, item_bits, strict=True):
            segments = len(p.layout)
            decoded.append(
                decode_mf_secavg(
                    result.parts[at : at + segments],
                    items=part.items,
                    network=part.network,
                    fraction_bits=part.fraction_bits,
                    item_fraction_bits=item_fraction_bits(
                        c,
                        fraction_bits=part.fraction_bits,
                        item_bits=bits,
                        delta_bound=self.delta_bound,
                    ),
                    num_clients=c,
                )
            )
            at += segments
        result.server_seconds += time.perf_counter() - start
        return decoded

    def graph_seed(self, client_ids: np.ndarray) -> bytes:
        """The public seed of the Harary graph of a round of ``client_ids`` (in position order):
        HMAC of the run's graph key and the ids, so a set of clients that meets again (a fixed
        cohort) gets the same graph, and so meets the same neighbours, whose pair keys are
        cached; a new set gets an independent graph."""
        ids = np.ascontiguousarray(client_ids, dtype="<i8")
        return hmac.digest(self._graph_key, ids.tobytes(), "sha256")[:16]


def decode_mf_secavg(
    parts: Sequence[np.ndarray],
    *,
    items: torch.Tensor,
    network: torch.Tensor,
    fraction_bits: int,
    item_fraction_bits: int,
    num_clients: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """New (items, network) from the unmasked segment sums (:func:`mf_secavg_layout`):
    NN = Σ n θ / N and, for each item i some client touched,
    (rint(Q[i] 2^f) + Σ_touched d_k[i] / c_i) / 2^f = Σ_touched rint(Q_k[i] 2^f) / (c_i 2^f), the
    mean of the clients' rows to within 2^-(f+1) (f = ``item_fraction_bits``); untouched rows are
    kept exactly."""
    wide, narrow = parts
    num_items, width = items.shape
    size = network.numel()
    weighted = decode_fixed_point(wide[:size], fraction_bits=fraction_bits)
    num_samples = float(int(wide[size]))
    counts = _count_lanes(narrow[num_items * width :], num_items, num_clients).astype(np.float64)
    sums = decode_fixed_point(narrow[: num_items * width], fraction_bits=0)
    sums = sums.reshape(num_items, width)
    sums /= np.maximum(counts, 1.0)[:, None]
    # touched rows: (rint(Q 2^f) + Σ d_k / c_i) / 2^f = mean of the clients' rint(Q_k 2^f) / 2^f
    sums += fixed_point_rows(items.detach().numpy().astype(np.float64), item_fraction_bits)
    sums /= 2.0**item_fraction_bits
    untouched = counts == 0
    sums[untouched] = items.detach().numpy()[untouched]  # rows nobody touched are kept
    new_items = torch.from_numpy(sums).to(items.dtype)
    return new_items, torch.from_numpy(weighted / num_samples).to(network.dtype)


def upload_sizes(*, network_size: int, num_items: int, item_width: int) -> dict[str, int]:
    """Words of each segment of the MF-SecAvg plaintext (for cost tables)."""
    return {
        "network": network_size,
        "samples": 1,
        "items": num_items * item_width,
        "counts": num_items,
    }
