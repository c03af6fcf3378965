"""The metrics of one training run that ``fedrec eval`` summarises (definitions: the module
doc of :mod:`fedrec.eval.etror` and ``docs/metrics.md``): an :class:`Estimate` with its
t-interval, the learning curve and its metrics (optimal reward, plateau, ETROR), and the final
greedy evaluation (:class:`PolicyEval`, :func:`regret`, :class:`FinalEval`).

Every public name here is also importable from :mod:`fedrec.eval.etror`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from fedrec.eval.curves import cumulative_returns, moving_average
from fedrec.eval.stats import mean_ci, welch_ci

# ---------------------------------------------------------------------------------------------
# Estimates


@dataclass(frozen=True)
class Estimate:
    """A mean with the half-width of its confidence interval (NaN when there is none).

    ``n`` values went into the mean; ``missing`` more were NaN (e.g. seeds that never reached).
    """

    mean: float
    half_width: float = math.nan
    n: int = 1
    missing: int = 0

    def format(self, digits: int = 1, *, unit: str = "seeds") -> str:
        """``"mean ± hw"``, ``"mean"`` without a CI, ``"–"`` (``"never"`` for ETROR) without values.

        With missing values a suffix ``"(n/total <unit>)"`` says how many values were used.
        """
        if self.n == 0 or math.isnan(self.mean):
            text = "never" if self.missing and unit == "reached" else "–"
        elif math.isnan(self.half_width):
            text = f"{self.mean:.{digits}f}"
        else:
            text = f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"
        if self.missing:
            text += f" ({self.n}/{self.n + self.missing} {unit})"
        return text

    def __str__(self) -> str:
        return self.format()


def t_interval(values: ArrayLike, *, confidence: float = 0.95) -> Estimate:
    """Mean of the finite ``values`` with a two-sided t confidence interval (NaN for n < 2)."""
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    finite = array[np.isfinite(array)]
    n, missing = len(finite), len(array) - len(finite)
    if n == 0:
        return Estimate(math.nan, math.nan, 0, missing)
    mean, half_width = mean_ci(finite, confidence)
    return Estimate(mean, half_width, n, missing)


# ---------------------------------------------------------------------------------------------
# Curve metrics


def learning_curve(
    returns: ArrayLike, *, log_every: int = 20, window: int = 100
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's logged curve: ``(episodes, values)``, 1-based episode numbers.

    At each episode ``e`` with ``e % log_every == 0`` and ``e >= window``: the mean of the last
    ``window`` returns (episodes ``e - window + 1 .. e``). Empty arrays for runs shorter than
    ``window``.
    """
    _check_curve_options(log_every, window)
    values = np.asarray(returns, dtype=np.float64).reshape(-1)
    cumulative = cumulative_returns(values)
    return moving_average(lambda e: cumulative[e], len(values), log_every=log_every, window=window)


def _check_curve_options(log_every: int, window: int) -> None:
    if log_every < 1 or window < 1:
        raise ValueError(f"log_every and window must be >= 1, got {log_every}, {window}")


def threshold(target: float, *, tolerance: float = 0.01, relative: bool = True) -> float:
    """``target - tolerance`` (absolute) or ``target - tolerance * |target|`` (relative)."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    return target - (tolerance * abs(target) if relative else tolerance)


def episodes_to_reach(
    episodes: ArrayLike,
    values: ArrayLike,
    target: float,
    *,
    tolerance: float = 0.01,
    relative: bool = True,
) -> float:
    """The first logged episode whose curve value is >= ``threshold(target)``; NaN if none."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0 or not math.isfinite(target):
        return math.nan
    reached = np.flatnonzero(values >= threshold(target, tolerance=tolerance, relative=relative))
    return float(np.asarray(episodes)[reached[0]]) if len(reached) else math.nan


def plateau(episodes: ArrayLike, values: ArrayLike, *, tail: float = 0.2) -> float:
    """Mean of the curve points at episodes > (1 - tail) · last logged episode (>= 1 point)."""
    if not 0 < tail <= 1:
        raise ValueError(f"tail must be in (0, 1], got {tail}")
    episodes, values = np.asarray(episodes), np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return math.nan
    in_tail = episodes > (1 - tail) * episodes[-1]
    in_tail[-1] = True
    return float(values[in_tail].mean())


@dataclass(frozen=True, eq=False)
class CurveMetrics:
    """Metrics of one return series' learning curve (NaN where undefined or never reached)."""

    episodes: np.ndarray
    values: np.ndarray
    total_episodes: int
    optimal_reward: float
    optimal_episode: float
    plateau: float
    etror: float
    etror_plateau: float
    etror_target: float = math.nan


def run_metrics(
    returns: ArrayLike,
    *,
    log_every: int = 20,
    window: int = 100,
    tail: float = 0.2,
    tolerance: float = 0.01,
    relative: bool = True,
    target: float | None = None,
) -> CurveMetrics:
    """Curve, paper-style optimal reward, plateau and ETROR(s) of one series of episode returns."""
    returns = np.asarray(returns, dtype=np.float64).reshape(-1)
    episodes, values = learning_curve(returns, log_every=log_every, window=window)
    return curve_metrics(
        episodes,
        values,
        len(returns),
        tail=tail,
        tolerance=tolerance,
        relative=relative,
        target=target,
    )


def curve_metrics(
    episodes: np.ndarray,
    values: np.ndarray,
    total_episodes: int,
    *,
    tail: float = 0.2,
    tolerance: float = 0.01,
    relative: bool = True,
    target: float | None = None,
) -> CurveMetrics:
    """:func:`run_metrics` of a learning curve already computed (``total_episodes`` logged)."""
    if len(values) == 0:
        best, best_episode = math.nan, math.nan
    else:
        best, best_episode = float(values.max()), float(episodes[int(values.argmax())])
    level = plateau(episodes, values, tail=tail)
    options = {"tolerance": tolerance, "relative": relative}
    return CurveMetrics(
        episodes=episodes,
        values=values,
        total_episodes=total_episodes,
        optimal_reward=best,
        optimal_episode=best_episode,
        plateau=level,
        etror=episodes_to_reach(episodes, values, best, **options),
        etror_plateau=episodes_to_reach(episodes, values, level, **options),
        etror_target=math.nan
        if target is None
        else episodes_to_reach(episodes, values, target, **options),
    )


# ---------------------------------------------------------------------------------------------
# Final greedy evaluation


@dataclass(frozen=True, eq=False)
class PolicyEval:
    """One policy's held-out evaluation: mean, CI half-width and (optionally) the returns."""

    mean: float
    half_width: float = math.nan
    returns: np.ndarray | None = None

    @property
    def estimate(self) -> Estimate:
        return Estimate(self.mean, self.half_width)


def regret(
    planner: PolicyEval, agent: PolicyEval, *, confidence: float = 0.95
) -> tuple[Estimate, str]:
    """Planner mean - agent mean with its CI, and how the CI was obtained.

    Same-length ``returns`` lists are the same held-out episodes: paired t-interval. Different
    lengths: Welch's interval. No lists: half-widths combined in quadrature.
    """
    p, a = planner.returns, agent.returns
    if p is not None and a is not None and len(p) == len(a) and len(p) > 0:
        estimate = t_interval(p - a, confidence=confidence)
        return Estimate(planner.mean - agent.mean, estimate.half_width), "paired"
    if p is not None and a is not None and len(p) > 1 and len(a) > 1:
        half = welch_ci(p, a, confidence)[1]
        return Estimate(planner.mean - agent.mean, half), "welch"
    half = math.hypot(planner.half_width, agent.half_width)
    return Estimate(planner.mean - agent.mean, half), "quadrature"


@dataclass(frozen=True, eq=False)
class FinalEval:
    """Held-out evaluation of one return series: agent and reference policies, regret."""

    agent: PolicyEval | None = None
    references: Mapping[str, PolicyEval] = field(default_factory=dict)
    regret: Estimate | None = None
    regret_method: str = ""
    #: agent - random on the same held-out episodes (paired), the question for a platform
    #: without feedback: did it learn anything at all?
    gain_over_random: Estimate | None = None
    #: agent - top_x (the fixed highest-feature heuristic), paired: did it learn anything a
    #: fixed rule does not already do?
    gain_over_top_x: Estimate | None = None
    #: agent - bottom_x (the mirror heuristic, smallest feature first), paired likewise
    gain_over_bottom_x: Estimate | None = None
    #: agent - best_open_loop (the best schedule of fixed rules, a function of the step only),
    #: paired likewise: did it learn anything that no feedback-free policy does?
    gain_over_best_open_loop: Estimate | None = None
    #: agent - belief_planner (hidden user types: the model known, the user inferred), paired
    gain_over_belief_planner: Estimate | None = None
    #: multi-platform: agent_alone - top_x_alone, paired, each platform with every other platform
    #: serving random slates: one platform compared across methods with the others held fixed
    alone_over_top_x: Estimate | None = None
