"""SecAgg+'s protocol rounds, one function each, on the state of one round (:class:`RoundState`).

:func:`advertise_keys` (every edge's round pair secret, from the long-term pair keys),
:func:`share_keys` (fresh self-mask seed b_m and round key ρ_m, the pair mask keys sealed under
ρ_m, both Shamir-shared among the neighbours), :func:`collect_masked_inputs` (the survivors' rows
masked in place) and :func:`unmask` (the server rebuilds the secrets from t answering neighbours
and removes the masks). :func:`fedrec.federation.secagg.plus.secure_sum_plus` opens the round and
calls them in order.
"""

from __future__ import annotations

import hmac
import secrets
import struct
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fedrec.federation.secagg.graph import GraphParameters, is_connected
from fedrec.federation.secagg.inputs import WordRows
from fedrec.federation.secagg.keys import (
    KEY_BYTES,
    LIMBS,
    ROUND_LABEL,
    KeyDirectory,
    key_limbs,
    limbs_key_checked,
    shamir_combine_many,
    shamir_split_limbs,
)
from fedrec.federation.secagg.masking import NONCE, Masker
from fedrec.federation.secagg.outcome import SecAggAborted

_WORD_BYTES = 8


# ------------------------------------------------------------------------------------------------
# The round's state


@dataclass
class RoundState:
    """What the server and the simulated clients of one round share: the checked arguments, the
    rows being masked, the graph, and which clients are left at each stage."""

    round_id: int
    ids: list[int]
    """the clients' long-term identities, by position."""
    params: GraphParameters
    rows: WordRows
    """the inputs, masked in place (a copy unless ``overwrite_input``)."""
    single: np.ndarray | None
    """the (n, L) uint64 words viewed by ``rows`` when the inputs were word vectors."""
    directory: KeyDirectory
    agreements_before: int
    """the directory's X25519 count when the round started."""
    seed: bytes
    """the graph's public randomness."""
    neighbours: np.ndarray
    ring: list[int]
    nbr_lists: list[list[int]]
    mirror: list[list[int]]
    """``mirror[m][col]``: m's column in the row of its neighbour at column col."""
    edges: list[tuple[int, int, int, int]]
    absent: set[int]
    """positions that left before sharing their keys."""
    dropped: set[int]
    """positions of U2 whose masked input never arrives."""
    shared: np.ndarray
    """U2 (bool mask): the clients whose shares arrived."""
    survived: np.ndarray
    """U3 (bool mask): the clients of U2 whose masked input arrived."""
    answered: np.ndarray
    """the survivors that answer the unmasking request."""
    per_client: bool
    shared_list: list[bool] = field(init=False)
    survived_list: list[bool] = field(init=False)

    def __post_init__(self) -> None:
        self.shared_list, self.survived_list = self.shared.tolist(), self.survived.tolist()

    @property
    def n(self) -> int:
        return self.params.num_clients

    @property
    def k(self) -> int:
        return self.params.degree

    @property
    def t(self) -> int:
        return self.params.threshold

    def abort(self, reason: str) -> SecAggAborted:
        return round_aborted(self.round_id, reason)


def round_aborted(round_id: int, reason: str) -> SecAggAborted:
    return SecAggAborted(
        f"round {round_id}: {reason}; the round is aborted and the global model kept"
    )


# ------------------------------------------------------------------------------------------------
# The protocol's rounds


@dataclass
class PairSecrets:
    """The round's secrets of each edge between clients of U2, per client and neighbour column."""

    mask_key: list[list[bytes | None]]
    """``mask_key[m][col]``: the 16-byte key of m's pair mask with its neighbour at col."""
    channel: list[list[AESGCM | None]]
    """``channel[m][col]``: the cipher of the shares m and that neighbour send each other."""


def advertise_keys(state: RoundState) -> PairSecrets:
    """AdvertiseKeys: every edge of clients of U2 gets its round's pair secret (mask key |
    share-channel key), HKDF-Expand of the pair's long-term PRK (X25519 runs only for a pair
    that was never neighbours before). Computed once per edge, or by each end with
    ``per_client``."""
    n, k, ids, shared = state.n, state.k, state.ids, state.shared_list
    mask_key: list[list[bytes | None]] = [[None] * k for _ in range(n)]
    channel: list[list[AESGCM | None]] = [[None] * k for _ in range(n)]
    pair_key, digest, pack = state.directory.pair_key, hmac.digest, struct.pack
    prefix = ROUND_LABEL + pack("<Q", state.round_id)  # round_secret's info, built once per round
    for a, col_a, b, col_b in state.edges:  # a < b
        if not (shared[a] and shared[b]):
            continue
        ia, ib = ids[a], ids[b]
        low, high = (ia, ib) if ia < ib else (ib, ia)
        info = prefix + pack("<QQ", low, high) + b"\x01"
        if state.per_client:  # each client runs its own X25519 (once per neighbour) and HKDF
            sa = digest(pair_key(ia, ib), info, "sha256")
            sb = digest(pair_key(ib, ia), info, "sha256")
            channel[a][col_a] = AESGCM(sa[KEY_BYTES:])
            channel[b][col_b] = AESGCM(sb[KEY_BYTES:])
        else:  # the two compute the same bytes: once per unordered pair
            sa = sb = digest(pair_key(low, high), info, "sha256")
            channel[a][col_a] = channel[b][col_b] = AESGCM(sa[KEY_BYTES:])
        mask_key[a][col_a], mask_key[b][col_b] = sa[:KEY_BYTES], sb[:KEY_BYTES]
    return PairSecrets(mask_key, channel)


@dataclass
class Shares:
    """What ShareKeys leaves: each member's fresh self-mask seed, its sealed pair mask keys (the
    server's), the shares each holder keeps, and the bytes sent."""

    members: np.ndarray
    """positions of U2."""
    self_seed: dict[int, bytes]
    sealed: dict[int, bytes]
    held: np.ndarray
    """(n, k, 2 · LIMBS) uint64: ``held[owner, col]``, the shares of (b, ρ) of ``owner`` that
    its neighbour at column col keeps."""
    share_bytes: int


def share_keys(state: RoundState, pair: PairSecrets) -> Shares:
    """ShareKeys: every member m of U2 draws fresh b_m and ρ_m; ρ_m encrypts m's pair mask keys
    (the server keeps the ciphertext); both are Shamir-shared among m's neighbours
    (x = neighbour column + 1), each share encrypted under the pair's channel key and relayed."""
    n, k, t, ids = state.n, state.k, state.t, state.ids
    members = np.flatnonzero(state.shared)
    member_list = members.tolist()
    fresh = np.frombuffer(secrets.token_bytes(2 * KEY_BYTES * len(members)), dtype=np.uint8)
    fresh = fresh.reshape(len(members), 2, KEY_BYTES)
    fresh_bytes = fresh.tobytes()
    self_seed: dict[int, bytes] = {}
    sealed: dict[int, bytes] = {}
    empty_key = bytes(KEY_BYTES)
    for i, m in enumerate(member_list):
        base = 2 * KEY_BYTES * i
        self_seed[m] = fresh_bytes[base : base + KEY_BYTES]
        mask_keys = b"".join(key if key is not None else empty_key for key in pair.mask_key[m])
        sealed[m] = AESGCM(fresh_bytes[base + KEY_BYTES : base + 2 * KEY_BYTES]).encrypt(
            NONCE, mask_keys, _aad(state.round_id, ids[m])
        )
    limbs = key_limbs(fresh.reshape(-1, KEY_BYTES)).reshape(len(members), 2 * LIMBS)
    shares = shamir_split_limbs(limbs, holders=k, threshold=t)  # (|U2|, k, 6)
    share_size = 2 * LIMBS * _WORD_BYTES
    payloads = shares.tobytes()
    held_bytes = bytearray(n * k * share_size)  # [owner, column] as the holder keeps it
    share_bytes = 0
    aad = _aad(state.round_id, 0)
    up, down = _direction_nonce(0, 1), _direction_nonce(1, 0)
    id_bytes = [struct.pack("<Q", i) for i in ids]
    for i, m in enumerate(member_list):
        for column, j in enumerate(state.nbr_lists[m]):
            if not state.shared_list[j]:
                continue
            header = id_bytes[m] + id_bytes[j]
            nonce = up if m < j else down
            at = (i * k + column) * share_size
            sender = pair.channel[m][column]
            message = header + payloads[at : at + share_size]
            blob = sender.encrypt(nonce, message, aad)  # type: ignore[union-attr]
            share_bytes += len(blob)
            # the holder decrypts with its own copy of the pair secret
            holder = pair.channel[j][state.mirror[m][column]]
            plain = holder.decrypt(nonce, blob, aad)  # type: ignore[union-attr]
            if plain[:16] != header:
                raise ValueError("a share was relayed to the wrong client")
            at = (m * k + column) * share_size
            held_bytes[at : at + share_size] = plain[16:]
    held = np.frombuffer(held_bytes, dtype="<u8").reshape(n, k, 2 * LIMBS)
    return Shares(members, self_seed, sealed, held, share_bytes)


def collect_masked_inputs(
    state: RoundState, mask_key: list[list[bytes | None]], self_seed: dict[int, bytes]
) -> int:
    """MaskedInputCollection: y_m = x_m + PRG(b_m) + Σ_{j ∈ N(m) ∩ U2} ±PRG(s_mj), the lower
    position adding and the higher subtracting, the survivors' rows masked in place segment by
    segment (a stream of B bytes covers the whole row). Returns the streams expanded.

    Clients are visited in ring order and each edge is expanded from the end that reaches the
    other forward, so the rows an edge touches are still in cache; with ``per_client`` every
    survivor expands its own."""
    n, k = state.n, state.k
    shared, survived, nbr_lists = state.shared_list, state.survived_list, state.nbr_lists
    masker = Masker(state.rows, state.rows.segments())
    expand, add, subtract = masker.expand, masker.add, masker.subtract
    sparse = k < n - 1
    visit = state.ring if sparse else range(n)
    for m in visit:
        if not shared[m]:
            continue
        if survived[m]:
            add(m, expand(self_seed[m]))
        keys_m = mask_key[m]
        if state.per_client:
            if not survived[m]:
                continue
            for column, j in enumerate(nbr_lists[m]):
                if shared[j]:
                    (add if m < j else subtract)(m, expand(keys_m[column]))  # type: ignore[arg-type]
            continue
        first = k // 2 if sparse else m  # ring offsets +1..+k/2, or the positions j > m
        for column in range(first, k):
            j = nbr_lists[m][column]
            if not shared[j] or not (survived[m] or survived[j]):
                continue
            stream = expand(keys_m[column])  # type: ignore[arg-type]
            lo, hi = (m, j) if m < j else (j, m)
            if survived[lo]:
                add(lo, stream)
            if survived[hi]:
                subtract(hi, stream)
    masker.finish()
    return masker.streams


@dataclass
class Unmasked:
    """What Unmasking leaves: the survivors, each segment's sum, the bytes of the unmask
    shares, and the streams the server expanded."""

    order: np.ndarray
    """positions of U3, ascending."""
    totals: list[np.ndarray]
    unmask_bytes: int
    streams: int


def unmask(state: RoundState, shares: Shares) -> Unmasked:
    """Unmasking: with enough survivors, forming a connected graph, each answering neighbour
    returns its share of b_m for a survivor m and of ρ_d for a dropped d with surviving
    neighbours (never both for one client); the server rebuilds them from the first t per
    client, removes the self masks and, with the pair mask keys ρ_d unseals, the dropped
    clients' dangling pair masks."""
    order = _check_survivors(state)
    owners = {
        "b": order,
        "rho": np.array(
            [d for d in sorted(state.dropped) if state.survived[state.neighbours[d]].any()],
            dtype=np.int64,
        ),
    }
    rebuilt = _rebuild_secrets(state, owners, shares.held)
    everyone = len(order) == state.n
    totals = [
        (segment if everyone else segment[order]).sum(axis=0, dtype=segment.dtype)
        for segment in state.rows.segments()
    ]
    unmask_bytes = (len(order) + len(owners["rho"])) * state.t * LIMBS * _WORD_BYTES
    streams = _remove_masks(state, totals, owners["rho"], rebuilt, shares.sealed)
    return Unmasked(order, totals, unmask_bytes, streams)


def _check_survivors(state: RoundState) -> np.ndarray:
    """U3 in position order, after checking that it can be unmasked: more than t survivors,
    and a connected survivors' graph (a Harary or complete graph with every client surviving is
    connected by construction)."""
    order = np.flatnonzero(state.survived)
    n, t = state.n, state.t
    if len(order) <= t:  # each survivor needs t answering neighbours, themselves survivors
        raise state.abort(
            f"{len(order)} of {n} clients survived to upload a masked input, below the "
            f"threshold {t} plus one"
        )
    everyone = len(order) == n
    connected, components = (
        (True, 1) if everyone else is_connected(state.neighbours, state.survived)
    )
    if not connected:
        raise state.abort(
            f"the survivors' masking graph has {components} components, so unmasking would "
            "reveal partial sums"
        )
    return order


def _rebuild_secrets(
    state: RoundState, owners: dict[str, np.ndarray], held: np.ndarray
) -> dict[str, np.ndarray]:
    """The limbs of b_m of each survivor ("b") and of ρ_d of each dropped client ("rho"), from
    the shares of the first t of their neighbours that answer; aborts when a client has fewer
    than t."""
    t, k = state.t, state.k
    columns: dict[str, np.ndarray] = {}
    for part_name, who in owners.items():
        answering = state.answered[state.neighbours[who]]
        short = np.flatnonzero(answering.sum(1) < t)
        if len(short):
            m = int(who[short[0]])
            role = "survivor" if part_name == "b" else "dropped client"
            raise state.abort(
                f"{role} {m} has {int(answering[short[0]].sum())} of its {k} neighbours "
                f"answering the unmasking, below the threshold {t}"
            )
        columns[part_name] = np.argsort(~answering, axis=1, kind="stable")[:, :t]
    limb_part = {"b": slice(0, LIMBS), "rho": slice(LIMBS, 2 * LIMBS)}
    return {
        part: shamir_combine_many(columns[part], held[who[:, None], columns[part], limb_part[part]])
        for part, who in owners.items()
    }


def _remove_masks(
    state: RoundState,
    totals: list[np.ndarray],
    dropped: np.ndarray,
    rebuilt: dict[str, np.ndarray],
    sealed: dict[int, bytes],
) -> int:
    """Subtract the survivors' self masks from ``totals`` (in place) and undo the pair masks
    the survivors share with the ``dropped`` clients; the streams expanded."""
    server = Masker(state.rows, [total[None, :] for total in totals])
    for limbs_b in rebuilt["b"]:  # the survivors' self masks
        server.subtract(0, server.expand(limbs_key_checked(limbs_b, state.abort)))
    for d, limbs_rho in zip(dropped.tolist(), rebuilt["rho"], strict=True):
        try:
            key = limbs_key_checked(limbs_rho, state.abort)
            mask_keys = AESGCM(key).decrypt(NONCE, sealed[d], _aad(state.round_id, state.ids[d]))
        except InvalidTag as error:  # a wrong rebuild cannot decrypt: abort, never a wrong sum
            raise state.abort(f"the round key of dropped client {d} did not rebuild") from error
        for column, j in enumerate(state.nbr_lists[d]):
            if state.survived_list[j]:  # j < d added +PRG(s_jd): undo it
                stream = server.expand(mask_keys[16 * column : 16 * column + 16])
                (server.subtract if j < d else server.add)(0, stream)
    server.finish()
    return server.streams


def _aad(round_id: int, client: int) -> bytes:
    return struct.pack("<QQ", round_id, client)


def _direction_nonce(sender: int, receiver: int) -> bytes:
    return bytes(11) + (b"\x01" if sender < receiver else b"\x02")
