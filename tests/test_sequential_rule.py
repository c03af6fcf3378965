"""The sequential-test rule search (``rule_search_sequential``): its numbers, its test on the
observed readings, and that it learns to tell the hidden user types apart from returns alone
(fedrec/ChocKaleUserTypes-v0 with strongly sensitive users, 16,384 episodes: about 15 s)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from fedrec.agents.registry import resolve_agent
from fedrec.agents.slate_rule_sequential import (
    UNITS,
    SequentialRuleSearchAgent,
    SequentialRuleSearchConfig,
    rule_numbers,
)
from fedrec.train.loop import TrainConfig, train

USER_TYPES = "fedrec/ChocKaleUserTypes-v0"
#: tau 0 or 0.3 (the registered env: 0 or 0.1): the types' readings part within a few steps
STRONG = {"user_sensitivities": (0.0, 0.3)}


def _z(**numbers: float) -> np.ndarray:
    """Standard units of a rule given by its numbers (times as fractions of the episode)."""
    return np.array([(numbers.get(k, c) - c) / s for k, (c, s) in UNITS.items()])


def test_rule_numbers_map_standard_units_to_steps_and_readings() -> None:
    at_centre = rule_numbers(np.zeros(len(UNITS)), 60)
    assert at_centre["test_from"] == 12 and at_centre["switch_at"] == 45
    assert at_centre["threshold"] == 0.5 and at_centre["margin"] == 0.0
    far = rule_numbers(np.full(len(UNITS), 100.0), 60)  # times stay inside the episode
    assert far["test_from"] == far["level_from"] == far["switch_at"] == 60
    assert rule_numbers(np.full(len(UNITS), -100.0), 60)["switch_at"] == 0


def test_a_user_whose_readings_stay_low_is_marked_and_served_its_own_rule() -> None:
    agent = SequentialRuleSearchAgent(slate_size=1, episode_length=10, seed=0)
    rule = _z(test_from=0.2, level_from=0.0, threshold=0.55, p_early=-1.0, p_latched=1.0)
    agent.mean = rule
    candidates = np.tile(np.linspace(-1, 1, 5)[None, :, None], (2, 1, 1))
    agent.begin_episodes(np.ones(2, dtype=bool))
    served = []
    for _ in range(4):
        obs = {"candidates": candidates, "user": np.array([[0.5], [0.7]])}
        served.append(candidates[np.arange(2), agent.act_batch(obs)[:, 0], 0])
    # steps 0-1: both get the early rule (bottom-x); from step 2 the user reading 0.5 (below the
    # threshold) is marked and gets top-x, the one reading 0.7 keeps bottom-x
    assert [list(s) for s in served] == [[-1, -1], [-1, -1], [1, -1], [1, -1]]
    assert list(agent.latched) == [True, False]
    agent.begin_episodes(np.array([True, False]))  # a new episode forgets the verdict
    agent.act_batch({"candidates": candidates, "user": np.array([[0.7], [0.7]])})
    assert list(agent.latched) == [False, False]


@pytest.mark.parametrize(
    "name", ["rule_search_sequential", "rule_search_evidence", "rule_search_fitted"]
)
def test_an_env_without_satisfaction_readings_is_refused_by_name(name: str) -> None:
    # every rule that reads the observed satisfaction
    env = gym.make_vec("fedrec/ChocKaleSlate-v0", num_envs=2)
    agent = resolve_agent(name).from_env(env, seed=0)
    obs, _ = env.reset(seed=0)
    obs = {k: v for k, v in obs.items() if k != "user"}
    agent.begin_episodes(np.ones(2, dtype=bool))
    with pytest.raises(ValueError, match="observed satisfaction"):
        agent.act_batch(obs)
    env.close()


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="episodes_per_rule"):
        SequentialRuleSearchConfig(episodes_per_rule=0)
    with pytest.raises(ValueError, match="elite_fraction"):
        SequentialRuleSearchConfig(population=4, elite_fraction=0.25)


def test_the_search_learns_to_serve_each_hidden_type_its_own_plan() -> None:
    holder: list[SequentialRuleSearchAgent] = []
    config = SequentialRuleSearchConfig(population=32, episodes_per_rule=4)

    def build(env: gym.vector.VectorEnv) -> SequentialRuleSearchAgent:
        holder.append(SequentialRuleSearchAgent.from_env(env, config=config, seed=0))
        return holder[-1]

    result = train(
        build,
        config=TrainConfig(
            env_id=USER_TYPES, episodes=16384, num_envs=64, seed=0, env_kwargs=STRONG,
            eval_episodes=400, references=True, checkpoint_every=0, progress=False,
        ),
    )  # fmt: skip
    policies = result.final_eval["policies"]
    agent = np.array(policies["agent"]["returns"])
    # paired on the same held-out episodes (measured: +43.0 over bottom-x, the better fixed rule
    # here; training seed 2: +53.3; seed 1's search settles on bottom-x itself, a local optimum)
    for heuristic, margin in (("bottom_x", 15.0), ("top_x", 100.0)):
        gain = agent - np.array(policies[heuristic]["returns"])
        assert gain.mean() - 1.96 * gain.std(ddof=1) / np.sqrt(len(gain)) > margin, heuristic
    # by step 20 the learned rule has marked about half the indifferent users (tau 0) and almost
    # none of the sensitive ones (measured: 0.46 and 0.01)
    learned = holder[-1]
    env = gym.make_vec(USER_TYPES, num_envs=400, **STRONG)
    obs, info = env.reset(seed=77)
    tau = info["user_sensitivity"].copy()  # read by the test only, never shown to the agent
    learned.begin_episodes(np.ones(400, dtype=bool))
    for _ in range(20):
        obs, *_ = env.step(learned.act_batch(obs))
    env.close()
    assert learned.latched[tau == 0].mean() > 0.3 > 0.05 > learned.latched[tau > 0].mean()
