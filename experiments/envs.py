"""``fedrec bench envs``: environment throughput of ``fedrec/ChocKale-v0`` against RecSim, on one core.

For each setting (N candidates, slate size n) it measures, with the fixed valid slate
``np.arange(n)`` as the action:

- RecSim's own ``long_term_satisfaction`` env (when ``recsim-no-tf`` is installed), steps/s;
- the single env through ``gymnasium.make`` (the standard wrappers) and unwrapped, steps/s;
- the native batched env (``gymnasium.make_vec``) at several numbers of users, user-steps/s.

Episodes restart as they end (``reset()`` for the single envs and RecSim, Gymnasium's NEXT_STEP
autoreset for the batched env), and the reset time counts. Every cell is measured several times
and the median is reported with the min-max range. :func:`run_benchmark` does the measuring and
returns a :class:`BenchmarkResult`; :func:`render` prints it; :func:`add_parser` and :func:`run`
are the command-line glue.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The targets are "on one core": keep BLAS/OpenMP pools to one thread. This only affects libraries
# loaded after this point (the `fedrec` command already defaults OMP_NUM_THREADS to 1 at start-up);
# the simulators do not call BLAS, so NumPy's element-wise kernels run on one thread regardless.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
for _name in THREAD_VARIABLES:
    os.environ.setdefault(_name, "1")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

import fedrec  # noqa: E402, F401  (registers the environments)
from fedrec.experiments import harness  # noqa: E402
from fedrec.experiments.harness import option  # noqa: E402

ENV_ID = "fedrec/ChocKale-v0"
DEFAULT_SETTINGS: tuple[tuple[int, int], ...] = ((10, 3), (100, 10), (500, 10))
DEFAULT_USERS: tuple[int, ...] = (1, 64, 1024, 4096)
DEFAULT_REPEATS = 5
DEFAULT_SECONDS = 0.5
QUICK_SETTINGS: tuple[tuple[int, int], ...] = ((10, 3),)
QUICK_USERS: tuple[int, ...] = (1, 64)
QUICK_REPEATS = 2
QUICK_SECONDS = 0.05

#: Implementations, in table order: key -> label.
IMPLEMENTATIONS = {
    "recsim": "RecSim LTS",
    "single": "fedrec make",
    "unwrapped": "fedrec unwrapped",
    "batched": "fedrec make_vec",
}
#: Target of the batched env: user-steps/s at (N, n) = (100, 10), at the largest batch measured.
BATCHED_TARGET = 1_000_000
BATCHED_TARGET_SETTING = (100, 10)
#: Target of the single env (gymnasium.make): this many times RecSim's steps/s, at every setting.
SINGLE_VS_RECSIM_TARGET = 3.0


def _setting(text: str) -> tuple[int, int]:
    try:
        n_cand, n_slate = (int(part) for part in text.replace("x", ",").split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected N,n (e.g. 100,10), got {text!r}") from error
    return n_cand, n_slate


@dataclass(frozen=True)
class BenchConfig:
    """What to measure and for how long (its fields are the options of ``fedrec bench envs``)."""

    settings: tuple[tuple[int, int], ...] = option(DEFAULT_SETTINGS, parse=_setting, metavar="N,n")
    """(num_candidates, slate_size) pairs (default: 10,3 100,10 500,10)"""
    users: tuple[int, ...] = option(DEFAULT_USERS, metavar="B")
    """numbers of users of the batched env (default: 1 64 1024 4096)"""
    repeats: int = DEFAULT_REPEATS
    """runs per cell"""
    seconds: float = option(DEFAULT_SECONDS, exclusive="budget")
    """seconds per run"""
    steps: int | None = option(None, exclusive="budget")
    """exact step() calls per run, instead of seconds"""
    warmup_steps: int = option(20, cli=False)
    seed: int = option(0, cli=False)
    include_recsim: bool = option(True, flag="--recsim")
    """measure RecSim's environment too (--no-recsim skips it)"""

    def __post_init__(self) -> None:
        if not self.settings:
            raise ValueError("at least one (num_candidates, slate_size) setting is needed")
        for n_cand, n_slate in self.settings:
            if not 1 <= n_slate <= n_cand:
                raise ValueError(f"setting ({n_cand}, {n_slate}) needs 1 <= slate_size <= N")
        if not self.users or min(self.users) < 1:
            raise ValueError(f"numbers of users must be >= 1, got {self.users}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.steps is None and not self.seconds > 0:
            raise ValueError(f"seconds must be > 0, got {self.seconds}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


@dataclass(frozen=True)
class Cell:
    """Repeated measurements of one implementation at one setting and number of users."""

    implementation: str
    """A key of :data:`IMPLEMENTATIONS`."""
    num_candidates: int
    slate_size: int
    num_users: int
    steps: tuple[int, ...]
    """``step`` calls per repetition (each advances ``num_users`` users)."""
    seconds: tuple[float, ...]
    """Wall time per repetition."""

    @property
    def rates(self) -> tuple[float, ...]:
        """User-steps per second of each repetition (steps/s for a single env)."""
        return tuple(s * self.num_users / t for s, t in zip(self.steps, self.seconds, strict=True))

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def minimum(self) -> float:
        return min(self.rates)

    @property
    def maximum(self) -> float:
        return max(self.rates)

    @property
    def label(self) -> str:
        return IMPLEMENTATIONS[self.implementation]


@dataclass(frozen=True)
class TargetCheck:
    """One throughput target and whether this run met it (None: not measured)."""

    name: str
    setting: tuple[int, int]
    measured: float | None
    required: float
    unit: str

    @property
    def met(self) -> bool | None:
        return None if self.measured is None else self.measured >= self.required


@dataclass
class BenchmarkResult:
    """Everything one run measured, with its configuration and environment."""

    config: BenchConfig
    cells: list[Cell] = field(default_factory=list)
    recsim: str = "not requested"
    """RecSim's version, or why it was not measured."""
    threads: str = ""
    machine: str = ""

    def find(
        self, implementation: str, setting: tuple[int, int], num_users: int = 1
    ) -> Cell | None:
        """The cell of an implementation at a setting (and number of users), if measured."""
        for cell in self.cells:
            if (
                cell.implementation == implementation
                and (cell.num_candidates, cell.slate_size) == tuple(setting)
                and cell.num_users == num_users
            ):
                return cell
        return None

    def vs_recsim(self, cell: Cell) -> float | None:
        """Median throughput of ``cell`` over RecSim's at the same setting."""
        recsim = self.find("recsim", (cell.num_candidates, cell.slate_size))
        return None if recsim is None else cell.median / recsim.median

    def targets(self) -> list[TargetCheck]:
        """The project's throughput targets, evaluated on this run."""
        checks = []
        largest = max(self.config.users)
        batched = self.find("batched", BATCHED_TARGET_SETTING, largest)
        checks.append(
            TargetCheck(
                f"make_vec, {largest} users",
                BATCHED_TARGET_SETTING,
                None if batched is None else batched.median,
                BATCHED_TARGET,
                "user-steps/s",
            )
        )
        for setting in self.config.settings:
            single = self.find("single", setting)
            ratio = None if single is None else self.vs_recsim(single)
            checks.append(
                TargetCheck("make (single) / RecSim", setting, ratio, SINGLE_VS_RECSIM_TARGET, "x")
            )
        return checks

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: configuration, raw timings, medians and target checks."""
        cells = []
        for cell in self.cells:
            row = dataclasses.asdict(cell)
            row.update(
                label=cell.label,
                rates=list(cell.rates),
                median=cell.median,
                min=cell.minimum,
                max=cell.maximum,
                vs_recsim=self.vs_recsim(cell),
            )
            cells.append(row)
        targets = [{**dataclasses.asdict(t), "met": t.met} for t in self.targets()]
        return {
            "config": dataclasses.asdict(self.config),
            "recsim": self.recsim,
            "threads": self.threads,
            "machine": self.machine,
            "cells": cells,
            "targets": targets,
        }


# -- the measurements -----------------------------------------------------------------------------


def _load_recsim() -> tuple[Any, str]:
    """RecSim's ``long_term_satisfaction`` module and its version, or (None, reason)."""
    try:
        from importlib.metadata import version

        # Old gym prints an "unmaintained" notice to stderr on import.
        with contextlib.redirect_stderr(io.StringIO()):
            from recsim.environments import long_term_satisfaction
        return long_term_satisfaction, f"recsim-no-tf {version('recsim-no-tf')}"
    except Exception as error:  # ImportError, or an old dependency failing on import
        return None, f"not measured ({type(error).__name__}: {error}; pip install recsim-no-tf six)"


def _time_loop(step: Callable[[], None], config: BenchConfig) -> tuple[int, float]:
    """Call ``step`` for ``config.steps`` calls or ``config.seconds``; (calls, seconds)."""
    clock = time.perf_counter
    if config.steps is not None:
        start = clock()
        for _ in range(config.steps):
            step()
        return config.steps, clock() - start
    count, start, deadline = 0, clock(), clock() + config.seconds
    while True:
        for _ in range(8):  # check the clock every few calls
            step()
        count += 8
        now = clock()
        if now >= deadline:
            return count, now - start


def _stepper_fedrec_single(setting: tuple[int, int], seed: int, *, wrapped: bool) -> Callable:
    n_cand, n_slate = setting
    env = gym.make(ENV_ID, num_candidates=n_cand, slate_size=n_slate)
    if not wrapped:
        env = env.unwrapped
    env.reset(seed=seed)
    slate = np.arange(n_slate)

    def step() -> None:
        _, _, terminated, truncated, _ = env.step(slate)
        if terminated or truncated:
            env.reset()

    return step


def _stepper_fedrec_batched(setting: tuple[int, int], users: int, seed: int) -> Callable:
    n_cand, n_slate = setting
    env = gym.make_vec(ENV_ID, num_envs=users, num_candidates=n_cand, slate_size=n_slate)
    env.reset(seed=seed)
    slates = np.tile(np.arange(n_slate), (users, 1))

    def step() -> None:
        env.step(slates)  # NEXT_STEP autoreset restarts finished users

    return step


def _stepper_recsim(lts: Any, setting: tuple[int, int], seed: int) -> Callable:
    n_cand, n_slate = setting
    env = lts.create_environment(
        {"num_candidates": n_cand, "slate_size": n_slate, "resample_documents": True, "seed": seed}
    )
    np.random.seed(seed)  # noqa: NPY002  (RecSim's Gaussian noise uses the global RNG)
    env.reset()
    slate = np.arange(n_slate)

    def step() -> None:
        _, _, done, _ = env.step(slate)
        if done:
            env.reset()

    return step


def _plan(config: BenchConfig, recsim_available: bool) -> list[tuple[str, tuple[int, int], int]]:
    """The cells to measure, in order: (implementation, setting, users)."""
    plan = []
    for setting in config.settings:
        if recsim_available:
            plan.append(("recsim", setting, 1))
        plan += [("single", setting, 1), ("unwrapped", setting, 1)]
        plan += [("batched", setting, users) for users in config.users]
    return plan


def _thread_summary() -> str:
    values = ", ".join(f"{name}={os.environ.get(name, 'unset')}" for name in THREAD_VARIABLES[:3])
    try:
        cpus = f"{len(os.sched_getaffinity(0))} CPU(s) allowed"
    except AttributeError:  # not Linux
        cpus = f"{os.cpu_count()} CPU(s)"
    return f"one thread ({values}); {cpus}"


def run_benchmark(
    config: BenchConfig | None = None,
    *,
    progress: Callable[[str], None] | None = None,
) -> BenchmarkResult:
    """Measure every cell of ``config`` and return the raw results.

    :param progress: called with a short description before each measurement (for a progress bar);
        :func:`count_measurements` gives the total number of calls.
    """
    config = config or BenchConfig()
    lts, recsim_status = _load_recsim() if config.include_recsim else (None, "not requested")
    result = BenchmarkResult(
        config=config,
        recsim=recsim_status,
        threads=_thread_summary(),
        machine=f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"NumPy {np.__version__}, Gymnasium {gym.__version__}",
    )
    saved_rng = np.random.get_state()  # noqa: NPY002  (RecSim reseeds the global RNG)
    try:
        for implementation, setting, users in _plan(config, lts is not None):
            if implementation == "recsim":
                step = _stepper_recsim(lts, setting, config.seed)
            elif implementation == "batched":
                step = _stepper_fedrec_batched(setting, users, config.seed)
            else:
                step = _stepper_fedrec_single(
                    setting, config.seed, wrapped=implementation == "single"
                )
            for _ in range(config.warmup_steps):
                step()
            steps, seconds = [], []
            for repeat in range(config.repeats):
                if progress is not None:
                    progress(
                        f"{IMPLEMENTATIONS[implementation]} N={setting[0]} n={setting[1]}"
                        f" users={users} [{repeat + 1}/{config.repeats}]"
                    )
                count, elapsed = _time_loop(step, config)
                steps.append(count)
                seconds.append(elapsed)
            result.cells.append(
                Cell(implementation, setting[0], setting[1], users, tuple(steps), tuple(seconds))
            )
    finally:
        np.random.set_state(saved_rng)  # noqa: NPY002
    return result


def count_measurements(config: BenchConfig, recsim_available: bool = True) -> int:
    """How many times :func:`run_benchmark` calls ``progress``."""
    return len(_plan(config, recsim_available)) * config.repeats


# -- the table --------------------------------------------------------------------------------------


def _rate(value: float) -> str:
    """A rate with 3 significant digits and a k/M suffix (999.6k prints as 1M)."""
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= 0.9995 * scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def render(result: BenchmarkResult, console: Any | None = None) -> None:
    """Print the throughput table and the target checks with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    config = result.config
    how = f"{config.steps} steps" if config.steps is not None else f"{config.seconds:g} s"
    table = Table(
        title=f"Environment throughput: {ENV_ID} vs RecSim",
        caption=f"median (min–max) of {config.repeats} runs of {how}; action np.arange(n); "
        "episodes restart as they end. RecSim LTS: recsim.environments.long_term_satisfaction; "
        "make: gymnasium.make (standard wrappers); make_vec: the native batched env",
    )
    table.add_column("N", justify="right")
    table.add_column("n", justify="right")
    table.add_column("environment")
    table.add_column("users", justify="right")
    table.add_column("user-steps/s", justify="right", style="bold")
    table.add_column("min–max", justify="right")
    table.add_column("vs RecSim", justify="right")
    for index, cell in enumerate(result.cells):
        first = index == 0 or (
            result.cells[index - 1].num_candidates,
            result.cells[index - 1].slate_size,
        ) != (cell.num_candidates, cell.slate_size)
        ratio = result.vs_recsim(cell)
        table.add_row(
            str(cell.num_candidates) if first else "",
            str(cell.slate_size) if first else "",
            cell.label,
            str(cell.num_users),
            _rate(cell.median),
            f"{_rate(cell.minimum)}–{_rate(cell.maximum)}",
            "–" if ratio is None else f"{ratio:.2f}x",
            end_section=index + 1 < len(result.cells)
            and (result.cells[index + 1].num_candidates, result.cells[index + 1].slate_size)
            != (cell.num_candidates, cell.slate_size),
        )
    console.print(table)
    console.print(f"Threads: {result.threads}. RecSim: {result.recsim}.")
    console.print(f"Machine: {result.machine}.")

    targets = Table(title="Targets")
    targets.add_column("target")
    targets.add_column("N, n", justify="right")
    targets.add_column("measured", justify="right")
    targets.add_column("required", justify="right")
    targets.add_column("met")
    for check in result.targets():
        if check.unit == "x":
            measured = "–" if check.measured is None else f"{check.measured:.2f}x"
            required = f">= {check.required:g}x"
        else:
            measured = "–" if check.measured is None else _rate(check.measured)
            required = f">= {_rate(check.required)}"
        met = {True: "[green]yes[/]", False: "[red]no[/]", None: "not measured"}[check.met]
        targets.add_row(
            check.name, f"{check.setting[0]}, {check.setting[1]}", measured, required, met
        )
    console.print(targets)


# -- command line -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvsRun:
    """How ``fedrec bench envs`` runs and reports (besides what it measures)."""

    pin_cpu: int | None = option(None, metavar="CPU")
    """pin the process to this CPU (Linux)"""
    json: str | None = option(None, metavar="PATH")
    """save the raw results as JSON"""
    strict: bool = False
    """exit with status 1 when a target is missed"""


#: ``--quick``: the defaults it shortens (options given on the command line win).
QUICK = {
    "settings": QUICK_SETTINGS,
    "users": QUICK_USERS,
    "repeats": QUICK_REPEATS,
    "seconds": QUICK_SECONDS,
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``envs`` under ``fedrec bench``."""
    harness.add_bench_parser(
        subparsers,
        "envs",
        BenchConfig,
        EnvsRun,
        help="environment throughput, fedrec vs RecSim",
        description="Steps per second of fedrec/ChocKale-v0 (single env and batched) and of "
        "RecSim's long_term_satisfaction env (when recsim-no-tf is installed), on one thread. "
        "A default run takes about a minute.",
        handler=run,
        quick="a few seconds: N,n = 10,3, 1 and 64 users, 2 runs",
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The :class:`BenchConfig` of parsed command-line options (``--quick`` sets the defaults)."""
    return harness.config_from_args(
        BenchConfig, args, **(QUICK if getattr(args, "quick", False) else {})
    )


@contextlib.contextmanager
def _pinned(cpu: int | None) -> Iterator[None]:
    """Restrict the process to one CPU for the duration (no-op when ``cpu`` is None)."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def check_json_out(path: Path, config: BenchConfig) -> None:
    """Refuse (before measuring) a ``--json`` file that holds another configuration's results."""
    if not path.exists():
        return
    saved = harness.read_cached(
        path, harness.record({"config": harness.record({})}), "fedrec bench envs JSON"
    )
    harness.check_same(path, saved["config"], dataclasses.asdict(config))


def run(args: argparse.Namespace) -> int:
    """``fedrec bench envs``: measure, print the table, optionally save JSON."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    config = config_from_args(args)
    output = harness.config_from_args(EnvsRun, args)
    if output.json:
        check_json_out(Path(output.json), config)
    from fedrec.eval.tables import current_view, tables_from_rich

    console = Console(stderr=current_view().csv_to_stdout)
    recsim_available = config.include_recsim and _load_recsim()[0] is not None
    total = count_measurements(config, recsim_available)
    with (
        _pinned(output.pin_cpu),
        Progress(
            "{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar,
    ):
        task = bar.add_task("starting", total=total)

        done = iter(range(total))

        def advance(description: str) -> None:
            bar.update(task, description=description, completed=next(done, total))

        result = run_benchmark(config, progress=advance)
        if output.pin_cpu is not None:
            result.threads += f"; pinned to CPU {output.pin_cpu}"
    tables = tables_from_rich(lambda collector: render(result, collector))
    for table, key in zip(tables, ("throughput", "targets"), strict=False):
        table.key = key
    for previous, row in itertools.pairwise(tables[0].rows if tables else []):
        row[:2] = [cell or above for cell, above in zip(row[:2], previous[:2], strict=True)]
    harness.show_tables(tables, wide=lambda: render(result, console))
    if output.json:
        with open(output.json, "w", encoding="utf-8") as handle:
            json.dump(result.to_json(), handle, indent=2)
        console.print(f"Raw results saved to {output.json}")
    missed = [check for check in result.targets() if check.met is False]
    return 1 if output.strict and missed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark without the ``fedrec`` console script (``python -m fedrec.experiments.envs``)."""
    parser = argparse.ArgumentParser(prog="fedrec bench")
    add_parser(parser.add_subparsers(dest="benchmark", required=True))
    args = parser.parse_args(["envs", *(argv if argv is not None else sys.argv[1:])])
    return args.handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
