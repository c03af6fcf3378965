"""FedSlate's party processes and their mailbox refuse whoever lacks the run's keys, and bound
what an authenticated caller can make them hold or wait for; the wire codec refuses frames
nested too deep or with huge integers; TLS works with a self-signed certificate.

A raw gRPC client in the test stands for an unrelated local process: it knows the ports (they
are on loopback) but not the keys.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from tls_helpers import self_signed

from fedrec.agents.fedslate import FedSlateConfig, remote
from fedrec.agents.fedslate.remote import PARTY_SERVICE, RemoteParties
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.federation.grpc_transport import (
    DRIVER,
    KEY_HEADER,
    MAILBOX_SERVICE,
    MAX_DEPTH,
    MAX_WAIT_S,
    AuthenticationError,
    GrpcTransport,
    Mailbox,
    MailboxServer,
    TLSFiles,
    WireError,
    dumps,
    encode_message,
    loads,
    wait_seconds,
)
from fedrec.federation.messages import SERVER, InvalidMessage, Message, MessageKind

grpc = pytest.importorskip(
    "grpc", reason="parties in processes need grpcio (pip install 'fedrec[flower]')"
)

TINY = FedSlateConfig(
    learning_starts=8, batch_size=4, buffer_size=50, local_hidden=(8,), global_hidden=(8,)
)
PLATFORMS = ["platform_a", "platform_b"]


def _parties(tls: TLSFiles | None = None) -> RemoteParties:
    params = ChocKaleParams(num_candidates=6, slate_size=2)
    return RemoteParties(
        platforms=PLATFORMS,
        feedback={"platform_a": True, "platform_b": False},
        state_dims={"platform_a": 3, "platform_b": 3},
        params=params,
        config=TINY,
        seeds=[1, 2, 3],
        timeout_s=30,
        tls=tls,
    )


@pytest.fixture(scope="module")
def parties():
    with _parties() as run:
        yield run


def _raw(address: str, path: str, request: bytes, key: str | None = None) -> bytes:
    """A call from a process that is not part of the run (optionally with a guessed key)."""
    with grpc.insecure_channel(address) as channel:
        metadata = () if key is None else ((KEY_HEADER, key),)
        return channel.unary_unary(path)(request, timeout=10, metadata=metadata)


def _message(sender: str, receiver: str, kind: MessageKind = MessageKind.Q_VALUES) -> bytes:
    payload = np.ones((2, 6), np.float32)
    return encode_message(
        Message.make(kind, sender=sender, receiver=receiver, step=0, payload=payload)
    )


def _rewrite(frame: bytes, old: bytes, new: bytes) -> bytes:
    """``frame`` with ``old`` replaced by ``new`` in its JSON header (what a forger does)."""
    size = int.from_bytes(frame[4:8], "little")
    header = frame[8 : 8 + size].replace(old, new, 1)
    return frame[:4] + len(header).to_bytes(4, "little") + header + frame[8 + size :]


# ------------------------------------------------------------------ outsiders get nothing
def test_an_outsider_cannot_read_or_load_a_partys_state(parties) -> None:
    platform_b = parties._processes[2]
    assert platform_b.name == "platform_b"
    state_call = dumps({"method": "state_dict", "step": 0, "kwargs": {}})
    for key in (None, "0" * 64, parties._processes[1]._metadata[0][1]):  # A's key is not B's
        with pytest.raises(grpc.RpcError) as error:
            _raw(platform_b.address, f"/{PARTY_SERVICE}/Call", state_call, key)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    load_call = dumps({"method": "load_state_dict", "step": 0, "kwargs": {"state": {}}})
    with pytest.raises(grpc.RpcError) as error:
        _raw(platform_b.address, f"/{PARTY_SERVICE}/Call", load_call)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # the driver, with the key platform_b made, still reads it
    state = parties.platforms["platform_b"].state_dict()
    assert "local" in str(sorted(state)) or state


def test_an_outsider_cannot_inject_or_take_messages(parties) -> None:
    mailbox = parties.server._process.address
    forged = _message("platform_a", SERVER)  # a well-formed Q_VALUES: validation would pass it
    for method, request in (
        ("Deliver", forged),
        ("Take", dumps({"receiver": SERVER})),
        ("Peek", dumps({"receiver": "platform_b"})),
        ("Pending", dumps({})),
    ):
        with pytest.raises(grpc.RpcError) as error:
            _raw(mailbox, f"/{MAILBOX_SERVICE}/{method}", request, "f" * 64)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
    assert parties.channel.transport.pending() == 0  # nothing was queued
    # and the driver's own mailbox key may count, not send or take
    with pytest.raises(AuthenticationError, match="may not send as 'platform_a'"):
        parties.channel.transport.deliver_raw(forged)
    with pytest.raises(AuthenticationError, match="may not read"):
        parties.channel.transport.collect(SERVER)


def test_a_platform_key_only_reaches_its_own_queue() -> None:
    box = Mailbox()
    server = MailboxServer(mailbox=box)
    keys = box.open([SERVER, *PLATFORMS])
    a = GrpcTransport(server.address, key=keys["platform_a"], timeout_s=10)
    try:
        with pytest.raises(AuthenticationError, match="may not send as 'platform_b'"):
            a.deliver_raw(_message("platform_b", SERVER))
        box.deliver(_message(SERVER, "platform_b", MessageKind.FEDERATED_Q_VALUES), sender=SERVER)
        with pytest.raises(AuthenticationError, match="may not read 'platform_b'"):
            a.collect("platform_b")
        assert box.pending() == 1  # platform_b's message is still there, for platform_b only
    finally:
        a.close()
        server.stop()


# ------------------------------------------------------------------ bounds
def test_mailbox_refuses_oversize_frames_unknown_receivers_and_bad_waits() -> None:
    one = len(_message("platform_a", SERVER))
    box = Mailbox(max_frame_bytes=4096, max_queued_bytes=one + one // 2)
    server = MailboxServer(mailbox=box)
    keys = box.open([SERVER, "platform_a"])
    a = GrpcTransport(server.address, key=keys["platform_a"], timeout_s=10)
    try:
        big = encode_message(
            Message.make(
                MessageKind.Q_VALUES, sender="platform_a", receiver=SERVER, step=0,
                payload=np.ones((200, 6), np.float32),
            )
        )  # fmt: skip
        with pytest.raises(InvalidMessage, match="above the mailbox's limit of 4096"):
            a.deliver_raw(big)
        with pytest.raises(InvalidMessage, match="'nobody' is not a party of this run"):
            a.deliver_raw(
                _rewrite(
                    _message("platform_a", SERVER), b'"receiver": "server"', b'"receiver": "nobody"'
                )
            )
        a.deliver_raw(_message("platform_a", SERVER))  # one fits under the queue's limit
        with pytest.raises(InvalidMessage, match=f"would pass its limit of {one + one // 2}"):
            a.deliver_raw(_message("platform_a", SERVER))  # the queue total is bounded
        for wait in (math.nan, math.inf, -1.0, "10"):
            with pytest.raises(InvalidMessage, match="wait_s must be a finite number"):
                a.request_raw("Take", dumps({"receiver": "platform_a", "wait_s": wait}))
    finally:
        a.close()
        server.stop()
    assert wait_seconds(1e9) == MAX_WAIT_S  # a huge wait is cut server-side
    assert wait_seconds(0.5) == 0.5


def test_the_real_channel_limit_is_the_default() -> None:
    box = Mailbox()
    box.open([SERVER, "platform_a"])
    frame = _message("platform_a", SERVER)
    oversize = frame + b"\0" * (box.max_frame_bytes + 1 - len(frame))
    with pytest.raises(WireError, match="above the mailbox's limit"):
        box.deliver(oversize)  # refused on its size before it is even parsed
    assert box.max_frame_bytes < 1 << 30  # not the 1 GiB the gRPC server accepts


def test_decoding_refuses_deep_nesting_and_huge_integers() -> None:
    deep: object = 0
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(RecursionError):
        dumps(deep)  # our own encoder cannot even build it: hand-make the frame
    header = b'{"tree": ' + b"[" * 100_000 + b"0" + b"]" * 100_000 + b', "blobs": []}'
    frame = b"FRW1" + len(header).to_bytes(4, "little") + header
    with pytest.raises(WireError, match=f"nested 100001 deep \\(at most {MAX_DEPTH}\\)"):
        loads(frame)
    shallow = [[[["ok", '"]]]]]]"']]]]  # brackets inside strings do not count
    assert loads(dumps(shallow)) == shallow
    header = b'{"tree": ' + b"9" * 5000 + b', "blobs": []}'
    frame = b"FRW1" + len(header).to_bytes(4, "little") + header
    with pytest.raises(WireError, match="an integer of 5000 digits"):
        loads(frame)
    assert loads(dumps(2**200)) == 2**200  # RNG states (128-bit) still cross
    shape = _rewrite(dumps({"x": np.zeros(0, np.float32)}), b"[0]]", b"[4611686018427387904, 4]]")
    with pytest.raises(WireError, match="has 0 bytes"):
        loads(shape)  # shape product overflowing int64 is caught, not wrapped to 0


# ------------------------------------------------------------------ TLS
def test_tls_mailbox_with_a_self_signed_certificate(tmp_path: Path) -> None:
    tls = self_signed(tmp_path)
    box = Mailbox()
    server = MailboxServer(mailbox=box, tls=tls)
    keys = box.open([SERVER, "platform_a"])
    a = GrpcTransport(server.address, key=keys["platform_a"], timeout_s=10, tls=tls)
    try:
        a.deliver_raw(_message("platform_a", SERVER))
        assert a.pending() == 1
        with pytest.raises(grpc.RpcError):  # a plaintext client cannot talk to it
            _raw(server.address, f"/{MAILBOX_SERVICE}/Pending", dumps({}), keys[DRIVER])
    finally:
        a.close()
        server.stop()
    with pytest.raises(ValueError, match="cannot read the TLS key"):
        TLSFiles(
            cert_file=tls.cert_file, key_file=str(tmp_path / "missing.pem")
        ).server_credentials()


def test_parties_in_processes_over_tls(tmp_path: Path) -> None:
    tls = self_signed(tmp_path)
    with _parties(tls) as run:
        state = run.platforms["platform_a"].state_dict()
        run.platforms["platform_a"].load_state_dict(state)
        assert run.channel.transport.pending() == 0
        with pytest.raises(grpc.RpcError):  # no plaintext way in
            _raw(
                run.server._process.address,
                f"/{PARTY_SERVICE}/Call",
                dumps({"method": "ping", "step": 0, "kwargs": {}}),
            )


def test_dead_party_error_is_one_line_for_the_cli() -> None:
    from fedrec.cli import error_line, is_user_error

    error = remote.RemotePartyError("platform_b's process (pid 1) exited during act; stderr:\nx")
    assert is_user_error(error) and isinstance(error, RuntimeError)
    assert "\n" not in error_line(error)
    assert is_user_error(AuthenticationError("no valid key"))
