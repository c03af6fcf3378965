"""MF-SecAvg: secret sharing, fixed point, exactness, masked uploads look uniform, dropouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from fedrec.agents.ncf import NCF, NCFConfig
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.envs.datasets.synthetic import write_synthetic
from fedrec.federation.aggregators import ClientUpdates, MFFedAvg
from fedrec.federation.secagg import (
    FIELD_PRIME,
    MalformedContribution,
    MFSecAvg,
    SecAggAborted,
    SecAggClient,
    SecureTables,
    decode_fixed_point,
    encode_fixed_point,
    item_fraction_bits,
    mf_secavg_rows,
    mf_secavg_vector,
    secure_sum,
    shamir_combine,
    shamir_split,
)
from fedrec.train.fedncf import (
    ClientData,
    FedNCFConfig,
    round_rng,
    sample_round,
    train_federated,
    train_round_batched,
)

BITS = 24


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("secagg")
    write_synthetic("ml-100k", root / "ml-100k")
    return root


@pytest.fixture(scope="module")
def round_updates(data_dir: Path) -> tuple[ClientUpdates, torch.Tensor, torch.Tensor]:
    """A real NeuMF aggregation round of 8 clients (their uploads, the global items and network)."""
    data = load_prepared("ml-100k", data_dir)
    config = NCFConfig(model="neumf")
    net = NCF(
        config,
        num_users=data.num_users,
        num_items=data.num_items,
        generator=torch.Generator().manual_seed(0),
    )
    users = np.arange(0, 32, 4)
    samples = sample_round(
        ClientData.of(data), users, round_rng(0, 0), num_negatives=4, local_epochs=2
    )
    items, network = net.item_table(), net.network_vector()
    updates, _ = train_round_batched(
        config,
        round_samples=samples,
        user_rows=net.user_table()[torch.from_numpy(users)],
        items=items,
        network=network,
        lr=1e-2,
        batch_size=16,
    )
    return updates, items, network


def test_shamir_any_threshold_shares_rebuild_the_secret() -> None:
    secret = int.from_bytes(bytes(range(32)), "little")
    shares = shamir_split(secret, num_shares=7, threshold=4)
    rng = np.random.default_rng(0)
    for _ in range(5):
        chosen = rng.choice(7, 4, replace=False)
        assert shamir_combine([shares[i] for i in chosen]) == secret
    assert shamir_combine(shares[:3]) != secret  # below the threshold: unrelated value
    with pytest.raises(ValueError, match="threshold"):
        shamir_split(secret, num_shares=3, threshold=4)
    with pytest.raises(ValueError, match="secret"):
        shamir_split(FIELD_PRIME, num_shares=3, threshold=2)


def test_fixed_point_round_trip_and_overflow() -> None:
    values = np.array([-3.25, 0.0, 1e-7, 12345.678])
    words = encode_fixed_point(values, fraction_bits=BITS, num_clients=10)
    assert words.dtype == np.uint64
    np.testing.assert_allclose(
        decode_fixed_point(words, fraction_bits=BITS), values, atol=2.0**-BITS
    )
    total = words + words + words  # wraps modulo 2^64; negatives stay exact
    np.testing.assert_allclose(
        decode_fixed_point(total, fraction_bits=BITS), 3 * values, atol=3 * 2.0**-BITS
    )
    with pytest.raises(ValueError, match="overflow"):
        encode_fixed_point(np.array([2.0**40]), fraction_bits=BITS, num_clients=20)


def test_secure_sum_is_exact_modulo_2_64() -> None:
    rng = np.random.default_rng(1)
    vectors = [rng.integers(0, 2**63, 500, dtype=np.uint64) * np.uint64(2) for _ in range(5)]
    result = secure_sum(vectors, round_id=7)
    np.testing.assert_array_equal(result.total, np.sum(vectors, axis=0, dtype=np.uint64))
    assert result.survivors == [0, 1, 2, 3, 4] and result.dropped == []


def test_mf_secavg_equals_mf_fedavg(round_updates: tuple) -> None:
    updates, items, network = round_updates
    plain_items, plain_net = MFFedAvg().aggregate(items=items, network=network, updates=updates)
    secure = MFSecAvg(fraction_bits=BITS)
    secure_items, secure_net = secure.aggregate(items=items, network=network, updates=updates)
    # each client's values are rounded to 2^-25; float32 results add their own rounding
    tolerance = updates.num_clients * 2.0 ** -(BITS + 1) + 1e-6
    assert float((secure_items - plain_items).abs().max()) <= tolerance
    assert float((secure_net - plain_net).abs().max()) <= tolerance
    assert secure.last is not None and secure.last.survivors == list(range(updates.num_clients))
    # the server's view holds no plaintext: no masked word equals the client's word
    plaintext = mf_secavg_vector(updates, 0, fraction_bits=BITS, items=items)
    assert np.mean(secure.last.masked[0].view(np.uint32) == plaintext.view(np.uint32)) < 1e-3


def test_item_deltas_in_32_bit_words_keep_the_precision_and_refuse_overflow(
    round_updates: tuple,
) -> None:
    updates, items, network = round_updates
    plain_items, _ = MFFedAvg().aggregate(items=items, network=network, updates=updates)
    wide = MFSecAvg(item_bits=64).aggregate(items=items, network=network, updates=updates)[0]
    narrow = MFSecAvg().aggregate(items=items, network=network, updates=updates)[0]
    bits = item_fraction_bits(updates.num_clients, fraction_bits=BITS)
    assert bits == BITS  # 8 clients: 31 - 3 - 3 = 25 bits of headroom, capped at 24
    for got in (wide, narrow):  # rounding ≤ 2^-(bits+1) per value, plus float32's own
        assert float((got - plain_items).abs().max()) <= 2.0 ** -(bits + 1) + 1e-6
    assert item_fraction_bits(20, fraction_bits=BITS) == 23
    assert item_fraction_bits(1000, fraction_bits=BITS) == 18
    with pytest.raises(ValueError, match="item_bits=64"):
        item_fraction_bits(2**21, fraction_bits=BITS)
    # a delta outside the encodable range is an abort naming the client and the part
    limit = 2.0**31 / updates.num_clients / 2.0**bits
    far = items.clone()
    client = int(updates.row_client[0])
    far[updates.row_item[0]] += limit + 1.0
    with pytest.raises(MalformedContribution, match=rf"client {client}: .*item deltas"):
        MFSecAvg().aggregate(items=far, network=network, updates=updates)
    # MP_k is packed in 8-bit lanes below 256 clients: a quarter of the count words
    rows = mf_secavg_rows(updates, fraction_bits=BITS, items=items)
    num_items, width = items.shape
    assert rows.layout[1][1] == num_items * width + -(-num_items // 4)


def _uniformity_p_values(words: np.ndarray) -> tuple[float, float]:
    """Chi-square p of the byte histogram and KS p of words / 2^bits against U(0, 1)."""
    counts = np.bincount(words.view(np.uint8), minlength=256)
    chi2 = stats.chisquare(counts).pvalue
    scale = 2.0 ** (8 * words.dtype.itemsize)
    ks = stats.kstest(words.astype(np.float64) / scale, "uniform").pvalue
    return float(chi2), float(ks)


@pytest.mark.parametrize("graph", ["complete", "harary"])
def test_a_masked_upload_is_indistinguishable_from_noise(round_updates: tuple, graph: str) -> None:
    updates, items, _ = round_updates
    rows = mf_secavg_rows(updates, fraction_bits=BITS, items=items)
    plaintext = rows.buffer[3].copy()
    assert np.mean(plaintext == 0) > 0.2  # untouched items: zeros that must be hidden too
    chi2, ks = _uniformity_p_values(plaintext.view(np.uint32))
    assert chi2 < 1e-6 and ks < 1e-6  # the tests do detect the plaintext's structure
    result = secure_sum(rows, round_id=0, graph=graph, degree=4 if graph == "harary" else None)
    masked = result.masked[3]
    chi2, ks = _uniformity_p_values(masked.view(np.uint32 if graph == "harary" else np.uint64))
    assert chi2 > 1e-3 and ks > 1e-3


@pytest.mark.parametrize("graph", ["complete", "harary"])
def test_dropout_after_masking_is_recovered(round_updates: tuple, graph: str) -> None:
    updates, items, network = round_updates
    rows = mf_secavg_rows(updates, fraction_bits=BITS, items=items)
    degree = 4 if graph == "harary" else None
    result = secure_sum(rows, round_id=3, graph=graph, degree=degree, dropped_after_sharing=[2, 5])
    survivors = [k for k in range(updates.num_clients) if k not in (2, 5)]
    assert result.survivors == survivors and result.dropped == [2, 5]
    for got, segment in zip(result.parts, rows.segments(), strict=True):
        np.testing.assert_array_equal(got, segment[survivors].sum(axis=0, dtype=segment.dtype))

    # the aggregator with random dropouts equals MF-FedAvg over the survivors
    secure = MFSecAvg(fraction_bits=BITS, dropout=0.3, seed=4)
    got_items, got_net = secure.aggregate(items=items, network=network, updates=updates)
    assert secure.last is not None and secure.last.dropped  # someone dropped with this seed
    plain_items, plain_net = MFFedAvg().aggregate(
        items=items, network=network, updates=updates.subset(np.array(secure.last.survivors))
    )
    tolerance = updates.num_clients * 2.0 ** -(BITS + 1) + 1e-6
    assert float((got_items - plain_items).abs().max()) <= tolerance
    assert float((got_net - plain_net).abs().max()) <= tolerance


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_companion_rides_in_the_weights_protocol_run(
    round_updates: tuple, dropout: float
) -> None:
    """aggregate_with: the weights and a companion (here fake Adam moments, down to 1e-12) in one
    run of the protocol; each equals MF-FedAvg over the same survivors, the companion to 2^-47."""
    import dataclasses

    updates, items, network = round_updates
    rng = np.random.default_rng(3)
    width = 2 * items.shape[1]
    moments = dataclasses.replace(
        updates,
        network=torch.from_numpy(10.0 ** rng.uniform(-12, -2, (updates.num_clients, 9))).float(),
        item_rows=torch.from_numpy(10.0 ** rng.uniform(-12, -2, (len(updates.row_item), width))),
    )
    moments = dataclasses.replace(moments, item_rows=moments.item_rows.float())
    global_mv = (torch.full((items.shape[0], width), 1e-6), torch.full((9,), 1e-6))
    companion = SecureTables(*global_mv, moments, fraction_bits=46)
    secure = MFSecAvg(fraction_bits=BITS, dropout=dropout, seed=4)
    (got_items, got_net), (got_mv, got_net_mv) = secure.aggregate_with(
        items=items, network=network, updates=updates, companion=companion
    )
    result = secure.last
    assert secure.rounds == 1 and result is not None and len(result.parts) == 4
    assert bool(result.dropped) == (dropout > 0)  # a client that drops, drops from both
    survivors = np.array(result.survivors)
    plain = MFFedAvg()
    want_items, want_net = plain.aggregate(
        items=items, network=network, updates=updates.subset(survivors)
    )
    want_mv, want_net_mv = plain.aggregate(
        items=global_mv[0], network=global_mv[1], updates=moments.subset(survivors)
    )
    tolerance = updates.num_clients * 2.0 ** -(BITS + 1) + 1e-6
    assert float((got_items - want_items).abs().max()) <= tolerance
    assert float((got_net - want_net).abs().max()) <= tolerance
    # the companion's finer fixed point keeps values of 1e-12 (float32 rounding aside)
    torch.testing.assert_close(got_mv, want_mv, rtol=1e-5, atol=updates.num_clients * 2.0**-47)
    torch.testing.assert_close(got_net_mv, want_net_mv, rtol=1e-5, atol=2.0**-40)
    # uploads of other clients or rows than the weights' are refused before anything runs
    other = dataclasses.replace(moments, row_item=moments.row_item.flip(0))
    with pytest.raises(ValueError, match="same clients"):
        secure.aggregate_with(
            items=items,
            network=network,
            updates=updates,
            companion=SecureTables(*global_mv, other, fraction_bits=46),
        )
    assert secure.rounds == 1


def test_too_many_dropouts_abort_the_round_cleanly() -> None:
    vectors = [np.arange(10, dtype=np.uint64) for _ in range(5)]  # threshold 3 by default
    with pytest.raises(SecAggAborted, match="below the threshold 3"):
        secure_sum(vectors, round_id=0, dropped_after_sharing=[0, 1, 2])
    with pytest.raises(SecAggAborted, match="answered the unmasking"):
        secure_sum(vectors, round_id=0, dropped_after_sharing=[0], silent_in_unmasking=[1, 2])


def test_a_client_never_reveals_both_secrets_of_one_client() -> None:
    clients = [SecAggClient(k, np.zeros(4, np.uint64), round_id=0) for k in range(3)]
    roster = {c.position: c.advertise_keys() for c in clients}
    boxes: dict[int, dict[int, bytes]] = {k: {} for k in range(3)}
    for c in clients:
        for receiver, blob in c.share_keys(roster, threshold=2).items():
            boxes[receiver][c.position] = blob
    for c in clients:
        c.receive_shares(boxes[c.position])
    clients[0].unmask({0, 1}, {2}, threshold=2)
    with pytest.raises(ValueError, match="both of its secrets"):
        clients[0].unmask({0, 2}, {1}, threshold=2)
    with pytest.raises(ValueError, match="fewer survivors"):
        clients[1].unmask({1}, {0, 2}, threshold=2)


def test_training_with_mf_secavg_matches_mf_fedavg(data_dir: Path) -> None:
    finals = {}
    for aggregator in ("mf-fedavg", "mf-secavg"):
        config = FedNCFConfig(
            aggregator=aggregator,
            global_rounds=2,
            clients_per_round=12,
            lr=1e-2,
            client_optimizer="fresh",  # uploads: the item rows and network alone
        )
        result = train_federated(
            dataset="ml-100k", data_dir=data_dir, config=config, progress=False
        )
        assert result.aborted_rounds == 0
        finals[aggregator] = result.model
    torch.testing.assert_close(
        finals["mf-secavg"].item_table(), finals["mf-fedavg"].item_table(), atol=1e-5, rtol=1e-4
    )
    torch.testing.assert_close(
        finals["mf-secavg"].network_vector(),
        finals["mf-fedavg"].network_vector(),
        atol=1e-5,
        rtol=1e-4,
    )


def test_an_aborted_round_keeps_the_global_model(round_updates: tuple) -> None:
    updates, items, network = round_updates
    secure = MFSecAvg(dropout=0.95, seed=0)
    with pytest.raises(SecAggAborted):
        secure.aggregate(items=items, network=network, updates=updates)
    with pytest.raises(ValueError, match="dropout"):
        MFSecAvg(dropout=1.0)
