"""Dynamic programming over the Choc-vs-Kale user's exposure and remaining budget.

The user's state is its net exposure e (satisfaction is sigmoid(tau * e)) and the remaining time
budget t. Candidates are i.i.d. U(0, 1) each step, so the optimal value depends on (t, e) only:

    Qbar_t(e, x) = E[engagement | e, x] + E_eps[ V_{t-1}(beta e - 2 (c(x) - 1/2) + eps) ]
    Qnull_t(e)   = V_{t-1}(e)                      (nothing consumed: e unchanged)
    V_t(e)       = E_{x_1..x_N ~ U(0,1)} [ max_{|A| = k} W_t(e, A) ],  V_0 = 0,

with W_t(e, A) the choice-weighted mean of Qbar over A and the null item. The max over slates is
the exact assortment optimisation (:mod:`fedrec.agents.assortment`); for the first-slot choice
model it is the best single item. Numerics: V lives on a uniform exposure grid (linear
interpolation, clamped), the innovation expectation uses Gauss-Hermite quadrature, the candidate
expectation uses exact order statistics on a fine feature grid (first slot) or a fixed set of
Monte Carlo candidate sets on that grid (MNL). Acting uses the exact features of the offered
candidates, so only V carries discretisation error.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from fedrec.agents.assortment import optimal_slates
from fedrec.envs.choc_kale_model import ChocKaleModel, ChocKaleParams


@dataclass(frozen=True, kw_only=True)
class PlannerConfig:
    """Discretisation of the dynamic programme (defaults: value error well below 0.1%)."""

    exposure_points: int = 121
    """Points of the uniform exposure grid."""
    feature_points: int = 200
    """Midpoints of the feature grid for the candidate expectation."""
    candidate_samples: int = 256
    """Monte Carlo candidate sets per step for MNL choice (common to every grid point)."""
    quadrature_points: int = 12
    """Gauss-Hermite nodes for the exposure innovation."""
    seed: int = 0
    """Seed of the Monte Carlo candidate sets."""


DEFAULT_PLANNER_CONFIG = PlannerConfig()


def exposure_grid(params: ChocKaleParams, points: int) -> np.ndarray:
    """``points`` uniform exposures over the range the user's exposure can reach: the stationary
    range 1/(1 - beta) of the drift plus six stationary innovation spreads, either side."""
    p = params
    spread = 6.0 * p.innovation_stddev / np.sqrt(1.0 - p.memory_discount**2)
    reach = 1.0 / (1.0 - p.memory_discount) + spread
    return np.linspace(-reach, reach, points)


class ValueTable:
    """V_t(e) for t = 0..T, and the item values it implies for any offered candidates."""

    def __init__(
        self, params: ChocKaleParams, config: PlannerConfig = DEFAULT_PLANNER_CONFIG
    ) -> None:
        self.params, self.config = params, config
        self.model = ChocKaleModel(params)
        p = params
        self.grid = exposure_grid(p, config.exposure_points)
        self._step = self.grid[1] - self.grid[0]
        nodes, node_weights = np.polynomial.hermite_e.hermegauss(config.quadrature_points)
        self._noise = p.innovation_stddev * nodes
        self._noise_weights = node_weights / node_weights.sum()
        self.values = np.zeros((p.time_budget + 1, config.exposure_points))
        self._solve()

    # -- public -------------------------------------------------------------------------------
    def value(self, t: np.ndarray | int, exposure: np.ndarray) -> np.ndarray:
        """V_t(e), interpolated; ``t`` per user (clamped to [0, T])."""
        t = np.clip(np.broadcast_to(np.asarray(t), np.shape(exposure)), 0, self.params.time_budget)
        return self._interp(self.values[t], np.asarray(exposure, dtype=np.float64))

    def item_values(self, t: np.ndarray, exposure: np.ndarray, features: np.ndarray) -> np.ndarray:
        """Qbar_t(e, x) for each user's offered candidates: ``features`` (B, N) -> (B, N)."""
        t = np.clip(np.asarray(t), 1, self.params.time_budget)
        exposure = np.asarray(exposure, dtype=np.float64)
        chocness = self.model.chocness(np.asarray(features, dtype=np.float64))
        reward = self.model.expected_engagement(
            self.model.satisfaction(exposure)[:, None], chocness
        )
        following = self.values[t - 1]  # (B, E)
        drift = self.params.memory_discount * exposure[:, None] - 2.0 * (chocness - 0.5)
        future = np.zeros_like(reward)
        for noise, weight in zip(self._noise, self._noise_weights, strict=True):
            future += weight * self._interp(following[:, None, :], drift + noise)
        return reward + future

    # -- internals ----------------------------------------------------------------------------
    def _interp(self, table: np.ndarray, points: np.ndarray) -> np.ndarray:
        """Row-wise linear interpolation of ``table[..., E]`` on the grid, clamped at the ends."""
        position = np.clip((points - self.grid[0]) / self._step, 0.0, len(self.grid) - 1.0)
        low = np.minimum(position.astype(np.int64), len(self.grid) - 2)
        frac = position - low
        table = np.broadcast_to(table, points.shape + table.shape[-1:])
        left = np.take_along_axis(table, low[..., None], axis=-1)[..., 0]
        right = np.take_along_axis(table, low[..., None] + 1, axis=-1)[..., 0]
        return left + frac * (right - left)

    def _solve(self) -> None:
        p, config, model = self.params, self.config, self.model
        features = (np.arange(config.feature_points) + 0.5) / config.feature_points
        chocness = model.chocness(features)
        reward = model.expected_engagement(model.satisfaction(self.grid)[:, None], chocness)
        drift = p.memory_discount * self.grid[:, None] - 2.0 * (chocness - 0.5)  # (E, G)
        if p.choice_model == "mnl":
            rng = np.random.default_rng(config.seed)
            sets = rng.integers(
                0, config.feature_points, (config.candidate_samples, p.num_candidates)
            )
            weights, null_weight = model.choice_weights(features[sets])  # (S, N)
        for t in range(1, p.time_budget + 1):
            previous = self.values[t - 1]
            future = sum(
                weight * self._interp(previous, drift + noise)
                for noise, weight in zip(self._noise, self._noise_weights, strict=True)
            )
            item_value = reward + future  # (E, G)
            if p.choice_model == "first_slot":
                self.values[t] = _expected_max(item_value, p.num_candidates)
                continue
            grid_size, samples = len(self.grid), config.candidate_samples
            q = item_value[:, sets].reshape(grid_size * samples, p.num_candidates)
            v = np.broadcast_to(weights, (grid_size, *weights.shape)).reshape(q.shape)
            null_value = np.repeat(previous, samples)
            slates = optimal_slates(
                v, q, p.slate_size, null_weight=null_weight, null_value=null_value
            )
            vs = np.take_along_axis(v, slates, axis=1)
            qs = np.take_along_axis(q, slates, axis=1)
            best = (null_weight * null_value + (vs * qs).sum(axis=1)) / (
                null_weight + vs.sum(axis=1)
            )
            self.values[t] = best.reshape(grid_size, samples).mean(axis=1)


def _expected_max(item_value: np.ndarray, num_candidates: int) -> np.ndarray:
    """E[max of N i.i.d. draws] per row, each draw uniform over the row's grid values."""
    ordered = np.sort(item_value, axis=1)
    grid_size = ordered.shape[1]
    cdf = (np.arange(grid_size + 1) / grid_size) ** num_candidates
    return ordered @ np.diff(cdf)


@functools.lru_cache(maxsize=16)
def value_table(
    params: ChocKaleParams, config: PlannerConfig = DEFAULT_PLANNER_CONFIG
) -> ValueTable:
    """Solved value tables are cached per (parameters, discretisation)."""
    return ValueTable(params, config)
