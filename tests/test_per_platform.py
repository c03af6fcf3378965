"""Single-platform agents on the multi-platform env (``PerPlatformAgent``): each feedback platform's
copy sees exactly what a single-platform agent would (its own observations, rewards and episode
boundaries), a platform without feedback learns nothing and serves the configured fixed policy."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from fedrec.agents.per_platform import PerPlatformAgent, PerPlatformConfig
from fedrec.agents.reference import RandomPolicy
from fedrec.agents.registry import build_multi_platform_agent
from fedrec.agents.slate_rule import RuleSearchAgent
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv

SPY = textwrap.dedent(
    """
    import numpy as np
    from fedrec.agents.base import SlateAgent

    class SpyAgent(SlateAgent):
        def __init__(self, *, slate_size, seed=None, episode_length=0):
            super().__init__(slate_size=slate_size, seed=seed)
            self.episode_length = episode_length
            self.begun, self.seen, self.learned = [], [], []

        @classmethod
        def from_env(cls, env, *, config=None, seed=None):
            return cls(slate_size=env.single_action_space.slate_size, seed=seed,
                       episode_length=env.params.time_budget)

        def begin_episodes(self, mask):
            self.begun.append(len(mask))

        def act_batch(self, observations, *, infos=None):
            self.seen.append(sorted(observations))
            users = len(observations["candidates"])
            return np.tile(np.arange(self.slate_size), (users, 1))

        def learn(self, transitions):
            self.learned.append(transitions)
            return {"calls": float(len(self.learned))}
    """
)
USERS, JOINT_STEPS = 3, 10  # time_budget 20 shared by two platforms


@pytest.fixture
def spy_file(tmp_path: Path) -> str:
    path = tmp_path / "spy.py"
    path.write_text(SPY)
    return f"{path}:SpyAgent"


def _env(**kwargs) -> ChocKaleMultiPlatformBatchEnv:
    return ChocKaleMultiPlatformBatchEnv(
        num_users=USERS, num_candidates=10, slate_size=3, time_budget=2 * JOINT_STEPS, **kwargs
    )


def _train_episodes(agent: PerPlatformAgent, env: ChocKaleMultiPlatformBatchEnv, episodes: int):
    """The multi-platform training loop's protocol; returns platform A's rewards per step."""
    rewards_a = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        running = True
        while running:
            slates = agent.explore(obs)
            next_obs, rewards, terminated, _, _ = env.step(slates)
            feedback = {p: rewards[p] for p in env.possible_agents if env.feedback[p]}
            agent.observe(obs, slates, feedback, next_obs, terminated["platform_a"])
            rewards_a.append(rewards["platform_a"])
            obs, running = next_obs, not terminated["platform_a"].all()
        agent.end_episode(USERS)
    return rewards_a


def test_a_feedback_platform_trains_on_its_own_steps_only(spy_file):
    env = _env()
    agent = PerPlatformAgent.from_env(env, config=PerPlatformConfig(agent=spy_file), seed=0)
    spy, silent = agent.agents["platform_a"], agent.agents["platform_b"]
    assert isinstance(silent, RandomPolicy)  # no feedback: the fixed policy, never a learner
    assert spy.episode_length == JOINT_STEPS  # its share of the shared budget
    rewards_a = _train_episodes(agent, env, episodes=2)

    assert len(spy.learned) == 2 * JOINT_STEPS
    for step, transitions in enumerate(spy.learned):
        np.testing.assert_array_equal(transitions.rewards, rewards_a[step])
        assert set(transitions.observations) == {
            "candidates",
            "user",
            "response_click",
            "response_engagement",
        }  # platform A's own observation, nothing of B's
        last = (step + 1) % JOINT_STEPS == 0
        assert transitions.terminated.tolist() == [last] * USERS
        assert not transitions.truncated.any()
    # An episode start per episode (the end of one begins the next, as after an autoreset).
    assert spy.begun == [USERS, USERS, USERS]


def test_evaluation_batches_begin_their_own_episodes(spy_file):
    env = _env()
    agent = PerPlatformAgent.from_env(env, config=PerPlatformConfig(agent=spy_file), seed=0)
    spy = agent.agents["platform_a"]
    _train_episodes(agent, env, episodes=1)
    big = ChocKaleMultiPlatformBatchEnv(
        num_users=7, num_candidates=10, slate_size=3, time_budget=2 * JOINT_STEPS
    )
    for _ in range(2):  # two evaluation episodes, no end_episode between them
        obs, _ = big.reset(seed=5)
        for _ in range(JOINT_STEPS):
            obs, *_ = big.step(agent.act(obs))
    assert spy.begun == [USERS, USERS, 7, 7]
    assert len(spy.learned) == JOINT_STEPS  # acting greedily never learns


@pytest.mark.parametrize(("rule", "sign"), [("top_x", -1.0), ("bottom_x", 1.0)])
def test_a_silent_platform_serves_the_configured_heuristic(rule, sign):
    env = _env()
    agent = build_multi_platform_agent("rule_search", env, seed=1, silent=rule)
    assert isinstance(agent.agents["platform_a"], RuleSearchAgent)
    obs, _ = env.reset(seed=0)
    slates = agent.act(obs)
    features = obs["platform_b"]["candidates"][..., 0]
    expected = np.argsort(sign * features, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(np.sort(slates["platform_b"], 1), np.sort(expected, 1))


def test_every_platform_learns_when_every_platform_has_feedback():
    env = _env(feedback=[True, True])
    agent = build_multi_platform_agent("rule_search", env, seed=0)
    assert all(isinstance(a, RuleSearchAgent) for a in agent.agents.values())
    # Independent copies: different seeds, so different first rules.
    a, b = agent.agents["platform_a"], agent.agents["platform_b"]
    obs, _ = env.reset(seed=0)
    agent.explore(obs)
    assert not np.array_equal(a.draws, b.draws)


def test_inner_hyperparameters_reach_the_copy():
    agent = build_multi_platform_agent(
        "per_platform", _env(), agent="rule_search", agent_options=("population=8", "time_bins=4")
    )
    assert agent.agents["platform_a"].config.population == 8
    assert agent.agents["platform_a"].config.time_bins == 4


def test_bad_configurations_are_refused_with_the_reason():
    env = _env()
    with pytest.raises(ValueError, match="oracle"):
        build_multi_platform_agent("per_platform", env, agent="planner")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        PerPlatformConfig(agent_options=("population",))
    with pytest.raises(ValueError, match="no hyperparameter"):
        build_multi_platform_agent("rule_search", env, agent_options=("populaton=8",))
    with pytest.raises(ValueError, match="silent"):
        PerPlatformConfig(silent="popular")
    with pytest.raises(ValueError, match="unknown agent"):
        build_multi_platform_agent("per_platform", env, agent="no_such_agent")
