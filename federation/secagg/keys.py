"""SecAgg+'s key material: long-term pair keys, per-round pair secrets, Shamir shares of keys.

Each client enrols one long-term X25519 key pair (:class:`KeyDirectory`); two clients run X25519
once, when they first become neighbours, and keep PRK = HKDF-Extract(DH). Every round's pair
secret is HKDF-Expand(PRK, round, pair) (:func:`round_secret`): a 16-byte mask key and a 16-byte
key for the shares sent between them. A round id can be used once per directory, so per-round
secrets never repeat.

The 128-bit keys a client must be able to recover from (its self-mask seed b_m and its round key
ρ_m) are Shamir-shared among its neighbours over GF(2^44 − 17), as three 43-bit limbs each
(:func:`key_limbs`, :func:`limbs_key`), for all clients at once (:func:`shamir_split_limbs`,
:func:`shamir_combine_many`).
"""

from __future__ import annotations

import functools
import hmac
import math
import secrets
import struct
from collections.abc import Callable, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedrec.federation.secagg.outcome import SecAggAborted

#: Shamir's field for SecAgg+: the prime 2^44 − 17. Shares of a 128-bit key are three 43-bit
#: limbs, each shared on its own; a limb times a share x-coordinate (< 2^20) fits in 64 bits.
SHARE_PRIME = 2**44 - 17
#: Limbs of a shared key, and bytes of a key (AES-128 mask keys and round keys).
LIMBS = 3
KEY_BYTES = 16
#: The info prefix of :func:`round_secret` (its HKDF-Expand label).
ROUND_LABEL = b"fedrec-secagg+/round-v1"
_MAX_DEGREE = 2**20 - 1
_EXTRACT_SALT = b"fedrec-secagg+/pair-v1"


class KeyDirectory:
    """Long-term X25519 identities of the clients and each client's cached pair keys.

    A client enrols once (:meth:`enrol`: a key pair; the server publishes the public key). When
    two clients are first neighbours, each computes X25519 with the other's public key and keeps
    PRK = HKDF-Extract(salt, DH) (:meth:`pair_key`); later rounds only run HKDF-Expand on it
    (:func:`round_secret`). :meth:`claim_round` refuses a round id used before with this
    directory, since a repeated round would repeat every pair mask. The directory holds all
    clients' private keys only because the simulation runs every client in one process.
    """

    def __init__(self) -> None:
        self._private: dict[int, X25519PrivateKey] = {}
        self._public: dict[int, X25519PublicKey] = {}
        self._prk: dict[int | tuple[int, int], bytes] = {}  # (owner, peer) -> PRK
        self._rounds: set[int] = set()
        self.enrolments = 0
        """key pairs generated so far."""
        self.key_agreements = 0
        """X25519 exchanges computed so far (one per client per new neighbour)."""

    def __len__(self) -> int:
        return len(self._private)

    def enrol(self, client: int) -> bytes:
        """Client ``client``'s public key (32 bytes), making its key pair on first use."""
        client = int(client)
        if client not in self._private:
            key = X25519PrivateKey.generate()
            self._private[client] = key
            self._public[client] = key.public_key()
            self.enrolments += 1
        return self._public[client].public_bytes_raw()

    def pair_key(self, owner: int, peer: int) -> bytes:
        """``owner``'s PRK with ``peer``: HKDF-Extract of X25519(owner, peer), cached."""
        owner, peer = int(owner), int(peer)
        slot = owner << 32 | peer if owner < 2**32 and peer < 2**32 else (owner, peer)
        cached = self._prk.get(slot)
        if cached is None:
            self.enrol(owner)
            self.enrol(peer)
            shared = self._private[owner].exchange(self._public[peer])
            cached = hmac.digest(_EXTRACT_SALT, shared, "sha256")
            self._prk[slot] = cached
            self.key_agreements += 1
        return cached

    def claim_round(self, round_id: int) -> None:
        """Register ``round_id``; a second use raises ValueError (its secrets would repeat)."""
        if round_id in self._rounds:
            raise ValueError(
                f"round id {round_id} was already used with these long-term keys; reusing it "
                "would repeat every pair mask of the round (use a new round id)"
            )
        self._rounds.add(round_id)

    @property
    def cached_pairs(self) -> int:
        """Pair keys held (each client's own copy counted once per direction computed)."""
        return len(self._prk)


def round_secret(prk: bytes, round_id: int, a: int, b: int) -> bytes:
    """HKDF-Expand(PRK, info = label | round | pair, 32 bytes) for the pair {a, b}: the round's
    16-byte mask key, then its 16-byte key for the shares the two send each other (RFC 5869;
    one HMAC-SHA256 block)."""
    info = ROUND_LABEL + struct.pack("<QQQ", round_id, min(a, b), max(a, b))
    return hmac.digest(prk, info + b"\x01", "sha256")


def _random_field(shape: tuple[int, ...]) -> np.ndarray:
    """Uniform elements of GF(SHARE_PRIME) from the OS's CSPRNG (rejection sampling)."""
    size = math.prod(shape)
    out = np.frombuffer(secrets.token_bytes(8 * size), dtype="<u8") & np.uint64(2**44 - 1)
    bad = np.flatnonzero(out >= SHARE_PRIME)
    while len(bad):
        fresh = np.frombuffer(secrets.token_bytes(8 * len(bad)), dtype="<u8") & np.uint64(2**44 - 1)
        out[bad] = fresh
        bad = bad[fresh >= SHARE_PRIME]
    return out.reshape(shape)


def key_limbs(keys: np.ndarray) -> np.ndarray:
    """(m, 16) uint8 keys as (m, 3) uint64 limbs of 43, 43 and 42 bits."""
    words = np.ascontiguousarray(keys, dtype=np.uint8).view("<u8").reshape(-1, 2)
    lo, hi = words[:, 0], words[:, 1]
    mask43 = np.uint64(2**43 - 1)
    return np.stack(
        [
            lo & mask43,
            (lo >> np.uint64(43)) | ((hi & np.uint64(2**22 - 1)) << np.uint64(21)),
            hi >> np.uint64(22),
        ],
        axis=1,
    )


def limbs_key(limbs: Sequence[int]) -> bytes:
    """The 16-byte key of three limbs (the inverse of :func:`key_limbs`)."""
    if not (
        0 <= int(limbs[0]) < 2**43 and 0 <= int(limbs[1]) < 2**43 and 0 <= int(limbs[2]) < 2**42
    ):
        raise ValueError("limbs out of range: not the limbs of a 128-bit key")
    value = int(limbs[0]) | (int(limbs[1]) << 43) | (int(limbs[2]) << 86)
    return value.to_bytes(KEY_BYTES, "little")


def shamir_split_limbs(secrets_: np.ndarray, *, holders: int, threshold: int) -> np.ndarray:
    """Shares (m, holders, w) of m secrets of w field elements each: share x = 1..holders of an
    independent random polynomial of degree threshold − 1 per element (all at once)."""
    if not 1 <= threshold <= holders <= _MAX_DEGREE:
        raise ValueError(f"need 1 <= threshold <= holders <= {_MAX_DEGREE}")
    m, w = secrets_.shape
    p = np.uint64(SHARE_PRIME)
    x = np.arange(1, holders + 1, dtype=np.uint64)[None, :, None]
    coefficients = _random_field((threshold - 1, m, 1, w))
    acc = np.zeros((m, holders, w), dtype=np.uint64)
    for j in range(threshold - 2, -1, -1):  # Horner from the top coefficient
        acc = (acc * x + coefficients[j]) % p
    return (acc * x + secrets_[:, None, :]) % p


@functools.lru_cache(maxsize=4096)
def lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """Lagrange coefficients at 0 for the distinct x-coordinates ``xs`` over GF(SHARE_PRIME)."""
    p = SHARE_PRIME
    out = []
    for i, xi in enumerate(xs):
        num = den = 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % p
                den = den * (xj - xi) % p
        out.append(num * pow(den, -1, p) % p)
    return tuple(out)


def shamir_combine_limbs(xs: Sequence[int], shares: np.ndarray) -> list[int]:
    """The secret's field elements from shares (t, w) taken at x-coordinates ``xs``."""
    if len(set(xs)) != len(xs):
        raise ValueError("shares must have distinct x coordinates")
    coefficients = lagrange_at_zero(tuple(int(x) for x in xs))
    rows = shares.tolist()
    return [
        sum(c * row[e] for c, row in zip(coefficients, rows, strict=True)) % SHARE_PRIME
        for e in range(shares.shape[1])
    ]


def shamir_combine_many(columns: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Secrets (m, w) of m owners from t shares each, (m, t, w), taken at x = columns + 1
    (Lagrange at 0, all owners at once). Each coefficient is split into three 15-bit chunks so
    that every product (< 2^59) fits in 64 bits."""
    m, t = columns.shape
    out = np.zeros((m, shares.shape[2]), dtype=np.uint64)
    if m == 0:
        return out
    lam = np.array(
        [lagrange_at_zero(tuple(row)) for row in (columns + 1).tolist()], dtype=np.uint64
    )
    p, chunk_mask = np.uint64(SHARE_PRIME), np.uint64(2**15 - 1)
    for c in (2, 1, 0):  # Horner over the chunks: Σ_c 2^(15c) Σ_j share_j · λ_j^(c)
        chunk = (lam >> np.uint64(15 * c)) & chunk_mask
        acc = np.zeros_like(out)
        for j in range(t):
            acc = (acc + shares[:, j, :] * chunk[:, j, None]) % p
        out = (out * np.uint64(2**15) + acc) % p
    return out


def limbs_key_checked(limbs: np.ndarray, abort: Callable[[str], SecAggAborted]) -> bytes:
    try:
        return limbs_key(limbs.tolist())
    except ValueError:
        raise abort("a secret did not rebuild from its shares") from None
