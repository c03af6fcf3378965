"""The federation layer: message validation (privacy contract), transport and accounting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrec.federation.channel import Channel, InProcessTransport, Transport
from fedrec.federation.messages import (
    FEDSLATE_KINDS,
    PARAMETER_SHARING_KINDS,
    SERVER,
    InvalidMessage,
    Message,
    MessageKind,
    PrivacyViolation,
)

N = 7


def _channel() -> Channel:
    return Channel(["platform_a", "platform_b"], num_candidates=N)


def _q(rows: int = 4) -> np.ndarray:
    return np.zeros((rows, N), dtype=np.float32)


def test_q_values_pass_and_arrive_read_only() -> None:
    channel = _channel()
    payload = np.arange(4 * N, dtype=np.float32).reshape(4, N)
    channel.send(MessageKind.Q_VALUES, "platform_a", SERVER, payload)
    received = channel.receive(SERVER, MessageKind.Q_VALUES)
    np.testing.assert_array_equal(received, payload)
    assert not received.flags.writeable
    payload[0, 0] = 99.0  # the sender's later edits do not reach the receiver
    assert received[0, 0] == 0.0


@pytest.mark.parametrize(
    "payload",
    [
        {"q": np.zeros((4, N), np.float32)},  # a dict
        [[0.0] * N],  # a list
        torch.zeros(4, N),  # a tensor (could carry a graph)
        torch.nn.Linear(N, N).state_dict(),  # network parameters
        3.0,  # a scalar reward
    ],
)
def test_anything_but_an_array_is_a_privacy_violation(payload: object) -> None:
    with pytest.raises(PrivacyViolation, match="payload must be a plain numpy array"):
        _channel().send(MessageKind.Q_VALUES, "platform_a", SERVER, payload)


def _payload(kind: MessageKind) -> np.ndarray:
    if kind is MessageKind.SAMPLE_INDICES:
        return np.zeros(4, np.int64)
    if kind in (MessageKind.TD_TARGETS, MessageKind.MODEL_PARAMETERS):
        return np.zeros(4, np.float32)
    return _q()


@pytest.mark.parametrize("contract", [FEDSLATE_KINDS, PARAMETER_SHARING_KINDS])
@pytest.mark.parametrize("kind", list(MessageKind))
def test_a_channel_carries_only_its_contracts_kinds(
    contract: frozenset[MessageKind], kind: MessageKind
) -> None:
    channel = Channel(["platform_a", "platform_b"], num_candidates=N, kinds=contract)
    sender, receiver = (
        (SERVER, "platform_a")
        if kind
        in (
            MessageKind.FEDERATED_Q_VALUES,
            MessageKind.SAMPLE_INDICES,
        )
        else ("platform_a", SERVER)
    )
    before = channel.state_dict()
    if kind in contract:
        channel.send(kind, sender, receiver, _payload(kind))
        assert channel.receive(receiver, kind).shape == _payload(kind).shape
        return
    with pytest.raises(PrivacyViolation, match="outside this channel's contract"):
        channel.send(kind, sender, receiver, _payload(kind))
    assert channel.state_dict() == before and channel.transport.pending() == 0
    # A message of that kind handed over by the transport directly is refused and dropped too.
    sealed = Message.make(kind, sender=sender, receiver=receiver, step=0, payload=_payload(kind))
    channel.transport.deliver(sealed)
    with pytest.raises(PrivacyViolation, match="outside this channel's contract"):
        channel.receive(receiver, kind)
    assert channel.transport.pending() == 0


def test_fedslate_contract_refuses_model_parameters_by_default() -> None:
    with pytest.raises(PrivacyViolation, match="MODEL_PARAMETERS is outside"):
        _channel().send(MessageKind.MODEL_PARAMETERS, "platform_a", SERVER, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="non-empty set of MessageKind"):
        Channel(["platform_a"], num_candidates=N, kinds=["q_values"])


def test_unknown_kinds_are_refused() -> None:
    for kind in ("rewards", "observations", "parameters", None):
        with pytest.raises(PrivacyViolation, match="not allowed across parties"):
            Message.make(kind, sender="platform_a", receiver=SERVER, step=0, payload=_q())


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (np.zeros((4, N), np.float64), "dtype must be float32"),
        (np.zeros((4, N + 1), np.float32), "one per candidate"),
        (np.zeros((4,), np.float32), "2-d array"),
        (np.full((4, N), np.nan, np.float32), "NaN or inf"),
        (np.full((4, N), np.inf, np.float32), "NaN or inf"),
    ],
)
def test_malformed_q_values_are_refused(payload: np.ndarray, match: str) -> None:
    with pytest.raises(InvalidMessage, match=match):
        _channel().send(MessageKind.Q_VALUES, "platform_a", SERVER, payload)


def test_direction_rules() -> None:
    channel = _channel()
    with pytest.raises(InvalidMessage, match="between a platform and the server"):
        channel.send(MessageKind.Q_VALUES, "platform_a", "platform_b", _q())
    with pytest.raises(PrivacyViolation, match="only be sent by the server"):
        channel.send(MessageKind.FEDERATED_Q_VALUES, "platform_a", SERVER, _q())
    with pytest.raises(PrivacyViolation, match="only be sent by a platform"):
        channel.send(MessageKind.Q_VALUES, SERVER, "platform_a", _q())
    with pytest.raises(InvalidMessage, match="unknown party"):
        channel.send(MessageKind.Q_VALUES, "platform_z", SERVER, _q())
    with pytest.raises(InvalidMessage, match="dtype must be int64"):
        channel.send(MessageKind.SAMPLE_INDICES, SERVER, "platform_a", np.zeros(3, np.float32))


def test_receive_checks_the_protocol_order() -> None:
    channel = _channel()
    channel.send(MessageKind.TD_TARGETS, "platform_a", SERVER, np.zeros(4, np.float32))
    with pytest.raises(
        InvalidMessage, match="expected Q_VALUES but the next message is TD_TARGETS"
    ):
        channel.receive(SERVER, MessageKind.Q_VALUES)
    with pytest.raises(LookupError):
        channel.receive("platform_b", MessageKind.Q_VALUES)


def test_accounting_counts_payload_bytes_per_party_and_episode() -> None:
    channel = _channel()
    for _ in range(3):  # one "episode" of 3 exchanges of Q values for B = 4 users
        channel.send(MessageKind.Q_VALUES, "platform_a", SERVER, _q(4))
        channel.send(MessageKind.FEDERATED_Q_VALUES, SERVER, "platform_a", _q(4))
        channel.receive(SERVER, MessageKind.Q_VALUES)
        channel.receive("platform_a", MessageKind.FEDERATED_Q_VALUES)
    channel.end_episode(episodes=4)
    per = channel.per_episode()
    q_bytes = 4 * N * 4  # users x candidates x float32
    assert per["platform_a"]["sent_bytes"] == 3 * q_bytes / 4
    assert per["platform_a"]["received_bytes"] == 3 * q_bytes / 4
    assert per[SERVER]["sent_bytes"] == per[SERVER]["received_bytes"] == 3 * q_bytes / 4
    assert per["platform_b"]["sent_bytes"] == 0
    assert "platform_a" in channel.table()
    restored = _channel()
    restored.load_state_dict(channel.state_dict())
    assert restored.per_episode() == per


def test_transport_is_pluggable() -> None:
    class Recording(Transport):
        def __init__(self) -> None:
            self.inner, self.log = InProcessTransport(), []

        def deliver(self, message: Message) -> None:
            self.log.append((message.kind, message.sender, message.receiver, message.nbytes))
            self.inner.deliver(message)

        def collect(self, receiver: str) -> Message:
            return self.inner.collect(receiver)

    transport = Recording()
    channel = Channel(["platform_a"], num_candidates=N, transport=transport)
    channel.send(MessageKind.Q_VALUES, "platform_a", SERVER, _q(2))
    assert transport.log == [(MessageKind.Q_VALUES, "platform_a", SERVER, 2 * N * 4)]
    assert channel.receive(SERVER, MessageKind.Q_VALUES).shape == (2, N)
