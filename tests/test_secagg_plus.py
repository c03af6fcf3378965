"""SecAgg+: Harary-graph parameters and graphs, long-term keys, exactness, dropouts, the server's
view, and MF-SecAvg on the sparse protocol."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from scipy import stats

from fedrec.federation.aggregators import ClientUpdates, MFFedAvg
from fedrec.federation.secagg import (
    SHARE_PRIME,
    KeyDirectory,
    MFSecAvg,
    SecAggAborted,
    ThreatModel,
    WordRows,
    decode_fixed_point,
    encode_fixed_point,
    harary_neighbours,
    harary_parameters,
    is_connected,
    key_limbs,
    limbs_key,
    mf_secavg_rows,
    mf_secavg_vector,
    round_secret,
    secure_sum,
    secure_sum_plus,
    shamir_combine_limbs,
    shamir_combine_many,
    shamir_split_limbs,
)

U64 = np.uint64


def _sum(vectors: np.ndarray, keep: list[int] | None = None) -> np.ndarray:
    rows = vectors if keep is None else vectors[keep]
    return rows.sum(axis=0, dtype=np.uint64)


def _ring(neighbours: np.ndarray) -> list[int]:
    """The clients in ring order (column k/2 of a Harary row is the +1 neighbour)."""
    k = neighbours.shape[1]
    ring, current = [0], int(neighbours[0, k // 2])
    while current != 0:
        ring.append(current)
        current = int(neighbours[current, k // 2])
    return ring


# ------------------------------------------------------------------------------------------------
# Parameters and graphs


def test_default_parameters_per_round_size() -> None:
    threat = ThreatModel()
    got = {n: threat.parameters(n) for n in (5, 6, 12, 20, 100, 1000)}
    assert got[5].complete  # too small for a sparse graph
    assert [(got[n].degree, got[n].threshold) for n in (6, 12, 20, 100, 1000)] == [
        (4, 2),
        (4, 2),
        (4, 2),
        (16, 6),
        (36, 19),
    ]
    # a demanding model needs more neighbours, and the complete graph when nothing sparse works
    assert ThreatModel(corrupted=0.2, dropout=0.2).parameters(100).degree == 40
    assert ThreatModel(corrupted=0.4, dropout=0.4).parameters(20).degree == 18
    assert ThreatModel(corrupted=0.45, dropout=0.45).parameters(20).complete
    with pytest.raises(ValueError, match="fractions"):
        ThreatModel(corrupted=1.0)


@pytest.mark.parametrize(("n", "corrupted", "dropout"), [(30, 0.1, 0.1), (100, 0.05, 0.1)])
def test_parameters_meet_the_bounds_they_claim(n: int, corrupted: float, dropout: float) -> None:
    """Cross-check the exact-integer analysis with SciPy's hypergeometric distribution."""
    p = harary_parameters(n, corrupted=corrupted, dropout=dropout)
    k, t = p.degree, p.threshold
    a, d = math.floor(corrupted * n + 1e-9), math.floor(dropout * n + 1e-9)
    sec = 2.0**-41
    if k <= a + d:
        assert n * (n - k - 1) / 2 * math.comb(a + d, k) / math.comb(n, k) < sec
    assert stats.hypergeom(n - 1, a, k).sf(t - 1) <= sec / n  # Pr[>= t corrupted neighbours]
    assert stats.hypergeom(n - 1, n - 1 - d, k).cdf(t - 1) <= 2.0**-20 / n  # Pr[< t survivors]
    # and the next smaller degree fails one of them
    smaller = k - 2
    if smaller >= 4:
        t_small = max(2, int(stats.hypergeom(n - 1, a, smaller).isf(sec / n)) + 1)
        disconnected = smaller <= a + d and (
            n * (n - smaller - 1) / 2 * math.comb(a + d, smaller) / math.comb(n, smaller) >= sec
        )
        short = stats.hypergeom(n - 1, n - 1 - d, smaller).cdf(t_small - 1) > 2.0**-20 / n
        assert disconnected or short or t_small > smaller


@pytest.mark.parametrize(("n", "k"), [(20, 4), (101, 16), (1000, 36), (7, 6), (8, 7)])
def test_harary_graphs_are_regular_symmetric_and_seeded(n: int, k: int) -> None:
    nbrs = harary_neighbours(n, k, b"round seed")
    assert nbrs.shape == (n, k)
    adjacency = np.zeros((n, n), dtype=bool)
    adjacency[np.repeat(np.arange(n), k), nbrs.ravel()] = True
    assert (adjacency.sum(1) == k).all() and not adjacency.diagonal().any()  # k distinct others
    assert (adjacency == adjacency.T).all()  # undirected
    assert is_connected(nbrs, np.ones(n, dtype=bool)) == (True, 1)
    np.testing.assert_array_equal(nbrs, harary_neighbours(n, k, b"round seed"))  # deterministic
    if k < n - 1:
        assert not np.array_equal(nbrs, harary_neighbours(n, k, b"another seed"))
        assert sorted(_ring(nbrs)) == list(range(n))  # one ring through every client


def test_a_harary_graph_survives_any_k_minus_1_removals_but_not_two_gaps() -> None:
    """H(n, k) is k-connected (the deterministic part of the security argument)."""
    n, k = 14, 4
    nbrs = harary_neighbours(n, k, b"s")
    for removed in itertools.combinations(range(n), k - 1):
        alive = np.ones(n, dtype=bool)
        alive[list(removed)] = False
        assert is_connected(nbrs, alive)[0]
    ring = _ring(nbrs)
    alive = np.ones(n, dtype=bool)
    alive[[ring[0], ring[1], ring[7], ring[8]]] = False  # two runs of k/2 ring positions
    assert is_connected(nbrs, alive) == (False, 2)


# ------------------------------------------------------------------------------------------------
# Keys, Shamir shares


def test_pair_keys_are_symmetric_hkdf_and_cached() -> None:
    keys = KeyDirectory()
    prk = keys.pair_key(3, 9)
    assert keys.pair_key(9, 3) == prk  # X25519 agrees from both sides
    assert keys.key_agreements == 2 and keys.enrolments == 2
    keys.pair_key(3, 9)
    assert keys.key_agreements == 2  # cached: no new exchange
    # Extract once + Expand per round is RFC 5869 HKDF over the same inputs
    shared = keys._private[3].exchange(keys._public[9])
    info = b"fedrec-secagg+/round-v1" + (7).to_bytes(8, "little") + bytes([3]) + bytes(7)
    info += bytes([9]) + bytes(7)
    expected = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=b"fedrec-secagg+/pair-v1", info=info
    ).derive(shared)
    assert round_secret(prk, 7, 3, 9) == expected == round_secret(prk, 7, 9, 3)


def test_key_reuse_derives_distinct_round_seeds_and_refuses_a_repeated_round() -> None:
    keys = KeyDirectory()
    prk = keys.pair_key(0, 1)
    seeds = {round_secret(prk, r, 0, 1) for r in range(1000)}
    seeds |= {round_secret(keys.pair_key(0, 2), r, 0, 2) for r in range(1000)}
    assert len(seeds) == 2000
    vectors = np.arange(60, dtype=np.uint64).reshape(6, 10)
    first = secure_sum(vectors, round_id=5, graph="harary", keys=keys, graph_seed=b"g")
    # one X25519 per edge (6 clients x 4 neighbours / 2), less the pair {0, 1} met above
    assert first.protocol == "secagg+" and first.key_agreements == 12 - 1
    with pytest.raises(ValueError, match="already used"):
        secure_sum(vectors, round_id=5, graph="harary", keys=keys, graph_seed=b"g")
    again = secure_sum(vectors, round_id=6, graph="harary", keys=keys, graph_seed=b"g")
    assert again.key_agreements == 0  # the same neighbours: every pair key is reused
    # per-round masks are fresh: the same input gives unrelated uploads in the two rounds
    assert np.mean(first.masked[0] == again.masked[0]) < 0.2
    fresh = secure_sum(vectors, round_id=5, graph="harary", graph_seed=b"g")  # per-round keys
    assert fresh.key_agreements == 12


def test_shamir_limb_shares_rebuild_128_bit_keys() -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 256, (5, 16), dtype=np.uint8)
    limbs = key_limbs(keys)
    assert (limbs < SHARE_PRIME).all()
    assert [limbs_key(row) for row in limbs] == [k.tobytes() for k in keys]
    shares = shamir_split_limbs(limbs, holders=7, threshold=4)
    assert shares.shape == (5, 7, 3) and (shares < SHARE_PRIME).all()
    for chosen in ([0, 1, 2, 3], [6, 2, 4, 1], [3, 4, 5, 6]):
        for m in range(5):
            got = shamir_combine_limbs([c + 1 for c in chosen], shares[m, chosen])
            assert limbs_key(got) == keys[m].tobytes()
    below = shamir_combine_limbs([1, 2, 3], shares[0, :3])  # 3 < t shares: an unrelated value
    assert below != limbs[0].tolist()
    # the vectorised reconstruction agrees, also for large thresholds (products split in chunks)
    for holders, t in ((7, 4), (36, 19), (300, 151)):
        shares = shamir_split_limbs(limbs, holders=holders, threshold=t)
        columns = np.stack([rng.choice(holders, t, replace=False) for _ in range(5)])
        got = shamir_combine_many(columns, shares[np.arange(5)[:, None], columns])
        np.testing.assert_array_equal(got, limbs)


# ------------------------------------------------------------------------------------------------
# Exactness and dropouts


@pytest.mark.parametrize("per_client", [False, True])
@pytest.mark.parametrize(("n", "length"), [(6, 1), (20, 257), (57, 1000)])
def test_secure_sum_plus_is_exact(n: int, length: int, per_client: bool) -> None:
    rng = np.random.default_rng(n)
    vectors = rng.integers(0, 2**64, (n, length), dtype=np.uint64)
    keys = KeyDirectory()
    for round_id in range(2):
        result = secure_sum(
            vectors, round_id=round_id, graph="harary", keys=keys, per_client=per_client
        )
        np.testing.assert_array_equal(result.total, _sum(vectors))
        assert (
            result.survivors == list(range(n))
            and result.degree == ThreatModel().parameters(n).degree
        )
    # signed inputs, as a list, are two's complement; fixed point decodes to the real sum
    signed = [rng.integers(-(2**40), 2**40, length) for _ in range(n)]
    result = secure_sum(signed, round_id=9, graph="harary")
    assert result.total.view(np.int64).tolist() == np.sum(signed, axis=0).tolist()
    reals = rng.normal(0, 100, (n, length))
    words = np.stack([encode_fixed_point(r, fraction_bits=24, num_clients=n) for r in reals])
    total = decode_fixed_point(
        secure_sum(words, round_id=1, graph="harary").total, fraction_bits=24
    )
    np.testing.assert_allclose(total, reals.sum(0), atol=n * 2.0**-25 + 1e-9, rtol=0)


def test_secure_sum_leaves_the_callers_vectors_alone() -> None:
    vectors = np.arange(200, dtype=np.uint64).reshape(20, 10)
    before = vectors.copy()
    secure_sum(vectors, round_id=0, graph="harary")
    np.testing.assert_array_equal(vectors, before)


def test_dropouts_are_recovered_up_to_the_threshold_and_abort_beyond() -> None:
    n, seed = 20, b"dropouts"
    params = ThreatModel().parameters(n)
    k, t = params.degree, params.threshold
    nbrs = harary_neighbours(n, k, seed)
    vectors = np.random.default_rng(1).integers(0, 2**64, (n, 300), dtype=np.uint64)
    target = 0
    around = nbrs[target].tolist()

    # k - t of the target's neighbours drop after masking began, one more neighbour is silent
    # in the unmasking: every secret still has t answering holders
    drop = around[: k - t]
    result = secure_sum_plus(
        vectors, round_id=0, graph_seed=seed, dropped_after_sharing=drop, silent_in_unmasking=[5]
    )
    survivors = [i for i in range(n) if i not in drop]
    assert result.survivors == survivors and result.dropped == sorted(drop)
    np.testing.assert_array_equal(result.total, _sum(vectors, survivors))

    # one more neighbour gone: the target's self-mask seed cannot be rebuilt, a clean abort
    with pytest.raises(
        SecAggAborted, match=rf"survivor {target} has {t - 1} of its {k} .*below the threshold {t}"
    ):
        secure_sum_plus(
            vectors, round_id=1, graph_seed=seed, dropped_after_sharing=around[: k - t + 1]
        )
    # the same when the missing neighbours are silent survivors instead
    with pytest.raises(SecAggAborted, match="below the threshold"):
        secure_sum_plus(
            vectors, round_id=2, graph_seed=seed, silent_in_unmasking=around[: k - t + 1]
        )

    # dropouts before sharing: nobody masks with them and they are outside the sum
    result = secure_sum_plus(
        vectors, round_id=3, graph_seed=seed, dropped_before_keys=[4], dropped_before_sharing=[9]
    )
    assert result.absent == [4, 9]
    np.testing.assert_array_equal(
        result.total, _sum(vectors, [i for i in range(n) if i not in (4, 9)])
    )


def test_a_disconnected_survivor_graph_aborts_before_unmasking() -> None:
    n, seed = 20, b"gaps"
    nbrs = harary_neighbours(n, 4, seed)
    ring = _ring(nbrs)
    gaps = [ring[0], ring[1], ring[10], ring[11]]  # two runs of k/2: the survivors split in two
    vectors = np.ones((n, 8), dtype=np.uint64)
    with pytest.raises(SecAggAborted, match="2 components"):
        secure_sum_plus(vectors, round_id=0, graph_seed=seed, dropped_after_sharing=gaps)
    with pytest.raises(SecAggAborted, match="below the threshold"):
        secure_sum_plus(vectors, round_id=1, graph_seed=seed, dropped_after_sharing=range(18))


def _expected(n: int, nbrs: np.ndarray, t: int, drops: dict[str, set[int]]) -> list[int] | None:
    """The survivors, or None when the round must abort (an independent oracle)."""
    shared = set(range(n)) - drops["dropped_before_keys"] - drops["dropped_before_sharing"]
    survivors = shared - drops["dropped_after_sharing"]
    answering = survivors - drops["silent_in_unmasking"]
    dropped = shared & drops["dropped_after_sharing"]
    if len(shared) < 2 or len(survivors) <= t:
        return None
    alive = np.zeros(n, dtype=bool)
    alive[list(survivors)] = True
    if not is_connected(nbrs, alive)[0]:
        return None
    for m in survivors | {d for d in dropped if alive[nbrs[d]].any()}:
        if sum(int(j) in answering for j in nbrs[m]) < t:
            return None
    return sorted(survivors)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(6, 30),
    st.integers(0, 5),
    st.data(),
    st.booleans(),
)
def test_secure_sum_plus_is_exact_or_aborts_for_any_dropouts(
    n: int, length: int, data: st.DataObject, per_client: bool
) -> None:
    positions = st.sets(st.integers(0, n - 1), max_size=max(1, n // 4))
    drops = {
        name: data.draw(positions)
        for name in (
            "dropped_before_keys",
            "dropped_before_sharing",
            "dropped_after_sharing",
            "silent_in_unmasking",
        )
    }
    vectors = np.asarray(
        data.draw(
            st.lists(
                st.lists(st.integers(0, 2**64 - 1), min_size=length, max_size=length),
                min_size=n,
                max_size=n,
            )
        ),
        dtype=np.uint64,
    ).reshape(n, length)
    seed = data.draw(st.binary(min_size=1, max_size=8))
    params = ThreatModel().parameters(n)
    nbrs = harary_neighbours(n, params.degree, seed)
    expected = _expected(n, nbrs, params.threshold, drops)
    event("aborted" if expected is None else "exact sum")
    if expected is None:
        with pytest.raises(SecAggAborted):
            secure_sum_plus(vectors, round_id=0, graph_seed=seed, per_client=per_client, **drops)
        return
    result = secure_sum_plus(vectors, round_id=0, graph_seed=seed, per_client=per_client, **drops)
    assert result.survivors == expected
    np.testing.assert_array_equal(result.total, _sum(vectors, expected))
    # the same round on rows of 64- and 32-bit segments: each segment exact modulo its width
    narrow = data.draw(st.integers(0, 7))
    rows = WordRows.zeros(n, (("<u8", length), ("<u4", narrow)))
    rows.buffer[:] = np.frombuffer(
        data.draw(st.binary(min_size=rows.buffer.size, max_size=rows.buffer.size)), np.uint8
    ).reshape(rows.buffer.shape)
    result = secure_sum_plus(rows, round_id=1, graph_seed=seed, per_client=per_client, **drops)
    for got, segment in zip(result.parts, rows.segments(), strict=True):
        np.testing.assert_array_equal(got, segment[expected].sum(axis=0, dtype=segment.dtype))
    np.testing.assert_array_equal(
        result.total, np.concatenate([part.view(np.uint8) for part in result.parts])
    )


# ------------------------------------------------------------------------------------------------
# The server's view


def _uniformity_p_values(words: np.ndarray) -> tuple[float, float]:
    counts = np.bincount(words.view(np.uint8), minlength=256)
    chi2 = stats.chisquare(counts).pvalue
    ks = stats.kstest(words.astype(np.float64) / 2.0**64, "uniform").pvalue
    return float(chi2), float(ks)


def test_a_masked_upload_looks_uniform_and_every_survivor_has_masking_partners() -> None:
    n, length = 20, 20_000
    rng = np.random.default_rng(3)
    vectors = np.zeros((n, length), dtype=np.uint64)
    vectors[:, ::3] = rng.integers(0, 2**20, (n, len(range(0, length, 3))), dtype=np.uint64)
    chi2, ks = _uniformity_p_values(vectors[7])
    assert chi2 < 1e-6 and ks < 1e-6  # the tests do detect the plaintext's structure
    result = secure_sum(
        vectors, round_id=0, graph="harary", keys=KeyDirectory(), dropped_after_sharing=[2]
    )
    chi2, ks = _uniformity_p_values(result.masked[7])
    assert chi2 > 1e-3 and ks > 1e-3
    # structurally: every survivor shares pairwise masks with at least t other survivors, and
    # the survivors' graph is connected, so the masks only cancel in the total
    alive = np.zeros(n, dtype=bool)
    alive[result.survivors] = True
    assert result.neighbours is not None and result.threshold is not None
    partners = alive[result.neighbours].sum(1)[alive]
    assert (partners >= result.threshold).all()
    assert is_connected(result.neighbours, alive)[0]
    # and the self mask hides a client's input even if all its pair masks were known
    assert np.mean(result.masked[7] == vectors[7]) < 1e-3


# ------------------------------------------------------------------------------------------------
# MF-SecAvg on SecAgg+


def _updates(c: int, seed: int = 0, num_items: int = 40, width: int = 3) -> tuple:
    rng = np.random.default_rng(seed)
    rows_client, rows_item = [], []
    for k in range(c):
        items = np.sort(rng.choice(num_items, rng.integers(0, num_items // 2), replace=False))
        rows_client += [k] * len(items)
        rows_item += items.tolist()
    updates = ClientUpdates(
        clients=rng.choice(1000, c, replace=False),
        num_samples=rng.integers(5, 500, c),
        network=torch.randn(c, 7, generator=torch.Generator().manual_seed(seed)),
        row_client=torch.tensor(rows_client, dtype=torch.int64),
        row_item=torch.tensor(rows_item, dtype=torch.int64),
        item_rows=torch.randn(len(rows_item), width, generator=torch.Generator().manual_seed(1)),
        num_items=num_items,
    )
    return updates, torch.randn(num_items, width), torch.randn(7)


@pytest.mark.parametrize("item_bits", [32, 64])
def test_the_batched_encoding_equals_the_per_client_one(item_bits: int) -> None:
    updates, items, _ = _updates(9)
    rows = mf_secavg_rows(updates, fraction_bits=20, items=items, item_bits=item_bits)
    expected = np.stack(
        [
            mf_secavg_vector(updates, k, fraction_bits=20, items=items, item_bits=item_bits)
            for k in range(9)
        ]
    )
    np.testing.assert_array_equal(rows.buffer, expected)


@pytest.mark.parametrize(
    ("kwargs", "label"),
    [
        ({}, "secagg+ (Harary graph, long-term keys)"),
        ({"per_client": True}, "secagg+ (Harary graph, long-term keys)"),
        ({"key_reuse": False}, "secagg+ (Harary graph, per-round keys)"),
        ({"graph": "complete"}, "secagg+ (complete graph, long-term keys)"),
        ({"graph": "complete", "key_reuse": False}, "secagg (complete graph, per-round keys)"),
    ],
)
def test_mf_secavg_protocols_equal_mf_fedavg(kwargs: dict, label: str) -> None:
    updates, items, network = _updates(20)
    plain_items, plain_net = MFFedAvg().aggregate(items=items, network=network, updates=updates)
    secure = MFSecAvg(**kwargs)
    assert secure.protocol == label
    for _ in range(2):  # the second round reuses the long-term keys
        got_items, got_net = secure.aggregate(items=items, network=network, updates=updates)
        tolerance = 20 * 2.0**-25 + 1e-6
        assert float((got_items - plain_items).abs().max()) <= tolerance
        assert float((got_net - plain_net).abs().max()) <= tolerance
    assert secure.last is not None
    if kwargs.get("graph", "harary") == "harary":
        assert secure.last.protocol == "secagg+" and secure.last.degree == 4
    if kwargs == {}:
        assert secure.keys is not None and len(secure.keys) == 20  # enrolled by their user ids


def test_mf_secavg_small_rounds_use_the_complete_graph() -> None:
    updates, items, network = _updates(4)
    secure = MFSecAvg()
    secure.aggregate(items=items, network=network, updates=updates)
    assert secure.last is not None and secure.last.protocol == "secagg (complete graph)"


def test_mf_secavg_with_dropouts_equals_mf_fedavg_over_the_survivors_or_aborts() -> None:
    updates, items, network = _updates(20, seed=2)
    outcomes = set()
    for seed in range(6):
        secure = MFSecAvg(dropout=0.15, seed=seed)
        try:
            got_items, got_net = secure.aggregate(items=items, network=network, updates=updates)
        except SecAggAborted:
            outcomes.add("aborted")
            continue
        assert secure.last is not None
        outcomes.add("recovered" if secure.last.dropped else "no dropout")
        plain_items, plain_net = MFFedAvg().aggregate(
            items=items, network=network, updates=updates.subset(np.array(secure.last.survivors))
        )
        assert float((got_items - plain_items).abs().max()) <= 20 * 2.0**-25 + 1e-6
        assert float((got_net - plain_net).abs().max()) <= 20 * 2.0**-25 + 1e-6
    assert "recovered" in outcomes


def test_a_cohort_meeting_again_gets_its_graph_and_cached_pair_keys() -> None:
    updates, items, network = _updates(20)
    for per_client in (False, True):
        secure = MFSecAvg(per_client=per_client)
        secure.aggregate(items=items, network=network, updates=updates)
        assert secure.last is not None and secure.last.key_agreements == 40 * (1 + per_client)
        first = secure.last.neighbours
        enrolled = secure.keys.enrolments if secure.keys is not None else 0
        secure.aggregate(items=items, network=network, updates=updates)  # the same 20 clients
        assert secure.last.key_agreements == 0 and secure.keys is not None
        assert secure.keys.enrolments == enrolled == 20
        np.testing.assert_array_equal(secure.last.neighbours, first)
    ids = np.asarray(updates.clients)
    other = ids.copy()
    other[0] = max(ids) + 1  # one client replaced: another, independent graph
    assert secure.graph_seed(ids) == secure.graph_seed(ids.copy())
    assert secure.graph_seed(other) != secure.graph_seed(ids)
    assert MFSecAvg(seed=1).graph_seed(ids) != secure.graph_seed(ids)  # a key per run


def test_word_rows_layout_views_and_widening() -> None:
    rows = WordRows.zeros(3, (("<u8", 2), ("<u4", 3)))
    assert rows.buffer.shape == (3, 28)
    wide, narrow = rows.segments()
    wide[:] = 2**64 - 1
    narrow[:] = 2**32 - 1
    total = rows.widened().sum(axis=0, dtype=np.uint64)  # 3 (2^b − 1) modulo 2^64
    wide_sum, narrow_sum = rows.unpack(rows.narrowed(total))
    assert wide_sum.tolist() == [2**64 - 3] * 2 and narrow_sum.tolist() == [2**32 - 3] * 3
    with pytest.raises(ValueError, match="layout"):
        WordRows.zeros(2, (("<u2", 4),))
    with pytest.raises(ValueError, match="buffer"):
        WordRows(np.zeros((2, 5), np.uint8), (("<u4", 1),))
