"""Multi-platform env: feedback privacy, shared state and budget, rewards, determinism."""

from __future__ import annotations

import numpy as np
import pettingzoo
import pytest

import fedrec  # noqa: F401
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv, ChocKaleMultiPlatformEnv


def _random_actions(env, rng: np.random.Generator, batch: int | None = None) -> dict:
    n, k = env.params.num_candidates, env.params.slate_size
    shape = (batch or 1, n)
    actions = {a: np.argsort(rng.random(shape), axis=1)[:, :k] for a in env.possible_agents}
    return actions if batch else {a: s[0] for a, s in actions.items()}


def test_platform_without_feedback_never_sees_its_engagement() -> None:
    env = pettingzoo.make("parallel", "fedrec/ChocKaleMultiPlatform-v0")
    obs, infos = env.reset(seed=0)
    assert set(obs["platform_a"]) == {"candidates", "user", "response_click", "response_engagement"}
    assert set(obs["platform_b"]) == {"candidates", "user"}
    assert env.observation_space("platform_b").spaces.keys() == {"candidates", "user"}
    rng = np.random.default_rng(0)
    rewards_b = []
    while env.agents:
        obs, rewards, _, _, infos = env.step(_random_actions(env, rng))
        rewards_b.append(rewards["platform_b"])
        assert set(obs["platform_b"]) == {"candidates", "user"}
        assert infos["platform_b"] == {"feedback": False}
        assert "clicked_slot" in infos["platform_a"]
    assert rewards_b == [0.0] * 61
    truth = env.evaluation_engagement()
    assert truth["platform_b"] > 500  # it engaged all along, measured only for evaluation


def test_shared_budget_and_episode_length() -> None:
    for platforms in (2, 5):
        env = ChocKaleMultiPlatformEnv(num_platforms=platforms)
        env.reset(seed=1)
        assert env.oracle_state()["budget_left"] == 61 * platforms
        rng = np.random.default_rng(0)
        steps = 0
        while env.agents:
            env.step(_random_actions(env, rng))
            steps += 1
            assert env.oracle_state()["budget_left"] == 61 * platforms - platforms * steps
        assert steps == 61


def test_cross_platform_effect_on_the_shared_user() -> None:
    """What platform B serves changes platform A's engagement (one user state, long-term dynamics)."""

    def platform_a_return(b_serves_chocolate: bool) -> float:
        env = ChocKaleMultiPlatformBatchEnv(num_users=2000, sensitivity=0.05)
        obs, _ = env.reset(seed=0)
        running = True
        while running:
            features_b = obs["platform_b"]["candidates"][..., 0]
            order = np.argsort(-features_b if b_serves_chocolate else features_b, axis=1)
            actions = {"platform_a": np.tile(np.arange(3), (2000, 1)), "platform_b": order[:, :3]}
            obs, _, terminations, _, _ = env.step(actions)
            running = not terminations["platform_a"].all()
        return float(env.evaluation_engagement()["platform_a"].mean())

    # chocolate on B erodes satisfaction, so A (whose slates are the same) earns much less
    assert platform_a_return(False) > 1.3 * platform_a_return(True)


@pytest.mark.parametrize("mode", ["team", "sparse_team"])
def test_team_rewards(mode: str) -> None:
    env = ChocKaleMultiPlatformBatchEnv(
        num_users=50,
        feedback=[True, False, True],
        num_platforms=3,
        reward_mode=mode,
        reward_interval=7,
    )
    env.reset(seed=2)
    rng = np.random.default_rng(0)
    paid = {agent: np.zeros(50) for agent in env.possible_agents}
    step, running = 0, True
    while running:
        _, rewards, terminations, _, _ = env.step(_random_actions(env, rng, batch=50))
        step += 1
        running = not terminations["platform_a"].all()
        for agent in env.possible_agents:
            paid[agent] += rewards[agent]
        if mode == "sparse_team" and step % 7 and running:
            assert (rewards["platform_a"] == 0).all()
        np.testing.assert_array_equal(rewards["platform_a"], rewards["platform_c"])
        assert (rewards["platform_b"] == 0).all()
    team = sum(env.evaluation_engagement().values())
    np.testing.assert_allclose(paid["platform_a"], team)


def test_multi_platform_200_step_determinism() -> None:
    def run(seed: int) -> list:
        env = ChocKaleMultiPlatformEnv(num_platforms=3, feedback=[True, False, True])
        rng = np.random.default_rng(9)
        record = list(env.reset(seed=seed))
        for _ in range(200):
            if not env.agents:
                record += list(env.reset())
            record += list(env.step(_random_actions(env, rng)))
        return record

    def flatten(record: list) -> list[np.ndarray]:
        out = []
        for item in record:
            for agent_value in item.values():
                values = agent_value.values() if isinstance(agent_value, dict) else [agent_value]
                out += [np.asarray(v, dtype=np.float64) for v in values]
        return out

    first, again, other = flatten(run(4)), flatten(run(4)), flatten(run(5))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_batched_multi_platform_determinism_and_distribution() -> None:
    def returns(num_users: int, seed: int) -> np.ndarray:
        env = ChocKaleMultiPlatformBatchEnv(num_users=num_users)
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        for _ in range(61):
            env.step(_random_actions(env, rng, batch=num_users))
        return np.stack(list(env.evaluation_engagement().values()))

    np.testing.assert_array_equal(returns(64, 3), returns(64, 3))
    batched = returns(3000, 1)
    single = np.concatenate([returns(1, 100 + i) for i in range(300)], axis=1)
    for platform in range(2):
        se = np.sqrt(batched[platform].var() / 3000 + single[platform].var() / 300)
        assert abs(batched[platform].mean() - single[platform].mean()) < 4 * se


def test_shared_catalogue_shows_every_platform_the_same_candidates() -> None:
    """shared_catalogue=True (the FedSlate code's basic runs, one document seed for both
    platforms): every platform sees the first platform's candidates of the same joint step,
    across steps, resets and the per-user streams; the default keeps distinct streams."""
    env = ChocKaleMultiPlatformBatchEnv(num_users=6, num_platforms=3, shared_catalogue=True)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=3)
    seen = []
    for _ in range(70):  # crosses the 61-step episode end
        for agent in env.possible_agents[1:]:
            np.testing.assert_array_equal(obs[agent]["candidates"], obs["platform_a"]["candidates"])
        seen.append(obs["platform_a"]["candidates"].copy())
        obs, _, terminations, _, _ = env.step(_random_actions(env, rng, batch=6))
        if terminations["platform_a"].all():
            obs, _ = env.reset()
    assert not np.array_equal(seen[0], seen[1])  # candidates still change every step
    distinct = ChocKaleMultiPlatformBatchEnv(num_users=6, num_platforms=3)
    obs, _ = distinct.reset(seed=3)
    assert not np.array_equal(obs["platform_a"]["candidates"], obs["platform_b"]["candidates"])
    with pytest.raises(ValueError, match="shared_catalogue"):
        ChocKaleMultiPlatformBatchEnv(shared_catalogue="yes")
    single = ChocKaleMultiPlatformEnv(shared_catalogue=True)
    obs, _ = single.reset(seed=0)
    np.testing.assert_array_equal(obs["platform_a"]["candidates"], obs["platform_b"]["candidates"])
