"""SlateQ: decomposition, targets at s', weight sharing, optimiser settings, choice models, learning."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

import fedrec  # noqa: F401  (registers the envs)
from fedrec.agents.base import Transitions
from fedrec.agents.choice_models import LearnedMNLChoiceModel
from fedrec.agents.replay import ReplayBuffer
from fedrec.agents.slate_selection import slate_values
from fedrec.agents.slateq import ItemQNetwork, SlateQAgent, SlateQConfig, clicked_slots
from fedrec.eval.rollout import evaluate_policy

SMALL = SlateQConfig(
    hidden_sizes=(16,), learning_starts=64, batch_size=8, buffer_size=512, epsilon_decay=200
)


def _env(num_envs: int = 4, **kwargs):
    return gym.make_vec(
        "fedrec/ChocKaleSlate-v0",
        num_envs=num_envs,
        vectorization_mode="vector_entry_point",
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        **kwargs,
    )


def _fill(agent: SlateQAgent, env, steps: int, seed: int = 0) -> None:
    obs, info = env.reset(seed=seed)
    for _ in range(steps):
        slates = agent.explore_batch(obs, infos=info)
        next_obs, rewards, terminated, truncated, info = env.step(slates)
        agent.learn(Transitions(obs, slates, rewards, next_obs, terminated, truncated))
        obs = next_obs


def test_item_network_factorisation_equals_concatenated_linear_layer():
    torch.manual_seed(0)
    net = ItemQNetwork(5, 2, (8, 4))
    user, items = torch.randn(3, 5), torch.randn(3, 7, 2)
    joint_weight = torch.cat([net.user_layer.weight, net.item_layer.weight], dim=1)
    expanded = torch.cat([user[:, None, :].expand(-1, 7, -1), items], dim=-1)
    hidden = torch.nn.functional.linear(expanded, joint_weight, net.user_layer.bias)
    reference = net.head(hidden).squeeze(-1)
    torch.testing.assert_close(net(user, items), reference)


def test_one_network_is_shared_by_acting_and_training():
    env = _env()
    agent = SlateQAgent.from_env(env, config=SMALL, seed=0)
    obs, _ = env.reset(seed=1)
    before = agent.item_values(obs).copy()
    _fill(agent, env, 40)
    assert agent.gradient_steps > 0
    # Training moved the very network that acting reads (RecSim's lost weight sharing would not).
    assert not np.allclose(agent.item_values(obs), before)
    assert len(list(agent.q_network.parameters())) == len(list(agent.target_network.parameters()))


def test_td_target_evaluates_the_target_network_at_the_next_state():
    env = _env()
    config = dataclasses.replace(SMALL, target="greedy", gamma=0.9)
    agent = SlateQAgent.from_env(env, config=config, seed=0)
    _fill(agent, env, 30)
    sample = agent.replay.sample(np.random.default_rng(0), 8)
    obs = {k[4:]: v for k, v in sample.items() if k.startswith("obs/")}
    next_obs = {k[9:]: v for k, v in sample.items() if k.startswith("next_obs/")}
    next_user, next_items = agent._tensors(next_obs)
    targets = agent._td_targets(sample, next_obs, next_user, next_items).numpy()

    def manual(observations):
        user, items = agent._tensors(observations)
        q = agent.target_network(user, items).double().numpy()
        v, v_null = agent.choice.weights(observations["candidates"])
        slates = agent._select("greedy", v, q, v_null)
        value = np.where(sample["terminated"], 0.0, slate_values(v, q, v_null, slates))
        return sample["reward"] * agent.reward_scale + 0.9 * value

    np.testing.assert_allclose(targets, manual(next_obs), rtol=1e-5)
    assert not np.allclose(targets, manual(obs), rtol=1e-3)  # RecSim/RLlib's defect: s, not s'


def test_myopic_target_is_the_scaled_reward():
    env = _env()
    agent = SlateQAgent.from_env(env, config=dataclasses.replace(SMALL, gamma=0.0), seed=0)
    _fill(agent, env, 20)
    sample = agent.replay.sample(np.random.default_rng(1), 8)
    next_obs = {k[9:]: v for k, v in sample.items() if k.startswith("next_obs/")}
    targets = agent._td_targets(sample, next_obs, *agent._tensors(next_obs)).numpy()
    np.testing.assert_allclose(targets, sample["reward"] * agent.reward_scale, rtol=1e-6)


def test_sarsa_target_uses_the_logged_next_slate():
    env = _env()
    agent = SlateQAgent.from_env(env, config=dataclasses.replace(SMALL, target="sarsa"), seed=0)
    _fill(agent, env, 30)
    sample = agent.replay.sample(np.random.default_rng(2), 16, need_next_slate=True)
    assert (sample["has_next_slate"] | sample["terminated"]).all()
    next_obs = {k[9:]: v for k, v in sample.items() if k.startswith("next_obs/")}
    next_user, next_items = agent._tensors(next_obs)
    q = agent.target_network(next_user, next_items).double().detach().numpy()
    v, v_null = agent.choice.weights(next_obs["candidates"])
    value = np.where(sample["terminated"], 0.0, slate_values(v, q, v_null, sample["next_slate"]))
    expected = sample["reward"] * agent.reward_scale + SMALL.gamma * value
    targets = agent._td_targets(sample, next_obs, next_user, next_items).numpy()
    np.testing.assert_allclose(targets, expected, rtol=1e-5)


def test_replay_links_each_users_next_slate_and_not_across_episodes():
    buffer = ReplayBuffer(capacity=10, num_envs=2)
    obs = {"candidates": np.zeros((2, 3, 1), np.float32)}
    for step, done in enumerate(([False, True], [False, False])):
        slates = np.array([[step, 1], [2, step]])
        buffer.add(
            observations=obs,
            slates=slates,
            clicked_slot=np.array([0, -1]),
            rewards=np.ones(2),
            next_observations=obs,
            terminated=np.array(done),
            truncated=np.zeros(2, bool),
        )
    a = buffer.arrays
    np.testing.assert_array_equal(a["next_slate"][0], [1, 1])  # user 0's next slate
    assert a["has_next_slate"][0] and not a["has_next_slate"][1]  # user 1's episode ended
    assert not a["has_next_slate"][2:4].any()


def test_rmsprop_decay_is_alpha_not_weight_decay():
    env = _env()
    config = dataclasses.replace(SMALL, optimizer="rmsprop", rmsprop_decay=0.95)
    agent = SlateQAgent.from_env(env, config=config, seed=0)
    group = agent.optimizer.param_groups[0]
    assert isinstance(agent.optimizer, torch.optim.RMSprop)
    assert group["alpha"] == 0.95 and group["weight_decay"] == 0 and group["centered"]


def test_learned_mnl_choice_model_recovers_preferences():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = LearnedMNLChoiceModel(1, 1, hidden=8)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.03)
    true_logit = lambda x: 2.0 * x  # noqa: E731  (prefers high features; null logit 0)
    for _ in range(300):
        items = torch.from_numpy(rng.normal(size=(64, 5, 1)).astype(np.float32))
        user = torch.zeros(64, 1)
        slates = torch.from_numpy(np.argsort(rng.random((64, 5)), axis=1)[:, :3])
        logits = torch.cat(
            [true_logit(torch.gather(items[..., 0], 1, slates)), torch.zeros(64, 1)], dim=1
        )
        choice = torch.distributions.Categorical(logits=logits).sample()
        clicked = torch.where(choice == 3, -1, choice)
        loss = model.loss(user, items, slates, clicked)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    grid = torch.linspace(-1.5, 1.5, 7).reshape(1, 7, 1)
    v, v_null = model.weights_from_features(torch.zeros(1, 1), grid)
    estimated = np.log(v[0] / v_null[0])
    np.testing.assert_allclose(estimated, 2.0 * grid.numpy().ravel(), atol=0.5)


def test_clicked_slot_is_read_from_the_latest_response():
    next_obs = {"response_click": np.zeros((2, 3, 2), np.float32)}
    next_obs["response_click"][0, -1, 1] = 1.0
    next_obs["response_click"][1, 0, 0] = 1.0  # an old click, not this step's
    np.testing.assert_array_equal(clicked_slots(next_obs, np.zeros((2, 2))), [1, -1])
    # An env that gives only the last slate's clicks, (users, n): fedrec/InterestEvolution-v0.
    last_only = {"response_click": np.array([[0.0, 1.0], [0.0, 0.0]], np.float32)}
    np.testing.assert_array_equal(clicked_slots(last_only, np.zeros((2, 2))), [1, -1])


def test_slateq_trains_on_interest_evolution():
    env = gym.make_vec("fedrec/InterestEvolution-v0", num_envs=4)
    config = dataclasses.replace(SMALL, choice_model="learned")
    agent = SlateQAgent.from_env(env, config=config, seed=0)
    _fill(agent, env, 40)
    assert agent.gradient_steps > 0


@pytest.mark.parametrize("target", ["sarsa", "topk", "greedy", "optimal"])
@pytest.mark.parametrize("selection", ["topk", "greedy", "optimal"])
def test_every_target_and_selection_runs(target, selection):
    env = _env(num_envs=2, num_candidates=6, slate_size=2)
    config = dataclasses.replace(
        SMALL, target=target, selection=selection, optimal_solver="lp", learning_starts=16
    )
    agent = SlateQAgent.from_env(env, config=config, seed=0)
    _fill(agent, env, 20)
    assert agent.gradient_steps > 0
    obs, _ = env.reset(seed=5)
    slates = agent.act_batch(obs)
    assert slates.shape == (2, 2) and (slates[:, 0] != slates[:, 1]).all()


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"gamma=1\.5"):
        SlateQConfig(gamma=1.5)
    with pytest.raises(ValueError, match="target='bogus'"):
        SlateQConfig(target="bogus")


def test_slateq_learns_to_beat_random_on_a_small_slate_env():
    from fedrec.agents.reference import RandomPolicy
    from fedrec.train.loop import TrainConfig, train

    config = TrainConfig(
        env_id="fedrec/ChocKaleSlate-v0", episodes=160, num_envs=16, seed=0, eval_episodes=0,
        progress=False,
    )  # fmt: skip
    slateq = dataclasses.replace(
        SMALL, hidden_sizes=(32, 16), learning_starts=1000, epsilon_decay=3000, batch_size=32,
        buffer_size=10_000,
    )  # fmt: skip
    agent = SlateQAgent.from_env(_env(16), config=slateq, seed=0)
    result = train(agent, config=config)
    assert result.returns[-32:].mean() > result.returns[:32].mean()
    episodes = dict(episodes=300, num_envs=300, seed=99)
    learned = evaluate_policy("fedrec/ChocKaleSlate-v0", agent, **episodes)
    random = evaluate_policy("fedrec/ChocKaleSlate-v0", RandomPolicy(slate_size=3), **episodes)
    assert learned.mean - random.mean > 40  # random ~945, the optimum ~1047 here


def test_consumption_memory_tracks_the_discounted_consumed_features():
    from fedrec.agents.consumption_memory import MEMORY_KEY

    env = _env(num_envs=3)
    config = dataclasses.replace(SMALL, memory_decay=0.5)
    agent = SlateQAgent.from_env(env, config=config, seed=0)
    obs, info = env.reset(seed=4)
    agent.begin_episodes(np.ones(3, bool))
    expected, steps = np.zeros(3), 0
    for _ in range(8):
        slates = agent.explore_batch(obs, infos=info)
        assert (
            np.allclose(agent.memory.acted[:, 0], expected)
            and (agent.memory.acted[:, 1] == steps).all()
        )
        shown = np.take_along_axis(obs["candidates"][..., 0], slates, axis=1)
        next_obs, rewards, terminated, truncated, info = env.step(slates)
        clicks = next_obs["response_click"][:, -1, :]
        agent.learn(Transitions(obs, slates, rewards, next_obs, terminated, truncated))
        expected = 0.5 * expected + (clicks * shown).sum(axis=1)
        steps += 1
        obs = next_obs
    stored = agent.replay.arrays[f"next_obs/{MEMORY_KEY}"][
        agent.replay.size - 3 : agent.replay.size
    ]
    np.testing.assert_allclose(stored[:, 0], expected, rtol=1e-5)
    agent.begin_episodes(np.array([True, False, False]))
    # Memory advances when the next observation arrives (at act time): still 7 steps for user 1.
    assert agent.memory.memory[0].sum() == 0 and agent.memory.memory[1, 1] == steps - 1


def test_agent_with_memory_resumes_exactly(tmp_path):
    from fedrec.train.loop import TrainConfig, train

    config = dataclasses.replace(SMALL, memory_decay=0.9, learning_starts=200)

    def run(episodes, out, resume=False):
        train_config = TrainConfig(
            env_id="fedrec/ChocKaleLongTerm-v0", episodes=episodes, num_envs=4, seed=1,
            eval_episodes=0, checkpoint_every=4, progress=False,
        )  # fmt: skip
        factory = lambda env: SlateQAgent.from_env(env, config=config, seed=1)  # noqa: E731
        return train(factory, config=train_config, out_dir=out, resume=resume)

    reference = run(12, None)
    run(8, tmp_path / "r")
    resumed = run(12, tmp_path / "r", resume=True)
    np.testing.assert_array_equal(resumed.returns, reference.returns)


def test_a_batch_without_clicks_steps_with_zero_loss():
    """RecSim: the loss is 0 when no sampled transition has a click, and training goes on (this
    raised "does not require grad" before; SARDINE's envs have such batches)."""
    env = _env()
    agent = SlateQAgent.from_env(env, config=SMALL, seed=0)
    _fill(agent, env, 20)
    agent.replay.arrays["clicked_slot"][:] = -1
    steps = agent.gradient_steps
    metrics = agent._gradient_step()
    assert metrics["loss"] == 0.0
    assert agent.gradient_steps == steps + 1
