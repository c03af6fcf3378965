"""SecAgg+: one round of secure aggregation on a sparse random graph, with long-term pair keys.

The complete-graph protocol (:mod:`fedrec.federation.secagg.complete`, Bonawitz et al., CCS 2017)
masks and secret-shares between *all* pairs of a round's clients and makes fresh X25519 keys
every round. SecAgg+ keeps its guarantees under a bounded-fraction threat model at a fraction of
the cost (docs/secure_aggregation.md has the protocol, the security argument and the
measurements):

1. **Sparse graph** (Bell et al., CCS 2020; :mod:`fedrec.federation.secagg.graph`). Pairwise
   masks and secret shares are exchanged only between neighbours of a randomly labelled Harary
   graph; the threshold t is per neighbourhood. The server also aborts if the survivors' graph
   is disconnected.
2. **Amortised key agreement** (:mod:`fedrec.federation.secagg.keys`). Pair secrets come from
   long-term pair keys by HKDF-Expand per round; self-mask seeds stay fresh per round. Dropout
   recovery does not share the long-term key: client m encrypts its round's pair mask keys under
   a fresh round key ρ_m (the ciphertext goes to the server) and Shamir-shares ρ_m and its
   self-mask seed b_m among its neighbours, like the mask key and b_m of Bonawitz et al.
3. **Vectorised masking** (:mod:`fedrec.federation.secagg.masking`). One AES-128 counter-mode
   stream per seed, added to the upload with whole-array NumPy operations; the Shamir shares of
   a round are computed for all clients at once. An upload may be a
   :class:`~fedrec.federation.secagg.inputs.WordRows` of 64- and 32-bit segments.
4. **Graphs per client set.** ``graph_seed`` is public randomness; ``MFSecAvg`` derives it as
   HMAC(run key, the round's client ids), so a set of clients that meets again (a fixed cohort,
   ``FedNCFConfig(selection="cohorts")``) has the same graph and neighbours, and its pair keys
   are cached: X25519 runs once per pair per run.

:func:`secure_sum_plus` runs one round in one process: it checks the call and opens the round,
then calls one function per protocol round (:mod:`fedrec.federation.secagg.plus_rounds`). By
default each edge's pair secret and mask stream is computed once and applied to both of its
clients (the two would compute the same bytes); ``per_client=True`` makes every client derive
its own keys and streams, which is what a deployment spends and what
``benchmarks/secagg_cost.py`` reports next to it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Sequence

import numpy as np

from fedrec.federation.secagg.graph import ThreatModel, round_graph, round_parameters
from fedrec.federation.secagg.inputs import WordRows, client_positions, word_matrix
from fedrec.federation.secagg.keys import KeyDirectory
from fedrec.federation.secagg.outcome import SecureSumResult
from fedrec.federation.secagg.plus_rounds import (
    RoundState,
    Shares,
    Unmasked,
    advertise_keys,
    collect_masked_inputs,
    round_aborted,
    share_keys,
    unmask,
)


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
    :class:`~fedrec.federation.secagg.inputs.WordRows` of 64- and 32-bit segments).

    ``keys``: the long-term :class:`~fedrec.federation.secagg.keys.KeyDirectory` (pair keys
    reused across rounds; the round id must be new to it), or None for fresh per-round keys.
    ``client_ids``: the clients' long-term identities (default: their positions). ``graph``:
    "harary" (degree and threshold from ``threat``, default
    :class:`~fedrec.federation.secagg.graph.ThreatModel`, unless given) or "complete" (every
    pair; threshold default a majority). ``graph_seed``: the round's public randomness for the
    labelling (default fresh random bytes; recorded in the result). ``per_client``: every client
    derives its own pair keys and mask streams instead of once per edge (same result, a
    deployment's cost). ``overwrite_input``: mask an (n, L) uint64 input matrix, or a
    ``WordRows``, in place (saves a copy).

    For word vectors the result's ``total`` is the uint64 sum and ``masked`` the uint64 uploads;
    for a ``WordRows`` both are byte rows (``WordRows.unpack`` splits them into segments) and
    ``parts`` holds each segment's sum.

    The dropout stages are those of :func:`fedrec.federation.secagg.protocol.secure_sum`. The
    round aborts (:class:`~fedrec.federation.secagg.outcome.SecAggAborted`) when a survivor, or
    a dropped client with surviving neighbours, has fewer than ``threshold`` neighbours answering
    the unmasking, or when the survivors' graph is disconnected (unmasking would reveal partial
    sums).
    """
    start = time.perf_counter()
    state = _open_round(
        vectors,
        round_id=round_id,
        client_ids=client_ids,
        keys=keys,
        graph=graph,
        threat=threat,
        degree=degree,
        threshold=threshold,
        graph_seed=graph_seed,
        per_client=per_client,
        overwrite_input=overwrite_input,
        dropped_before_keys=dropped_before_keys,
        dropped_before_sharing=dropped_before_sharing,
        dropped_after_sharing=dropped_after_sharing,
        silent_in_unmasking=silent_in_unmasking,
    )
    pair = advertise_keys(state)
    shares = share_keys(state, pair)
    client_streams = collect_masked_inputs(state, pair.mask_key, shares.self_seed)
    client_seconds = time.perf_counter() - start

    start = time.perf_counter()
    unmasked = unmask(state, shares)
    server_seconds = time.perf_counter() - start
    return _result(
        state,
        shares,
        unmasked,
        streams=client_streams + unmasked.streams,
        client_seconds=client_seconds,
        server_seconds=server_seconds,
    )


def _open_round(
    vectors: Sequence[np.ndarray] | np.ndarray | WordRows,
    *,
    round_id: int,
    client_ids: Sequence[int] | np.ndarray | None,
    keys: KeyDirectory | None,
    graph: str,
    threat: ThreatModel | None,
    degree: int | None,
    threshold: int | None,
    graph_seed: bytes | None,
    per_client: bool,
    overwrite_input: bool,
    dropped_before_keys: Iterable[int],
    dropped_before_sharing: Iterable[int],
    dropped_after_sharing: Iterable[int],
    silent_in_unmasking: Iterable[int],
) -> RoundState:
    """Check the arguments and the inputs (before any key is made), claim the round id, draw the
    graph, and the sets of clients left at each stage. Aborts with fewer than 2 in U2."""
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
    params = round_parameters(n, graph, threat, degree, threshold)
    absent = client_positions("dropped_before_keys", dropped_before_keys, n) | client_positions(
        "dropped_before_sharing", dropped_before_sharing, n
    )
    dropped = client_positions("dropped_after_sharing", dropped_after_sharing, n)
    silent = client_positions("silent_in_unmasking", silent_in_unmasking, n)
    rows, single = _input_rows(vectors, n, overwrite_input=overwrite_input)
    directory = KeyDirectory() if keys is None else keys
    directory.claim_round(round_id)
    agreements_before = directory.key_agreements
    seed = secrets.token_bytes(16) if graph_seed is None else bytes(graph_seed)
    nbrs, ring, nbr_lists, mirror, edges = round_graph(n, params.degree, seed)

    # U2: the clients whose shares arrived (U1 minus those who left before sharing).
    shared = np.ones(n, dtype=bool)
    shared[list(absent)] = False
    if shared.sum() < 2:
        raise round_aborted(
            round_id, f"{int(shared.sum())} of {n} clients shared their keys, below 2"
        )
    survived = shared.copy()
    survived[[d for d in dropped if shared[d]]] = False
    answered = survived.copy()
    answered[list(silent)] = False
    return RoundState(
        round_id=round_id,
        ids=ids,
        params=params,
        rows=rows,
        single=single,
        directory=directory,
        agreements_before=agreements_before,
        seed=seed,
        neighbours=nbrs,
        ring=ring,
        nbr_lists=nbr_lists,
        mirror=mirror,
        edges=edges,
        absent=absent,
        dropped={d for d in dropped if shared[d]},
        shared=shared,
        survived=survived,
        answered=answered,
        per_client=per_client,
    )


def _input_rows(
    vectors: Sequence[np.ndarray] | np.ndarray | WordRows, n: int, *, overwrite_input: bool
) -> tuple[WordRows, np.ndarray | None]:
    """The inputs as the :class:`WordRows` the round masks (a copy unless ``overwrite_input``),
    and for word vectors the (n, L) uint64 matrix those rows view."""
    if isinstance(vectors, WordRows):
        return (vectors if overwrite_input else vectors.copy()), None
    words = word_matrix(vectors)
    if not (
        overwrite_input
        or not isinstance(vectors, np.ndarray)
        or not np.shares_memory(words, vectors)
    ):
        words = words.copy()
    return WordRows(words.view(np.uint8).reshape(n, -1), (("<u8", words.shape[1]),)), words


def _result(
    state: RoundState,
    shares: Shares,
    unmasked: Unmasked,
    *,
    streams: int,
    client_seconds: float,
    server_seconds: float,
) -> SecureSumResult:
    """The round's :class:`~fedrec.federation.secagg.outcome.SecureSumResult`: the sum as the
    inputs came (uint64 words, or a byte row of the segments' sums) and what it cost."""
    order, totals, members = unmasked.order, unmasked.totals, shares.members
    responders = int(state.answered.sum())
    upload = (
        shares.share_bytes // max(len(members), 1)
        + len(shares.sealed.get(int(members[0]), b""))
        + state.rows.buffer.shape[1]
        + unmasked.unmask_bytes // max(responders, 1)
    )
    if state.single is not None:
        total_out = totals[0]
        masked = {int(m): state.single[m] for m in order.tolist()}
    else:
        total_out = (
            np.concatenate([part.view(np.uint8) for part in totals])
            if totals
            else np.zeros(0, np.uint8)
        )
        masked = {int(m): state.rows.buffer[m] for m in order.tolist()}
    return SecureSumResult(
        total=total_out,
        survivors=[int(m) for m in order],
        dropped=sorted(state.dropped),
        client_seconds=client_seconds,
        server_seconds=server_seconds,
        upload_bytes_per_client=upload,
        masked=masked,
        absent=sorted(state.absent),
        protocol="secagg+" if not state.params.complete else "secagg+ (complete graph)",
        degree=state.k,
        threshold=state.t,
        neighbours=state.neighbours,
        graph_seed=state.seed,
        key_agreements=state.directory.key_agreements - state.agreements_before,
        prg_streams=streams,
        parts=totals,
    )
