"""ETROR, "optimal reward", plateau and final-evaluation metrics of training runs, over seeds.

A training run directory (written by the training loop) holds ``config.json``, ``episodes.csv``
(one row per completed training episode: ``episode,step,return,length``, or several return
columns ``return/<platform>`` for multi-platform runs) and, once finished, ``final_eval.json``
(the greedy agent and the reference policies on the same held-out episodes); a compacted run
(committed results) has its curve summary ``curve.json.gz`` instead of the log, which gives every
metric below bit for bit (:mod:`fedrec.eval.curves`). Every column named
``return`` or ``return/...`` is a *return series*; every metric is computed per series. A run with
two or more platform columns also has the derived series ``return/joint`` (:data:`JOINT_SERIES`).

Definitions (see ``docs/metrics.md`` for the reasoning):

* **Learning curve** (as logged by the FedSlate paper's code): at every episode ``e`` that is a
  multiple of ``log_every`` (20) and at least ``window`` (100), the mean of the returns of episodes
  ``e - window + 1 .. e``. Nothing is logged before ``window`` episodes exist (the paper's code
  would average the fewer episodes available; those points are the noisiest, so we omit them).
* **Optimal reward** (paper-style): the maximum of the curve. Biased upwards: it is the maximum of
  a noisy moving average (single-episode std ≈ 160, curve s.e. ≈ 16), so it exceeds the true
  plateau even for a flat curve. Reported for comparison with the papers only.
* **Plateau**: the mean of the curve points in the final ``tail`` (20%) of the run's episodes,
  i.e. at episodes > (1 - tail) · last logged episode (at least the last point). Less biased.
* **ETROR** (episodes to reach optimal reward): the first logged episode at which the curve is
  >= optimal reward - tolerance. Tolerance is relative (default 1% of |target|) or absolute.
  **ETROR to plateau**: the same with the plateau as target. **ETROR to target**: the same with
  a given absolute target (e.g. a paper's optimal reward). A curve that never reaches its target
  (or is empty: fewer than ``window`` episodes) has ETROR NaN; aggregation reports how many seeds
  reached instead of dropping the others silently.
* **Final greedy evaluation** (unbiased): ``final_eval.json``'s agent mean ± 95% CI over held-out
  episodes. **Regret** = planner mean - agent mean; when both policies' ``returns`` lists have the
  same length they were played on the same held-out episodes, so the CI is the paired t-interval
  of the per-episode differences; otherwise Welch's interval from the lists, or the two
  half-widths combined in quadrature when the lists are absent.
* **Joint return** (multi-platform): the platforms share one user, so the series
  ``return/joint`` is the user's total engagement: per training episode the sum of the platform
  returns, and per policy with every platform in ``final_eval.json`` (not the ``*_alone`` ones)
  the per-held-out-episode sum of its platform returns, with the t-interval of those sums.
* **Heuristics**: vs random, vs top-x and vs bottom-x are agent - reference, paired on the
  held-out episodes exactly as the regret (``top_x``/``bottom_x``: the n largest/smallest-feature
  candidates).
* **Greedy-slate diagnostics** (FedSlate family): ``final_eval.json``'s optional ``diagnostics``
  ``{platform: {"saturated": f, "top_x_slates": f}}`` (fractions in [0, 1]), summarised per group
  and platform as the mean over seeds with the min and max (:class:`SlateDiagnostics`).
* **Across seeds**: runs are grouped by config ``label`` (else by the config's agent, env id,
  env and agent kwargs, episodes, steps and num_envs: :data:`GROUP_KEYS`);
  each metric is the mean over seeds with a 95% t confidence interval (no CI for one seed, except
  the final-evaluation metrics, which then keep their held-out-episode CI).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from fedrec.eval.curves import (
    CURVE_FILE,
    CurveSummary,
    cumulative_returns,
    moving_average,
    read_curve_summary,
)
from fedrec.eval.stats import column_mean_ci, mean_ci, welch_ci

REQUIRED_COLUMNS = ("episode", "step", "length")
#: The derived series of a multi-platform run: the sum of its platform returns per user-episode.
JOINT_SERIES = "return/joint"
#: The config keys that define an experiment; runs that differ only elsewhere (seed) are seeds.
GROUP_KEYS = ("agent", "env_id", "env_kwargs", "agent_config", "episodes", "steps", "num_envs")
#: The paired differences of a :class:`FinalEval` (fields of :class:`SeriesSummary` too): one
#: policy minus another on the same held-out episodes of a run.
PAIRED = (
    "regret",
    "gain_over_random",
    "gain_over_top_x",
    "gain_over_bottom_x",
    "gain_over_best_open_loop",
    "gain_over_belief_planner",
    "alone_over_top_x",
)
#: The fractions of ``final_eval.json``'s ``diagnostics`` entry, per platform.
DIAGNOSTICS = ("saturated", "top_x_slates")


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


# ---------------------------------------------------------------------------------------------
# Run directories


@dataclass(frozen=True, eq=False)
class RunLog:
    """One training run directory, loaded: config, episode table, optional final evaluation.

    A compacted run (committed results) has no episode table (``episodes`` is None) but its
    curve summary (``curves``, :mod:`fedrec.eval.curves`): every metric reads the same from it;
    only :meth:`returns`, the per-episode returns themselves, is then unavailable.
    """

    path: Path
    config: Mapping[str, Any]
    episodes: pd.DataFrame | None
    final_eval: Mapping[str, Any] | None = None
    curves: CurveSummary | None = None

    @property
    def series(self) -> list[str]:
        """The return columns: ``return`` and/or ``return/<platform>``."""
        if self.episodes is None:
            return list(self._summary.columns)
        return [c for c in self.episodes.columns if c == "return" or c.startswith("return/")]

    @property
    def _summary(self) -> CurveSummary:
        if self.curves is None:
            raise ValueError(f"{self.path}: neither an episode table nor a curve summary")
        return self.curves

    @property
    def platform_series(self) -> list[str]:
        """The per-platform return columns ``return/<platform>`` (not ``return``, not joint)."""
        return [c for c in self.series if c.startswith("return/") and c != JOINT_SERIES]

    @property
    def joint(self) -> bool:
        """Whether ``return/joint`` is derived here: two or more platforms, no such column."""
        return len(self.platform_series) >= 2 and JOINT_SERIES not in self.series

    @property
    def reported_series(self) -> list[str]:
        """The series to summarise: the return columns, then ``return/joint`` when derived."""
        return self.series + ([JOINT_SERIES] if self.joint else [])

    @property
    def diagnostics(self) -> Mapping[str, Mapping[str, float]]:
        """The final evaluation's greedy-slate diagnostics per platform (:data:`DIAGNOSTICS`;
        FedSlate family only, empty when absent)."""
        if self.final_eval is None:
            return {}
        return self.final_eval.get("diagnostics") or {}

    def returns(self, series: str = "return") -> np.ndarray:
        """One series' training returns; ``return/joint`` is the row sum of the platform columns.

        :raises ValueError: the run is compacted (only its curve summary is kept).
        """
        if self.episodes is None:
            raise ValueError(
                f"{self.path}: its per-episode log was compacted into {CURVE_FILE}; the "
                "learning curve and every metric are there, the per-episode returns are not"
            )
        if series == JOINT_SERIES and self.joint:
            return self.episodes[self.platform_series].sum(axis=1).to_numpy(dtype=np.float64)
        return self.episodes[series].to_numpy(dtype=np.float64)

    def curve_metrics(
        self,
        series: str,
        *,
        log_every: int = 20,
        window: int = 100,
        tail: float = 0.2,
        tolerance: float = 0.01,
        relative: bool = True,
        target: float | None = None,
    ) -> CurveMetrics:
        """:func:`run_metrics` of one series: from the episode table, or from the curve summary
        of a compacted run (the same numbers, bit for bit)."""
        options = {"tail": tail, "tolerance": tolerance, "relative": relative, "target": target}
        if self.episodes is not None:
            return run_metrics(self.returns(series), log_every=log_every, window=window, **options)
        _check_curve_options(log_every, window)
        summary = self._summary
        episodes, values = summary.learning_curve(
            series, log_every=log_every, window=window, where=self.path
        )
        return curve_metrics(episodes, values, summary.rows, **options)

    def return_range(self, series: str) -> tuple[float, float, int]:
        """The smallest and largest finite training return of ``series`` (NaN without any) and
        how many returns are finite."""
        if self.episodes is None:
            curve = self._summary.series[series]
            return curve.low, curve.high, curve.finite
        returns = self.returns(series)
        finite = returns[np.isfinite(returns)]
        if not len(finite):
            return math.nan, math.nan, 0
        return float(finite.min()), float(finite.max()), len(finite)

    @property
    def agent(self) -> str:
        """The agent's name: a built-in name, or the class of ``module:Class`` / ``file.py:Class``."""
        return str(self.config["agent"]).rpartition(":")[2]

    @property
    def env_id(self) -> str:
        return str(self.config["env_id"])

    @property
    def seed(self) -> int | None:
        seed = self.config.get("seed")
        return None if seed is None else int(seed)

    @property
    def group_key(self) -> str:
        """Runs with the same key are seeds of one experiment: the label, else the config's
        :data:`GROUP_KEYS` (other keys, e.g. the seed or bookkeeping, do not split groups)."""
        if self.config.get("label"):
            return str(self.config["label"])
        relevant = {k: _without_seed(self.config.get(k)) for k in GROUP_KEYS}
        relevant = {k: v for k, v in relevant.items() if v not in (None, {})}  # absent == empty
        return json.dumps(relevant, sort_keys=True, default=str)

    def final(self, series: str, *, confidence: float = 0.95) -> FinalEval:
        """The final evaluation entries that belong to ``series`` (empty when absent)."""
        if self.final_eval is None:
            return FinalEval()
        policies = self.final_eval["policies"]
        if series == JOINT_SERIES and self.joint:
            found = {
                name: entry
                for name in policies
                if not name.endswith("_alone")  # the others serve random: no joint meaning
                and (entry := self._joint_entry(policies[name], confidence)) is not None
            }
        else:
            found = {
                name: entry
                for name in policies
                if (entry := _policy_entry(policies[name], series, self.path)) is not None
            }
        agent = found.pop("agent", None)
        result = (
            regret(found["planner"], agent, confidence=confidence)
            if (agent is not None and "planner" in found)
            else None
        )

        def over(reference: str) -> Estimate | None:
            """Agent - ``reference``, paired on the same held-out episodes (as the regret)."""
            if agent is None or reference not in found:
                return None
            return regret(agent, found[reference], confidence=confidence)[0]

        alone = (
            regret(found["agent_alone"], found["top_x_alone"], confidence=confidence)[0]
            if ("agent_alone" in found and "top_x_alone" in found)
            else None
        )
        return FinalEval(
            agent=agent,
            references=found,
            regret=None if result is None else result[0],
            regret_method="" if result is None else result[1],
            gain_over_random=over("random"),
            gain_over_top_x=over("top_x"),
            gain_over_bottom_x=over("bottom_x"),
            gain_over_best_open_loop=over("best_open_loop"),
            gain_over_belief_planner=over("belief_planner"),
            alone_over_top_x=alone,
        )

    def _joint_entry(self, entry: Any, confidence: float) -> PolicyEval | None:
        """A policy's joint return: per held-out episode the sum of its platform returns.

        The platforms of a policy are played on the same held-out episodes, so the sums are
        paired and the CI is the t-interval of the sums. ``None`` unless the policy has every
        platform; without equal-length ``returns`` lists only the mean (sum of means) is known.
        """
        parts = [_policy_entry(entry, series, self.path) for series in self.platform_series]
        if any(part is None for part in parts):
            return None
        lists = [part.returns for part in parts]
        if all(r is not None and len(r) == len(lists[0]) for r in lists) and len(lists[0]):
            sums = np.sum(lists, axis=0)
            estimate = t_interval(sums, confidence=confidence)
            return PolicyEval(estimate.mean, estimate.half_width, sums)
        return PolicyEval(float(sum(part.mean for part in parts)))


def _without_seed(value: Any) -> Any:
    """``value`` with every nested ``seed`` entry removed (seeds never split a group)."""
    if isinstance(value, Mapping):
        return {k: _without_seed(v) for k, v in value.items() if k != "seed"}
    return value


def _policy_entry(entry: Any, series: str, run: Path) -> PolicyEval | None:
    """The entry of one policy for ``series``: flat for ``return``, per platform otherwise."""
    where = run / "final_eval.json"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: a policy entry must be an object, got {entry!r:.60}")
    if "mean" not in entry:  # multi-platform: {"platform_a": {...}, ...}
        key = series.removeprefix("return/") if series != "return" else "total"
        entry = entry.get(key)
        if entry is None:
            return None
        if not isinstance(entry, Mapping) or "mean" not in entry:
            raise ValueError(f"{where}: entry {key!r} has no 'mean'")
    elif series != "return":
        return None
    try:
        returns = entry.get("returns")
        return PolicyEval(
            mean=float(entry["mean"]),
            half_width=float(entry.get("half_width", math.nan)),
            returns=None if returns is None else np.asarray(returns, dtype=np.float64),
        )
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: malformed policy entry ({error})") from None


def _read_json(path: Path) -> Any:
    """A JSON file, or a gzipped one (``*.json.gz``, as compacted runs keep them)."""
    try:
        if path.suffix == ".gz":
            try:
                return json.loads(gzip.decompress(path.read_bytes()))
            except (OSError, EOFError) as error:
                raise ValueError(f"{path}: not a gzip file ({error})") from None
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def run_file(run_dir: str | Path, name: str) -> Path:
    """``run_dir/name``, or ``run_dir/name.gz`` where only that exists (a compacted run keeps
    ``final_eval.json`` and ``references.json`` gzipped; a finished run is one where
    ``run_file(run, "final_eval.json").is_file()``).

    :raises ValueError: both exist (which one holds the run's record would be ambiguous).
    """
    plain, packed = Path(run_dir) / name, Path(run_dir) / f"{name}.gz"
    if plain.exists() and packed.exists():
        raise ValueError(f"{plain} and {packed.name} both exist: keep one")
    return packed if packed.exists() else plain


def load_run(path: str | Path) -> RunLog:
    """Load a run directory; errors name the file and what is wrong with it.

    A finished run's log may be archived as ``episodes.csv.gz`` (gzip; read when ``episodes.csv``
    is absent), or replaced by its curve summary ``curve.json.gz`` (read when neither exists;
    :mod:`fedrec.eval.curves`); ``final_eval.json`` and ``references.json`` may be gzipped
    (``*.json.gz``): the committed results are kept that way.

    :raises FileNotFoundError: the directory, ``config.json`` or ``episodes.csv`` is missing.
    :raises ValueError: a file is malformed (bad JSON, missing fields or columns, non-numbers).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"run directory {path} does not exist")
    if not path.is_dir():
        raise ValueError(f"{path} is not a run directory (expected a directory)")
    config_path, csv_path, final_path = (
        path / "config.json",
        path / "episodes.csv",
        run_file(path, "final_eval.json"),
    )
    if not csv_path.is_file() and (path / "episodes.csv.gz").is_file():
        csv_path = path / "episodes.csv.gz"  # pandas decompresses by the file name
    summary_path = path / CURVE_FILE
    compacted = not csv_path.is_file() and summary_path.is_file()
    for required in (config_path, *(() if compacted else (csv_path,))):
        if not required.is_file():
            raise FileNotFoundError(f"{required} is missing: {path} is not a training run")
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a JSON object")
    missing = [key for key in ("agent", "env_id") if key not in config]
    if missing:
        raise ValueError(f"{config_path}: missing {', '.join(missing)}")
    episodes = None if compacted else _read_episodes(csv_path)
    curves = read_curve_summary(summary_path) if compacted else None
    final = None
    if final_path.is_file():
        final = _read_json(final_path)
        if not isinstance(final, dict) or not isinstance(final.get("policies"), dict):
            raise ValueError(f"{final_path}: expected an object with a 'policies' object")
        for name, entry in final["policies"].items():
            _check_policy_entry(entry, f"{final_path}: policy {name!r}")
        if "diagnostics" in final:
            _check_diagnostics(final["diagnostics"], f"{final_path}: diagnostics")
        final = _with_added_references(final, run_file(path, "references.json"))
    run = RunLog(path=path, config=config, episodes=episodes, final_eval=final, curves=curves)
    for series in run.reported_series:  # parse final_eval.json's entries now, not when printing
        run.final(series)
    return run


def _with_added_references(final: dict[str, Any], path: Path) -> dict[str, Any]:
    """``final_eval`` plus the reference policies evaluated later on the same held-out episodes
    (``references.json``, written by ``fedrec eval --complete-references``): the same evaluation
    seed and episode count, and no policy the run already recorded."""
    if not path.is_file():
        return final
    added = _read_json(path)
    if not isinstance(added, dict) or not isinstance(added.get("policies"), dict):
        raise ValueError(f"{path}: expected an object with a 'policies' object")
    for key in ("seed", "episodes"):
        if added.get(key) != final.get(key):
            raise ValueError(
                f"{path}: {key} {added.get(key)!r} is not the final evaluation's "
                f"{final.get(key)!r}: these references were not evaluated on the run's episodes"
            )
    clash = sorted(set(added["policies"]) & set(final["policies"]))
    if clash:
        raise ValueError(f"{path}: {', '.join(clash)} already in final_eval.json")
    for name, entry in added["policies"].items():
        _check_policy_entry(entry, f"{path}: policy {name!r}")
    return {**final, "policies": {**final["policies"], **added["policies"]}}


def _check_policy_entry(entry: Any, where: str) -> None:
    """A policy entry is ``{"mean": ...}`` or ``{platform: {"mean": ...}, ...}``."""
    if isinstance(entry, Mapping) and "mean" in entry:
        return
    if not isinstance(entry, Mapping) or not entry:
        raise ValueError(f"{where}: expected an object with 'mean' or per-platform objects")
    for platform, value in entry.items():
        if not isinstance(value, Mapping) or "mean" not in value:
            raise ValueError(f"{where}: entry {platform!r} has no 'mean'")


def _check_diagnostics(entry: Any, where: str) -> None:
    """Diagnostics are ``{platform: {"saturated": f, "top_x_slates": f}, ...}``, f in [0, 1];
    each platform has at least one of the two (``saturated`` only for tanh heads)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected an object of per-platform objects, got {entry!r:.60}")
    for platform, values in entry.items():
        if not isinstance(values, Mapping):
            raise ValueError(f"{where}: entry {platform!r} must be an object, got {values!r:.60}")
        if not any(key in values for key in DIAGNOSTICS):
            raise ValueError(f"{where}: entry {platform!r} has none of {list(DIAGNOSTICS)}")
        for key in (k for k in DIAGNOSTICS if k in values):
            value = values[key]
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not 0 <= value <= 1:
                raise ValueError(
                    f"{where}: entry {platform!r}: {key!r} must be a fraction in [0, 1], "
                    f"got {value!r:.60}"
                )


def _read_episodes(csv_path: Path) -> pd.DataFrame:
    try:
        table = pd.read_csv(csv_path)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{csv_path}: empty file (expected a header line)") from None
    except pd.errors.ParserError as error:
        raise ValueError(f"{csv_path}: not a valid CSV ({error})") from None
    table.columns = [str(c).strip() for c in table.columns]
    series = [c for c in table.columns if c == "return" or c.startswith("return/")]
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing or not series:
        wanted = ", ".join(missing + ([] if series else ["return or return/<platform>"]))
        raise ValueError(
            f"{csv_path}: missing column(s) {wanted}; found {', '.join(table.columns) or 'none'}"
        )
    for column in (*REQUIRED_COLUMNS, *series):
        values = pd.to_numeric(table[column], errors="coerce")
        bad = np.flatnonzero(values.isna().to_numpy())
        if len(bad):
            raise ValueError(
                f"{csv_path}: column {column!r} has a missing or non-numeric value at data row "
                f"{bad[0] + 1} ({table[column].iloc[bad[0]]!r})"
            )
        table[column] = values
    if (np.diff(table["episode"].to_numpy()) <= 0).any():
        raise ValueError(f"{csv_path}: column 'episode' must be strictly increasing")
    return table


def find_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run directories among ``paths``; a directory of run directories expands to its runs.

    A path counts as a run when it holds ``episodes.csv`` or ``config.json``; otherwise its
    subdirectories that do are used (sorted). Anything else is returned as is, so that
    :func:`load_run` reports what is missing.
    """
    found: list[Path] = []
    for path in map(Path, paths):
        is_run = (path / "episodes.csv").exists() or (path / "config.json").exists()
        children = (
            sorted(p for p in path.iterdir() if (p / "config.json").is_file())
            if path.is_dir() and not is_run
            else []
        )
        found.extend(children or [path])
    return found


# ---------------------------------------------------------------------------------------------
# Aggregation over seeds


@dataclass(frozen=True, eq=False)
class SeriesSummary:
    """One return series of one group of runs, over seeds."""

    series: str
    seeds: int
    etror: Estimate
    etror_plateau: Estimate
    etror_target: Estimate
    optimal_reward: Estimate
    plateau: Estimate
    final: Estimate | None
    regret: Estimate | None
    references: Mapping[str, Estimate]
    per_run: Sequence[CurveMetrics]
    curve_episodes: np.ndarray
    curve_mean: np.ndarray
    curve_low: np.ndarray
    curve_high: np.ndarray
    band: str
    #: final greedy eval - random, paired on held-out episodes per seed, then across seeds
    gain_over_random: Estimate | None = None
    #: final greedy eval - top_x (the fixed highest-feature heuristic), paired likewise
    gain_over_top_x: Estimate | None = None
    #: final greedy eval - bottom_x (the mirror heuristic), paired likewise
    gain_over_bottom_x: Estimate | None = None
    #: final greedy eval - best_open_loop (the best schedule of fixed rules), paired likewise
    gain_over_best_open_loop: Estimate | None = None
    #: final greedy eval - belief_planner (hidden user types), paired likewise
    gain_over_belief_planner: Estimate | None = None
    #: multi-platform: the platform alone (others random) - top_x alone, paired likewise
    alone_over_top_x: Estimate | None = None
    #: every episode return and final-evaluation value of the series lies in [0, 1]: a rate such
    #: as HR@10 on a leave-one-out evaluation env (tables print it with 4 decimals, not 1)
    unit_interval: bool = False

    @property
    def planner(self) -> Estimate | None:
        return self.references.get("planner")

    @property
    def myopic(self) -> Estimate | None:
        """The oracle that maximises this step's expected engagement (Choc-vs-Kale runs)."""
        return self.references.get("myopic")

    @property
    def random(self) -> Estimate | None:
        return self.references.get("random")

    @property
    def top_x(self) -> Estimate | None:
        return self.references.get("top_x")

    @property
    def bottom_x(self) -> Estimate | None:
        return self.references.get("bottom_x")

    @property
    def best_open_loop(self) -> Estimate | None:
        return self.references.get("best_open_loop")

    @property
    def belief_planner(self) -> Estimate | None:
        """Knows the model, infers the user (hidden user types only)."""
        return self.references.get("belief_planner")

    @property
    def alone(self) -> Estimate | None:
        """The agent on this platform with every other platform serving random slates."""
        return self.references.get("agent_alone")


@dataclass(frozen=True)
class Spread:
    """Values over seeds: their mean, smallest and largest, and how many there are."""

    mean: float
    low: float
    high: float
    n: int = 1

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        array = np.asarray(values, dtype=np.float64)
        return cls(float(array.mean()), float(array.min()), float(array.max()), len(array))

    @classmethod
    def of_present(cls, entries: Sequence[Mapping[str, float]], key: str) -> Spread | None:
        """The spread of ``key`` over the entries that have it (None if none has)."""
        values = [entry[key] for entry in entries if key in entry]
        return cls.of(values) if values else None

    def format(self, digits: int = 3) -> str:
        """``"mean (low–high)"``; the mean alone for one value."""
        text = f"{self.mean:.{digits}f}"
        return text if self.n < 2 else f"{text} ({self.low:.{digits}f}–{self.high:.{digits}f})"


@dataclass(frozen=True)
class SlateDiagnostics:
    """One platform's greedy-slate diagnostics in one group, over the seeds that recorded them."""

    platform: str
    seeds: int
    saturated: Spread | None
    top_x_slates: Spread | None


def slate_diagnostics(runs: Sequence[RunLog]) -> dict[str, SlateDiagnostics]:
    """Per platform (in order of first appearance): the runs' final-evaluation diagnostics."""
    platforms = list(dict.fromkeys(p for run in runs for p in run.diagnostics))
    found = {}
    for platform in platforms:
        entries = [run.diagnostics[platform] for run in runs if platform in run.diagnostics]
        found[platform] = SlateDiagnostics(
            platform=platform,
            seeds=len(entries),
            saturated=Spread.of_present(entries, "saturated"),
            top_x_slates=Spread.of_present(entries, "top_x_slates"),
        )
    return found


@dataclass(frozen=True, eq=False)
class GroupSummary:
    """Runs of one experiment (same label or config) across seeds."""

    key: str
    label: str
    runs: Sequence[RunLog]
    series: Mapping[str, SeriesSummary]
    #: per platform, the greedy-slate diagnostics of the final evaluations (empty without any)
    diagnostics: Mapping[str, SlateDiagnostics] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int | None]:
        return [run.seed for run in self.runs]

    @property
    def agent(self) -> str:
        return self.runs[0].agent

    @property
    def env_id(self) -> str:
        return self.runs[0].env_id

    @property
    def env_kwargs(self) -> Mapping[str, Any]:
        return self.runs[0].config.get("env_kwargs") or {}


def _seed_estimate(estimates: Sequence[Estimate], *, confidence: float) -> Estimate | None:
    """Across-seed t-interval of per-run estimates; one run keeps its own (held-out) CI."""
    if not estimates:
        return None
    if len(estimates) == 1:
        return estimates[0]
    return t_interval([e.mean for e in estimates], confidence=confidence)


def _across_seeds(finals: Sequence[FinalEval], name: str, *, confidence: float) -> Estimate | None:
    """A per-run paired difference (the :class:`FinalEval` field ``name``) across seeds."""
    values = [getattr(f, name) for f in finals if getattr(f, name) is not None]
    return _seed_estimate(values, confidence=confidence)


def in_unit_interval(runs: Sequence[RunLog], series: str) -> bool:
    """Whether every value of ``series`` in ``runs`` lies in [0, 1]: all episode returns and every
    final-evaluation mean and return (HR@K, NDCG@K, click rates rather than summed rewards)."""
    ranges = [run.return_range(series) for run in runs if series in run.reported_series]
    values = []
    for run in runs:
        final = run.final(series)
        for policy in (final.agent, *final.references.values()):
            if policy is not None:
                values.append(np.asarray([policy.mean]))
                if policy.returns is not None:
                    values.append(policy.returns)
    finite = np.concatenate([v[np.isfinite(v)] for v in values] or [np.zeros(0)])
    if len(finite):
        ranges.append((float(finite.min()), float(finite.max()), len(finite)))
    present = [(low, high) for low, high, count in ranges if count]
    return bool(present) and all(low >= 0 and high <= 1 for low, high in present)


def mean_curve(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], *, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str]:
    """Mean curve over seeds with a band: ``(episodes, mean, low, high, band)``.

    Seeds are aligned on logged episodes (a shorter run contributes to its episodes only). The
    band is the 95% t-interval where at least 3 seeds have a point, min–max where 2 do, and
    absent (low = high = mean) where 1 does; ``band`` names what was drawn.
    """
    episodes = np.unique(np.concatenate([c[0] for c in curves] or [np.zeros(0, np.int64)]))
    table = np.full((len(curves), len(episodes)), np.nan)
    for row, (x, y) in enumerate(curves):
        table[row, np.searchsorted(episodes, x)] = y
    mean, half, count = column_mean_ci(table, confidence)
    low, high = mean.copy(), mean.copy()
    ci = count >= 3
    low[ci], high[ci] = mean[ci] - half[ci], mean[ci] + half[ci]
    two = count == 2
    if two.any():
        low[two], high[two] = np.nanmin(table[:, two], axis=0), np.nanmax(table[:, two], axis=0)
    kinds = [name for name, used in (("95% CI", ci.any()), ("min–max", two.any())) if used]
    return episodes, mean, low, high, " / ".join(kinds) or "none"


def _display_labels(groups: Mapping[str, Sequence[RunLog]]) -> dict[str, str]:
    """Readable group labels: the config label, else agent, env and the settings that differ."""

    def flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in config.items():
            if not prefix and (key not in GROUP_KEYS or key in ("agent", "env_id")):
                continue
            if key == "seed":
                continue
            if isinstance(value, Mapping):
                out.update(flat(value, f"{key}."))
            else:
                out[f"{prefix}{key}"] = json.dumps(value, default=str)
        return out

    flats = {key: flat(runs[0].config) for key, runs in groups.items()}
    keys = sorted({k for f in flats.values() for k in f})
    varying = [k for k in keys if len({f.get(k) for f in flats.values()}) > 1]
    labels = {}
    for key, runs in groups.items():
        if runs[0].config.get("label"):
            labels[key] = str(runs[0].config["label"])
            continue
        env = runs[0].env_id.split("/")[-1]
        extra = " ".join(f"{k.split('.')[-1]}={flats[key].get(k, '-')}" for k in varying)
        labels[key] = f"{runs[0].agent} {env}" + (f" {extra}" if extra else "")
    return labels


def aggregate(
    runs: Sequence[RunLog],
    *,
    log_every: int = 20,
    window: int = 100,
    tail: float = 0.2,
    tolerance: float = 0.01,
    relative: bool = True,
    target: float | None = None,
    confidence: float = 0.95,
) -> list[GroupSummary]:
    """Group runs by label (else config without seed) and summarise every return series.

    Per group and series: number of seeds, and mean ± ``confidence`` t-interval across seeds of
    ETROR (to optimal reward, to plateau, to ``target``), paper-style optimal reward, plateau,
    final greedy evaluation, regret vs planner and the reference policies' means. A derived
    ``return/joint`` comes after the other series. Groups keep the order of their first run.
    """
    grouped: dict[str, list[RunLog]] = {}
    for run in runs:
        grouped.setdefault(run.group_key, []).append(run)
    labels = _display_labels(grouped)
    options = {
        "log_every": log_every,
        "window": window,
        "tail": tail,
        "tolerance": tolerance,
        "relative": relative,
        "target": target,
    }
    summaries = []
    for key, members in grouped.items():
        members = sorted(members, key=lambda r: (r.seed is None, r.seed or 0, str(r.path)))
        names = list(dict.fromkeys(s for run in members for s in run.reported_series))
        names.sort(key=lambda name: name == JOINT_SERIES)  # after the platforms (stable)
        per_series = {}
        for series in names:
            having = [run for run in members if series in run.reported_series]
            curves = [run.curve_metrics(series, **options) for run in having]
            finals = [run.final(series, confidence=confidence) for run in having]

            def across(values: list[float]) -> Estimate:
                return t_interval(values, confidence=confidence)

            agents = [f.agent.estimate for f in finals if f.agent is not None]
            refs = sorted({name for f in finals for name in f.references})
            episodes, mean, low, high, band = mean_curve(
                [(c.episodes, c.values) for c in curves], confidence=confidence
            )
            per_series[series] = SeriesSummary(
                series=series,
                seeds=len(having),
                etror=across([c.etror for c in curves]),
                etror_plateau=across([c.etror_plateau for c in curves]),
                etror_target=across([c.etror_target for c in curves]),
                optimal_reward=across([c.optimal_reward for c in curves]),
                plateau=across([c.plateau for c in curves]),
                final=_seed_estimate(agents, confidence=confidence),
                references={
                    name: _seed_estimate(
                        [f.references[name].estimate for f in finals if name in f.references],
                        confidence=confidence,
                    )
                    for name in refs
                },
                per_run=curves,
                curve_episodes=episodes,
                curve_mean=mean,
                curve_low=low,
                curve_high=high,
                band=band,
                **{name: _across_seeds(finals, name, confidence=confidence) for name in PAIRED},
                unit_interval=in_unit_interval(having, series),
            )
        diagnostics = slate_diagnostics(members)
        summaries.append(GroupSummary(key, labels[key], members, per_series, diagnostics))
    return summaries
