"""FedSlate and baselines: privacy by construction, protocol, update counts, K platforms, resume."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from fedrec.agents.fedslate import (
    FederatedServer,
    FedSlateAgent,
    FedSlateConfig,
    Platform,
    platform_state,
)
from fedrec.agents.registry import build_multi_platform_agent
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.federation.channel import InProcessTransport
from fedrec.federation.messages import SERVER, Message, MessageKind, PrivacyViolation
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

SMALL = {
    "learning_starts": 120,
    "batch_size": 8,
    "buffer_size": 200,
    "local_hidden": (16,),
    "global_hidden": (16,),
    "target_update_interval": 50,
}


class Recording(InProcessTransport):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[Message] = []

    def deliver(self, message: Message) -> None:
        self.log.append(message)
        super().deliver(message)


def _env(users: int = 4, **kwargs) -> ChocKaleMultiPlatformBatchEnv:
    return ChocKaleMultiPlatformBatchEnv(users, num_candidates=10, slate_size=3, **kwargs)


def _play(agent, env, steps: int, seed: int = 0) -> None:
    obs, _ = env.reset(seed=seed)
    first = env.possible_agents[0]
    for _ in range(steps):
        slates = agent.explore(obs)
        next_obs, rewards, terminated, truncated, _ = env.step(slates)
        feedback = {p: rewards[p] for p in env.possible_agents if env.feedback[p]}
        agent.observe(obs, slates, feedback, next_obs, terminated[first])
        obs = next_obs
        if terminated[first].all() or truncated[first].all():
            agent.end_episode(env.num_users)
            obs, _ = env.reset()


def _agent(env, method: str = "fedslate", transport=None, **overrides) -> FedSlateAgent:
    config = FedSlateConfig(method=method, **{**SMALL, **overrides})
    return FedSlateAgent.from_env(env, config=config, seed=0, transport=transport)


def _reachable(root: object, depth: int = 3) -> list[object]:
    """Objects reachable from ``root``'s attributes (a few levels deep)."""
    seen, frontier = [], [root]
    for _ in range(depth):
        nxt = []
        for obj in frontier:
            for child in gc.get_referents(*([vars(obj)] if hasattr(obj, "__dict__") else [obj])):
                if not isinstance(child, (int, float, str, bytes, type)):
                    seen.append(child)
                    nxt.append(child)
        frontier = nxt
    return seen


def test_parties_hold_no_reference_to_each_other() -> None:
    agent = _agent(_env())
    server_refs = _reachable(agent.server)
    platform_nets = [m for p in agent.platforms.values() for m in (p.q_network, p.target_network)]
    assert not any(isinstance(o, Platform) for o in server_refs)
    assert not any(any(o is net for net in platform_nets) for o in server_refs)
    for platform in agent.platforms.values():
        refs = _reachable(platform)
        assert not any(
            isinstance(o, (Platform, FederatedServer)) for o in refs if o is not platform
        )
        assert not any(o is agent.server.network for o in refs)


def test_platform_without_feedback_never_receives_a_reward() -> None:
    env = _env()
    transport = Recording()
    agent = _agent(env, transport=transport)
    obs, _ = env.reset(seed=0)
    slates = agent.explore(obs)
    next_obs, rewards, terminated, _, _ = env.step(slates)
    with pytest.raises(PrivacyViolation, match="without feedback"):
        agent.observe(obs, slates, dict(rewards), next_obs, terminated["platform_a"])
    _play(agent, env, 100)
    assert agent.rounds > 0
    b = agent.platforms["platform_b"]
    assert "reward" not in b.replay.arrays and "clicked_slot" not in b.replay.arrays
    with pytest.raises(PrivacyViolation):
        b.compute_label(send=False)
    to_b = [m for m in transport.log if m.receiver == "platform_b"]
    assert {m.kind for m in to_b} <= {
        MessageKind.FEDERATED_Q_VALUES,
        MessageKind.Q_GRADIENTS,
        MessageKind.TD_TARGETS,
        MessageKind.SAMPLE_INDICES,
    }
    # Every label B receives is one that A sent (A's TD target for the same replay rows).
    from_a = [
        m.payload
        for m in transport.log
        if m.kind is MessageKind.TD_TARGETS and m.sender == "platform_a"
    ]
    to_b_labels = [m.payload for m in to_b if m.kind is MessageKind.TD_TARGETS]
    assert len(to_b_labels) == len(from_a) == agent.rounds
    for sent, got in zip(from_a, to_b_labels, strict=True):
        np.testing.assert_array_equal(sent, got)
    # Only validated arrays crossed: nothing was a dict, tensor or parameter.
    assert all(type(m.payload) is np.ndarray for m in transport.log)


def test_acting_traffic_is_one_q_vector_each_way_per_step() -> None:
    env = _env(users=4)
    agent = _agent(env, learning_starts=10_000)  # burn-in only: acting messages alone
    _play(agent, env, 61)
    per = agent.traffic()
    q_bytes = 61 * 10 * 4  # steps x N x float32, per user-episode
    for p in ("platform_a", "platform_b"):
        assert per[p]["sent_bytes"] == q_bytes
        assert per[p]["received_bytes"] == q_bytes
    assert per[SERVER]["sent_bytes"] == per[SERVER]["received_bytes"] == 2 * q_bytes


@pytest.mark.parametrize("platforms", [2, 3, 5])
def test_update_counts_per_round(platforms: int) -> None:
    feedback = (
        (True,) + (False,) * (platforms - 1) if platforms != 5 else (True, True, True, False, False)
    )
    env = _env(num_platforms=platforms, feedback=feedback)
    agent = _agent(env)
    _play(agent, env, 45)
    assert agent.rounds > 0
    for platform in agent.platforms.values():  # every local net once per round
        assert platform.updates == agent.rounds
    assert agent.server.updates == platforms * agent.rounds  # F once per platform (twice for K=2)
    assert agent.channel.transport.pending() == 0


def test_targets_use_target_nets_at_next_state_and_labels_are_arrays() -> None:
    env = _env()
    transport = Recording()
    agent = _agent(env, transport=transport)
    _play(agent, env, 30)  # burn-in done, learning started
    transport.log.clear()
    b_before = {
        k: v.clone() for k, v in agent.platforms["platform_b"].q_network.state_dict().items()
    }
    agent.learn_round()
    a = agent.platforms["platform_a"]
    index = next(m.payload for m in transport.log if m.kind is MessageKind.SAMPLE_INDICES)
    sent = next(
        m.payload
        for m in transport.log
        if m.kind is MessageKind.TARGET_Q_VALUES and m.sender == "platform_a"
    )
    next_state = a.replay.arrays["next_state"][index]
    with torch.no_grad():
        expected = a.target_network(torch.from_numpy(a.normalizer("state", next_state))).numpy()
    np.testing.assert_allclose(sent, expected, rtol=1e-6)
    online = next(
        m.payload
        for m in transport.log
        if m.kind is MessageKind.Q_VALUES and m.sender == "platform_b"
    )
    b = agent.platforms["platform_b"]
    b.q_network.load_state_dict(b_before)  # the values B sent came from its pre-update net
    state_b = b.replay.arrays["state"][index]
    with torch.no_grad():
        expected_b = b.q_network(torch.from_numpy(b.normalizer("state", state_b))).numpy()
    np.testing.assert_allclose(online, expected_b, rtol=1e-5, atol=1e-6)
    assert isinstance(a._label, np.ndarray)  # a label is data: no gradient can flow through it


def test_local_label_depends_on_next_state_only() -> None:
    env = _env()
    agent = _agent(env, method="slateq")
    _play(agent, env, 30)
    a = agent.platforms["platform_a"]
    index = np.arange(8)
    a.begin_round(index)
    a.compute_label(send=False)
    base = a._label.copy()
    a.begin_round(index)
    a._batch["state"] = a._batch["state"] + 5.0
    a.compute_label(send=False)
    np.testing.assert_array_equal(a._label, base)
    a.begin_round(index)
    a._batch["next_state"] = a._batch["next_state"] + 5.0
    a.compute_label(send=False)
    assert not np.allclose(a._label, base)


def test_slateq_baseline_sends_nothing_and_silent_platform_does_not_learn() -> None:
    env = _env()
    agent = _agent(env, method="slateq")
    before = {k: v.clone() for k, v in agent.platforms["platform_b"].q_network.state_dict().items()}
    _play(agent, env, 45)
    assert agent.channel is None and agent.server is None
    assert agent.platforms["platform_a"].updates == agent.rounds > 0
    after = agent.platforms["platform_b"].q_network.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_variants_construct_and_run() -> None:
    env = _env()
    linear = _agent(env, global_network="linear")
    assert isinstance(linear.server.network.net, torch.nn.Linear)
    _play(linear, env, 40)
    fedq = _agent(env, method="fedq")
    _play(fedq, env, 40)
    assert fedq.rounds > 0
    itemwise = _agent(env, local_network="itemwise")
    _play(itemwise, env, 40)
    assert itemwise.rounds > 0
    with pytest.raises(ValueError, match="feedback on every platform"):
        _agent(env, method="fedslate_exp")
    both = _env(feedback=(True, True), reward_mode="sparse_team")
    exp = _agent(both, method="fedslate_exp")
    _play(exp, both, 40)
    assert exp.server.updates == 2 * exp.rounds
    random = build_multi_platform_agent("random", env, seed=0)
    obs, _ = env.reset(seed=0)
    slates = random.explore(obs)
    assert all(np.unique(s, axis=None).size >= 3 for s in slates.values())


def test_state_has_no_document_ids() -> None:
    env = _env()
    obs, _ = env.reset(seed=0)
    assert platform_state(obs["platform_a"]).shape == (4, 1 + 10 + 5 * 3)
    assert platform_state(obs["platform_b"]).shape == (4, 1 + 10)


def _config(**kwargs) -> MultiPlatformTrainConfig:
    base = {
        "method": "fedslate",
        "episodes": 12,
        "num_users": 4,
        "seed": 3,
        "env_kwargs": {"num_candidates": 10, "slate_size": 3},
        "agent_kwargs": SMALL,
        "checkpoint_every": 4,
        "eval_episodes": 0,
        "progress": False,
    }
    return MultiPlatformTrainConfig(**{**base, **kwargs})


def test_training_is_deterministic_and_resumes_exactly(tmp_path) -> None:
    full = train_multi_platform(_config(), out_dir=tmp_path / "full")
    again = train_multi_platform(_config(), out_dir=None)
    for p in full.returns:
        np.testing.assert_array_equal(full.returns[p], again.returns[p])
    train_multi_platform(_config(episodes=8), out_dir=tmp_path / "part")
    resumed = train_multi_platform(_config(), out_dir=tmp_path / "part", resume=True)
    for p in full.returns:
        np.testing.assert_array_equal(full.returns[p], resumed.returns[p])
    assert (tmp_path / "full" / "episodes.csv").read_text() == (
        tmp_path / "part" / "episodes.csv"
    ).read_text()
    assert full.traffic == resumed.traffic


def test_final_eval_is_per_platform_and_readable_by_fedrec_eval(tmp_path) -> None:
    from fedrec.eval.etror import aggregate, load_run

    train_multi_platform(_config(eval_episodes=8, planner=False), out_dir=tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.series == ["return/platform_a", "return/platform_b"]
    (group,) = aggregate([run])
    assert group.series["return/platform_b"].final is not None
    assert group.series["return/platform_b"].random is not None


def test_numpy_loss_gradients_match_autograd() -> None:
    from fedrec.agents.fedslate import smooth_l1_and_grad

    rng = np.random.default_rng(0)
    prediction, target = rng.normal(0, 2, 50), rng.normal(0, 2, 50)
    loss, grad = smooth_l1_and_grad(prediction, target)
    p = torch.tensor(prediction, requires_grad=True)
    expected = torch.nn.functional.smooth_l1_loss(p, torch.tensor(target))
    expected.backward()
    assert loss == pytest.approx(float(expected.detach()))
    np.testing.assert_allclose(grad, p.grad.numpy())
    # The "B" loss: W(s, greedy slate) on a label, gradient through the values only.
    env = _env()
    agent = _agent(env)
    _play(agent, env, 30)
    b = agent.platforms["platform_b"]
    b.begin_round(np.arange(8))
    q = rng.normal(0, 1, (8, 10)).astype(np.float32)
    label = rng.normal(0, 1, 8).astype(np.float32)
    loss, grad = b.loss_and_grad(q, label)
    v, v_null = b.choice_weights(b._batch["state"])
    slates = b._select(v, q.astype(np.float64), v_null)
    qt = torch.tensor(q, dtype=torch.float64, requires_grad=True)
    vs = torch.from_numpy(np.take_along_axis(v, slates, axis=1))
    den = torch.from_numpy(v_null + np.take_along_axis(v, slates, axis=1).sum(1))
    value = (vs * qt.gather(1, torch.from_numpy(slates))).sum(1) / den
    torch.nn.functional.smooth_l1_loss(value, torch.tensor(label, dtype=torch.float64)).backward()
    np.testing.assert_allclose(grad, qt.grad.numpy(), rtol=1e-5, atol=1e-8)


def test_itemwise_local_network_is_permutation_equivariant():
    import torch

    from fedrec.agents.fedslate import ItemwiseLocalQNetwork, LocalQNetwork

    torch.manual_seed(0)
    n, history = 6, 4
    state = torch.randn(3, 1 + n + history)
    order = torch.randperm(n)
    shuffled = state.clone()
    shuffled[:, 1 : 1 + n] = state[:, 1 : 1 + n][:, order]
    itemwise = ItemwiseLocalQNetwork(1 + n + history, n, (16,), "linear")
    torch.testing.assert_close(itemwise(shuffled), itemwise(state)[:, order])
    positional = LocalQNetwork(1 + n + history, n, (16,), "linear")  # the paper's: not equivariant
    assert not torch.allclose(positional(shuffled), positional(state)[:, order])


def test_residual_federated_network_starts_as_the_identity_and_learns() -> None:
    """global_network="residual": F(x) = Q_own + MLP(x), the MLP's output layer starting at zero."""
    from fedrec.agents.fedslate import FederatedNetwork

    torch.manual_seed(0)
    net = FederatedNetwork(3, 5, (8,), "residual", "linear")
    inputs = torch.randn(4, 15)
    torch.testing.assert_close(net(inputs), inputs[:, :5])  # pass-through of the own block
    net(inputs).sum().backward()
    assert net.net[-1].weight.grad.abs().sum() > 0  # the correction term is trained
    env = _env()
    agent = _agent(env, global_network="residual", local_activation="relu")
    assert isinstance(agent.platforms["platform_a"].q_network.net[1], torch.nn.ReLU)
    _play(agent, env, 40)
    assert agent.rounds > 0 and agent.server.updates == 2 * agent.rounds
    with pytest.raises(ValueError, match="global_network='bogus'"):
        FedSlateConfig(global_network="bogus")
    with pytest.raises(ValueError, match="head='tanh'"):
        FedSlateConfig(global_network="residual", head="tanh")
    with pytest.raises(ValueError, match="local_activation='tanh'"):
        FedSlateConfig(local_activation="tanh")


def test_bench_fedslate_cli_runs_the_requested_seeds(tmp_path, capsys) -> None:
    """`fedrec bench fedslate --first-seed` adds seeds to a setting's folder (e.g. seeds 3 and 4
    beside 0-2) and prints the eval table of the runs it made."""
    from fedrec.cli import main

    argv = ["bench", "fedslate", "--setting", "10x3", "--methods", "random", "--episodes", "16"]
    argv += ["--seeds", "2", "--first-seed", "3", "--eval-episodes", "16", "--no-planner"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in (tmp_path / "random").iterdir()) == ["seed3", "seed4"]
    assert "random" in capsys.readouterr().out
    assert (tmp_path / "learning_curves.png").is_file()
    table = (tmp_path / "table.csv").read_text().splitlines()
    assert table[0].startswith("group,series,seeds,ETROR") and len(table) == 1 + 3  # A, B, joint
    series = [row.split(",")[:2] for row in table[1:]]
    assert series == [["random", f"return/{s}"] for s in ("platform_a", "platform_b", "joint")]
    assert main([*argv[:8], "--first-seed=-1", "--out", str(tmp_path)]) == 2
    assert "--first-seed (first_seed) must be >= 0, got -1" in capsys.readouterr().err


def test_saturated_official_values_make_the_greedy_slate_the_top_x_slate() -> None:
    """The official code's settings (tanh heads, its softmax choice model): once every federated
    value sits at the tanh bound, the greedy slate is the n largest-feature candidates, and the
    diagnostics the final evaluation records say so."""
    import torch

    from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv

    env = ChocKaleMultiPlatformBatchEnv(8, num_candidates=10, slate_size=3)
    agent = build_multi_platform_agent("fedslate_official", env, seed=0)
    assert agent.config.head == "tanh" and agent.config.choice_model == "paper"
    last = agent.server.network.net[-2]  # the Linear before the tanh head
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(10.0)  # every federated value at tanh(10) ~ 1
    observations, _ = env.reset(seed=0)
    agent.start_diagnostics()
    agent.act(observations)
    diagnostics = agent.diagnostics()
    for platform in ("platform_a", "platform_b"):
        assert diagnostics[platform] == {"saturated": 1.0, "top_x_slates": 1.0}
    assert agent.diagnostics() == {}  # counting stopped
