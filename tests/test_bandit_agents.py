"""The bandit slate agents (``cascade_ucb1``, ``cascade_linucb``, ``linucb_slate``): each learns the
optimal slate of a tiny cascade env with known attraction probabilities, reads the click from the
observation of every env that shows one, resumes exactly (also inside ``per_platform`` on the
multi-platform env; the registry-wide kill-and-resume test covers the single-platform runs), and
refuses, naming the reason, an env it cannot learn on."""

from __future__ import annotations

import copy
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from resume_helpers import resumed_copy

import fedrec  # noqa: F401  (registers the envs)
from fedrec.agents.base import SlateAgent, Transitions
from fedrec.agents.cascade_bandits import (
    CascadeUCB1Agent,
    cascade_feedback,
    clicked_slots,
    layout_of,
)
from fedrec.agents.registry import build_multi_platform_agent, make_config, resolve_agent
from fedrec.envs.datasets.synthetic import write_synthetic
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.envs.slates import SlateSpace
from fedrec.train.checkpoint import from_plain, to_plain

NAMES = ("cascade_ucb1", "cascade_linucb", "linucb_slate")
CASCADE = "fedrec/ChocKaleCascade-v0"
INTEREST = "fedrec/InterestEvolution-v0"
SIMULATED = ["fedrec/ChocKale-v0", "fedrec/ChocKaleLongTerm-v0", CASCADE, INTEREST]


def _registered(env_id: str) -> None:
    if env_id not in gym.registry:  # an env added by a later change than these agents
        pytest.skip(f"{env_id} is not registered")


def _same(a, b) -> bool:
    """Exact equality of two agent states (arrays by value, dtype and shape)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


# --------------------------------------------------------------------------- a tiny cascade env
class TinyCascade:
    """A batched cascade env with known attraction probabilities (the logged envs' keys).

    ``items`` items with fixed features x in [0, 1]^2; every step offers all of them to each user
    in a fresh random order. The user examines the slate top-down and clicks item e with
    probability w(e) = 0.02 + 0.5 x1 + 0.3 x2 (linear in [1, x]), stopping at the first click;
    reward 1 per click. ``contextual``: each user has a public type u in {0, 1} (redrawn every
    step) and w(u, e) = 0.02 + 0.7 (u x1 + (1 - u) x2), linear in [1, u] x [1, x].
    """

    def __init__(
        self, num_envs: int, *, items: int = 12, slate_size: int = 3, contextual: bool = False
    ) -> None:
        self.num_envs, self.items, self.slate_size = num_envs, items, slate_size
        self.contextual = contextual
        self.features = np.random.default_rng(128).random((items, 2))
        entries = {
            "candidate_ids": spaces.Box(0, items - 1, (items,), np.int64),
            "candidate_features": spaces.Box(0.0, 1.0, (items, 2), np.float32),
            "last_click": spaces.Box(0.0, 1.0, (slate_size,), np.float32),
        }
        if contextual:
            entries["user_features"] = spaces.Box(0.0, 1.0, (1,), np.float32)
        self.single_observation_space = spaces.Dict(entries)
        self.single_action_space = SlateSpace(items, slate_size)

    def attraction(self, users: np.ndarray) -> np.ndarray:
        """w of every user (B,) and item: (B, items)."""
        x1, x2 = self.features[:, 0], self.features[:, 1]
        if self.contextual:
            u = users[:, None]
            return 0.02 + 0.7 * (u * x1 + (1 - u) * x2)
        return np.broadcast_to(0.02 + 0.5 * x1 + 0.3 * x2, (len(users), self.items))

    def _observation(self) -> dict[str, np.ndarray]:
        obs = {
            "candidate_ids": self.order.copy(),
            "candidate_features": self.features[self.order].astype(np.float32),
            "last_click": self.click.copy(),
        }
        if self.contextual:
            obs["user_features"] = self.users[:, None].astype(np.float32)
        return obs

    def _draw(self) -> None:
        self.order = np.argsort(self.rng.random((self.num_envs, self.items)), axis=1)
        self.users = self.rng.integers(0, 2, self.num_envs).astype(np.float64)

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        self.rng = np.random.default_rng(seed)
        self.click = np.zeros((self.num_envs, self.slate_size), np.float32)
        self._draw()
        return self._observation()

    def click_probability(self, slates: np.ndarray) -> np.ndarray:
        """Expected reward of each user's slate (candidate indices): 1 - prod(1 - w)."""
        w = self.attraction(self.users)
        items = np.take_along_axis(self.order, slates, axis=1)
        return 1.0 - np.prod(1.0 - np.take_along_axis(w, items, axis=1), axis=1)

    def best_probability(self) -> np.ndarray:
        w = np.sort(self.attraction(self.users), axis=1)[:, -self.slate_size :]
        return 1.0 - np.prod(1.0 - w, axis=1)

    def step(self, slates: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        w = self.attraction(self.users)
        items = np.take_along_axis(self.order, slates, axis=1)
        attractive = self.rng.random(slates.shape) < np.take_along_axis(w, items, axis=1)
        clicked = np.where(attractive.any(axis=1), attractive.argmax(axis=1), -1)
        self.click = np.zeros_like(self.click)
        self.click[np.flatnonzero(clicked >= 0), clicked[clicked >= 0]] = 1.0
        self._draw()
        return self._observation(), (clicked >= 0).astype(np.float64)


def _regrets(agent: SlateAgent, env: TinyCascade, steps: int, seed: int = 0) -> np.ndarray:
    """Train ``agent`` with its behaviour slates for ``steps`` steps; each step's mean regret
    (best click probability minus the slate's)."""
    obs = env.reset(seed)
    regrets = []
    for _ in range(steps):
        slates = agent.explore_batch(obs)
        regrets.append(float(np.mean(env.best_probability() - env.click_probability(slates))))
        next_obs, rewards = env.step(slates)
        none = np.zeros(env.num_envs, dtype=bool)
        agent.learn(Transitions(obs, slates, rewards, next_obs, none, none))
        obs = next_obs
    return np.array(regrets)


def _greedy(agent: SlateAgent, env: TinyCascade, draws: int = 20) -> tuple[float, float]:
    """The greedy slates on fresh candidate orders: how often they hold exactly the K most
    attractive items, and their mean regret."""
    hits, regrets = [], []
    for _ in range(draws):
        env._draw()
        slates = agent.act_batch(env._observation())
        chosen = np.sort(np.take_along_axis(env.order, slates, axis=1), axis=1)
        best = np.sort(np.argsort(-env.attraction(env.users), axis=1)[:, : env.slate_size], 1)
        hits.append(np.all(chosen == best, axis=1))
        regrets.append(env.best_probability() - env.click_probability(slates))
    return float(np.mean(hits)), float(np.mean(regrets))


def _random_regret(env: TinyCascade, steps: int = 200) -> float:
    env.reset(99)
    rng = np.random.default_rng(5)
    regret = []
    for _ in range(steps):
        slates = np.argsort(rng.random((env.num_envs, env.items)), axis=1)[:, : env.slate_size]
        regret.append(np.mean(env.best_probability() - env.click_probability(slates)))
        env.step(slates)
    return float(np.mean(regret))


def _train(
    name: str, steps: int, overrides=None, **env_kwargs
) -> tuple[SlateAgent, TinyCascade, np.ndarray]:
    env = TinyCascade(16, **env_kwargs)
    cls = resolve_agent(name)
    agent = cls.from_env(env, config=make_config(cls, overrides or {}), seed=0)
    return agent, env, _regrets(agent, env, steps)


CASES = {  # name: (env, config overrides, steps); each on a cascade env its model fits
    "cascade_ucb1": ({}, {}, 300),
    "cascade_linucb": ({}, {"alpha": 0.5}, 150),
    "linucb_slate": ({"contextual": True}, {"alpha": 0.5, "feedback": "cascade"}, 150),
}


@pytest.mark.parametrize("name", NAMES)
def test_each_bandit_learns_the_optimal_slate_of_a_cascade_env(name):
    """Regret per step falls; the greedy slates are the optimal ones (exactly, for at least half
    of the users -- a random slate is, for 1 in 220 -- and within a small regret for all)."""
    env_kwargs, overrides, steps = CASES[name]
    agent, env, regrets = _train(name, steps, overrides, **env_kwargs)
    fifth = steps // 5
    early, late = regrets[:fifth].mean(), regrets[-fifth:].mean()
    random_regret = _random_regret(TinyCascade(16, **env_kwargs))
    optimal, greedy_regret = _greedy(agent, env)
    print(
        f"{name}: regret early {early:.4f} late {late:.4f} greedy {greedy_regret:.4f} "
        f"random {random_regret:.4f}; greedy slate optimal for {optimal:.0%}"
    )
    assert late < 0.5 * early
    assert late < 0.1 * random_regret
    assert greedy_regret < 0.02 * random_regret
    assert optimal >= 0.5


def test_user_features_serve_two_user_types_that_a_non_contextual_bandit_cannot():
    """The contextual env's two types want different items: linucb_slate reads the type,
    cascade_linucb (the same linear model and feedback, items only) serves a compromise."""
    _, _, contextual = _train("linucb_slate", 150, {"feedback": "cascade"}, contextual=True)
    _, _, items_only = _train("cascade_linucb", 150, contextual=True)
    print(f"late regret: linucb_slate {contextual[-30:].mean():.4f}, "
          f"cascade_linucb {items_only[-30:].mean():.4f}")  # fmt: skip
    assert contextual[-30:].mean() < 0.1 * items_only[-30:].mean()


def test_position_blind_linucb_still_learns_on_a_cascade_env():
    """linucb_slate's default feedback labels every slate item (items below a click too, which
    the cascade user never examined): misspecified here, it still beats random by far."""
    _, _, regrets = _train("linucb_slate", 150, contextual=True)
    random_regret = _random_regret(TinyCascade(16, contextual=True))
    print(f"position-blind late regret {regrets[-30:].mean():.4f}, random {random_regret:.4f}")
    assert regrets[-30:].mean() < 0.2 * random_regret


ON_CASCADE = {  # the attraction is a logistic of a quadratic in x: the linear agents fit x, x^2
    "cascade_ucb1": {},
    "cascade_linucb": {"degree": 2},
    "linucb_slate": {"degree": 2, "feedback": "cascade"},
}


def _cascade_regrets(agent: SlateAgent | None, steps: int) -> np.ndarray:
    """Per-step mean regret on fedrec/ChocKaleCascade-v0 (one episode, 16 users), read from the
    env's hidden ground truth; ``agent=None``: uniformly random slates."""
    env = gym.make_vec(CASCADE, num_envs=16, time_budget=steps)
    obs, _ = env.reset(seed=0)
    rng, regrets = np.random.default_rng(0), []
    for _ in range(steps):
        if agent is None:
            slates = np.argsort(rng.random((16, 10)), axis=1)[:, :3]
        else:
            slates = agent.explore_batch(obs)
        next_obs, rewards, terminated, truncated, info = env.step(slates)
        regrets.append(np.mean(info["optimal_click_probability"] - info["slate_click_probability"]))
        if agent is not None:
            agent.learn(Transitions(obs, slates, rewards, next_obs, terminated, truncated))
        obs = next_obs
    return np.array(regrets)


@pytest.mark.parametrize("name", NAMES)
def test_each_bandit_learns_on_the_cascade_env(name):
    """fedrec/ChocKaleCascade-v0 resamples its candidates every step (CascadeUCB1's items are
    feature bins there): the regret per step falls, to a small fraction of random slates'."""
    _registered(CASCADE)
    cls = resolve_agent(name)
    env = gym.make_vec(CASCADE, num_envs=16)
    agent = cls.from_env(env, config=make_config(cls, ON_CASCADE[name]), seed=0)
    steps = 300
    regrets, random_regret = _cascade_regrets(agent, steps), _cascade_regrets(None, steps).mean()
    early, late = regrets[: steps // 5].mean(), regrets[-steps // 5 :].mean()
    print(
        f"{name} on {CASCADE}: regret early {early:.4f} late {late:.4f} random {random_regret:.4f}"
    )
    assert late < 0.5 * early
    assert late < 0.2 * random_regret


def test_cascade_feedback_reads_the_click_position():
    clicked = np.array([1, -1, 0])
    examined, attracted = cascade_feedback(clicked, 3)
    assert examined.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0]]
    assert attracted.tolist() == [[0, 1, 0], [0, 0, 0], [1, 0, 0]]


def test_cascade_ucb1_counts_what_the_cascade_model_observes():
    env = TinyCascade(2)
    agent = CascadeUCB1Agent.from_env(env, seed=0)
    obs = env.reset(0)
    slates = np.array([[0, 1, 2], [3, 4, 5]])
    click = np.array([[0, 1, 0], [0, 0, 0]], np.float32)  # user 0 clicked slot 1, user 1 nothing
    agent.learn(
        Transitions(obs, slates, np.ones(2), {**obs, "last_click": click}, *[np.zeros(2, bool)] * 2)
    )
    ids = obs["candidate_ids"]
    examined = np.zeros(env.items)
    np.add.at(examined, [ids[0, 0], ids[0, 1], *ids[1, 3:6]], 1.0)  # above the click; all three
    assert agent.examined.tolist() == examined.tolist()
    assert np.flatnonzero(agent.clicks).tolist() == [ids[0, 1]] and agent.clicks.sum() == 1


# --------------------------------------------------------------------------- the registered envs
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bandit-logged")
    for name in ("ml-100k", "lastfm-2k", "taobao-ads"):
        write_synthetic(name, root / name)
    return root


def _play(agent: SlateAgent, env: gym.vector.VectorEnv, steps: int) -> None:
    obs, _ = env.reset(seed=0)
    for _ in range(steps):
        slates = agent.explore_batch(obs)
        next_obs, rewards, terminated, truncated, _ = env.step(slates)
        agent.learn(Transitions(obs, slates, rewards, next_obs, terminated, truncated))
        obs = next_obs


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("env_id", [*SIMULATED, "ml"])
def test_each_bandit_runs_on_the_registered_envs(name, env_id, data_dir):
    kwargs = {"num_candidates": 10, "slate_size": 3}
    if env_id == "ml":
        env_id, kwargs = "fedrec/MovieLens100K-v0", {**kwargs, "data_dir": str(data_dir)}
    _registered(env_id)
    env = gym.make_vec(env_id, num_envs=4, **kwargs)
    agent = resolve_agent(name).from_env(env, seed=0)
    built = copy.deepcopy(agent.state_dict())
    _play(agent, env, 15)
    assert not _same(agent.state_dict(), built)
    assert agent.rounds == 60
    obs, _ = env.reset(seed=1)
    slates = agent.act_batch(obs)
    assert slates.shape == (4, 3) and all(len(set(row)) == 3 for row in slates.tolist())


def test_the_click_is_read_from_each_envs_observation(data_dir):
    """The clicked slot read from the next observation is the env's own ``clicked_slot`` /
    ``consumed_slot``."""
    for env_id, kwargs, key in (
        ("fedrec/ChocKaleSlate-v0", {"history_length": 3}, "clicked_slot"),
        ("fedrec/MovieLens100K-v0", {"data_dir": str(data_dir)}, "consumed_slot"),
        (CASCADE, {}, "clicked_slot"),
        (INTEREST, {}, "clicked_slot"),
    ):
        if env_id not in gym.registry:
            continue
        env = gym.make_vec(env_id, num_envs=8, **kwargs)
        layout = layout_of(env, "test")
        obs, _ = env.reset(seed=0)
        for _ in range(5):
            obs, _, _, _, info = env.step(np.tile(np.arange(layout.slate_size), (8, 1)))
            assert clicked_slots(obs, layout.click_key).tolist() == info[key].tolist()


@pytest.mark.parametrize("name", NAMES)
def test_an_env_without_a_click_or_candidates_is_refused(name, data_dir):
    cls = resolve_agent(name)
    for env_id, kwargs in (
        ("fedrec/MovieLens100K-v0", {"data_dir": str(data_dir), "mode": "evaluation"}),
        ("fedrec/TaobaoAds-v0", {"data_dir": str(data_dir)}),
    ):
        with pytest.raises(ValueError, match="observes no click"):
            cls.from_env(gym.make_vec(env_id, num_envs=2, **kwargs))
    lastfm = gym.make_vec("fedrec/Lastfm2K-v0", num_envs=2, data_dir=str(data_dir))
    if name == "cascade_ucb1":  # items are ids there
        cls.from_env(lastfm)
    else:
        with pytest.raises(ValueError, match=r"needs item features.*use cascade_ucb1"):
            cls.from_env(lastfm)


def test_cascade_ucb1_identifies_resampled_candidates_by_feature_bin():
    """Choc-vs-Kale resamples its candidates: an item is a feature bin, numbered when first
    learned from (a bin not met yet is unknown, -1); forcing ids is refused."""
    env = gym.make_vec("fedrec/ChocKaleLongTerm-v0", num_envs=2)
    agent = CascadeUCB1Agent.from_env(env, config=CascadeUCB1Agent.Config(feature_bins=5))
    assert not agent.use_ids
    obs = {"candidates": np.array([[[0.0], [0.19], [0.2], [0.99], [1.0]]], np.float32)}
    assert agent.item_ids(obs).tolist() == [[-1] * 5]
    assert agent.item_ids(obs, add=True).tolist() == [[0, 0, 1, 2, 2]]
    assert agent.bins.tolist() == [[0], [1], [4]] and agent.examined.tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="no ids"):
        CascadeUCB1Agent.from_env(env, config=CascadeUCB1Agent.Config(identity="ids"))


# --------------------------------------------------------------------------- resume
@pytest.mark.parametrize("name", NAMES)
def test_each_bandit_resumes_exactly_from_plain_data(name):
    env = TinyCascade(4, contextual=True)
    agent = resolve_agent(name).from_env(env, seed=1)
    _regrets(agent, env, 20)
    restored = resolve_agent(name).from_env(env, seed=7)
    restored.load_state_dict(from_plain(to_plain(agent.state_dict())))
    first, second = _regrets(agent, env, 20, seed=3), _regrets(restored, env, 20, seed=3)
    assert np.array_equal(first, second)
    assert _same(agent.state_dict(), restored.state_dict())


@pytest.mark.parametrize("name", NAMES)
def test_each_bandit_runs_per_platform_and_resumes_exactly(name):
    def fresh():
        env = ChocKaleMultiPlatformBatchEnv(
            num_users=3, num_candidates=10, slate_size=3, time_budget=12
        )
        return env, build_multi_platform_agent("per_platform", env, seed=0, agent=name)

    agent, restored = resumed_copy(fresh, 2, 2)
    inner = agent.agents["platform_a"]
    assert type(inner) is resolve_agent(name) and inner.rounds == 4 * 3 * 6
    assert _same(agent.state_dict(), restored.state_dict())
