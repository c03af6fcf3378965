"""Training run directories for ``fedrec eval``: :func:`load_run` reads and validates one
(``config.json``, ``episodes.csv`` or a compacted run's ``curve.json.gz``, ``final_eval.json``
and ``references.json``, plain or gzipped) into a :class:`RunLog`, whose methods give the metrics
of :mod:`fedrec.eval.metrics` per return series; :func:`find_runs` expands folders of runs.

Every public name here is also importable from :mod:`fedrec.eval.etror`.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedrec.eval.curves import CURVE_FILE, JOINT_SERIES, CurveSummary, read_curve_summary
from fedrec.eval.metrics import (
    CurveMetrics,
    Estimate,
    FinalEval,
    PolicyEval,
    _check_curve_options,
    curve_metrics,
    regret,
    run_metrics,
    t_interval,
)

REQUIRED_COLUMNS = ("episode", "step", "length")
#: The config keys that define an experiment; runs that differ only elsewhere (seed) are seeds.
GROUP_KEYS = ("agent", "env_id", "env_kwargs", "agent_config", "episodes", "steps", "num_envs")
#: The fractions of ``final_eval.json``'s ``diagnostics`` entry, per platform.
DIAGNOSTICS = ("saturated", "top_x_slates")


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


def read_run_json(path: Path) -> Any:
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
    config = read_run_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a JSON object")
    missing = [key for key in ("agent", "env_id") if key not in config]
    if missing:
        raise ValueError(f"{config_path}: missing {', '.join(missing)}")
    episodes = None if compacted else _read_episodes(csv_path)
    curves = read_curve_summary(summary_path) if compacted else None
    final = None
    if final_path.is_file():
        final = read_run_json(final_path)
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
    added = read_run_json(path)
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
