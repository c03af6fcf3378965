"""``fedrec/InterestEvolution-v0``: statistical parity with RecSim's ``interest_evolution`` env,
the env card, seeding, Gymnasium's checker, state, and the native vector env.

Parity. RecSim's own env (``recsim-no-tf`` 0.2.3, a test-only dependency; built exactly as RLlib's
``InterestEvolutionRecSimEnv``: ``create_environment`` with ``num_candidates=10, slate_size=2,
resample_documents=True``) and fedrec's env are rolled out with the same three policies, and
three per-episode statistics are compared with Welch's two-sample t-test: the **return** (total
watch time), the **length** (steps until the time budget is spent) and the **click rate**
(clicks / steps). Policies, all functions of the observation only:

- ``random``: a uniformly random slate;
- ``greedy``: the two candidates of highest affinity (user interest in their topic) first;
- ``worst``: the two of lowest affinity: few clicks, long episodes, and the one policy whose
  return depends strongly on the interest dynamics (the interests it serves get clicked and move).

Statistics: every test uses ``ALPHA = 0.001`` (two-sided); there are 12 such tests (3 statistics
x (3 policies of the vector env + the random policy of the single env)), so a correct
implementation fails at a new seed with probability at most 1.2 % (Bonferroni); seeds are fixed,
so the outcome is deterministic. Per-episode standard deviations of the return are about 11.4
(random), 25.4 (greedy) and 18.3 (worst); with ``RECSIM_EPISODES`` = 250 / 250 / 100 and
``FEDREC_EPISODES = 5000`` the standard errors of the difference are about 0.7 / 1.6 / 1.9, so
the smallest effect detected with 99 % power, 5.6 s.e., is about 4.2 / 9.2 / 10.5. Effects of
bugs this must catch, on the mean return (fedrec's vector env with the bug, 20,000 episodes per
cell, seed 0, minus the correct env's):

| bug | random | greedy | worst |
|---|---|---|---|
| step penalty 1.0 instead of 0.5 | -15.3 | -9.7 | -22.2 |
| no quality-driven budget update (``user_update_alpha = 0``) | +20.4 | +20.4 | +6.0 |
| no interest evolution (``alpha_y_intercept = 0``) | +0.5 | -0.3 | +27.0 |
| multinomial logit instead of RecSim's proportional choice | -1.6 | -1.1 | +35.6 |
| ``no_click_mass = 2`` | -7.6 | -5.1 | -11.6 |

``test_power`` re-checks, with the measured standard errors, that each bug is detectable by at
least one policy's return test.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import warnings
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from scipy import stats

import fedrec  # noqa: F401  (registers the environments)
from fedrec.envs.hidden import hidden_info_keys, strip_hidden
from fedrec.envs.interest_evolution import InterestEvolutionEnv
from fedrec.envs.interest_evolution_vector import InterestEvolutionVectorEnv
from fedrec.envs.slates import SlateSpace

ENV_ID = "fedrec/InterestEvolution-v0"
NUM_CANDIDATES, SLATE_SIZE, NUM_TOPICS = 10, 2, 20
ALPHA = 0.001
POWER = 0.99
RECSIM_EPISODES = {"random": 250, "greedy": 250, "worst": 100}
FEDREC_EPISODES = 5000
SINGLE_EPISODES = 300
SEED = 3102


def _recsim_module():
    # Importing recsim imports old gym, which prints a "Gym has been unmaintained" notice.
    with contextlib.redirect_stderr(io.StringIO()):
        return pytest.importorskip("recsim.environments.interest_evolution")


def policy_slates(policy: str, user: np.ndarray, docs: np.ndarray, rng: np.random.Generator):
    """Slates (B, n) for interests ``user`` (B, K) and one-hot candidates ``docs`` (B, N, K)."""
    if policy == "random":
        return np.argsort(rng.random(docs.shape[:2]), axis=1)[:, :SLATE_SIZE]
    affinity = np.einsum("bnk,bk->bn", docs, user)
    key = -affinity if policy == "greedy" else affinity
    return np.argsort(key, axis=1, kind="stable")[:, :SLATE_SIZE]


@dataclass
class Episodes:
    """Per-episode statistics of one side (RecSim or fedrec) under one policy."""

    returns: np.ndarray
    lengths: np.ndarray
    click_rates: np.ndarray

    def statistic(self, name: str) -> np.ndarray:
        return {"return": self.returns, "length": self.lengths, "click_rate": self.click_rates}[
            name
        ]


def rollout_recsim(policy: str, episodes: int, seed: int) -> Episodes:
    """Episodes of RecSim's env (old gym 4-tuple API), configured as RLlib's tuned examples.

    RecSim seeds its user and video samplers with ``env_config['seed']`` and draws the choice
    and the direction of the interest update from the global ``np.random``, which we seed and
    restore afterwards.
    """
    iev = _recsim_module()
    saved = np.random.get_state()  # noqa: NPY002  (RecSim draws from the global RNG)
    np.random.seed(seed)  # noqa: NPY002
    rng = np.random.default_rng(seed)
    try:
        env = iev.create_environment(
            {
                "num_candidates": NUM_CANDIDATES,
                "slate_size": SLATE_SIZE,
                "resample_documents": True,
                "seed": seed,
            }
        )
        returns, lengths, rates = np.zeros(episodes), np.zeros(episodes), np.zeros(episodes)
        for episode in range(episodes):
            obs, done, total, steps, clicks = env.reset(), False, 0.0, 0, 0
            while not done:
                docs = np.stack(list(obs["doc"].values()))[None]
                slate = policy_slates(policy, np.asarray(obs["user"])[None], docs, rng)[0]
                obs, reward, done, _ = env.step(slate)
                total += reward
                steps += 1
                clicks += sum(response["click"] for response in obs["response"])
            returns[episode], lengths[episode], rates[episode] = total, steps, clicks / steps
    finally:
        np.random.set_state(saved)  # noqa: NPY002
    return Episodes(returns, lengths, rates)


def rollout_vector(policy: str, episodes: int, seed: int, **kwargs) -> Episodes:
    """One episode per user of the native batched env (``gymnasium.make_vec``)."""
    env = gym.make_vec(ENV_ID, num_envs=episodes, **kwargs)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    returns, lengths, clicks = np.zeros(episodes), np.zeros(episodes), np.zeros(episodes)
    alive = np.ones(episodes, dtype=bool)
    while alive.any():
        slates = policy_slates(policy, obs["user"], obs["candidates"], rng)
        obs, rewards, terminated, truncated, info = env.step(slates)
        returns += np.where(alive, rewards, 0.0)
        lengths += alive
        clicks += alive & (info["clicked_slot"] >= 0)
        alive &= ~(terminated | truncated)
    env.close()
    return Episodes(returns, lengths, clicks / lengths)


def rollout_single(policy: str, episodes: int, seed: int) -> Episodes:
    """Episodes of the single env through ``gymnasium.make`` (with the standard wrappers)."""
    env = gym.make(ENV_ID)
    rng = np.random.default_rng(seed)
    returns, lengths, rates = np.zeros(episodes), np.zeros(episodes), np.zeros(episodes)
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed if episode == 0 else None)
        done, total, steps, clicks = False, 0.0, 0, 0
        while not done:
            slate = policy_slates(policy, obs["user"][None], obs["candidates"][None], rng)[0]
            obs, reward, terminated, truncated, info = env.step(slate)
            done = terminated or truncated
            total += reward
            steps += 1
            clicks += info["clicked_slot"] >= 0
        returns[episode], lengths[episode], rates[episode] = total, steps, clicks / steps
    env.close()
    return Episodes(returns, lengths, rates)


@pytest.fixture(scope="module")
def rollouts() -> dict[tuple[str, str], Episodes]:
    """All rollouts, keyed by (side, policy); computed once for the module (about 20 s)."""
    _recsim_module()
    out: dict[tuple[str, str], Episodes] = {}
    for k, (policy, episodes) in enumerate(RECSIM_EPISODES.items()):
        out["recsim", policy] = rollout_recsim(policy, episodes, SEED + k)
        out["vector", policy] = rollout_vector(policy, FEDREC_EPISODES, SEED + 100 + k)
    out["single", "random"] = rollout_single("random", SINGLE_EPISODES, SEED + 200)
    return out


STATISTICS = ("return", "length", "click_rate")
SIDES = [("vector", policy) for policy in RECSIM_EPISODES] + [("single", "random")]


def describe(sample: np.ndarray) -> str:
    se = sample.std(ddof=1) / math.sqrt(len(sample))
    return f"{sample.mean():.4g} ± {1.96 * se:.2g} (95 % CI, n={len(sample)})"


@pytest.mark.parametrize("statistic", STATISTICS)
@pytest.mark.parametrize(("side", "policy"), SIDES)
def test_statistics_match_recsim(
    rollouts: dict[tuple[str, str], Episodes], side: str, policy: str, statistic: str
) -> None:
    ours = rollouts[side, policy].statistic(statistic)
    theirs = rollouts["recsim", policy].statistic(statistic)
    result = stats.ttest_ind(ours, theirs, equal_var=False)
    assert result.pvalue > ALPHA, (
        f"{side} vs RecSim, {policy} policy, mean {statistic}: {describe(ours)} vs "
        f"{describe(theirs)}; Welch p = {result.pvalue:.2g} < {ALPHA}"
    )


#: (bug, policy, effect on the mean return) from the module docstring's table: for every bug the
#: policy whose test catches it.
BUGS = [
    ("step_penalty=1.0", "random", 15.3),
    ("user_update_alpha=0", "random", 20.4),
    ("alpha_y_intercept=0", "worst", 27.0),
    ("choice_model='mnl'", "worst", 35.6),
    ("no_click_mass=2", "random", 7.6),
]


@pytest.mark.parametrize(("bug", "policy", "effect"), BUGS)
def test_power(
    rollouts: dict[tuple[str, str], Episodes], bug: str, policy: str, effect: float
) -> None:
    ours, theirs = rollouts["vector", policy].returns, rollouts["recsim", policy].returns
    se = math.sqrt(ours.var(ddof=1) / len(ours) + theirs.var(ddof=1) / len(theirs))
    detectable = (stats.norm.ppf(1 - ALPHA / 2) + stats.norm.ppf(POWER)) * se
    assert effect > detectable, f"{bug} ({effect}) below the detectable {detectable:.1f}"


def test_reference_values(rollouts: dict[tuple[str, str], Episodes]) -> None:
    """The values docs/interest_evolution.md quotes (random: return 154.4, 83.7 steps, 47 %
    clicks; greedy: 165.9, 66.5, 64 %; worst: 95.3, 204, 13 %), within 5 s.e. of the vector env."""
    quoted = {
        "random": (154.4, 83.7, 0.474),
        "greedy": (165.9, 66.5, 0.637),
        "worst": (95.3, 204.4, 0.126),
    }
    for policy, values in quoted.items():
        for statistic, value in zip(STATISTICS, values, strict=True):
            sample = rollouts["vector", policy].statistic(statistic)
            se = sample.std(ddof=1) / math.sqrt(len(sample))
            assert abs(sample.mean() - value) < 5 * se + 1e-9, (policy, statistic, describe(sample))


# --------------------------------------------------------------------------------------------
# The env itself


def test_card_has_the_gymnasium_sections_and_names_the_hidden_keys() -> None:
    doc = InterestEvolutionEnv.__doc__ or ""
    found = re.findall(r"^\s*## (.+?)\s*$", doc, flags=re.MULTILINE)
    for section in (
        "Description", "Action Space", "Observation Space", "Dynamics", "Rewards",
        "Starting State", "Episode End", "Info", "Arguments",
    ):  # fmt: skip
        assert section in found, section
    info = doc.split("## Info", 1)[1].split("\n    ## ", 1)[0]
    assert "hidden" in info
    for key in InterestEvolutionEnv.metadata["hidden_info_keys"]:
        assert f"``{key}``" in info
    assert "num_candidates=10, slate_size=2" in doc  # RLlib's tuned-example config


@pytest.mark.parametrize("size", [{}, {"num_candidates": 30, "slate_size": 5}])
def test_check_env_without_warnings(size: dict) -> None:
    env = gym.make(ENV_ID, **size)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []
    assert isinstance(env.action_space, SlateSpace)


def test_spaces_and_hidden_keys() -> None:
    env = gym.make(ENV_ID)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert obs["candidates"].shape == (NUM_CANDIDATES, NUM_TOPICS)
    assert (obs["candidates"].sum(axis=1) == 1).all()
    assert hidden_info_keys(env) == {"budget_left", "candidate_quality"}
    assert info["budget_left"] == 200.0 and info["candidate_quality"].shape == (NUM_CANDIDATES,)
    assert set(strip_hidden(info, hidden_info_keys(env))) == {"clicked_slot"}
    vec = gym.make_vec(ENV_ID, num_envs=3)
    assert hidden_info_keys(vec) == hidden_info_keys(env)


def test_seeding_fixes_the_trajectory() -> None:
    def trajectory(seed: int) -> list:
        env = gym.make(ENV_ID)
        obs, _ = env.reset(seed=seed)
        out = [obs["user"].copy()]
        for step in range(150):
            obs, reward, terminated, _, info = env.step(np.array([step % 10, (step + 3) % 10]))
            out += [reward, info["clicked_slot"], obs["candidates"].argmax(1).tolist()]
            if terminated:
                obs, _ = env.reset()
        return out

    first, again, other = trajectory(7), trajectory(7), trajectory(8)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("choice_model", ["proportional", "mnl"])
def test_vector_env_with_one_user_is_the_single_env(choice_model: str) -> None:
    """Same seed, same actions: identical observations, rewards, ends and infos, over several
    episodes (the vector env resets the finished user at the next step, NEXT_STEP)."""
    single = InterestEvolutionEnv(choice_model=choice_model)
    vector = gym.make_vec(ENV_ID, num_envs=1, choice_model=choice_model)
    assert isinstance(vector, InterestEvolutionVectorEnv)
    obs_s, info_s = single.reset(seed=11)
    obs_v, info_v = vector.reset(seed=11)
    rng = np.random.default_rng(0)
    episodes = 0
    for _ in range(600):
        slate = rng.permutation(NUM_CANDIDATES)[:SLATE_SIZE]
        obs_s, r_s, term_s, _, info_s = single.step(slate)
        obs_v, r_v, term_v, _, info_v = vector.step(slate[None])
        for key in obs_s:
            np.testing.assert_array_equal(obs_s[key], obs_v[key][0])
        assert (r_s, term_s) == (r_v[0], term_v[0])
        assert info_s["budget_left"] == info_v["budget_left"][0]
        np.testing.assert_array_equal(info_s["candidate_quality"], info_v["candidate_quality"][0])
        if term_s:
            episodes += 1
            obs_s, _ = single.reset()
            obs_v, *_ = vector.step(slate[None])  # the autoreset step
            for key in obs_s:
                np.testing.assert_array_equal(obs_s[key], obs_v[key][0])
    assert episodes >= 4


def test_single_and_vector_envs_agree_in_distribution(
    rollouts: dict[tuple[str, str], Episodes],
) -> None:
    for statistic in STATISTICS:
        single = rollouts["single", "random"].statistic(statistic)
        vector = rollouts["vector", "random"].statistic(statistic)
        result = stats.ttest_ind(single, vector, equal_var=False)
        assert result.pvalue > ALPHA, (statistic, describe(single), describe(vector))


def _play(env, actions: list[np.ndarray]) -> list:
    """Step ``env`` through ``actions`` (a single env is reset when its episode ends)."""
    vector = isinstance(env, gym.vector.VectorEnv)
    results = []
    for action in actions:
        obs, reward, terminated, *_ = env.step(action)
        results.append((obs["user"].copy(), reward))
        if not vector and terminated:
            env.reset()
    return results


@pytest.mark.parametrize("vector", [False, True])
def test_state_dict_resumes_exactly(vector: bool) -> None:
    env = gym.make_vec(ENV_ID, num_envs=4) if vector else gym.make(ENV_ID).unwrapped
    env.reset(seed=3)
    rng = np.random.default_rng(1)
    slates = [rng.permutation(NUM_CANDIDATES)[:SLATE_SIZE] for _ in range(70)]
    actions = [np.tile(slate, (4, 1)) if vector else slate for slate in slates]
    _play(env, actions[:30])
    state = env.state_dict()
    first = _play(env, actions[30:])
    env.load_state_dict(state)
    second = _play(env, actions[30:])
    for (u1, r1), (u2, r2) in zip(first, second, strict=True):
        np.testing.assert_array_equal(u1, u2)
        np.testing.assert_array_equal(r1, r2)


def test_invalid_actions_are_refused_before_anything_changes() -> None:
    env = gym.make(ENV_ID).unwrapped
    env.reset(seed=0)
    before = env.state_dict()
    for bad in ([0, 0], [0, 10], [1], [0.0, 1.0], "ab", [-1, 2]):
        with pytest.raises(ValueError):
            env.step(bad)
    after = env.state_dict()
    np.testing.assert_array_equal(before["simulator"]["interests"], after["simulator"]["interests"])
    assert before["np_random"] == after["np_random"]


def test_dynamics_follow_recsim() -> None:
    """One step by hand: the watched video's topic interest moves by +-alpha(x)(1 - x), the
    budget drops by the watch time less its quality bonus, a no-click costs the step penalty."""
    env = InterestEvolutionEnv()
    obs, info = env.reset(seed=4)
    seen_click = seen_none = False
    for _ in range(200):
        user, topics = obs["user"].astype(np.float64), obs["candidates"].argmax(1)
        quality, budget = info["candidate_quality"], info["budget_left"]
        obs, reward, terminated, _, info = env.step(np.array([0, 1]))
        slot = info["clicked_slot"]
        if slot < 0:
            seen_none = True
            assert reward == 0.0 and info["budget_left"] == pytest.approx(budget - 0.5)
        else:
            seen_click = True
            topic, x = topics[slot], float(env._sim.interests[0][topics[slot]])
            old = float(user[topic])
            step = 0.3 * (1 - abs(old)) * (1 - old)
            assert min(abs(x - np.clip(old + step, -1, 1)), abs(x - (old - step))) < 1e-6
            watch = min(budget, 4.0)
            assert reward == pytest.approx(watch)
            expected = budget - watch + 0.9 / 3.4 * watch * quality[slot]
            assert info["budget_left"] == pytest.approx(expected)
        if terminated:
            break
    assert seen_click and seen_none
