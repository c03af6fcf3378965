"""The complete-graph protocol: secure aggregation where every pair of a round's clients masks.

This is the semi-honest version of Bonawitz et al., "Practical Secure Aggregation for
Privacy-Preserving Machine Learning" (CCS 2017), with its dropout recovery, fresh keys every
round and a global threshold t, which costs O(n^2) key agreements and PRG streams and O(n^3)
secret-sharing work per round (SecAgg+, :mod:`fedrec.federation.secagg.plus`, is the sparse
version :class:`~fedrec.federation.secagg.mf_secavg.MFSecAvg` uses by default):

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
   (:class:`~fedrec.federation.secagg.outcome.SecAggAborted`): the global model is kept, never
   a wrong aggregate.

Clients may drop out at every stage (:func:`secure_sum_complete`'s ``dropped_before_keys``,
``dropped_before_sharing``, ``dropped_after_sharing`` and ``silent_in_unmasking``): the result is
the exact sum of the survivors' inputs, or, with fewer than t clients left at any stage, the
abort. A malformed contribution -- a vector that is not a 1-d integer array of the round's length
(floats are refused, never cast) -- aborts the round too
(:class:`~fedrec.federation.secagg.outcome.MalformedContribution`), before any key is made.

Here are the protocol's primitives (Shamir sharing over GF(2^521 − 1), the ChaCha20 PRG, HKDF),
its client (:class:`SecAggClient`) and one round in one process (:func:`secure_sum_complete`).
"""

from __future__ import annotations

import secrets
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedrec.federation.secagg.inputs import client_positions, client_words
from fedrec.federation.secagg.outcome import MalformedContribution, SecAggAborted, SecureSumResult

#: Shamir's field: the Mersenne prime 2^521 − 1 (larger than the 256-bit secrets shared).
FIELD_PRIME = 2**521 - 1
_RAW = serialization.Encoding.Raw
_WORD_BYTES = 8


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


def secure_sum_complete(
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
    :func:`~fedrec.federation.secagg.inputs.encode_fixed_point` (which MF-SecAvg's
    :func:`~fedrec.federation.secagg.mf_plaintext.mf_secavg_vector` calls).

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
