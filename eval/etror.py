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

The module is split by job: the metrics of one run are in :mod:`fedrec.eval.metrics`, the
run-directory reader in :mod:`fedrec.eval.runs`, and the aggregation over seeds here; every public
name of the two is importable from here too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedrec.eval.metrics import (
    CurveMetrics,
    Estimate,
    FinalEval,
    PolicyEval,
    curve_metrics,
    episodes_to_reach,
    learning_curve,
    plateau,
    regret,
    run_metrics,
    t_interval,
    threshold,
)
from fedrec.eval.runs import (
    DIAGNOSTICS,
    GROUP_KEYS,
    JOINT_SERIES,
    REQUIRED_COLUMNS,
    RunLog,
    find_runs,
    load_run,
    run_file,
)
from fedrec.eval.stats import column_mean_ci

__all__ = [
    "DIAGNOSTICS",
    "GROUP_KEYS",
    "JOINT_SERIES",
    "PAIRED",
    "REQUIRED_COLUMNS",
    "CurveMetrics",
    "Estimate",
    "FinalEval",
    "GroupSummary",
    "PolicyEval",
    "RunLog",
    "SeriesSummary",
    "SlateDiagnostics",
    "Spread",
    "aggregate",
    "curve_metrics",
    "episodes_to_reach",
    "find_runs",
    "in_unit_interval",
    "learning_curve",
    "load_run",
    "mean_curve",
    "plateau",
    "regret",
    "run_file",
    "run_metrics",
    "slate_diagnostics",
    "t_interval",
    "threshold",
]

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
