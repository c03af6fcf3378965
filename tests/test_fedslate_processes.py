"""FedSlate's parties in separate processes (gRPC on loopback): same results, same traffic.

One short training per transport on a fixed seed (a feedback platform and one without, learning
rounds included) is compared bit for bit: slates, losses, every tensor of every party's state,
and the channel's counters. The transport and its codec are checked on their own (exact round
trips, refused and tampered messages), and the party processes must be gone after ``close``,
after a party dies, and when construction fails.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch

pytest.importorskip(
    "grpc", reason="parties in processes need grpcio (pip install 'fedrec[flower]')"
)

from fedrec.agents.fedslate import FedSlateAgent, FedSlateConfig, platform_state, remote
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.federation.channel import Channel
from fedrec.federation.grpc_transport import (
    DRIVER,
    GrpcTransport,
    Mailbox,
    MailboxServer,
    WireError,
    dumps,
    encode_message,
    loads,
)
from fedrec.federation.messages import (
    SERVER,
    InvalidMessage,
    Message,
    MessageKind,
    PrivacyViolation,
)
from fedrec.federation.supervisor import alive

TINY = {
    "learning_starts": 60,
    "batch_size": 8,
    "buffer_size": 200,
    "local_hidden": (16,),
    "global_hidden": (16,),
    "target_update_interval": 50,
}
USERS, STEPS = 4, 75  # 300 transitions per platform: 80 learning rounds, 1 episode closed


def _env() -> ChocKaleMultiPlatformBatchEnv:
    return ChocKaleMultiPlatformBatchEnv(USERS, num_candidates=10, slate_size=3)


def _train(parties: str) -> dict:
    """Train on seed 0; what the run produced (and the agent, still open)."""
    env = _env()
    agent = FedSlateAgent.from_env(env, config=FedSlateConfig(**TINY), seed=0, parties=parties)
    obs, _ = env.reset(seed=0)
    first = env.possible_agents[0]
    slates_log, losses = [], []
    for _ in range(STEPS):
        slates = agent.explore(obs)
        slates_log.append(slates)
        next_obs, rewards, terminated, truncated, _ = env.step(slates)
        feedback = {p: rewards[p] for p in env.possible_agents if env.feedback[p]}
        losses.append(agent.observe(obs, slates, feedback, next_obs, terminated[first]))
        obs = next_obs
        if terminated[first].all() or truncated[first].all():
            agent.end_episode(env.num_users)
            obs, _ = env.reset()
    agent.start_diagnostics()
    greedy = agent.act(obs)
    return {
        "agent": agent,
        "slates": slates_log,
        "greedy": greedy,
        "losses": losses,
        "diagnostics": agent.diagnostics(),
        "state": agent.state_dict(),
        "traffic": agent.traffic(),
        "table": agent.channel.table(),
        "obs": obs,
    }


@pytest.fixture(scope="module")
def runs():
    local = _train("in-process")
    processes = _train("processes")
    yield local, processes
    processes["agent"].close()


def _assert_same_tree(a: object, b: object, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, path
        assert torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype, path
        np.testing.assert_array_equal(a, b, err_msg=path)
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            _assert_same_tree(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same_tree(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _gone(pid: int) -> bool:
    return not alive(pid)


def _wait_gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_gone(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------ same results
def test_processes_give_identical_slates_losses_and_weights(runs) -> None:
    local, processes = runs
    agent = processes["agent"]
    assert agent.rounds == local["agent"].rounds >= 70  # learning rounds actually happened
    assert set(agent.remote.pids) == {SERVER, "platform_a", "platform_b"}
    assert agent.feedback == {"platform_a": True, "platform_b": False}
    assert agent.platforms["platform_b"].updates > 0  # the platform without feedback learned
    _assert_same_tree(local["slates"], processes["slates"], "slates")
    _assert_same_tree(local["greedy"], processes["greedy"], "greedy")
    assert local["losses"][-1] and local["losses"] == processes["losses"]
    assert local["diagnostics"] == processes["diagnostics"]
    # every tensor of every party: networks, targets, Adam moments, replay, RNG states
    _assert_same_tree(local["state"], processes["state"], "state")


def test_processes_report_the_same_traffic(runs) -> None:
    local, processes = runs
    assert processes["state"]["channel"]["episodes"] == USERS  # and 15 steps of the next
    assert local["traffic"] == processes["traffic"]
    assert local["table"] == processes["table"]
    assert local["state"]["channel"] == processes["state"]["channel"]
    by_kind = processes["state"]["channel"]["total"]["platform_b"]["by_kind"]
    assert by_kind["Q_GRADIENTS"] > 0 and "TD_TARGETS" not in by_kind  # B never sends a label


def test_state_dict_round_trips_through_the_parties(runs) -> None:
    _, processes = runs
    agent = processes["agent"]
    state = agent.state_dict()
    agent.load_state_dict(state)
    _assert_same_tree(state, agent.state_dict(), "state")
    twin = FedSlateAgent.from_env(_env(), config=FedSlateConfig(**TINY), seed=1)
    twin.load_state_dict(state)  # a checkpoint of the processes loads in-process
    _assert_same_tree(twin.act(processes["obs"]), agent.act(processes["obs"]), "act")


def test_a_party_still_refuses_what_the_contract_forbids(runs) -> None:
    _, processes = runs
    agent, obs = processes["agent"], processes["obs"]["platform_b"]
    slates = agent.act(processes["obs"])["platform_b"]
    with pytest.raises(PrivacyViolation, match=r"platform_b.*never receive a reward"):
        agent.platforms["platform_b"].store(
            obs, slates, obs, np.zeros(USERS, bool), np.ones(USERS), burn_in=False
        )
    with pytest.raises(PrivacyViolation, match="does not run 'local_q'"):
        agent.platforms["platform_b"]._call("local_q", state=platform_state(obs))
    assert agent.channel.transport.pending() == 0


# ------------------------------------------------------------------ the transport
def test_codec_round_trips_arrays_and_state_exactly() -> None:
    rng = np.random.default_rng(0)
    value = {
        "f32": rng.standard_normal((5, 7)).astype(np.float32),
        "f64": np.array([np.nan, np.inf, -0.0, 1e-300]),
        "i64": np.arange(-3, 3, dtype=np.int64).reshape(2, 3)[:, ::2],  # not contiguous
        "bool": np.array([True, False]),
        "empty": np.zeros((0, 4), np.float32),
        "scalar": np.float32(1.5),
        "tensor": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "rng": np.random.default_rng(3).bit_generator.state,  # 128-bit ints
        3: ("tuple", None, 2.5, [1, {"x": b"raw"}]),
    }
    back = loads(dumps(value))
    _assert_same_tree(value, back)
    assert type(back["scalar"]) is np.float32 and type(back[3]) is tuple
    assert back["f32"].flags.writeable and back["f32"].tobytes() == value["f32"].tobytes()
    with pytest.raises(WireError, match="plain numeric"):
        dumps({"x": np.array([object()])})
    with pytest.raises(WireError, match="cannot encode"):
        dumps({"x": {1, 2}})
    frame = dumps({"x": np.zeros(3)})
    with pytest.raises(WireError):
        loads(frame[:-1])
    forged = frame.replace(b'"<f8"', b'"|O8"')
    with pytest.raises(WireError, match="refused dtype"):
        loads(forged)
    with pytest.raises(WireError, match="bad magic"):
        loads(b"\x80\x04\x95" + frame)  # a pickle stream is not a frame


def _mailbox(*platforms: str) -> tuple[MailboxServer, dict[str, GrpcTransport]]:
    """A mailbox server for SERVER and ``platforms`` and one authenticated transport each."""
    box = Mailbox()
    server = MailboxServer(mailbox=box)
    keys = box.open([SERVER, *platforms])
    transports = {
        who: GrpcTransport(server.address, key=key, timeout_s=10) for who, key in keys.items()
    }
    return server, transports


def _close(server: MailboxServer, transports: dict[str, GrpcTransport]) -> None:
    for transport in transports.values():
        transport.close()
    server.stop()


def test_grpc_transport_matches_in_process_semantics() -> None:
    server, t = _mailbox("platform_a", "platform_b")
    try:
        names = ["platform_a", "platform_b"]
        channels = {
            who: Channel(names, num_candidates=4, transport=t[who]) for who in (SERVER, *names)
        }
        q = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
        index = np.array([5, 0, 7], dtype=np.int64)
        channels["platform_a"].send(MessageKind.Q_VALUES, "platform_a", SERVER, q)
        channels["platform_b"].send(MessageKind.Q_VALUES, "platform_b", SERVER, q + 1)
        channels[SERVER].send(MessageKind.SAMPLE_INDICES, SERVER, "platform_a", index)
        assert t[DRIVER].pending() == 3
        with pytest.raises(InvalidMessage, match="stays queued"):
            channels["platform_a"].receive("platform_a", MessageKind.TD_TARGETS)
        assert t[DRIVER].pending() == 3  # a wrong kind leaves the message queued
        head = t[SERVER].peek(SERVER)
        assert head.sender == "platform_a" and t[DRIVER].pending() == 3
        server_channel = channels[SERVER]
        np.testing.assert_array_equal(server_channel.receive(SERVER, MessageKind.Q_VALUES), q)
        got = server_channel.receive(SERVER, MessageKind.Q_VALUES)  # FIFO per receiver
        assert got.tobytes() == (q + 1).tobytes() and not got.flags.writeable
        back = channels["platform_a"].receive("platform_a", MessageKind.SAMPLE_INDICES)
        assert back.dtype == np.int64 and back.tolist() == index.tolist()
        assert t[DRIVER].pending() == 0
        with pytest.raises(LookupError, match="no message waiting"):
            server_channel.receive(SERVER, MessageKind.Q_VALUES)
        assert channels["platform_a"].current["platform_a"].sent_bytes == q.nbytes
        # each channel counts its party's sends (and what those deliver to the receiver)
        assert sum(c.current[SERVER].received_messages for c in channels.values()) == 2
    finally:
        _close(server, t)


def test_refused_and_tampered_messages_never_arrive() -> None:
    server, t = _mailbox("platform_a")
    transport = t["platform_a"]
    try:
        channel = Channel(["platform_a"], num_candidates=4, transport=transport)
        server_channel = Channel(["platform_a"], num_candidates=4, transport=t[SERVER])
        with pytest.raises(PrivacyViolation, match="outside this channel's contract"):
            channel.send(MessageKind.MODEL_PARAMETERS, "platform_a", SERVER, np.zeros(3, "f4"))
        with pytest.raises(InvalidMessage, match="NaN"):
            channel.send(MessageKind.Q_VALUES, "platform_a", SERVER, np.full((1, 4), np.nan, "f4"))
        assert transport.pending() == 0 and channel.current["platform_a"].sent_messages == 0
        # What a hostile sender could put on the mailbox: a NaN payload, an object array.
        good = Message.make(
            MessageKind.TD_TARGETS, sender="platform_a", receiver=SERVER, step=0,
            payload=np.ones(2, np.float32),
        )  # fmt: skip
        frame = encode_message(good)
        nan = frame[:-8] + np.full(2, np.nan, np.float32).tobytes()
        transport.deliver_raw(nan)
        transport.deliver_raw(frame.replace(b'"<f4"', b'"|O4"'))
        transport.deliver_raw(frame)
        for _ in range(2):
            with pytest.raises(InvalidMessage):
                server_channel.receive(SERVER, MessageKind.TD_TARGETS)
        assert server_channel.receive(SERVER, MessageKind.TD_TARGETS).tolist() == [1.0, 1.0]
        assert transport.pending() == 0  # the tampered frames were dropped
        with pytest.raises(InvalidMessage, match="undeliverable"):
            transport.deliver_raw(b"not a frame")
        with pytest.raises(ValueError, match="loopback only"):
            MailboxServer(host="0.0.0.0")
    finally:
        _close(server, t)


# ------------------------------------------------------------------ processes are cleaned up
def test_no_process_is_left_after_a_party_dies(runs) -> None:
    _, processes = runs
    agent, obs = processes["agent"], processes["obs"]
    pids = [*agent.remote.pids.values(), agent.remote.launcher_pid]
    token = agent.remote.token
    if os.path.isdir("/proc"):
        assert sorted(_marked(token)) == sorted(pids)
    assert len(pids) == 4 and not any(_gone(pid) for pid in pids)
    with pytest.raises(remote.RemotePartyError, match=r"platform_b's process \(pid \d+\) exited"):
        with agent:  # the error leaves the block: every process is stopped
            os.kill(agent.remote.pids["platform_b"], signal.SIGKILL)
            agent.act(obs)
    assert agent.remote.closed and agent.remote.pids == {}
    agent.close()  # idempotent
    assert _wait_gone(pids)
    if os.path.isdir("/proc"):
        assert _marked(token) == []


def _marked(token: str) -> list[int]:
    """Processes whose environment holds ``token`` (the launcher and the parties it forked)."""
    needle = f"{remote.TOKEN_VARIABLE}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_no_process_is_left_when_startup_fails(monkeypatch) -> None:
    launchers: list[remote.Launcher] = []

    def fail(self, names, timeout_s):
        launchers.append(self)
        raise TimeoutError("simulated start-up failure")

    monkeypatch.setattr(remote.Launcher, "wait_ready", fail)
    with pytest.raises(TimeoutError, match="simulated"):
        FedSlateAgent.from_env(_env(), config=FedSlateConfig(**TINY), parties="processes")
    (launcher,) = launchers
    assert launcher.proc.returncode is not None  # stopped and reaped
    deadline = time.monotonic() + 10
    while _marked(launcher.token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _marked(launcher.token) == []


def test_processes_need_a_federated_method() -> None:
    with pytest.raises(ValueError, match="needs a federated method"):
        FedSlateAgent.from_env(
            _env(), config=FedSlateConfig(method="slateq", **TINY), parties="processes"
        )
    with pytest.raises(ValueError, match="parties must be one of"):
        FedSlateAgent.from_env(_env(), config=FedSlateConfig(**TINY), parties="threads")


def test_cli_refuses_parties_for_other_agents(tmp_path, capsys) -> None:
    from fedrec.cli import main

    code = main(
        ["train", "random", "--env", "fedrec/ChocKaleMultiPlatform-v0", "--episodes", "1",
         "--parties", "processes", "--out", str(tmp_path / "run")]
    )  # fmt: skip
    assert code != 0
    assert "only FedSlate's federated methods" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
