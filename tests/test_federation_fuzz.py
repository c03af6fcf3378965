"""Property-based tests of the federation layer: secure aggregation and the FedSlate channel.

Secure aggregation (``secure_sum``, ``MFSecAvg``) returns the exact sum of the survivors' inputs or
aborts cleanly with ``SecAggAborted``, for any dropouts at any stage and any input (integers in
and out of range, NaN/inf floats, wrong shapes and dtypes). The channel delivers any payload
exactly (an equal, read-only copy) or refuses it with ``InvalidMessage`` / ``PrivacyViolation``,
and a refused send changes no counter and queues nothing; a receive of the wrong kind leaves the
queue as it was; a hand-made ``Message`` never gets through.

Example counts scale with the Hypothesis profile of ``tests/conftest.py`` (``ci`` by default,
``HYPOTHESIS_PROFILE=long`` for the long campaign): :func:`_examples`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedrec.federation.aggregators import ClientUpdates, MFFedAvg
from fedrec.federation.channel import Channel, InProcessTransport, Transport
from fedrec.federation.messages import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_MESSAGE_ROWS,
    PAYLOAD_SPEC,
    PLATFORM_ONLY,
    SERVER,
    SERVER_ONLY,
    InvalidMessage,
    Message,
    MessageKind,
    PrivacyViolation,
)
from fedrec.federation.secagg import (
    MalformedContribution,
    MFSecAvg,
    SecAggAborted,
    secure_sum,
)

#: The loaded profile's example budget (ci: 10, long: 2000); each test takes a multiple of it.
PROFILE_EXAMPLES = settings().max_examples


def _examples(factor: float) -> int:
    return max(1, round(PROFILE_EXAMPLES * factor))


def _fuzz(factor: float) -> settings:
    return settings(
        max_examples=_examples(factor),
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )


#: Examples per category in the default (ci) profile: see the report in the module doc.
FACTORS = {
    "secure_sum_valid": 30,
    "secure_sum_malformed": 20,
    "mf_secavg": 30,
    "channel_send": 100,
    "channel_wrong_kind": 30,
    "channel_hand_made": 30,
}

# ------------------------------------------------------------------------------------------------
# Secure aggregation

INT_DTYPES = [np.dtype(t) for t in ("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")]


@st.composite
def int_vectors(draw: st.DrawFn, n: int, length: int) -> list[Any]:
    """``n`` integer inputs of ``length``: arrays of any integer dtype, or lists of Python ints
    that fit in 64 bits."""
    vectors: list[Any] = []
    for _ in range(n):
        if draw(st.booleans()):
            dtype = draw(st.sampled_from(INT_DTYPES))
            vectors.append(draw(hnp.arrays(dtype, length)))
        else:
            low = draw(st.sampled_from([0, -(2**63)]))
            high = 2**64 - 1 if low == 0 else 2**63 - 1
            vectors.append(draw(st.lists(st.integers(low, high), min_size=length, max_size=length)))
    return vectors


@st.composite
def dropouts(draw: st.DrawFn, n: int) -> dict[str, set[int]]:
    positions = st.sets(st.integers(0, n - 1), max_size=max(1, n // 3))
    return {
        "dropped_before_keys": draw(positions),
        "dropped_before_sharing": draw(positions),
        "dropped_after_sharing": draw(positions),
        "silent_in_unmasking": draw(positions),
    }


@st.composite
def secure_rounds(draw: st.DrawFn) -> tuple[list[Any], int | None, dict[str, set[int]]]:
    n = draw(st.integers(2, 6))
    length = draw(st.integers(0, 6))
    threshold = draw(st.one_of(st.none(), st.integers(2, n)))
    return draw(int_vectors(n, length)), threshold, draw(dropouts(n))


def _expected_round(
    n: int, threshold: int, drops: dict[str, set[int]]
) -> tuple[list[int], list[int]] | None:
    """(survivors, dropped after sharing), or None when some stage is below the threshold."""
    advertised = set(range(n)) - drops["dropped_before_keys"]
    shared = advertised - drops["dropped_before_sharing"]
    survivors = shared - drops["dropped_after_sharing"]
    responders = survivors - drops["silent_in_unmasking"]
    if min(len(advertised), len(shared), len(survivors), len(responders)) < threshold:
        return None
    return sorted(survivors), sorted(shared & drops["dropped_after_sharing"])


@_fuzz(FACTORS["secure_sum_valid"])
@given(secure_rounds(), st.integers(0, 2**64 - 1))
def test_secure_sum_is_exact_or_aborts_for_any_dropouts(round_: tuple, round_id: int) -> None:
    vectors, threshold, drops = round_
    n = len(vectors)
    expected = _expected_round(n, n // 2 + 1 if threshold is None else threshold, drops)
    event("aborted" if expected is None else "exact sum")
    if expected is None:
        with pytest.raises(SecAggAborted, match="below the threshold"):
            secure_sum(vectors, round_id=round_id, threshold=threshold, **drops)
        return
    result = secure_sum(vectors, round_id=round_id, threshold=threshold, **drops)
    survivors, dropped = expected
    assert result.survivors == survivors and result.dropped == dropped
    length = len(vectors[0])
    exact = [sum(int(vectors[k][i]) for k in survivors) % 2**64 for i in range(length)]
    assert result.total.dtype == np.uint64
    assert [int(w) for w in result.total] == exact


#: Client inputs that cannot enter an integer sum of ``length`` words.
def malformed_inputs(length: int) -> st.SearchStrategy[Any]:
    floats = st.floats(allow_nan=True, allow_infinity=True)
    return st.one_of(
        st.sampled_from([np.float16, np.float32, np.float64]).flatmap(
            lambda dtype: hnp.arrays(dtype, length)  # any values of the dtype: NaN, inf
        )
        if length
        else st.just(np.zeros(0, np.float64)),
        st.lists(floats, min_size=max(length, 1), max_size=max(length, 1)),  # floats, NaN, inf
        hnp.arrays(np.int64, st.integers(0, 8).filter(lambda m: m != length)),  # wrong length
        hnp.arrays(np.int64, hnp.array_shapes(min_dims=2, max_dims=3, max_side=3)),  # not 1-d
        hnp.arrays(np.int64, ()),  # a scalar
        hnp.arrays(np.bool_, length),  # bools are not integers here
        hnp.arrays(np.complex128, length),
        st.lists(  # Python ints outside 64 bits
            st.one_of(st.integers(2**64, 2**80), st.integers(-(2**80), -(2**63) - 1)),
            min_size=max(length, 1),
            max_size=max(length, 1),
        ),
        st.just([[1, 2], [3]]),  # ragged
        st.text(max_size=3),
        st.none(),
    )


@st.composite
def malformed_rounds(draw: st.DrawFn) -> tuple[list[Any], int, dict[str, set[int]]]:
    n = draw(st.integers(2, 5))
    length = draw(st.integers(0, 5))
    vectors = draw(int_vectors(n, length))
    # at least one client stays well formed (all of them with the same wrong length would be a
    # consistent round of that length)
    bad = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1))
    for k in sorted(bad):
        vectors[k] = draw(malformed_inputs(length))
    return vectors, draw(st.integers(0, 2**32)), draw(dropouts(n))


@_fuzz(FACTORS["secure_sum_malformed"])
@given(malformed_rounds())
def test_a_malformed_input_aborts_the_round_before_it_starts(round_: tuple) -> None:
    vectors, round_id, drops = round_
    with pytest.raises(MalformedContribution, match="client"):
        secure_sum(vectors, round_id=round_id, **drops)


def test_float_vectors_are_refused_not_cast() -> None:
    """The fuzzing finding: [0.7, -1.5] + [0.7, 2.5] used to sum to [0, 1] after a silent cast."""
    with pytest.raises(MalformedContribution, match="dtype float64"):
        secure_sum([np.array([0.7, -1.5]), np.array([0.7, 2.5])], round_id=0)
    signed = secure_sum([np.array([-1, 2]), np.array([3, -4])], round_id=0)  # two's complement
    assert signed.total.view(np.int64).tolist() == [2, -2]


@st.composite
def client_updates(draw: st.DrawFn) -> tuple[ClientUpdates, torch.Tensor, torch.Tensor]:
    """A consistent MF-SecAvg round: C clients, I items of width E, a network of size S."""
    c, num_items, width, size = (draw(st.integers(2, 4)), draw(st.integers(1, 5)), 2, 3)
    values = st.floats(-8, 8, width=32)
    rows_client, rows_item = [], []
    for k in range(c):
        items = sorted(draw(st.sets(st.integers(0, num_items - 1), max_size=num_items)))
        rows_client += [k] * len(items)
        rows_item += items
    r = len(rows_item)
    updates = ClientUpdates(
        clients=np.arange(c),
        num_samples=np.array(draw(st.lists(st.integers(1, 200), min_size=c, max_size=c))),
        network=torch.from_numpy(draw(hnp.arrays(np.float32, (c, size), elements=values))),
        row_client=torch.tensor(rows_client, dtype=torch.int64),
        row_item=torch.tensor(rows_item, dtype=torch.int64),
        item_rows=torch.from_numpy(draw(hnp.arrays(np.float32, (r, width), elements=values))),
        num_items=num_items,
    )
    items = torch.from_numpy(draw(hnp.arrays(np.float32, (num_items, width), elements=values)))
    network = torch.from_numpy(draw(hnp.arrays(np.float32, (size,), elements=values)))
    return updates, items, network


CORRUPTIONS = (
    "none",
    "nan_network",
    "inf_item_row",
    "out_of_fixed_point_range",
    "int_network",
    "complex_item_rows",
    "wide_network",
    "wide_item_rows",
    "item_out_of_range",
    "negative_item",
    "duplicate_row",
    "fractional_samples",
    "nan_samples",
)


def _corrupt(updates: ClientUpdates, how: str, client: int) -> ClientUpdates:
    """``updates`` with one malformed contribution (ClientUpdates' own checks still pass)."""
    network, item_rows = updates.network.clone(), updates.item_rows.clone()
    row_item, row_client = updates.row_item.clone(), updates.row_client.clone()
    samples = updates.num_samples.astype(np.float64)
    mine = (row_client == client).nonzero().flatten()
    if how == "nan_network":
        network[client, 0] = float("nan")
    elif how == "inf_item_row":
        if len(mine) == 0:
            network[client, -1] = float("inf")
        else:
            item_rows[mine[0], 0] = float("-inf")
    elif how == "out_of_fixed_point_range":
        network[client, 1] = 3e38
    elif how == "int_network":
        network = network.to(torch.int64)
    elif how == "complex_item_rows":
        item_rows = item_rows.to(torch.complex64)
    elif how == "wide_network":
        network = torch.cat([network, network[:, :1]], dim=1)
    elif how == "wide_item_rows":
        item_rows = torch.cat([item_rows, item_rows[:, :1]], dim=1)
    elif how in ("item_out_of_range", "negative_item", "duplicate_row"):
        if how == "duplicate_row":  # the client uploads one item row twice
            extra = [int(row_item[mine[0]])] if len(mine) else [0, 0]
        else:
            extra = [updates.num_items if how == "item_out_of_range" else -1]
        row_client = torch.cat([row_client, torch.full((len(extra),), client)])
        row_item = torch.cat([row_item, torch.tensor(extra)])
        item_rows = torch.cat([item_rows, item_rows.new_zeros(len(extra), item_rows.shape[1])])
    elif how == "fractional_samples":
        samples[client] += 0.5
    elif how == "nan_samples":
        samples[client] = np.nan
    return ClientUpdates(
        clients=updates.clients,
        num_samples=samples if how.endswith("_samples") else updates.num_samples,
        network=network,
        row_client=row_client,
        row_item=row_item,
        item_rows=item_rows,
        num_items=updates.num_items,
    )


@_fuzz(FACTORS["mf_secavg"])
@given(
    client_updates(),
    st.sampled_from(CORRUPTIONS),
    st.integers(0, 3),
    st.sampled_from([0.0, 0.4]),
    st.integers(0, 100),
)
def test_mf_secavg_gives_mf_fedavg_or_aborts_keeping_the_model(
    round_: tuple, how: str, client: int, dropout: float, seed: int
) -> None:
    updates, items, network = round_
    updates = _corrupt(updates, how, client % updates.num_clients)
    items_before, network_before = items.clone(), network.clone()
    secure = MFSecAvg(dropout=dropout, seed=seed)
    try:
        new_items, new_network = secure.aggregate(items=items, network=network, updates=updates)
    except SecAggAborted:
        event(f"aborted: {how}")
        # the documented abort; the caller's global model is untouched (the trainer keeps it)
        assert how != "none" or dropout > 0
        torch.testing.assert_close(items, items_before, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(network, network_before, rtol=0, atol=0, equal_nan=True)
        return
    event("aggregated")
    assert how == "none", f"a {how} update was aggregated"
    assert secure.last is not None
    plain_items, plain_network = MFFedAvg().aggregate(
        items=items, network=network, updates=updates.subset(np.array(secure.last.survivors))
    )
    torch.testing.assert_close(new_items, plain_items, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(new_network, plain_network, atol=1e-4, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# The channel

N = 5
PLATFORMS = ("platform_a", "platform_b")
PARTIES = (SERVER, *PLATFORMS)
#: (max_message_bytes, max_message_rows) of the channels under test.
LIMITS = st.sampled_from(
    [(DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_MESSAGE_ROWS), (None, None), (96, 4)]
)


class CollectOnly(Transport):
    """A third-party transport with only the two required methods (peek/take: the defaults)."""

    def __init__(self) -> None:
        self.inner = InProcessTransport()

    def deliver(self, message: Message) -> None:
        self.inner.deliver(message)

    def collect(self, receiver: str) -> Message:
        return self.inner.collect(receiver)


def _channel(limits: tuple[int | None, int | None], transport: Transport | None = None) -> Channel:
    max_bytes, max_rows = limits
    return Channel(  # every kind allowed: these tests fuzz payloads; contracts are tested apart
        PLATFORMS,
        num_candidates=N,
        transport=transport,
        max_message_bytes=max_bytes,
        max_message_rows=max_rows,
        kinds=frozenset(MessageKind),
    )


DTYPES = st.sampled_from(
    [
        *(np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint64),
        *(np.bool_, np.complex64, np.dtype(">f4"), np.dtype(">i8")),
    ]
)
ARRAYS = hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=7))
Q_ROWS = st.integers(1, 6)
Q_LIKE = st.one_of(  # the right dtype and shape, any values: NaN, inf, negatives, huge
    Q_ROWS.flatmap(lambda b: hnp.arrays(np.float32, (b, N))),
    Q_ROWS.flatmap(lambda b: hnp.arrays(np.float32, (b,))),
    Q_ROWS.flatmap(lambda b: hnp.arrays(np.int64, (b,))),
    Q_ROWS.flatmap(lambda b: hnp.arrays(np.float32, (b, N), elements=st.floats(-1, 1, width=32))),
)
HUGE = st.sampled_from([DEFAULT_MAX_MESSAGE_ROWS + 1, 2_000_000, 4 * 2**20]).map(
    lambda rows: np.broadcast_to(np.float32(0.5), (rows, N))  # zero-copy: nothing is allocated
)


def _sealed_message() -> Message:
    return Message.make(
        MessageKind.Q_VALUES,
        sender="platform_a",
        receiver=SERVER,
        step=0,
        payload=np.zeros((1, N), np.float32),
    )


PAYLOADS = st.one_of(
    Q_LIKE,
    ARRAYS,
    HUGE,
    st.dictionaries(st.text(max_size=3), Q_LIKE, max_size=2),
    Q_LIKE.map(torch.from_numpy),
    Q_LIKE.map(np.ma.masked_array),  # an ndarray subclass
    Q_LIKE.map(lambda a: a.tolist()),
    st.builds(_sealed_message),  # a Message as the payload of another
    st.one_of(st.none(), st.floats(), st.integers(), st.text(max_size=3), st.binary(max_size=8)),
)
KINDS = st.one_of(st.sampled_from(list(MessageKind)), st.sampled_from(["q_values", None, 3]))


def _acceptable(
    kind: Any, sender: str, receiver: str, payload: Any, limits: tuple[int | None, int | None]
) -> bool:
    """The contract, written independently of fedrec.federation.messages."""
    if not isinstance(kind, MessageKind) or sender == receiver:
        return False
    if (
        sender not in PARTIES
        or receiver not in PARTIES
        or (sender == SERVER) == (receiver == SERVER)
    ):
        return False
    if (kind in SERVER_ONLY and sender != SERVER) or (kind in PLATFORM_ONLY and sender == SERVER):
        return False
    if type(payload) is not np.ndarray:
        return False
    ndim, dtype = PAYLOAD_SPEC[kind]
    if payload.dtype != dtype or payload.ndim != ndim or payload.shape[0] < 1:
        return False
    if ndim == 2 and payload.shape[1] != N:
        return False
    max_bytes, max_rows = limits
    if (max_rows is not None and payload.shape[0] > max_rows) or (
        max_bytes is not None and payload.nbytes > max_bytes
    ):
        return False
    if dtype.kind == "f" and not np.isfinite(payload).all():
        return False
    return not (kind is MessageKind.SAMPLE_INDICES and payload.min() < 0)


def _queues(channel: Channel) -> dict[str, list[int]]:
    transport = channel.transport
    assert isinstance(transport, InProcessTransport)
    return {r: [id(m) for m in q] for r, q in transport.queues.items() if q}


def _valid_payload(kind: MessageKind, rows: int, value: float) -> np.ndarray:
    ndim, dtype = PAYLOAD_SPEC[kind]
    shape = (rows, N) if ndim == 2 else (rows,)
    return np.full(shape, abs(value), dtype=dtype)


#: A valid message: (kind, sender, receiver).
ROUTES = [
    (kind, sender, receiver)
    for kind in MessageKind
    for sender in PARTIES
    for receiver in PARTIES
    if _acceptable(kind, sender, receiver, _valid_payload(kind, 1, 0.0), (None, None))
]


@st.composite
def sends(draw: st.DrawFn) -> tuple[Any, str, str, Any]:
    """(kind, sender, receiver, payload): 3/4 of them well routed with a payload of the
    kind's dtype and shape (any values: NaN, inf, negative indices, huge), the rest anything."""
    if draw(st.integers(0, 3)):
        kind, sender, receiver = draw(st.sampled_from(ROUTES))
        ndim, dtype = PAYLOAD_SPEC[kind]
        rows = draw(Q_ROWS)
        shape = (rows, N) if ndim == 2 else (rows,)
        tame = st.floats(-1e6, 1e6, width=32) if dtype.kind == "f" else st.integers(0, 2**40)
        payload = draw(
            st.one_of(
                hnp.arrays(dtype, shape, elements=tame),
                hnp.arrays(dtype, shape, elements=tame),
                hnp.arrays(dtype, shape),
                HUGE if ndim == 2 else st.just(np.zeros(2_000_000, dtype)),
                PAYLOADS,
            )
        )
        return kind, sender, receiver, payload
    anyone = st.sampled_from([*PARTIES, "platform_z"])
    return draw(KINDS), draw(anyone), draw(anyone), draw(PAYLOADS)


@_fuzz(FACTORS["channel_send"])
@given(sends(), LIMITS)
def test_any_payload_is_delivered_exactly_or_refused_without_a_trace(
    send: tuple, limits: tuple
) -> None:
    kind, sender, receiver, payload = send
    channel = _channel(limits)
    before, queues = channel.state_dict(), _queues(channel)
    small = type(payload) is np.ndarray and payload.nbytes <= 2**20
    original = np.array(payload, copy=True) if small else None
    try:
        channel.send(kind, sender, receiver, payload)
    except (InvalidMessage, PrivacyViolation) as error:
        event(f"refused: {type(error).__name__}")
        assert not _acceptable(kind, sender, receiver, payload, limits)
        assert channel.state_dict() == before and _queues(channel) == queues
        assert channel.transport.pending() == 0
        return
    event("delivered")
    assert _acceptable(kind, sender, receiver, payload, limits)
    assert channel.transport.pending() == 1
    traffic = channel.state_dict()["current"]
    assert traffic[sender]["sent_bytes"] == traffic[receiver]["received_bytes"] == payload.nbytes
    got = channel.receive(receiver, kind)
    assert type(got) is np.ndarray and got.dtype == payload.dtype and got.shape == payload.shape
    np.testing.assert_array_equal(got, payload)
    assert not got.flags.writeable and not np.shares_memory(got, payload)
    if original is not None:  # the sender's array is left as it was
        np.testing.assert_array_equal(payload, original)
    assert channel.transport.pending() == 0


@_fuzz(FACTORS["channel_wrong_kind"])
@given(
    st.lists(st.tuples(st.sampled_from(ROUTES), Q_ROWS, st.integers(0, 9)), min_size=1, max_size=8),
    st.sampled_from(list(MessageKind)),
    st.sampled_from(["in-process", "collect-only"]),
)
def test_a_wrong_kind_receive_leaves_the_queue_unchanged(
    messages: list, wrong: MessageKind, transport_name: str
) -> None:
    transport = InProcessTransport() if transport_name == "in-process" else CollectOnly()
    channel = _channel((DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_MESSAGE_ROWS), transport)
    sent: dict[str, list[tuple[MessageKind, np.ndarray]]] = {p: [] for p in PARTIES}
    for (kind, sender, receiver), rows, value in messages:
        payload = _valid_payload(kind, rows, float(value))
        channel.send(kind, sender, receiver, payload)
        sent[receiver].append((kind, payload))
    receiver = messages[0][0][2]
    head_kind = sent[receiver][0][0]
    if wrong is not head_kind:
        counters, pending = channel.state_dict(), transport.pending()
        queues = _queues(channel) if isinstance(transport, InProcessTransport) else None
        with pytest.raises(InvalidMessage, match="stays queued"):
            channel.receive(receiver, wrong)
        assert channel.state_dict() == counters and transport.pending() == pending
        if queues is not None:
            assert _queues(channel) == queues
    for party, expected in sent.items():  # everything still arrives, in order
        for kind, payload in expected:
            np.testing.assert_array_equal(channel.receive(party, kind), payload)
    for party in PARTIES:
        with pytest.raises(LookupError):
            channel.receive(party, MessageKind.Q_VALUES)


@_fuzz(FACTORS["channel_hand_made"])
@given(
    st.sampled_from(ROUTES),
    PAYLOADS,
    st.sampled_from(["in-process", "collect-only"]),
)
def test_a_hand_made_message_never_gets_through(route: tuple, payload: Any, name: str) -> None:
    kind, sender, receiver = route
    with pytest.raises(InvalidMessage, match=r"Message\.make"):
        Message(kind, sender, receiver, 0, payload)
    transport = InProcessTransport() if name == "in-process" else CollectOnly()
    channel = _channel((DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_MESSAGE_ROWS), transport)
    valid = Message.make(
        kind, sender=sender, receiver=receiver, step=0, payload=_valid_payload(kind, 2, 1.0)
    )
    forged = dataclasses.replace(valid, payload=payload)  # copies make's seal, not its checks
    transport.deliver(forged)  # straight onto the transport, around Channel.send
    with pytest.raises((InvalidMessage, PrivacyViolation)):
        channel.receive(receiver, kind)
    with pytest.raises(LookupError):  # the forged message was dropped, not delivered later
        channel.receive(receiver, kind)
    transport.deliver(valid)  # a sealed, valid message is delivered as it is
    np.testing.assert_array_equal(channel.receive(receiver, kind), valid.payload)


def test_the_fuzzing_findings_stay_fixed() -> None:
    channel = _channel((DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_MESSAGE_ROWS))
    huge = np.broadcast_to(np.float32(0.0), (2_000_000, N))
    with pytest.raises(InvalidMessage, match="exceed the channel's limit"):
        channel.send(MessageKind.Q_VALUES, "platform_a", SERVER, huge)
    with pytest.raises(InvalidMessage, match="exceed the channel's limit"):  # bytes, at N = 500
        Channel(PLATFORMS, num_candidates=500).send(
            MessageKind.Q_VALUES, "platform_a", SERVER, np.zeros((40_000, 500), np.float32)
        )
    # the built-in FedSlate's largest message (500 users x 500 candidates) passes the defaults
    largest = np.zeros((500, 500), np.float32)
    big = Channel(PLATFORMS, num_candidates=500)
    big.send(MessageKind.Q_VALUES, "platform_a", SERVER, largest)
    assert big.receive(SERVER, MessageKind.Q_VALUES).shape == (500, 500)
    with pytest.raises(ValueError, match="max_message_rows"):
        Channel(PLATFORMS, num_candidates=N, max_message_rows=0)


def test_a_nan_update_is_the_documented_abort() -> None:
    """The fuzzing finding: a NaN update raised ValueError instead of SecAggAborted."""
    updates = ClientUpdates(
        clients=np.arange(3),
        num_samples=np.array([4, 5, 6]),
        network=torch.tensor([[0.0, 1.0], [float("nan"), 1.0], [0.5, 0.5]]),
        row_client=torch.tensor([0, 1, 2]),
        row_item=torch.tensor([0, 1, 1]),
        item_rows=torch.ones(3, 2),
        num_items=3,
    )
    with pytest.raises(SecAggAborted, match=r"client 1.*NaN or inf"):
        MFSecAvg().aggregate(items=torch.zeros(3, 2), network=torch.zeros(2), updates=updates)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_diverged_clients_abort_their_rounds_and_the_global_model_is_kept(tmp_path) -> None:
    """Federated training whose clients diverge (lr 1e30: inf/NaN updates) keeps running: every
    MF-SecAvg round aborts, the trainer counts it and keeps the finite global model."""
    from fedrec.envs.datasets.synthetic import write_synthetic
    from fedrec.train.fedncf import FedNCFConfig, train_federated

    write_synthetic("ml-100k", tmp_path / "ml-100k")
    config = FedNCFConfig(
        aggregator="mf-secavg", global_rounds=1, clients_per_round=12, lr=1e30,
        client_optimizer="fresh",
    )  # fmt: skip
    result = train_federated(dataset="ml-100k", data_dir=tmp_path, config=config, progress=False)
    assert result.aborted_rounds > 0
    assert torch.isfinite(result.model.item_table()).all()
    assert torch.isfinite(result.model.network_vector()).all()
