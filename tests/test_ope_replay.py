"""The replay evaluator (fedrec.eval.ope.replay, Li et al. 2011): unbiased on simulated uniform
logs with a known truth (whole-slate matching under any reward; per-position matching under
additive rewards, biased under a cascade), refuses non-uniform or missing propensities, and runs
end to end on a logged-data env built from small generated files."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from fedrec.agents.logged_baselines import PopularityAgent
from fedrec.envs.datasets.synthetic import write_synthetic
from fedrec.eval import ope
from fedrec.train.collect import collect

N, K, CONTEXTS = 4, 2, 3
SLATES = ope.enumerate_slates(N, K)  # 12 ordered slates
ATTRACTION = np.random.default_rng(0).uniform(0.1, 0.8, (CONTEXTS, N))
POSITION = np.array([1.0, 0.6])
TARGET = np.array([[3, 1], [0, 2], [2, 3]])  # the target's slate in each context


def _click_probabilities(context: np.ndarray, slates: np.ndarray, model: str) -> np.ndarray:
    """(n, K) probability of a click at each slot."""
    a = ATTRACTION[context[:, None], slates] * POSITION
    if model == "additive":
        return a
    above = np.cumprod(np.concatenate([np.ones((len(a), 1)), 1 - a[:, :-1]], axis=1), axis=1)
    return a * above  # cascade: a click at slot k needs no click above


def _truth(model: str) -> float:
    contexts = np.arange(CONTEXTS)
    return float(_click_probabilities(contexts, TARGET, model).sum(axis=1).mean())


def _uniform_log(
    rng: np.random.Generator, n: int, model: str
) -> tuple[ope.LoggedSlates, np.ndarray]:
    context = rng.integers(0, CONTEXTS, n)
    slates = SLATES[rng.integers(0, len(SLATES), n)]
    rewards = (rng.random((n, K)) < _click_probabilities(context, slates, model)).astype(float)
    data = ope.LoggedSlates(
        slates=slates,
        rewards=rewards,
        behaviour_slate=np.full(n, 1 / len(SLATES)),
        behaviour_slot=np.full((n, K), 1 / N),
    )
    return data, TARGET[context]


@pytest.mark.parametrize("model", ["additive", "cascade"])
def test_slate_replay_is_unbiased(model: str) -> None:
    rng = np.random.default_rng(1)
    data, target = _uniform_log(rng, 30_000, model)
    estimate = ope.replay(data, target, num_candidates=N)
    assert abs(estimate.value - _truth(model)) < 3 * estimate.std_error
    assert estimate.logged == 30_000 and estimate.variant == "slate"
    assert abs(estimate.accepted - 2_500) < 5 * math.sqrt(2_500)  # 1 in 12 slates
    # over 200 logged datasets the mean estimate is within 3 standard errors of the truth
    values = [ope.replay(*_uniform_log(rng, 2_000, model), num_candidates=N).value
              for _ in range(200)]  # fmt: skip
    assert abs(np.mean(values) - _truth(model)) < 3 * np.std(values, ddof=1) / math.sqrt(200)


def test_position_replay_is_unbiased_only_for_additive_rewards() -> None:
    rng = np.random.default_rng(2)
    additive = [
        ope.replay(*_uniform_log(rng, 2_000, "additive"), num_candidates=N, variant="position")
        for _ in range(200)
    ]
    values = np.array([e.value for e in additive])
    se = values.std(ddof=1) / math.sqrt(200)
    assert abs(values.mean() - _truth("additive")) < 3 * se
    # its delta-method standard error matches the spread over datasets (within 15%)
    assert np.mean([e.std_error for e in additive]) == pytest.approx(values.std(ddof=1), rel=0.15)
    cascade = np.array(
        [
            ope.replay(
                *_uniform_log(rng, 2_000, "cascade"), num_candidates=N, variant="position"
            ).value
            for _ in range(200)
        ]
    )
    bias = cascade.mean() - _truth("cascade")
    assert abs(bias) > 4 * cascade.std(ddof=1) / math.sqrt(200)  # measured: -0.0089, 5.2 SE


def test_replay_refuses_logs_that_are_not_uniform() -> None:
    rng = np.random.default_rng(3)
    data, target = _uniform_log(rng, 100, "additive")
    skewed = ope.LoggedSlates(
        slates=data.slates, rewards=data.rewards,
        behaviour_slate=np.where(np.arange(100) == 7, 0.5, 1 / 12),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"uniformly logged.*behaviour_slate\[7\]"):
        ope.replay(skewed, target, num_candidates=N)
    bare = ope.LoggedSlates(slates=data.slates, rewards=data.rewards)
    with pytest.raises(ValueError, match="needs the logging propensities"):
        ope.replay(bare, target, num_candidates=N)
    with pytest.raises(ValueError, match="needs the logging propensities"):
        ope.replay(bare, target, num_candidates=N, variant="position")
    with pytest.raises(ValueError, match="uniformly logged"):  # uniform over 5, not 4
        ope.replay(data, target, num_candidates=5)
    with pytest.raises(ValueError, match="variant"):
        ope.replay(data, target, num_candidates=N, variant="prefix")
    with pytest.raises(ValueError, match="target_slates must have shape"):
        ope.replay(data, target[:5], num_candidates=N)
    one = ope.LoggedSlates(slates=[[0, 1]], rewards=[[1.0, 0.0]], behaviour_slate=[1 / 12])
    with pytest.raises(ValueError, match="none of the 1 logged slates matches"):
        ope.replay(one, [[1, 0]], num_candidates=N)
    single = ope.replay(one, [[0, 1]], num_candidates=N)
    assert single.value == 1.0 and math.isnan(single.std_error)


@pytest.mark.parametrize("variant", ["slate", "position"])
def test_groups_of_one_event_give_the_plain_interval(variant: str) -> None:
    data, target = _uniform_log(np.random.default_rng(4), 5_000, "cascade")
    plain = ope.replay(data, target, num_candidates=N, variant=variant)
    grouped = ope.replay(data, target, num_candidates=N, variant=variant, groups=np.arange(5_000))
    assert grouped.value == pytest.approx(plain.value)
    assert grouped.std_error == pytest.approx(plain.std_error, rel=0.01)
    paired = ope.replay(data, target, num_candidates=N, variant=variant,
                        groups=np.arange(5_000) // 2)  # fmt: skip
    assert paired.value == pytest.approx(plain.value)


# ---------------------------------------------------------------------------------------------
# End to end on a logged-data env (MovieLens 100K format, generated files)

ENV = "fedrec/MovieLens100K-v0"
SMALL = {"num_candidates": 5, "slate_size": 2}  # 20 ordered slates


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("replay")
    write_synthetic("ml-100k", root / "ml-100k")
    return root


def _popularity(env: gym.Env) -> PopularityAgent:
    return PopularityAgent.from_env(env, seed=11)


def _branch_truth(data_dir: Path, episodes: int) -> tuple[float, float]:
    """Uniformly logged steps of the single env; at each, the popularity agent's reward is read
    by saving the env, stepping its slate and restoring (the env's reward is deterministic
    given its state). Returns the mean and standard error of the target's per-step reward."""
    env = gym.make(ENV, data_dir=data_dir, **SMALL).unwrapped
    agent = _popularity(env)
    rng = np.random.default_rng(5)
    rewards = []
    obs, _ = env.reset(seed=21)
    for _ in range(episodes):
        done = False
        while not done:
            batch = {key: value[None] for key, value in obs.items()}
            chosen = agent.act_batch(batch)[0]
            saved = env.state_dict()
            rewards.append(env.step(chosen)[1])
            env.load_state_dict(saved)
            logged = rng.permutation(SMALL["num_candidates"])[: SMALL["slate_size"]]
            obs, _, terminated, truncated, _ = env.step(logged)
            done = terminated or truncated
        obs, _ = env.reset()
    values = np.array(rewards)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values)))


def test_replay_end_to_end_on_a_logged_data_env(data_dir: Path) -> None:
    """``fedrec.train.collect`` logs uniformly random slates; replay evaluates the popularity
    agent on them; its estimate agrees with the agent's reward on the uniform logger's states
    (read by branching the env) within 3 standard errors."""
    logged = collect(ENV, "random", episodes=1000, seed=0, env_kwargs={"data_dir": data_dir, **SMALL},
                     num_envs=64, progress=False)  # fmt: skip
    env = gym.make(ENV, data_dir=data_dir, **SMALL)
    agent = _popularity(env)
    slates, rewards, propensity, target, groups = [], [], [], [], []
    for index, episode in enumerate(logged.episodes):
        observations = {key: value[:-1] for key, value in episode["observations"].items()}
        slates.append(episode["actions"])
        # per-slot rewards: the consumed slot, read from the next observation's last_click
        rewards.append(episode["observations"]["last_click"][1:])
        propensity.append(episode["propensity_slate"])
        target.append(agent.act_batch(observations))
        groups.append(np.full(len(episode["rewards"]), index))
    rewards = np.concatenate(rewards)
    assert np.allclose(rewards.sum(axis=1), np.concatenate([e["rewards"] for e in logged.episodes]))
    data = ope.LoggedSlates(
        slates=np.concatenate(slates), rewards=rewards, behaviour_slate=np.concatenate(propensity)
    )
    # events of one episode are correlated: the interval is clustered by episode
    estimate = ope.replay(
        data, np.concatenate(target), num_candidates=5, groups=np.concatenate(groups)
    )
    assert abs(estimate.accepted - data.n / 20) < 5 * math.sqrt(data.n / 20)
    truth, truth_se = _branch_truth(data_dir, episodes=400)
    assert abs(estimate.value - truth) < 3 * math.hypot(estimate.std_error, truth_se)
    # the popularity agent beats a uniformly random slate on these logs
    assert truth > rewards.sum(axis=1).mean()
