"""The best open-loop rule: a slate schedule that depends on the step only, searched with the model.

An *open-loop* policy never reads an observation beyond the offered candidates' features: at step
t of the episode it serves the slate of a fixed *rule* ``schedule[t]``, and the rules are the
env's fixed slate rules over the candidates' feature ranks:

* ``top_x`` (the n largest features, largest first) and ``bottom_x`` (the n smallest, smallest
  first), the two one-slate heuristics;
* the mixtures in between: ``top{j}+bottom{n-j}``, the j largest and the n - j smallest;
* the rank windows ``ranks{m}-{m+n-1}``, the candidates ranked m .. m + n - 1 by feature (largest
  first; ``ranks{m+n-1}-{m}`` smallest first), which grade the consumed item's feature.

Such a policy needs no feedback and learns nothing, so it is the baseline a learning claim must
beat: an agent that scores what a schedule fixed in advance scores has learned nothing that the
step counter does not already give.

**The search.** Candidates are i.i.d. U(0, 1) every step and the choice model depends on the
features only, so under a rule the consumed item's feature has a fixed distribution, whatever the
user's state. The expected return of a schedule is then a linear functional of the user's exposure
density: with ``d_t`` the density of the exposure (per user type) on a grid,

    E[return] = sum_t  d_t . r_{a_t},      d_{t+1} = d_t M_{a_t},

where ``r_a(e)`` is the expected engagement at exposure e under rule a and ``M_a`` the exposure
transition (the consumed item's shift ``-2 (c - 1/2)``, the discount and the Gaussian innovation,
deposited on the grid by linear interpolation). Each rule's consumed-feature distribution is
estimated once from ``samples`` candidate sets (the same sets for every rule), binned into
``feature_bins`` bins. The search is exhaustive over every *two-phase* schedule (rule a until step
s, then rule b: every a, b and s, from forward densities and backward values), then improves the
best one a step at a time (backward sweeps: with the earlier steps fixed, each step takes the rule
that maximises the exact value of the rest) until no single step changes. The result is a local
optimum over all open-loop schedules that is at least as good as every two-phase one; its value is
the model's (grid) value, checked against simulation in the tests, and every table reports its
simulated return on the held-out episodes.

Multi-platform envs: the user visits the K platforms in order each joint step and every visit is
one step of the same dynamics, so the schedule runs over visits (``K * steps``) and
:class:`JointOpenLoopPolicy` serves visit ``t * K + k`` on platform k. With a shared catalogue the
platforms of a joint step see the same candidates; the search treats them as independent draws
(the table's simulated return is exact either way).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.agents.base import Info, NoConfig, Observation, SlateAgent
from fedrec.agents.planner import exposure_grid
from fedrec.envs.choc_kale_model import ChocKaleModel, ChocKaleParams


@dataclasses.dataclass(frozen=True)
class RankRule:
    """A fixed slate rule: the feature ranks served, slot by slot (rank 0 = the largest feature)."""

    name: str
    ranks: tuple[int, ...]


def fixed_rules(params: ChocKaleParams) -> tuple[RankRule, ...]:
    """The env's fixed slate rules: top-x, bottom-x, the mixtures in between and the rank windows,
    without rules the choice model cannot tell apart (first name kept): under MNL only the set of
    ranks matters, under the first-slot model only the rank in slot 0."""
    n, big = params.slate_size, params.num_candidates
    bottom = tuple(range(big - 1, big - 1 - n, -1))  # smallest first
    rules = [RankRule("top_x", tuple(range(n))), RankRule("bottom_x", bottom)]
    rules += [
        RankRule(f"top{j}+bottom{n - j}", tuple(range(j)) + bottom[: n - j]) for j in range(1, n)
    ]
    windows = range(1, big - n + 1)
    rules += [RankRule(f"ranks{m}-{m + n - 1}", tuple(range(m, m + n))) for m in windows]
    # the same windows smallest first: under the first-slot model they serve every other rank
    rules += [
        RankRule(f"ranks{m + n - 1}-{m}", tuple(range(m + n - 1, m - 1, -1))) for m in windows
    ]
    unique: dict[object, RankRule] = {}
    for rule in rules:
        key = rule.ranks[0] if params.choice_model == "first_slot" else frozenset(rule.ranks)
        unique.setdefault(key, rule)
    return tuple(unique.values())


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpenLoopSearchConfig:
    """Discretisation and Monte Carlo size of the search (defaults: value error well below 0.5%)."""

    exposure_points: int = 401
    """Points of the uniform exposure grid."""
    feature_bins: int = 100
    """Bins of the consumed item's feature."""
    samples: int = 20_000
    """Candidate sets drawn to estimate each rule's consumed-feature distribution."""
    quadrature_points: int = 8
    """Gauss-Hermite nodes for the exposure innovation."""
    max_sweeps: int = 20
    """Backward improvement sweeps at most (each changes at least one step or ends the search)."""
    seed: int = 0
    """Seed of the candidate sets."""


DEFAULT_SEARCH_CONFIG = OpenLoopSearchConfig()


@dataclasses.dataclass(frozen=True)
class OpenLoopPlan:
    """A schedule of fixed rules, one per step (per visit on a multi-platform env)."""

    rules: tuple[RankRule, ...]
    schedule: tuple[int, ...]
    #: The model's expected return of the schedule (grid value; the tables report simulation).
    value: float
    #: The best constant (one-rule) schedule's model value, for comparison.
    best_constant_value: float

    def rank_table(self) -> np.ndarray:
        """(steps, n) int64: the ranks served at each step."""
        return np.array([self.rules[i].ranks for i in self.schedule], dtype=np.int64)

    def describe(self) -> str:
        """Run-length form, steps 1-based: ``bottom_x (1-56), top_x (57-61)``."""
        parts, start = [], 1
        for index, run in itertools.groupby(self.schedule):
            length = len(list(run))
            end = start + length - 1
            span = f"{start}" if length == 1 else f"{start}-{end}"
            parts.append(f"{self.rules[index].name} ({span})")
            start = end + 1
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.describe(),
            "model_value": self.value,
            "best_constant_model_value": self.best_constant_value,
            "schedule": [self.rules[i].name for i in self.schedule],
        }


class OpenLoopModel:
    """The exact (grid) expected return of any schedule of fixed rules, for one env's parameters."""

    def __init__(
        self,
        params: ChocKaleParams,
        rules: tuple[RankRule, ...],
        horizon: int,
        config: OpenLoopSearchConfig = DEFAULT_SEARCH_CONFIG,
    ) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.params, self.rules, self.horizon, self.config = params, rules, horizon, config
        model = ChocKaleModel(params)
        p = params
        self.grid = exposure_grid(p, config.exposure_points)
        taus = np.asarray(p.user_sensitivities or (p.sensitivity,), dtype=np.float64)
        # Initial density: e0 = (u - 1/2) / (1 - beta), u ~ U(0, 1), each type equally likely.
        u = (np.arange(4000) + 0.5) / 4000
        start = self._deposit((u - 0.5) / (1.0 - p.memory_discount), np.full(u.size, 1 / u.size))
        self.start = np.repeat(start[None], len(taus), axis=0) / len(taus)  # (types, E)
        chocness, probability, null = self._consumed(model)  # (F,), (R, F), (R,)
        satisfaction = model.satisfaction(self.grid[None, :], taus[:, None])  # (types, E)
        engagement = model.expected_engagement(satisfaction[..., None], chocness)  # (types, E, F)
        self.rewards = np.einsum("tef,rf->rte", engagement, probability)  # (R, types, E)
        kernels = self._kernels(chocness)  # (F, E, E)
        self.transitions = np.einsum("rf,fij->rij", probability, kernels)
        self.transitions += null[:, None, None] * np.eye(len(self.grid))[None]

    # -- model ----------------------------------------------------------------------------------
    def _consumed(self, model: ChocKaleModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per rule: the binned distribution of the consumed item's choc-ness and P(no click)."""
        p, config = self.params, self.config
        rng = np.random.default_rng(config.seed)
        features = -np.sort(-rng.random((config.samples, p.num_candidates)), axis=1)
        bins = config.feature_bins
        probability = np.zeros((len(self.rules), bins))
        weighted = np.zeros(bins)
        mass = np.zeros(bins)
        null = np.zeros(len(self.rules))
        for index, rule in enumerate(self.rules):
            slate_x = features[:, list(rule.ranks)]
            weights, null_weight = model.choice_weights(slate_x)
            total = weights.sum(axis=1, keepdims=True) + null_weight
            chosen = weights / total
            c = model.chocness(slate_x)
            where = np.minimum((c * bins).astype(np.int64), bins - 1)
            np.add.at(probability[index], where.ravel(), chosen.ravel() / config.samples)
            np.add.at(weighted, where.ravel(), (chosen * c).ravel())
            np.add.at(mass, where.ravel(), chosen.ravel())
            null[index] = float(np.mean(null_weight / total[:, 0]))
        centres = (np.arange(bins) + 0.5) / bins
        chocness = np.where(mass > 0, weighted / np.maximum(mass, 1e-300), centres)
        return chocness, probability, null

    def _deposit(self, points: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Mass ``weights`` at ``points``, spread on the grid by linear interpolation (clamped)."""
        grid = self.grid
        step = grid[1] - grid[0]
        position = np.clip((points - grid[0]) / step, 0.0, len(grid) - 1.0)
        low = np.minimum(position.astype(np.int64), len(grid) - 2)
        frac = position - low
        density = np.zeros(len(grid))
        np.add.at(density, low, weights * (1.0 - frac))
        np.add.at(density, low + 1, weights * frac)
        return density

    def _kernels(self, chocness: np.ndarray) -> np.ndarray:
        """K[f, i, j]: probability of moving from grid point i to j when an item of bin f is
        consumed (discount, shift, innovation by Gauss-Hermite nodes, linear interpolation)."""
        p, grid = self.params, self.grid
        nodes, node_weights = np.polynomial.hermite_e.hermegauss(self.config.quadrature_points)
        node_weights = node_weights / node_weights.sum()
        size = len(grid)
        step = grid[1] - grid[0]
        kernels = np.zeros((len(chocness), size, size))
        rows = np.arange(size)
        for noise, weight in zip(p.innovation_stddev * nodes, node_weights, strict=True):
            target = p.memory_discount * grid[None, :] - 2.0 * (chocness[:, None] - 0.5) + noise
            position = np.clip((target - grid[0]) / step, 0.0, size - 1.0)  # (F, E)
            low = np.minimum(position.astype(np.int64), size - 2)
            frac = position - low
            for f in range(len(chocness)):
                np.add.at(kernels[f], (rows, low[f]), weight * (1.0 - frac[f]))
                np.add.at(kernels[f], (rows, low[f] + 1), weight * frac[f])
        return kernels

    # -- evaluation and search -------------------------------------------------------------------
    def value(self, schedule: tuple[int, ...] | np.ndarray) -> float:
        """The expected return of ``schedule`` (one rule index per step)."""
        if len(schedule) != self.horizon:
            raise ValueError(f"a schedule has {self.horizon} steps, got {len(schedule)}")
        density, total = self.start, 0.0
        for rule in schedule:
            total += float(np.sum(density * self.rewards[rule]))
            density = density @ self.transitions[rule]
        return total

    def search(self) -> OpenLoopPlan:
        """Exhaustive over two-phase schedules, then single-step improvement (see the module)."""
        rules, horizon = len(self.rules), self.horizon
        forward = np.empty((rules, horizon + 1, *self.start.shape))  # d_s under "a until s"
        backward = np.zeros((rules, horizon + 1, *self.start.shape))  # value of "b from s"
        for a in range(rules):
            forward[a, 0] = self.start
            for t in range(horizon):
                forward[a, t + 1] = forward[a, t] @ self.transitions[a]
        for b in range(rules):
            for t in range(horizon - 1, -1, -1):
                backward[b, t] = self.rewards[b] + backward[b, t + 1] @ self.transitions[b].T
        two_phase = np.einsum("astk,bstk->abs", forward, backward)  # (a, b, switch step)
        a, b, switch = np.unravel_index(int(np.argmax(two_phase)), two_phase.shape)
        schedule = np.array([a] * switch + [b] * (horizon - switch), dtype=np.int64)
        best_constant = float(np.max(np.diagonal(two_phase[:, :, 0])))
        for _ in range(self.config.max_sweeps):
            if not self._improve(schedule):
                break
        return OpenLoopPlan(
            self.rules, tuple(int(i) for i in schedule), self.value(schedule), best_constant
        )

    def _improve(self, schedule: np.ndarray) -> bool:
        """One backward sweep: with steps < t fixed, step t takes the best rule given the (already
        improved) rest. Returns whether any step changed."""
        densities = [self.start]
        for rule in schedule[:-1]:
            densities.append(densities[-1] @ self.transitions[rule])
        rest = np.zeros_like(self.start)  # value of the schedule after step t, per grid point
        changed = False
        for t in range(self.horizon - 1, -1, -1):
            options = self.rewards + np.einsum("rij,kj->rki", self.transitions, rest)
            scores = np.einsum("rki,ki->r", options, densities[t])
            best = int(np.argmax(scores))
            if scores[best] > scores[schedule[t]] + 1e-9 * abs(scores[best]):
                schedule[t], changed = best, True
            rest = options[schedule[t]]
        return changed


@functools.lru_cache(maxsize=16)
def best_open_loop_plan(
    params: ChocKaleParams,
    horizon: int | None = None,
    config: OpenLoopSearchConfig = DEFAULT_SEARCH_CONFIG,
) -> OpenLoopPlan:
    """The best open-loop schedule found for an env's parameters (cached per parameters)."""
    rules = fixed_rules(params)
    model = OpenLoopModel(params, rules, horizon or params.time_budget, config)
    return model.search()


def _features(observations: Observation) -> np.ndarray:
    return np.asarray(observations["candidates"], dtype=np.float64)[..., 0]


def serve(plan: OpenLoopPlan, features: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Each user's slate of the rule its step prescribes (``steps`` per user, 0-based; past the
    schedule's end the last rule)."""
    order = np.argsort(-features, axis=1, kind="stable")  # rank 0 = the largest feature
    ranks = plan.rank_table()[np.minimum(steps, len(plan.schedule) - 1)]
    return np.take_along_axis(order, ranks, axis=1).astype(np.int64)


class OpenLoopPolicy(SlateAgent):
    """``best_open_loop``: the searched schedule of fixed rules; reads no observation but the
    candidates' features and counts each user's steps itself (no learning, no oracle)."""

    Config = NoConfig

    def __init__(self, plan: OpenLoopPlan, *, slate_size: int, seed: int | None = None) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        self.plan = plan
        self.steps = np.zeros(0, dtype=np.int64)

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        """Search the best schedule for a Choc-vs-Kale env's parameters (cached)."""
        from fedrec.agents.oracles import env_params

        del config
        params = env_params(env)
        return cls(best_open_loop_plan(params), slate_size=params.slate_size, seed=seed)

    def begin_episodes(self, mask: np.ndarray) -> None:
        mask = np.asarray(mask, dtype=bool)
        if self.steps.shape != mask.shape:
            self.steps = np.zeros(mask.shape, dtype=np.int64)
        self.steps[mask] = 0

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        features = _features(observations)
        if self.steps.shape != (len(features),):  # never told of an episode start: all start now
            self.steps = np.zeros(len(features), dtype=np.int64)
        # Choc-vs-Kale episodes have a fixed length, so the count wraps at the schedule's end
        # (also where a caller never calls begin_episodes between batches of episodes).
        slates = serve(self.plan, features, self.steps % len(self.plan.schedule))
        self.steps += 1
        return slates

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "steps": self.steps.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.steps = np.asarray(state["steps"], dtype=np.int64).copy()


class JointOpenLoopPolicy:
    """The schedule over visits on every platform of a multi-platform env: in joint step t,
    platform k serves the rule of visit ``t * K + k`` (evaluation only; no oracle)."""

    oracle = False

    def __init__(self, plan: OpenLoopPlan, platforms: list[str]) -> None:
        if len(plan.schedule) % len(platforms):
            raise ValueError(
                f"a schedule of {len(plan.schedule)} visits does not split into joint steps of "
                f"{len(platforms)} platforms"
            )
        self.plan, self.platforms = plan, list(platforms)
        self.joint_step = 0  # counted over episodes of fixed length

    @classmethod
    def for_env(cls, env: Any) -> JointOpenLoopPolicy:
        """Search the best schedule for a multi-platform env (cached per parameters)."""
        from fedrec.agents.multi_platform import episode_length_of

        horizon = env.num_platforms * episode_length_of(env)
        return cls(best_open_loop_plan(env.params, horizon), env.possible_agents)

    def act_joint(
        self, observations: Mapping[str, Observation], oracle: Any = None
    ) -> dict[str, np.ndarray]:
        del oracle
        k = len(self.platforms)
        step = self.joint_step % (len(self.plan.schedule) // k)  # synchronised, fixed length
        slates = {}
        for index, platform in enumerate(self.platforms):
            features = _features(observations[platform])
            slates[platform] = serve(self.plan, features, np.full(len(features), step * k + index))
        self.joint_step += 1
        return slates


__all__ = [
    "DEFAULT_SEARCH_CONFIG",
    "JointOpenLoopPolicy",
    "OpenLoopModel",
    "OpenLoopPlan",
    "OpenLoopPolicy",
    "OpenLoopSearchConfig",
    "RankRule",
    "best_open_loop_plan",
    "fixed_rules",
    "serve",
]
