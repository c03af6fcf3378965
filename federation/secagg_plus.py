"""SecAgg+: secure aggregation on a sparse random Harary graph, with long-term pair keys.

The protocol of :mod:`fedrec.federation.secagg` (Bonawitz et al., CCS 2017) masks and secret-
shares between *all* pairs of a round's clients and makes fresh X25519 keys every round. This
module keeps its guarantees under a bounded-fraction threat model at a fraction of the cost
(docs/secure_aggregation.md has the protocol, the security argument and the measurements):

1. **Sparse graph** (Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic
   Overhead", CCS 2020). The server draws a public random permutation of the round's clients and
   places them on the ring of the Harary graph H(n, k): each client is a neighbour of the k/2
   clients on either side. Pairwise masks and secret shares are exchanged only between
   neighbours; the threshold t is per neighbourhood. :class:`ThreatModel` turns the fractions
   of corrupted clients (γ) and dropouts (δ) into (k, t) with the paper's analysis: the honest
   survivors stay connected and no client has t corrupted neighbours except with probability
   2^-σ (σ = 40), and every client keeps t surviving neighbours except with probability 2^-η
   (η = 20). The server also aborts if the survivors' graph is disconnected.
2. **Amortised key agreement.** Each client enrols one long-term X25519 key pair
   (:class:`KeyDirectory`); two clients run X25519 once, when they first become neighbours, and
   keep PRK = HKDF-Extract(DH). Every round's pair secret is HKDF-Expand(PRK, round, pair): a
   16-byte mask key and a 16-byte key for the shares sent between them. A round id can be used
   once per directory, so per-round secrets never repeat. Self-mask seeds stay fresh per round.
   Dropout recovery does not share the long-term key: client m encrypts its round's pair mask
   keys under a fresh round key ρ_m (the ciphertext goes to the server) and Shamir-shares ρ_m
   and its self-mask seed b_m among its neighbours, like the mask key and b_m of Bonawitz et al.
3. **Vectorised masking.** One AES-128 counter-mode stream per seed, added to the upload with
   whole-array NumPy operations; the Shamir shares of a round are computed for all clients at
   once over GF(2^44 − 17) (a 128-bit key is three 43-bit limbs). An upload may be a
   :class:`~fedrec.federation.secagg.WordRows` of 64- and 32-bit segments: one keystream per
   seed covers the row's bytes and is added segment by segment (modulo 2^64 or 2^32), so
   MF-SecAvg's 32-bit item words halve the mask bytes.
4. **Graphs per client set.** ``graph_seed`` is public randomness; ``MFSecAvg`` derives it as
   HMAC(run key, the round's client ids), so a set of clients that meets again (a fixed cohort,
   ``FedNCFConfig(selection="cohorts")``) has the same graph and neighbours, and its pair keys
   are cached: X25519 runs once per pair per run.

:func:`secure_sum_plus` runs one round in one process. By default each edge's pair secret and
mask stream is computed once and applied to both of its clients (the two would compute the same
bytes); ``per_client=True`` makes every client derive its own keys and streams, which is what a
deployment spends and what ``benchmarks/secagg_cost.py`` reports next to it.
"""

from __future__ import annotations

import functools
import hmac
import math
import secrets
import struct
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fedrec.federation.secagg import (
    MalformedContribution,
    SecAggAborted,
    SecureSumResult,
    WordRows,
    client_positions,
    client_words,
)

#: Shamir's field for SecAgg+: the prime 2^44 − 17. Shares of a 128-bit key are three 43-bit
#: limbs, each shared on its own; a limb times a share x-coordinate (< 2^20) fits in 64 bits.
SHARE_PRIME = 2**44 - 17
_LIMB_BITS = 43
_LIMBS = 3
_KEY_BYTES = 16
_MAX_DEGREE = 2**20 - 1
_NONCE = bytes(12)
_EXTRACT_SALT = b"fedrec-secagg+/pair-v1"
_ROUND_LABEL = b"fedrec-secagg+/round-v1"
_WORD_BYTES = 8


# ------------------------------------------------------------------------------------------------
# Parameters: the threat model and the graph


@dataclass(frozen=True)
class GraphParameters:
    """A round's graph: ``degree`` neighbours per client and the per-neighbourhood ``threshold``."""

    num_clients: int
    degree: int
    threshold: int

    @property
    def complete(self) -> bool:
        """Whether every client is a neighbour of every other one."""
        return self.degree >= self.num_clients - 1


@functools.lru_cache(maxsize=256)
def harary_parameters(
    num_clients: int,
    *,
    corrupted: float,
    dropout: float,
    security_bits: int = 40,
    correctness_bits: int = 20,
    min_degree: int = 4,
) -> GraphParameters:
    """The smallest even degree k ≥ ``min_degree`` of a randomly labelled Harary graph H(n, k),
    and its threshold t, that meet the threat model (the analysis of Bell et al., CCS 2020):

    - *security*: with A = ⌊γn⌋ corrupted and D = ⌊δn⌋ dropped clients placed independently of
      the random labelling, (a) the graph minus those A + D clients is disconnected with
      probability ≤ 2^-(σ+1) -- removing nodes disconnects H(n, k) only if they cover two
      disjoint runs of k/2 consecutive ring positions, so Pr ≤ n(n−k−1)/2 · C(A+D, k)/C(n, k),
      which is 0 when k > A + D; and (b) some honest client has t or more corrupted neighbours
      (who could pool t shares of both of its secrets) with probability ≤ 2^-(σ+1): t − 1 is
      the hypergeometric (n−1, A, k) quantile at 2^-(σ+1)/n (a union bound over clients);
    - *correctness*: some client has fewer than t surviving neighbours (its secrets could not be
      rebuilt; the round aborts) with probability ≤ 2^-η, via the hypergeometric
      (n−1, n−1−D, k) lower tail at 2^-η/n.

    t is the smallest secure value, which leaves the most room for dropouts beyond δ. When no
    degree below n − 1 qualifies, the result is the complete graph with a majority threshold.
    All probabilities are compared in exact integer arithmetic.
    """
    n = num_clients
    if n < 2:
        raise ValueError(f"need at least 2 clients, got {n}")
    if not (0 <= corrupted < 1 and 0 <= dropout < 1):
        raise ValueError("corrupted and dropout must be fractions in [0, 1)")
    bad_corrupt = math.floor(corrupted * n + 1e-9)
    bad_dropped = math.floor(dropout * n + 1e-9)
    bad = bad_corrupt + bad_dropped
    start = max(2, min_degree + (min_degree % 2))
    for k in range(start, n - 1, 2):
        # (a) the honest survivors stay connected: n(n−k−1)/2 · C(bad, k) / C(n, k) < 2^-(σ+1)
        if k <= bad and (
            n * (n - k - 1) * math.comb(bad, k) * 2 ** (security_bits + 1) >= 2 * math.comb(n, k)
        ):
            continue
        t = secure_threshold(n, k, corrupted=corrupted, security_bits=security_bits)
        # correctness: Pr[surviving neighbours < t] <= 2^-η / n
        if t <= k and _lower_tail_ok(n - 1, n - 1 - bad_dropped, k, t, correctness_bits, n):
            return GraphParameters(n, k, t)
    return GraphParameters(n, n - 1, n // 2 + 1 if n > 2 else 2)


def secure_threshold(num_clients: int, degree: int, *, corrupted: float, security_bits: int) -> int:
    """The smallest t ≥ 2 such that some honest client has t or more corrupted neighbours with
    probability ≤ 2^-(σ+1) (⌊γn⌋ corrupted clients among the n − 1 others, a union bound)."""
    n = num_clients
    bad_corrupt = math.floor(corrupted * n + 1e-9)
    return max(2, _upper_quantile(n - 1, bad_corrupt, degree, security_bits + 1, n) + 1)


def _hypergeometric_counts(population: int, marked: int, draws: int) -> list[int]:
    """C(marked, x) · C(population − marked, draws − x) for x = 0..draws (exact integers)."""
    return [
        math.comb(marked, x) * math.comb(population - marked, draws - x) for x in range(draws + 1)
    ]


def _upper_quantile(population: int, marked: int, draws: int, bits: int, union: int) -> int:
    """The smallest q with Pr[X > q] ≤ 2^-bits / union, X hypergeometric."""
    counts = _hypergeometric_counts(population, marked, draws)
    total = math.comb(population, draws)
    tail = 0
    for q in range(draws, -1, -1):  # tail = Pr[X > q] · total
        if tail * union * 2**bits > total:
            return q + 1
        tail += counts[q]
    return 0 if tail * union * 2**bits <= total else -1


def _lower_tail_ok(population: int, marked: int, draws: int, t: int, bits: int, union: int) -> bool:
    """Whether Pr[X < t] ≤ 2^-bits / union, X hypergeometric (marked = survivors)."""
    if marked < 0:
        return False
    counts = _hypergeometric_counts(population, marked, draws)
    return sum(counts[:t]) * union * 2**bits <= math.comb(population, draws)


@dataclass(frozen=True)
class ThreatModel:
    """The bounded-fraction threat model SecAgg+ is sized for.

    An honest-but-curious server that may collude with up to a fraction ``corrupted`` (γ) of a
    round's clients; up to a fraction ``dropout`` (δ) of the clients drop at some stage. The
    defaults (5% corrupted, as in Bell et al.'s example, and 10% dropouts) give degree 4 and
    threshold 2 for FedNCF's 20 clients per round, degree 16 for 100 clients and 36 for 1,000.
    """

    corrupted: float = 0.05
    dropout: float = 0.10
    security_bits: int = 40
    """σ: privacy fails with probability at most 2^-σ."""
    correctness_bits: int = 20
    """η: a round aborts for lack of shares with probability at most 2^-η."""
    min_degree: int = 4
    """degree floor: with degree 2 (a ring) and t = 2 a single dropout leaves its neighbours
    without enough shares."""

    def __post_init__(self) -> None:
        if not 0 <= self.corrupted < 1 or not 0 <= self.dropout < 1:
            raise ValueError("corrupted and dropout must be fractions in [0, 1)")
        if self.security_bits < 1 or self.correctness_bits < 1:
            raise ValueError("security_bits and correctness_bits must be >= 1")
        if self.min_degree < 2:
            raise ValueError(f"min_degree must be >= 2, got {self.min_degree}")

    def parameters(self, num_clients: int) -> GraphParameters:
        """(k, t) for a round of ``num_clients`` (see :func:`harary_parameters`)."""
        return harary_parameters(
            num_clients,
            corrupted=self.corrupted,
            dropout=self.dropout,
            security_bits=self.security_bits,
            correctness_bits=self.correctness_bits,
            min_degree=self.min_degree,
        )


def harary_neighbours(num_clients: int, degree: int, seed: bytes) -> np.ndarray:
    """(n, k) neighbours of each client in H(n, k) under the random labelling given by ``seed``.

    The permutation is drawn from ``seed`` (public randomness of the round), so every party
    derives the same graph. Row i lists client i's neighbours from ring offset −k/2 to +k/2
    (0 excluded); a neighbour's column + 1 is its Shamir x-coordinate for client i's secrets.
    ``degree`` must be even, or n − 1 (the complete graph, listed in position order).
    """
    n, k = num_clients, degree
    if not 1 <= k <= n - 1:
        raise ValueError(f"degree must be in [1, {n - 1}], got {k}")
    if k == n - 1:
        everyone = np.arange(n)
        return np.array([np.delete(everyone, i) for i in range(n)], dtype=np.int64).reshape(n, k)
    if k % 2:
        raise ValueError(f"a sparse Harary graph needs an even degree, got {k}")
    digest = hmac.digest(b"fedrec-secagg+/graph-v1", bytes(seed), "sha256")
    ring = np.random.default_rng(np.frombuffer(digest, dtype=np.uint32)).permutation(n)
    slot = np.empty(n, dtype=np.int64)
    slot[ring] = np.arange(n)
    half = k // 2
    offsets = np.concatenate([np.arange(-half, 0), np.arange(1, half + 1)])
    return ring[(slot[:, None] + offsets[None, :]) % n]


def is_connected(neighbours: np.ndarray, alive: np.ndarray) -> tuple[bool, int]:
    """Whether the graph restricted to the ``alive`` clients (bool mask) is connected, and its
    number of components (0 for an empty set)."""
    alive = np.asarray(alive, dtype=bool)
    remaining = alive.copy()
    components = 0
    while remaining.any():
        components += 1
        frontier = np.flatnonzero(remaining)[:1]
        remaining[frontier] = False
        while len(frontier):
            reached = neighbours[frontier].ravel()
            reached = np.unique(reached[remaining[reached]])
            remaining[reached] = False
            frontier = reached
    return components <= 1, components


# ------------------------------------------------------------------------------------------------
# Long-term keys


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
    info = _ROUND_LABEL + struct.pack("<QQQ", round_id, min(a, b), max(a, b))
    return hmac.digest(prk, info + b"\x01", "sha256")


# ------------------------------------------------------------------------------------------------
# PRG and Shamir shares of 128-bit keys


_ZEROS: dict[int, bytes] = {}


def aes_prg(key: bytes, length: int) -> np.ndarray:
    """``length`` pseudorandom uint64 words: the AES-128 counter-mode keystream under ``key``
    (read-only). Computed as the AES-GCM encryption of zeros, whose ciphertext is exactly that
    keystream (the tag is dropped), because OpenSSL's GCM path is the fastest AES code here."""
    if len(key) != _KEY_BYTES:
        raise ValueError("AES PRG keys are 16 bytes")
    stream = AESGCM(key).encrypt(_NONCE, _zeros(_WORD_BYTES * length), None)
    return np.frombuffer(stream, dtype="<u8", count=length)


def _zeros(size: int) -> bytes:
    """``size`` zero bytes (cached: the plaintext every keystream encrypts)."""
    zeros = _ZEROS.get(size)
    if zeros is None:
        if len(_ZEROS) > 8:
            _ZEROS.clear()
        zeros = _ZEROS[size] = bytes(size)
    return zeros


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
    return value.to_bytes(_KEY_BYTES, "little")


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


def _limbs_key_checked(limbs: np.ndarray, abort: Callable[[str], SecAggAborted]) -> bytes:
    try:
        return limbs_key(limbs.tolist())
    except ValueError:
        raise abort("a secret did not rebuild from its shares") from None


# ------------------------------------------------------------------------------------------------
# One round


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


def secure_sum_plus(
    vectors: Sequence[np.ndarray] | np.ndarray | WordRows,
    *,
    round_id: int,
    client_ids: Sequence[int] | np.ndarray | None = None,
    keys: KeyDirectory | None = None,
    graph: str = "harary",
    threat: ThreatModel | None = None,
    degree: int | None = None,
    threshold: int | None = None,
    graph_seed: bytes | None = None,
    per_client: bool = False,
    overwrite_input: bool = False,
    dropped_before_keys: Iterable[int] = (),
    dropped_before_sharing: Iterable[int] = (),
    dropped_after_sharing: Iterable[int] = (),
    silent_in_unmasking: Iterable[int] = (),
) -> SecureSumResult:
    """One SecAgg+ round over ``vectors`` (1-d integer arrays, an (n, L) integer matrix, or a
    :class:`~fedrec.federation.secagg.WordRows` of 64- and 32-bit segments).

    ``keys``: the long-term :class:`KeyDirectory` (pair keys reused across rounds; the round id
    must be new to it), or None for fresh per-round keys. ``client_ids``: the clients' long-term
    identities (default: their positions). ``graph``: "harary" (degree and threshold from
    ``threat``, default :class:`ThreatModel`, unless given) or "complete" (every pair; threshold
    default a majority). ``graph_seed``: the round's public randomness for the labelling (default
    fresh random bytes; recorded in the result). ``per_client``: every client derives its own
    pair keys and mask streams instead of once per edge (same result, a deployment's cost).
    ``overwrite_input``: mask an (n, L) uint64 input matrix, or a ``WordRows``, in place (saves
    a copy).

    For word vectors the result's ``total`` is the uint64 sum and ``masked`` the uint64 uploads;
    for a ``WordRows`` both are byte rows (``WordRows.unpack`` splits them into segments) and
    ``parts`` holds each segment's sum.

    The dropout stages are those of :func:`fedrec.federation.secagg.secure_sum`. The round
    aborts (:class:`SecAggAborted`) when a survivor, or a dropped client with surviving
    neighbours, has fewer than ``threshold`` neighbours answering the unmasking, or when the
    survivors' graph is disconnected (unmasking would reveal partial sums).
    """
    start = time.perf_counter()
    n = vectors.num_rows if isinstance(vectors, WordRows) else len(vectors)
    if n < 3:
        raise ValueError("SecAgg+ needs at least 3 clients (use the complete-graph protocol)")
    if isinstance(round_id, bool) or not isinstance(round_id, (int, np.integer)):
        raise ValueError(f"round_id must be an integer, got {round_id!r}")
    if not 0 <= round_id < 2**64:
        raise ValueError(f"round_id must be in [0, 2^64), got {round_id}")
    round_id = int(round_id)
    ids = list(range(n)) if client_ids is None else [int(c) for c in client_ids]
    if len(ids) != n or len(set(ids)) != n or min(ids) < 0:
        raise ValueError("client_ids must be n distinct non-negative integers")
    params = _round_parameters(n, graph, threat, degree, threshold)
    k, t = params.degree, params.threshold
    absent = client_positions("dropped_before_keys", dropped_before_keys, n) | client_positions(
        "dropped_before_sharing", dropped_before_sharing, n
    )
    dropped = client_positions("dropped_after_sharing", dropped_after_sharing, n)
    silent = client_positions("silent_in_unmasking", silent_in_unmasking, n)
    if isinstance(vectors, WordRows):  # before any key is made
        rows = vectors if overwrite_input else vectors.copy()
        single = None
    else:
        words = word_matrix(vectors)
        if not (
            overwrite_input
            or not isinstance(vectors, np.ndarray)
            or not np.shares_memory(words, vectors)
        ):
            words = words.copy()
        rows = WordRows(words.view(np.uint8).reshape(n, -1), (("<u8", words.shape[1]),))
        single = words
    row_bytes = rows.buffer.shape[1]
    directory = KeyDirectory() if keys is None else keys
    directory.claim_round(round_id)
    agreements_before = directory.key_agreements
    seed = secrets.token_bytes(16) if graph_seed is None else bytes(graph_seed)
    nbrs, ring, nbr_lists, mirror, edges = _graph(n, k, seed)

    def abort(reason: str) -> SecAggAborted:
        return SecAggAborted(
            f"round {round_id}: {reason}; the round is aborted and the global model kept"
        )

    # U2: the clients whose shares arrived (U1 minus those who left before sharing).
    shared = np.ones(n, dtype=bool)
    shared[list(absent)] = False
    if shared.sum() < 2:
        raise abort(f"{int(shared.sum())} of {n} clients shared their keys, below 2")
    survived = shared.copy()
    survived[[d for d in dropped if shared[d]]] = False
    dropped = {d for d in dropped if shared[d]}
    answered = survived.copy()
    answered[list(silent)] = False
    shared_list, survived_list = shared.tolist(), survived.tolist()

    # Pair secrets of the round's edges between clients of U2 (mask key | share-channel key),
    # kept per client and neighbour column: mask_key[m][col], channel[m][col].
    mask_key: list[list[bytes | None]] = [[None] * k for _ in range(n)]
    channel: list[list[AESGCM | None]] = [[None] * k for _ in range(n)]
    pair_key, digest, pack = directory.pair_key, hmac.digest, struct.pack
    prefix = _ROUND_LABEL + pack("<Q", round_id)  # round_secret's info, built once per round
    for a, col_a, b, col_b in edges:  # a < b
        if not (shared_list[a] and shared_list[b]):
            continue
        ia, ib = ids[a], ids[b]
        low, high = (ia, ib) if ia < ib else (ib, ia)
        info = prefix + pack("<QQ", low, high) + b"\x01"
        if per_client:  # each client runs its own X25519 (once per neighbour) and HKDF
            sa = digest(pair_key(ia, ib), info, "sha256")
            sb = digest(pair_key(ib, ia), info, "sha256")
            channel[a][col_a] = AESGCM(sa[_KEY_BYTES:])
            channel[b][col_b] = AESGCM(sb[_KEY_BYTES:])
        else:  # the two compute the same bytes: once per unordered pair
            sa = sb = digest(pair_key(low, high), info, "sha256")
            channel[a][col_a] = channel[b][col_b] = AESGCM(sa[_KEY_BYTES:])
        mask_key[a][col_a], mask_key[b][col_b] = sa[:_KEY_BYTES], sb[:_KEY_BYTES]

    # ShareKeys: fresh b_m and ρ_m; ρ_m encrypts m's pair mask keys (the server keeps the
    # ciphertext); both are Shamir-shared among m's neighbours (x = neighbour column + 1).
    members = np.flatnonzero(shared)
    member_list = members.tolist()
    fresh = np.frombuffer(secrets.token_bytes(2 * _KEY_BYTES * len(members)), dtype=np.uint8)
    fresh = fresh.reshape(len(members), 2, _KEY_BYTES)
    fresh_bytes = fresh.tobytes()
    self_seed: dict[int, bytes] = {}
    sealed: dict[int, bytes] = {}
    empty_key = bytes(_KEY_BYTES)
    for i, m in enumerate(member_list):
        base = 2 * _KEY_BYTES * i
        self_seed[m] = fresh_bytes[base : base + _KEY_BYTES]
        mask_keys = b"".join(key if key is not None else empty_key for key in mask_key[m])
        sealed[m] = AESGCM(fresh_bytes[base + _KEY_BYTES : base + 2 * _KEY_BYTES]).encrypt(
            _NONCE, mask_keys, _aad(round_id, ids[m])
        )
    limbs = key_limbs(fresh.reshape(-1, _KEY_BYTES)).reshape(len(members), 2 * _LIMBS)
    shares = shamir_split_limbs(limbs, holders=k, threshold=t)  # (|U2|, k, 6)
    share_size = 2 * _LIMBS * _WORD_BYTES
    payloads = shares.tobytes()
    held_bytes = bytearray(n * k * share_size)  # [owner, column] as the holder keeps it
    share_bytes = 0
    aad = _aad(round_id, 0)
    up, down = _direction_nonce(0, 1), _direction_nonce(1, 0)
    id_bytes = [pack("<Q", i) for i in ids]
    for i, m in enumerate(member_list):
        for column, j in enumerate(nbr_lists[m]):
            if not shared_list[j]:
                continue
            header = id_bytes[m] + id_bytes[j]
            nonce = up if m < j else down
            at = (i * k + column) * share_size
            blob = channel[
                m
            ][
                column
            ].encrypt(  # type: ignore[union-attr]
                nonce, header + payloads[at : at + share_size], aad
            )
            share_bytes += len(blob)
            # the holder decrypts with its own copy of the pair secret
            plain = channel[j][mirror[m][column]].decrypt(nonce, blob, aad)  # type: ignore[union-attr]
            if plain[:16] != header:
                raise ValueError("a share was relayed to the wrong client")
            at = (m * k + column) * share_size
            held_bytes[at : at + share_size] = plain[16:]
    held = np.frombuffer(held_bytes, dtype="<u8").reshape(n, k, 2 * _LIMBS)

    # MaskedInputCollection: y_m = x_m + PRG(b_m) + Σ_{j ∈ N(m) ∩ U2} ±PRG(s_mj), the lower
    # position adding and the higher subtracting, rows masked in place segment by segment (a
    # stream of B bytes covers the whole row). Clients are visited in ring order and each edge
    # is expanded from the end that reaches the other forward, so the rows an edge touches are
    # still in cache; per client, every survivor expands its own.
    order = np.flatnonzero(survived)
    segments = rows.segments()
    masker = _Masker(rows, segments)
    expand, add, subtract = masker.expand, masker.add, masker.subtract
    sparse = k < n - 1
    visit = ring if sparse else range(n)
    for m in visit:
        if not shared_list[m]:
            continue
        if survived_list[m]:
            add(m, expand(self_seed[m]))
        keys_m = mask_key[m]
        if per_client:
            if not survived_list[m]:
                continue
            for column, j in enumerate(nbr_lists[m]):
                if shared_list[j]:
                    (add if m < j else subtract)(m, expand(keys_m[column]))  # type: ignore[arg-type]
            continue
        first = k // 2 if sparse else m  # ring offsets +1..+k/2, or the positions j > m
        for column in range(first, k):
            j = nbr_lists[m][column]
            if not shared_list[j] or not (survived_list[m] or survived_list[j]):
                continue
            stream = expand(keys_m[column])  # type: ignore[arg-type]
            lo, hi = (m, j) if m < j else (j, m)
            if survived_list[lo]:
                add(lo, stream)
            if survived_list[hi]:
                subtract(hi, stream)
    masker.finish()
    streams = masker.streams
    client_seconds = time.perf_counter() - start

    # Unmasking. The server first checks that the survivors' graph is connected (a Harary or
    # complete graph with every client surviving is connected by construction).
    start = time.perf_counter()
    if len(order) <= t:  # each survivor needs t answering neighbours, themselves survivors
        raise abort(
            f"{len(order)} of {n} clients survived to upload a masked input, below the "
            f"threshold {t} plus one"
        )
    everyone = len(order) == n
    connected, components = (True, 1) if everyone else is_connected(nbrs, survived)
    if not connected:
        raise abort(
            f"the survivors' masking graph has {components} components, so unmasking would "
            "reveal partial sums"
        )
    # Each answering neighbour returns its share of b_m for a survivor m, of ρ_d for a dropped d
    # with surviving neighbours (never both for one client); the first t per client are used.
    owners = {
        "b": order,
        "rho": np.array([d for d in sorted(dropped) if survived[nbrs[d]].any()], dtype=np.int64),
    }
    columns: dict[str, np.ndarray] = {}
    for part_name, who in owners.items():
        answering = answered[nbrs[who]]
        short = np.flatnonzero(answering.sum(1) < t)
        if len(short):
            m = int(who[short[0]])
            role = "survivor" if part_name == "b" else "dropped client"
            raise abort(
                f"{role} {m} has {int(answering[short[0]].sum())} of its {k} neighbours "
                f"answering the unmasking, below the threshold {t}"
            )
        columns[part_name] = np.argsort(~answering, axis=1, kind="stable")[:, :t]
    totals = [
        (segment if everyone else segment[order]).sum(axis=0, dtype=segment.dtype)
        for segment in segments
    ]
    limb_part = {"b": slice(0, _LIMBS), "rho": slice(_LIMBS, 2 * _LIMBS)}
    rebuilt = {
        part: shamir_combine_many(columns[part], held[who[:, None], columns[part], limb_part[part]])
        for part, who in owners.items()
    }
    unmask_bytes = (len(order) + len(owners["rho"])) * t * _LIMBS * _WORD_BYTES
    server = _Masker(rows, [total[None, :] for total in totals])
    for limbs_b in rebuilt["b"]:  # the survivors' self masks
        server.subtract(0, server.expand(_limbs_key_checked(limbs_b, abort)))
    for d, limbs_rho in zip(owners["rho"].tolist(), rebuilt["rho"], strict=True):
        try:
            key = _limbs_key_checked(limbs_rho, abort)
            mask_keys = AESGCM(key).decrypt(_NONCE, sealed[d], _aad(round_id, ids[d]))
        except InvalidTag as error:  # a wrong rebuild cannot decrypt: abort, never a wrong sum
            raise abort(f"the round key of dropped client {d} did not rebuild") from error
        for column, j in enumerate(nbr_lists[d]):
            if survived_list[j]:  # j < d added +PRG(s_jd): undo it
                stream = server.expand(mask_keys[16 * column : 16 * column + 16])
                (server.subtract if j < d else server.add)(0, stream)
    server.finish()
    streams += server.streams
    server_seconds = time.perf_counter() - start

    responders = int(answered.sum())
    upload = (
        share_bytes // max(len(members), 1)
        + len(sealed.get(int(members[0]), b""))
        + row_bytes
        + unmask_bytes // max(responders, 1)
    )
    if single is not None:
        total_out, masked = totals[0], {int(m): single[m] for m in order.tolist()}
    else:
        total_out = (
            np.concatenate([part.view(np.uint8) for part in totals])
            if totals
            else np.zeros(0, np.uint8)
        )
        masked = {int(m): rows.buffer[m] for m in order.tolist()}
    return SecureSumResult(
        total=total_out,
        survivors=[int(m) for m in order],
        dropped=sorted(dropped),
        client_seconds=client_seconds,
        server_seconds=server_seconds,
        upload_bytes_per_client=upload,
        masked=masked,
        absent=sorted(absent),
        protocol="secagg+" if not params.complete else "secagg+ (complete graph)",
        degree=k,
        threshold=t,
        neighbours=nbrs,
        graph_seed=seed,
        key_agreements=directory.key_agreements - agreements_before,
        prg_streams=streams,
        parts=totals,
    )


class _Masker:
    """Adds AES keystreams of whole rows to the rows of a :class:`WordRows` in place.

    ``targets[s]`` is a (targets, words) array for segment s: the rows of the clients, or the
    server's running total as one row. The large segments (the largest, and any of at least
    :data:`_LARGE_SEGMENT_BYTES`: MF-SecAvg's item part, and a companion's) are added stream by
    stream with one NumPy operation each; the other (small) segments, MF-SecAvg's 14 network
    words, are collected and added in one operation per segment at :meth:`finish`, which must be
    called before reading the targets.
    """

    def __init__(self, rows: WordRows, targets: Sequence[np.ndarray]) -> None:
        offsets = rows.offsets
        sizes = [dtype.itemsize * count for dtype, _, count in offsets]
        largest = max(range(len(sizes)), key=sizes.__getitem__) if sizes else None
        self.mains = [
            s for s in range(len(sizes)) if s == largest or sizes[s] >= _LARGE_SEGMENT_BYTES
        ]
        self.minor = [s for s in range(len(sizes)) if s not in self.mains and sizes[s]]
        self.offsets = offsets
        self.zeros = _zeros(rows.buffer.shape[1])
        self.targets_by_segment = targets
        self.main_targets = [list(targets[s]) for s in self.mains]
        self.heads: list[bytes] = []
        self.plus: list[tuple[int, int]] = []  # (target, stream)
        self.minus: list[tuple[int, int]] = []
        self.streams = 0

    def expand(self, key: bytes) -> tuple[list[np.ndarray], int]:
        """The large segments' words of ``key``'s keystream, and the stream's number."""
        stream = AESGCM(key).encrypt(_NONCE, self.zeros, None)
        for s in self.minor:
            dtype, offset, count = self.offsets[s]
            self.heads.append(stream[offset : offset + dtype.itemsize * count])
        self.streams += 1
        words = []
        for s in self.mains:
            dtype, offset, count = self.offsets[s]
            words.append(np.frombuffer(stream, dtype, count, offset))
        return words, self.streams - 1

    def add(self, target: int, stream: tuple[list[np.ndarray], int]) -> None:
        for rows, words in zip(self.main_targets, stream[0], strict=True):
            row = rows[target]
            np.add(row, words, out=row)
        self.plus.append((target, stream[1]))

    def subtract(self, target: int, stream: tuple[list[np.ndarray], int]) -> None:
        for rows, words in zip(self.main_targets, stream[0], strict=True):
            row = rows[target]
            np.subtract(row, words, out=row)
        self.minus.append((target, stream[1]))

    def finish(self) -> None:
        for position, s in enumerate(self.minor):
            dtype, _, count = self.offsets[s]
            chunks = self.heads[position :: len(self.minor)]
            heads = np.frombuffer(b"".join(chunks), dtype).reshape(len(chunks), count)
            segment = self.targets_by_segment[s]
            for pairs, ufunc in ((self.plus, np.add), (self.minus, np.subtract)):
                if pairs:
                    where, which = np.array(pairs, dtype=np.int64).T
                    ufunc.at(segment, where, heads[which])
        self.heads, self.plus, self.minus = [], [], []


#: A segment of at least this many bytes is masked stream by stream (a smaller one is collected
#: and masked in one ``ufunc.at`` per segment, which is slow per word but cheap per call).
_LARGE_SEGMENT_BYTES = 4096


@functools.lru_cache(maxsize=1024)
def _graph(
    n: int, degree: int, seed: bytes
) -> tuple[
    np.ndarray, list[int], list[list[int]], list[list[int]], list[tuple[int, int, int, int]]
]:
    """The round's graph, cached (a cohort that meets again with the same graph seed rebuilds
    nothing): the neighbours (read-only), the ring order (for a sparse graph), the neighbour
    lists, ``mirror[m][col]`` (m's column in the row of its neighbour at column col) and the
    edges (a, column of b in a's row, b, column of a in b's row) with a < b."""
    nbrs = harary_neighbours(n, degree, seed)
    nbrs.setflags(write=False)
    lists = nbrs.tolist()
    column_of = [{j: col for col, j in enumerate(row)} for row in lists]
    mirror = [[column_of[j][m] for j in row] for m, row in enumerate(lists)]
    edges = [
        (a, col, b, mirror[a][col])
        for a, row in enumerate(lists)
        for col, b in enumerate(row)
        if a < b
    ]
    ring = _ring_order(nbrs) if degree < n - 1 else list(range(n))
    return nbrs, ring, lists, mirror, edges


def _round_parameters(
    n: int, graph: str, threat: ThreatModel | None, degree: int | None, threshold: int | None
) -> GraphParameters:
    if graph not in ("harary", "complete"):
        raise ValueError(f"graph must be 'harary' or 'complete', got {graph!r}")
    if graph == "complete":
        if degree is not None and degree != n - 1:
            raise ValueError("the complete graph has degree n - 1")
        k = n - 1
        t = min(n // 2 + 1, k) if threshold is None else threshold
    else:
        base = (threat or ThreatModel()).parameters(n) if degree is None else None
        k = base.degree if base is not None else degree
        if degree is not None and not (2 <= k <= n - 1 and (k % 2 == 0 or k == n - 1)):
            raise ValueError(f"degree must be even in [2, {n - 1}] or {n - 1}, got {degree}")
        model = threat or ThreatModel()
        t = threshold
        if t is None:
            t = (
                base.threshold
                if base is not None
                else secure_threshold(
                    n, k, corrupted=model.corrupted, security_bits=model.security_bits
                )
            )
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 2 <= t <= k:
        raise ValueError(f"threshold must be an integer in [2, {k}] (the degree), got {t!r}")
    return GraphParameters(n, k, int(t))


def _ring_order(neighbours: np.ndarray) -> list[int]:
    """The clients of a sparse Harary graph in ring order (column k/2 is the +1 neighbour)."""
    step = neighbours[:, neighbours.shape[1] // 2].tolist()
    order, current = [0], step[0]
    while current != 0:
        order.append(current)
        current = step[current]
    return order


def _aad(round_id: int, client: int) -> bytes:
    return struct.pack("<QQ", round_id, client)


def _direction_nonce(sender: int, receiver: int) -> bytes:
    return bytes(11) + (b"\x01" if sender < receiver else b"\x02")
