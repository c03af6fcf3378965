"""The evidence-weighing rule search (``rule_search_evidence``): its numbers, its running evidence
on the observed readings (early verdicts, taken back), and that it learns to tell the hidden user
types apart from returns alone (fedrec/ChocKaleUserTypes-v0 with strongly sensitive users)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from fedrec.agents.slate_rule_evidence import (
    UNITS,
    EvidenceRuleSearchAgent,
    EvidenceRuleSearchConfig,
    rule_numbers,
)
from fedrec.train.loop import TrainConfig, train

USER_TYPES = "fedrec/ChocKaleUserTypes-v0"
#: tau 0 or 0.3 (the registered env: 0 or 0.1): the types' readings part within a few steps
STRONG = {"user_sensitivities": (0.0, 0.3)}


def _z(**numbers: float) -> np.ndarray:
    """Standard units of a rule given by its numbers (the switch as a fraction of the episode)."""
    return np.array([(numbers.get(k, c) - c) / s for k, (c, s) in UNITS.items()])


def test_rule_numbers_are_clipped_to_a_usable_rule() -> None:
    at_centre = rule_numbers(np.zeros(len(UNITS)), 60)
    assert at_centre["decay"] == 0.5 and at_centre["switch_at"] == 45
    assert at_centre["centre"] == 0.5 and at_centre["p_early"] == 0.0
    far = rule_numbers(np.full(len(UNITS), 100.0), 60)
    assert far["decay"] == 0.99 and far["switch_at"] == 60
    low = rule_numbers(np.full(len(UNITS), -100.0), 60)
    assert low["decay"] == 0.0 and low["effect"] == 0.001 and low["switch_at"] == 0


def _play(agent: EvidenceRuleSearchAgent, readings: list[list[float]]) -> list[list[float]]:
    """Serve two users (slate of one among features 0, 0.25, ..., 1) while they read as given;
    returns the served features per step."""
    candidates = np.tile(np.linspace(0, 1, 5)[None, :, None], (2, 1, 1))
    served = []
    for reading in readings:
        obs = {"candidates": candidates, "user": np.array(reading)[:, None]}
        served.append(list(candidates[np.arange(2), agent.act_batch(obs)[:, 0], 0]))
    return served


def test_evidence_marks_a_flat_user_early_and_takes_the_verdict_back() -> None:
    agent = EvidenceRuleSearchAgent(slate_size=1, episode_length=20, seed=0)
    agent.mean = _z(decay=0.0, effect=0.1, centre=0.5, threshold=0.004, p_early=-1.0,
                    p_unresponsive=1.0, p_late=1.0, switch_at=1.0)  # fmt: skip
    agent.begin_episodes(np.ones(2, dtype=bool))
    # Bottom-x (feature 0) puts +0.5 on the trace, so a responsive user should read 0.55. User 0
    # reads 0.5 (flat): -0.00125 a step, below -0.004 after 4 steps. User 1 reads 0.55.
    served = _play(agent, [[0.5, 0.5], [0.5, 0.55], [0.5, 0.55], [0.5, 0.55], [0.5, 0.55]])
    assert served == [[0.0, 0.0]] * 4 + [[1.0, 0.0]]
    assert agent.evidence[0] == pytest.approx(-4 * 0.00125)
    assert agent.evidence[1] == pytest.approx(4 * 0.00125)
    # Top-x puts -0.5 on the trace: a responsive user would read 0.45. User 0 now does, and its
    # evidence climbs back over the threshold, so it gets bottom-x again (nothing was latched).
    assert _play(agent, [[0.45, 0.55]]) == [[0.0, 0.0]]
    assert agent.evidence[0] == pytest.approx(-3 * 0.00125)
    agent.begin_episodes(np.array([True, False]))  # a new episode forgets trace and evidence
    _play(agent, [[0.5, 0.55]])
    assert agent.evidence[0] == 0.0 and agent.trace[0] == 0.0


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="episodes_per_rule"):
        EvidenceRuleSearchConfig(episodes_per_rule=0)
    with pytest.raises(ValueError, match="elite_fraction"):
        EvidenceRuleSearchConfig(population=4, elite_fraction=0.25)


def test_the_search_learns_from_returns_what_to_serve_on_each_verdict() -> None:
    # The search starts from a usable statistic but undecided weights for a user found
    # unresponsive and for the end of the episode (0: neither top-x nor bottom-x): it must learn
    # from returns alone to serve top-x on that verdict and at the end.
    holder: list[EvidenceRuleSearchAgent] = []
    config = EvidenceRuleSearchConfig(population=32, episodes_per_rule=4, initial_std=0.3)

    def build(env: gym.vector.VectorEnv) -> EvidenceRuleSearchAgent:
        agent = EvidenceRuleSearchAgent.from_env(env, config=config, seed=0)
        agent.mean = _z(decay=0.7, effect=0.1, threshold=0.05, switch_at=0.95, p_early=-1.0,
                        p_unresponsive=0.0, p_late=0.0)  # fmt: skip
        holder.append(agent)
        return agent

    result = train(
        build,
        config=TrainConfig(
            env_id=USER_TYPES, episodes=16384, num_envs=64, seed=0, env_kwargs=STRONG,
            eval_episodes=400, references=True, checkpoint_every=0, progress=False,
        ),
    )  # fmt: skip
    learned = holder[-1]
    rule = learned.greedy_rule()
    assert rule["p_unresponsive"] > 0.1 and rule["p_late"] > 0.1  # measured: 0.32 and 0.30
    policies = result.final_eval["policies"]
    agent = np.array(policies["agent"]["returns"])
    # paired on the same held-out episodes (measured: +130.5 over bottom-x, the better fixed
    # rule here; training seeds 1 and 2: +96.2 and +113.0)
    for heuristic, margin in (("bottom_x", 60.0), ("top_x", 1000.0)):
        gain = agent - np.array(policies[heuristic]["returns"])
        assert gain.mean() - 1.96 * gain.std(ddof=1) / np.sqrt(len(gain)) > margin, heuristic
    # by step 20 the learned rule has found more than half the indifferent users (tau 0) and
    # almost none of the sensitive ones
    env = gym.make_vec(USER_TYPES, num_envs=400, **STRONG)
    obs, info = env.reset(seed=77)
    tau = info["user_sensitivity"].copy()  # read by the test only, never shown to the agent
    learned.begin_episodes(np.ones(400, dtype=bool))
    for _ in range(20):
        obs, *_ = env.step(learned.act_batch(obs))
    env.close()
    marked = learned.evidence < -rule["threshold"]
    # measured: 0.59 and 0.01
    assert marked[tau == 0].mean() > 0.4 > 0.05 > marked[tau > 0].mean()
