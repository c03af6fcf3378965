"""Compaction of committed results: finished runs' per-episode logs replaced by curve summaries.

``python -m fedrec.eval.compact DIR...`` replaces the logs of the finished runs under the
folders (those with a final evaluation) by their summaries (:mod:`fedrec.eval.curves`), after
checking that every metric reads the same from both; ``--gzip-json`` also gzips
``final_eval.json`` and ``references.json`` (:func:`fedrec.eval.etror.load_run` reads
``*.json.gz`` when the plain file is absent; a tool that opens ``final_eval.json`` itself does
not, hence opt-in). It is for committed results: the training loop keeps writing the full
``episodes.csv`` (resume and users need it). ``--keep-log PATH`` keeps the logs of the runs
under PATH (gzipped) where a figure needs the raw rows; ``--skip PATH`` leaves them untouched.
"""

from __future__ import annotations

import argparse
import gzip
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.eval.curves import (
    CURVE_FILE,
    EVERY,
    GZIPPED,
    LOGS,
    gzip_bytes,
    summarise,
    write_curve_summary,
)
from fedrec.eval.etror import load_run


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def check_same_metrics(full: Any, compact: Any, *, options: Sequence[Mapping[str, Any]]) -> None:
    """Raise unless every curve metric of ``compact`` (a run read from its summary) is the one
    of ``full`` (the same run with its log), bit for bit, under each of ``options``
    (keyword arguments of :meth:`~fedrec.eval.etror.RunLog.curve_metrics`)."""
    if full.reported_series != compact.reported_series or full.series != compact.series:
        raise AssertionError(f"{full.path}: series differ ({full.series} vs {compact.series})")
    for name in full.reported_series:
        a, b = full.return_range(name), compact.return_range(name)
        if not all(_same(x, y) for x, y in zip(a, b, strict=True)):
            raise AssertionError(f"{full.path}: {name}: return range differs ({a} vs {b})")
        for kwargs in options:
            a, b = full.curve_metrics(name, **kwargs), compact.curve_metrics(name, **kwargs)
            same = (
                np.array_equal(a.episodes, b.episodes)
                and a.values.tobytes() == b.values.tobytes()
                and a.total_episodes == b.total_episodes
            )
            fields = ("optimal_reward", "optimal_episode", "plateau", "etror", "etror_plateau")
            fields += ("etror_target",)
            same = same and all(_same(getattr(a, f), getattr(b, f)) for f in fields)
            if not same:
                raise AssertionError(f"{full.path}: {name}: curve metrics differ under {kwargs}")


#: The metric options :func:`compact_run` checks (the defaults, and a coarser curve).
CHECKED_OPTIONS = (
    {},
    {"log_every": 100, "window": 200, "tail": 0.5, "tolerance": 5.0, "relative": False},
)


def _replace(
    old: Path | Sequence[Path], check: Callable[[], bool], *, written: Path | None = None
) -> None:
    """Move the ``old`` files aside, ``check`` that the run reads the same without them, then
    delete them; on any failure put them back (and delete the ``written`` replacement)."""
    files = [old] if isinstance(old, Path) else list(old)
    aside = [path.rename(path.with_name(path.name + ".compacting")) for path in files]
    try:
        if not check():
            raise AssertionError(f"{files[0].parent}: reads differently without {files[0].name}")
    except BaseException:
        for path, moved in zip(files, aside, strict=True):
            moved.rename(path)
        if written is not None:
            written.unlink()
        raise
    for moved in aside:
        moved.unlink()


def compact_run(
    run_dir: Path | str, *, keep_log: bool = False, gzip_json: bool = False, every: int = EVERY
) -> list[str]:
    """Compact one finished run directory in place; returns what was done, for the log.

    Writes ``curve.json.gz`` (unless ``keep_log``: then the log is kept, gzipped), checks that
    the run reads the same from it and removes the log; with ``gzip_json`` it also gzips
    ``final_eval.json`` and ``references.json`` (checked byte for byte). Nothing is removed before its replacement is
    written and checked.
    """
    run_dir = Path(run_dir)
    done = []
    full = load_run(run_dir)
    logs = [run_dir / name for name in LOGS if (run_dir / name).is_file()]
    if keep_log:
        plain = run_dir / LOGS[0]
        if plain.is_file():
            (run_dir / LOGS[1]).write_bytes(gzip_bytes(plain.read_bytes()))
            _replace(
                plain,
                lambda: load_run(run_dir).episodes.equals(full.episodes),
                written=run_dir / LOGS[1],
            )
            done.append(f"{LOGS[0]} -> {LOGS[1]}")
    elif logs:
        write_curve_summary(summarise(full, every=every), run_dir / CURVE_FILE)

        def same() -> bool:
            check_same_metrics(full, load_run(run_dir), options=CHECKED_OPTIONS)
            return True

        _replace(logs, same, written=run_dir / CURVE_FILE)
        done.append(f"{' + '.join(log.name for log in logs)} -> {CURVE_FILE}")
    for name in GZIPPED if gzip_json else ():
        plain = run_dir / name
        if plain.is_file():
            data = plain.read_bytes()
            packed = run_dir / f"{name}.gz"
            packed.write_bytes(gzip_bytes(data))
            if gzip.decompress(packed.read_bytes()) != data:
                raise AssertionError(f"{packed}: does not decompress to {plain}")
            plain.unlink()
            done.append(f"{name} -> {name}.gz")
    return done


def finished_runs(roots: Iterable[Path | str]) -> list[Path]:
    """The finished run directories under ``roots`` (``config.json`` and a final evaluation)."""
    found = set()
    for root in map(Path, roots):
        for config in [root / "config.json", *root.rglob("config.json")]:
            run = config.parent
            finals = (GZIPPED[0], f"{GZIPPED[0]}.gz")
            if config.is_file() and any((run / name).is_file() for name in finals):
                found.add(run)
    return sorted(found)


def compact(
    roots: Iterable[Path | str],
    *,
    skip: Sequence[Path | str] = (),
    keep_log: Sequence[Path | str] = (),
    gzip_json: bool = False,
    every: int = EVERY,
    log: Callable[[str], Any] = print,
) -> list[Path]:
    """Compact every finished run under ``roots`` (:func:`compact_run`); runs under a ``skip``
    path are left as they are, runs under a ``keep_log`` path keep their log (gzipped)."""

    def under(run: Path, paths: Sequence[Path | str]) -> bool:
        return any(run.resolve().is_relative_to(Path(p).resolve()) for p in paths)

    runs = [run for run in finished_runs(roots) if not under(run, skip)]
    for run in runs:
        done = compact_run(run, keep_log=under(run, keep_log), gzip_json=gzip_json, every=every)
        log(f"{run}: {'; '.join(done) if done else 'already compact'}")
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedrec.eval.compact",
        description="Replace the per-episode logs of the finished runs under DIR by curve "
        "summaries (curve.json.gz; every metric checked to read the same), optionally gzip "
        "their final_eval.json and references.json. For committed results only.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    command = sub.add_parser("compact", help="compact the finished runs under the folders")
    command.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    command.add_argument(
        "--skip", action="append", type=Path, default=[], metavar="PATH",
        help="leave the runs under PATH as they are (repeatable)",
    )  # fmt: skip
    command.add_argument(
        "--keep-log", action="append", type=Path, default=[], metavar="PATH",
        help="keep the per-episode logs of the runs under PATH, gzipped (repeatable)",
    )  # fmt: skip
    command.add_argument(
        "--gzip-json", action="store_true",
        help="also gzip final_eval.json and references.json (fedrec eval and load_run read "
        "*.json.gz; a tool that opens final_eval.json itself does not)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(missing)}")
    compact(args.dirs, skip=args.skip, keep_log=args.keep_log, gzip_json=args.gzip_json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
