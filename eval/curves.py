"""Curve summaries: what the metrics need of a finished run's per-episode log.

A training run writes ``episodes.csv``, one row per episode; a 300,000-episode run's log is
megabytes. Every metric of :mod:`fedrec.eval.etror` reads the log through the learning curve
(the mean of the last ``window`` returns at every ``log_every``-th episode), which it computes
from the cumulative sums of the returns. A curve summary, ``curve.json.gz`` (:data:`CURVE_FILE`),
keeps those cumulative sums every :data:`EVERY` episodes, as float64 exactly as numpy computed
them, per return series (a multi-platform run's derived ``return/joint`` too), with the few
numbers the metrics need besides (:class:`CurveSummary`). :func:`fedrec.eval.etror.load_run`
reads it when the run has no ``episodes.csv``/``.gz``, and every metric, table and plot is then
the one the full log gives, bit for bit, for any ``window`` and ``log_every`` that are multiples
of :data:`EVERY` (the defaults are 100 and 20); other values are refused with the reason.

Replacing a finished run's log by its summary is :mod:`fedrec.eval.compact`'s job.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: The derived return series of a multi-platform run: per episode, the sum of its platforms' returns.
JOINT_SERIES = "return/joint"
#: The summary's file name in a run directory.
CURVE_FILE = "curve.json.gz"
#: The summary's ``format`` entry.
FORMAT = "fedrec curve summary 1"
#: Episodes between two stored cumulative sums (the default ``log_every``).
EVERY = 20
#: The per-episode logs a summary replaces (either may hold a run's log).
LOGS = ("episodes.csv", "episodes.csv.gz")
#: The JSON files compaction gzips (read as ``NAME.gz`` when ``NAME`` is absent).
GZIPPED = ("final_eval.json", "references.json")


def moving_average(
    cumulative: Callable[[np.ndarray], np.ndarray], total: int, *, log_every: int, window: int
) -> tuple[np.ndarray, np.ndarray]:
    """The learning curve from cumulative sums: ``cumulative(e)`` is the sum of the returns of
    episodes 1..e (0 at e = 0), for arrays of episode numbers; ``total`` episodes exist.

    At each episode ``e`` with ``e % log_every == 0`` and ``e >= window``:
    ``(cumulative(e) - cumulative(e - window)) / window``.
    """
    first = math.ceil(window / log_every) * log_every
    episodes = np.arange(first, total + 1, log_every, dtype=np.int64)
    return episodes, (cumulative(episodes) - cumulative(episodes - window)) / window


def cumulative_returns(returns: np.ndarray) -> np.ndarray:
    """``[0, r1, r1 + r2, ...]``: numpy's sequential float64 running sum, with 0 prepended."""
    return np.concatenate([[0.0], np.cumsum(np.asarray(returns, dtype=np.float64))])


@dataclass(frozen=True, eq=False)
class SeriesCurve:
    """One return series of a summary."""

    #: ``cumulative[k]``: the sum of the returns of episodes 1..k·every, k = 0 .. rows // every
    cumulative: np.ndarray
    #: the smallest and largest finite return (NaN without any) and how many returns are finite
    low: float
    high: float
    finite: int


@dataclass(frozen=True, eq=False)
class CurveSummary:
    """What the metrics need of a run's per-episode log (see the module docstring)."""

    #: number of logged episodes (rows of the log)
    rows: int
    #: the last row's ``episode`` and ``step`` (None for an empty log)
    last_episode: int | None
    last_step: int | None
    #: episodes between two stored cumulative sums
    every: int
    #: the log's return columns, in order (``return`` or ``return/<platform>``)
    columns: tuple[str, ...]
    #: every reported series: the columns, and a multi-platform run's derived ``return/joint``
    series: Mapping[str, SeriesCurve]

    def learning_curve(
        self, series: str, *, log_every: int, window: int, where: Path | str = "run"
    ) -> tuple[np.ndarray, np.ndarray]:
        """The curve :func:`fedrec.eval.etror.learning_curve` gives on the full log, bit for bit.

        :raises ValueError: ``log_every`` or ``window`` is not a multiple of :attr:`every`.
        """
        if log_every % self.every or window % self.every:
            raise ValueError(
                f"{where}: its per-episode log was compacted into {CURVE_FILE} (cumulative "
                f"returns every {self.every} episodes), so its curve needs log_every and window "
                f"that are multiples of {self.every}; got {log_every} and {window}"
            )
        grid = self.series[series].cumulative
        return moving_average(
            lambda e: grid[e // self.every], self.rows, log_every=log_every, window=window
        )


def summarise(run: Any, *, every: int = EVERY) -> CurveSummary:
    """The curve summary of a loaded run with its full log (a :class:`~fedrec.eval.etror.RunLog`)."""
    if run.episodes is None:
        raise ValueError(f"{run.path}: no per-episode log to summarise")
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    table = run.episodes
    series = {}
    for name in run.reported_series:
        returns = run.returns(name)
        finite = returns[np.isfinite(returns)]
        low, high = (float(finite.min()), float(finite.max())) if len(finite) else (math.nan,) * 2
        series[name] = SeriesCurve(cumulative_returns(returns)[::every], low, high, len(finite))
    last = None if table.empty else table.iloc[-1]
    return CurveSummary(
        rows=len(table),
        last_episode=None if last is None else int(last["episode"]),
        last_step=None if last is None else int(last["step"]),
        every=every,
        columns=tuple(run.series),
        series=series,
    )


def _to_json(summary: CurveSummary) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "rows": summary.rows,
        "last_episode": summary.last_episode,
        "last_step": summary.last_step,
        "every": summary.every,
        "columns": list(summary.columns),
        "series": {
            name: {
                "min": curve.low,
                "max": curve.high,
                "finite": curve.finite,
                "cumulative": curve.cumulative.tolist(),  # repr: float64 round-trips exactly
            }
            for name, curve in summary.series.items()
        },
    }


def gzip_bytes(data: bytes) -> bytes:
    """Deterministic gzip (no file name, time 0): the same input gives the same file."""
    return gzip.compress(data, compresslevel=9, mtime=0)


def write_curve_summary(summary: CurveSummary, path: Path | str) -> Path:
    """Write ``summary`` as gzipped JSON to ``path`` (a file, usually ``RUN/curve.json.gz``)."""
    path = Path(path)
    text = json.dumps(_to_json(summary), separators=(",", ":"))
    path.write_bytes(gzip_bytes(text.encode("utf-8")))
    return path


def read_curve_summary(path: Path | str) -> CurveSummary:
    """Read a ``curve.json.gz``; errors name the file and what is wrong with it."""
    path = Path(path)
    try:
        data = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, ValueError) as error:
        raise ValueError(f"{path}: not a gzipped JSON curve summary ({error})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a curve summary (expected format {FORMAT!r})")
    try:
        rows, every = int(data["rows"]), int(data["every"])
        columns = tuple(str(c) for c in data["columns"])
        series = {
            str(name): SeriesCurve(
                cumulative=np.asarray(entry["cumulative"], dtype=np.float64),
                low=float(entry["min"]),
                high=float(entry["max"]),
                finite=int(entry["finite"]),
            )
            for name, entry in data["series"].items()
        }
        last_episode, last_step = data["last_episode"], data["last_step"]
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"{path}: malformed curve summary ({error!r})") from None
    if every < 1 or rows < 0 or not columns or not set(columns) <= set(series):
        raise ValueError(f"{path}: malformed curve summary (rows, every or columns)")
    for name, curve in series.items():
        if curve.cumulative.shape != (rows // every + 1,):
            raise ValueError(
                f"{path}: series {name!r} has {curve.cumulative.size} cumulative sums, expected "
                f"{rows // every + 1} ({rows} rows, every {every})"
            )
    return CurveSummary(
        rows=rows,
        last_episode=None if last_episode is None else int(last_episode),
        last_step=None if last_step is None else int(last_step),
        every=every,
        columns=columns,
        series=series,
    )


# ---------------------------------------------------------------------------------------------
# Compaction
