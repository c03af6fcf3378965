"""How the cost of federated NCF training grows with the clients per round and the population.

Usage: ``python benchmarks/fedncf_scale.py [--models gmf neumf] [--users 943 10000 100000]
[--clients-per-round 20 100 1000] [--rounds 5] [--warmup 1] [--repeats 3]
[--out PATH] [--overwrite] [--in-process] [--quick]``: writes the Markdown report to ``--out``
(default ``runs/benchmarks/fedncf_scale/scale.md``; the committed one is
``results/fedncf/scale.md``) and the CSV beside it; an earlier run's files are replaced only with
``--overwrite``.

**Data.** Every point trains on a synthetic data set shaped like MovieLens-100K and scaled to
``U`` users (:func:`synthetic_clients`): 1,682 items; per-user counts from 20 + a log-normal
(σ = 1), clipped to 737, with a mean of about 106 (ML-100K: min 20, max 737, mean 106); items
picked without replacement with Zipf-like popularity (weight ∝ rank^-0.8, as in
:mod:`fedrec.envs.datasets.synthetic`), ranks shuffled over item ids; each user's held-out item is
one of its positives at random. The arrays are built in memory as a :class:`ClientData` (what
FedNCF trains from), with no files and no preprocessing, so a 100,000-user set takes seconds.

**What is timed.** The FedNCF aggregation round exactly as ``FedNCFTrainer.step`` runs it with
the default :class:`FedNCFConfig` (4 negatives per positive, 2 local epochs, batch 64, Adam
lr 1e-3, fresh client optimisers, MF-FedAvg, batched simulation): local sampling
(:func:`sample_round`), the batched client training (:func:`train_round_batched`), the write-back
of the private user rows and the aggregation. Clients are chosen as the trainer does (a fresh
permutation of all users per global round, split into ``ceil(U / c)`` groups). The selection,
evaluation and checkpoints are not timed. Each point trains ``--warmup`` untimed rounds, then
the same ``--rounds`` aggregation rounds (same clients, same local samples) ``--repeats``
times; a repeat's value is its mean seconds per round and the table shows the median over
repeats (min-max). Seconds per global round are that median x ``ceil(U / c)`` (the trainer's
aggregation rounds per global round). The *work* of a round is its number of local training
examples, sum over its clients of n_k x local epochs (n_k = 5 x training positives); the
table's s / 1k examples says whether time grows linearly in the work. The trainer splits the
users into ``ceil(U / c)`` near-equal groups, so a round can hold fewer than ``c`` clients (943
users at c = 100: groups of 94-95); when ``c`` exceeds ``U`` every user trains in every round.
The table shows the actual group size where it differs from ``c``.

**Memory.** By default every point runs in a fresh subprocess and reports the peak resident set
size of that process (``VmHWM`` from ``/proc/self/status``, or ``ru_maxrss`` where there is no
``/proc``): the peak RSS of a process never goes down, so points run one after another in one
process would all report the largest so far. The child reads ``VmHWM`` rather than
``ru_maxrss`` because Linux carries the parent's high-water mark into ``ru_maxrss`` across
fork/exec, while ``VmHWM`` belongs to the child's own address space. The high-water mark is
reset (``/proc/self/clear_refs``, Linux >= 4.0) once the data set is built, so the peak is that
of training, not of the data builder's temporaries (where the kernel refuses the reset, the
peak includes them). Columns: the data set's arrays (exact bytes); the peak RSS in training and,
in brackets, its excess over the RSS right after the imports (data set, model state, training);
and the peak of Python/NumPy allocations during one extra, untimed aggregation round, measured
with ``tracemalloc`` (the round's working set; tensors that PyTorch allocates itself are not
traced, but they are O(items) here, and tracemalloc's overhead is why that round is not timed).
``--in-process`` (for tests) runs all points in this process (the high-water mark is still
reset after each data build); its RSS figures then include whatever the process already held.

**Global rounds.** ``ceil(U / c) x median`` is how ``benchmarks/fedncf_speed.py`` extrapolates FedNeuMF;
with few clients per round the timed rounds' work varies a lot (long-tailed user activity), so the
table also gives the *work-scaled* estimate, s per example x the examples of a whole global round
(every user once), which is the better one wherever time is linear in the work.

Timings on a shared machine vary: read the min-max range. Everything runs with one thread.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from fedrec.agents.ncf import NCF, NCFConfig
from fedrec.envs.datasets.synthetic_clients import (  # noqa: F401  (re-exported for the tests)
    ML100K_ITEMS,
    ML100K_MAX,
    ML100K_MEAN,
    ML100K_MIN,
    POPULARITY_EXPONENT,
    Shape,
    synthetic_clients,
)
from fedrec.experiments.harness import claim_outputs, run_script, script_out
from fedrec.federation.registry import make_aggregator
from fedrec.train.fedncf import (
    ClientData,
    FedNCFConfig,
    round_rng,
    sample_round,
    train_round_batched,
)

#: Time per example within this factor across all points counts as "roughly linear".
LINEAR_TOLERANCE = 1.3
DEFAULT_OUT = script_out("fedncf_scale", None, "scale.md")


#: The tiny shape of ``--quick``.
QUICK_SHAPE = Shape(num_items=200, mean_interactions=12.0, min_interactions=4, max_interactions=60)


# ------------------------------------------------------------------------------------------------
# Synthetic data


# ------------------------------------------------------------------------------------------------
# Memory


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_mib() -> float:
    """This process's resident set size now (0 where /proc is missing)."""
    return (_proc_status_kib("VmRSS") or 0) / 1024


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM; ru_maxrss where there is no /proc)."""
    kib = _proc_status_kib("VmHWM")
    if kib is None:
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        kib = maxrss // 1024 if sys.platform == "darwin" else maxrss  # bytes on macOS
    return kib / 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")
    except OSError:
        return False
    return True


# ------------------------------------------------------------------------------------------------
# One point


@dataclass(frozen=True)
class PointSpec:
    """One measurement: a model, a population and a number of clients per round."""

    model: str
    users: int
    clients_per_round: int
    rounds: int
    warmup: int
    repeats: int
    seed: int = 0
    shape: Shape = field(default_factory=Shape)


@dataclass(frozen=True)
class PointResult:
    """What one point measured (times in seconds, memory in MiB)."""

    model: str
    users: int
    items: int
    clients_per_round: int
    clients_actual: float
    """mean clients per timed round: U splits into ceil(U / c) near-equal groups (all U if c >= U)."""
    examples_per_round: float
    """mean local training examples per timed round (all clients, all local epochs)."""
    rounds_per_global: int
    round_seconds: list[float]
    """per repeat: mean seconds per aggregation round."""
    examples_per_global: int
    """local training examples of one global round (every user once)."""
    data_seconds: float
    """building the synthetic data set (not part of the round times)."""
    data_mib: float
    """bytes of the data set's arrays."""
    start_rss_mib: float
    """RSS after the imports, before the data set is built."""
    peak_rss_mib: float
    """peak RSS from the end of the data build (see ``peak_reset``) to the end of the point."""
    peak_reset: bool
    """whether the high-water mark could be reset after the data build."""
    round_traced_mib: float
    isolated: bool
    """whether the point ran in its own process (its peak RSS is then its own)."""

    @property
    def median(self) -> float:
        return statistics.median(self.round_seconds)

    @property
    def global_seconds(self) -> float:
        return self.median * self.rounds_per_global

    @property
    def per_1k_examples(self) -> float:
        return self.median / self.examples_per_round * 1000

    @property
    def global_seconds_by_work(self) -> float:
        return self.median / self.examples_per_round * self.examples_per_global


class Simulation:
    """A FedNCF run's server state and client stores, stepped as ``FedNCFTrainer.step`` does."""

    def __init__(self, model: str, clients: ClientData, clients_per_round: int, seed: int) -> None:
        self.config = FedNCFConfig(
            client_optimizer="fresh",
            model=NCFConfig(model=model),
            clients_per_round=clients_per_round,
            seed=seed,
        )
        self.clients = clients
        self.num_users = len(clients.train_indptr) - 1
        net = NCF(
            self.config.model,
            num_users=self.num_users,
            num_items=clients.num_items,
            generator=torch.Generator().manual_seed(seed),
        )
        self.user_store, self.items, self.network = (
            net.user_table(),
            net.item_table(),
            net.network_vector(),
        )
        self.aggregator = make_aggregator(self.config.aggregator)
        self.per_global = self.config.rounds_per_global(self.num_users)
        self._selection = np.random.default_rng([seed, 1])
        self._groups: list[np.ndarray] = []

    def clients_of(self, aggregation_round: int) -> np.ndarray:
        """The sorted clients of an aggregation round (a fresh permutation per global round)."""
        while len(self._groups) <= aggregation_round:
            perm = self._selection.permutation(self.num_users)
            self._groups.extend(np.array_split(perm, self.per_global))
        return np.sort(self._groups[aggregation_round])

    def step(self, aggregation_round: int, users: np.ndarray) -> int:
        """Train one aggregation round of ``users``; returns its number of local examples."""
        c = self.config
        samples = sample_round(
            self.clients,
            users,
            round_rng(c.seed, aggregation_round),
            num_negatives=c.num_negatives,
            local_epochs=c.local_epochs,
        )
        index = torch.from_numpy(users)
        updates, rows = train_round_batched(
            c.model,
            round_samples=samples,
            user_rows=self.user_store[index],
            items=self.items,
            network=self.network,
            lr=c.lr,
            batch_size=c.batch_size,
        )
        self.user_store[index] = rows
        self.items, self.network = self.aggregator.aggregate(
            items=self.items, network=self.network, updates=updates
        )
        return len(samples.items)


def measure_point(spec: PointSpec, *, isolated: bool) -> PointResult:
    """Build the data set and time ``spec``'s aggregation rounds (see the module docstring)."""
    torch.set_num_threads(1)
    start_rss = current_rss_mib()
    began = time.perf_counter()
    clients = synthetic_clients(spec.users, shape=spec.shape, seed=spec.seed)
    data_seconds = time.perf_counter() - began
    data_bytes = sum(
        getattr(clients, f.name).nbytes for f in fields(clients) if f.name != "num_items"
    )
    peak_reset = reset_peak_rss()
    sim = Simulation(spec.model, clients, spec.clients_per_round, spec.seed)
    c = sim.config
    train_counts = np.diff(clients.train_indptr)
    examples_per_global = int(train_counts.sum()) * (1 + c.num_negatives) * c.local_epochs
    for r in range(spec.warmup):
        sim.step(r, sim.clients_of(r))
    timed = [(r, sim.clients_of(r)) for r in range(spec.warmup, spec.warmup + spec.rounds)]
    round_seconds, examples = [], []
    for _ in range(spec.repeats):
        examples.clear()
        start = time.perf_counter()
        for r, users in timed:
            examples.append(sim.step(r, users))
        round_seconds.append((time.perf_counter() - start) / spec.rounds)
    peak_rss = peak_rss_mib()  # before tracemalloc adds its own bookkeeping
    tracemalloc.start()
    try:
        sim.step(*timed[0])
        traced_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return PointResult(
        model=spec.model,
        users=spec.users,
        items=clients.num_items,
        clients_per_round=spec.clients_per_round,
        clients_actual=float(np.mean([len(users) for _, users in timed])),
        examples_per_round=float(np.mean(examples)),
        rounds_per_global=sim.per_global,
        round_seconds=round_seconds,
        examples_per_global=examples_per_global,
        data_seconds=data_seconds,
        data_mib=data_bytes / 2**20,
        start_rss_mib=start_rss,
        peak_rss_mib=peak_rss,
        peak_reset=peak_reset,
        round_traced_mib=traced_peak / 2**20,
        isolated=isolated,
    )


def measure_in_subprocess(spec: PointSpec) -> PointResult:
    """:func:`measure_point` in a fresh Python process (so its peak RSS is the point's own)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    payload = json.dumps(asdict(spec))
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--point", payload],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"point {spec} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return PointResult(**json.loads(done.stdout.strip().splitlines()[-1]))


def _spec_from_json(payload: str) -> PointSpec:
    values = json.loads(payload)
    values["shape"] = Shape(**values["shape"])
    return PointSpec(**values)


# ------------------------------------------------------------------------------------------------
# Reporting


CSV_FIELDS = (
    "model",
    "users",
    "items",
    "clients_per_round",
    "clients_actual",
    "examples_per_round",
    "rounds_per_global",
    "s_per_round_median",
    "s_per_round_min",
    "s_per_round_max",
    "s_per_global_round",
    "s_per_global_round_by_work",
    "examples_per_global_round",
    "s_per_1k_examples",
    "data_mib",
    "peak_rss_mib",
    "start_rss_mib",
    "peak_reset",
    "round_traced_mib",
    "data_build_s",
    "repeats",
    "isolated",
)


def csv_row(p: PointResult) -> dict[str, Any]:
    return {
        "model": p.model,
        "users": p.users,
        "items": p.items,
        "clients_per_round": p.clients_per_round,
        "clients_actual": f"{p.clients_actual:.1f}",
        "examples_per_round": f"{p.examples_per_round:.0f}",
        "rounds_per_global": p.rounds_per_global,
        "s_per_round_median": f"{p.median:.6f}",
        "s_per_round_min": f"{min(p.round_seconds):.6f}",
        "s_per_round_max": f"{max(p.round_seconds):.6f}",
        "s_per_global_round": f"{p.global_seconds:.4f}",
        "s_per_global_round_by_work": f"{p.global_seconds_by_work:.4f}",
        "examples_per_global_round": p.examples_per_global,
        "s_per_1k_examples": f"{p.per_1k_examples:.6f}",
        "data_mib": f"{p.data_mib:.2f}",
        "peak_rss_mib": f"{p.peak_rss_mib:.1f}",
        "start_rss_mib": f"{p.start_rss_mib:.1f}",
        "peak_reset": p.peak_reset,
        "round_traced_mib": f"{p.round_traced_mib:.2f}",
        "data_build_s": f"{p.data_seconds:.3f}",
        "repeats": len(p.round_seconds),
        "isolated": p.isolated,
    }


def _seconds(s: float) -> str:
    return f"{s:.3g}" if s < 100 else f"{s:,.0f}"


def markdown_table(points: list[PointResult]) -> list[str]:
    lines = [
        "| model | users | clients / round | examples / round (work) | s / aggregation round, "
        "median (min–max) | aggregation rounds / global | s / global round: rounds x median "
        "(work-scaled) | s / 1k examples | data MiB | peak RSS MiB in training (+ over imports) "
        "| round working set MiB (tracemalloc) |",
        "|---|--:|--:|--:|---|--:|---|--:|--:|---|--:|",
    ]
    for p in points:
        clients = f"{p.clients_per_round:,}"
        if p.clients_actual >= p.users:
            clients += f" (all {p.users:,})"
        elif abs(p.clients_actual - p.clients_per_round) >= 1:
            clients += f" (groups of ~{p.clients_actual:.0f})"
        lines.append(
            f"| {p.model.upper()} | {p.users:,} | {clients} | {p.examples_per_round:,.0f} | "
            f"{_seconds(p.median)} ({_seconds(min(p.round_seconds))}–"
            f"{_seconds(max(p.round_seconds))}) | {p.rounds_per_global:,} | "
            f"{_seconds(p.global_seconds)} ({_seconds(p.global_seconds_by_work)}) | "
            f"{p.per_1k_examples:.3g} | {p.data_mib:.3g} | "
            f"{p.peak_rss_mib:,.0f} (+{max(p.peak_rss_mib - p.start_rss_mib, 0):,.0f}) | "
            f"{p.round_traced_mib:,.1f} |"
        )
    return lines


def _slope(work: list[float], seconds: list[float]) -> float | None:
    """Least-squares slope of log(seconds) against log(work) (1: linear); None if work is flat."""
    x, y = np.log(work), np.log(seconds)
    if np.ptp(x) < 1e-9:
        return None
    return float(np.polyfit(x, y, 1)[0])


def _span_lines(points: list[PointResult], *, fixed: str, varied: str) -> list[str]:
    """For each value of ``fixed``: how s per 1k examples and s per global round change from the
    smallest to the largest ``varied`` (users or clients per round)."""
    label = {"users": "users", "clients_per_round": "clients/round"}
    lines = []
    for value in sorted({getattr(p, fixed) for p in points}):
        run = sorted(
            (p for p in points if getattr(p, fixed) == value), key=lambda p: getattr(p, varied)
        )
        if len(run) < 2:
            continue
        first, last = run[0], run[-1]
        growth = getattr(last, varied) / getattr(first, varied)
        scale = f" (×{growth:.3g})" if varied == "users" else ""
        lines.append(
            f"  - {value:,} {label[fixed]}: from {getattr(first, varied):,} to "
            f"{getattr(last, varied):,} {label[varied]}{scale}, s per 1k examples "
            f"×{last.per_1k_examples / first.per_1k_examples:.2f}, s per global round "
            f"×{last.global_seconds / first.global_seconds:.3g}."
        )
    return lines


def linearity_lines(points: list[PointResult]) -> list[str]:
    """Whether time grows linearly in the work, per model, with the measured ratios where not."""
    lines = []
    for model in dict.fromkeys(p.model for p in points):
        ps = [p for p in points if p.model == model]
        per = [p.per_1k_examples for p in ps]
        lo, hi = ps[int(np.argmin(per))], ps[int(np.argmax(per))]
        ratio = hi.per_1k_examples / lo.per_1k_examples
        slope = _slope([p.examples_per_round for p in ps], [p.median for p in ps])
        slope_text = "" if slope is None else f"; log-log slope of s/round against work {slope:.2f}"
        name = model.upper()
        if ratio <= LINEAR_TOLERANCE:
            lines.append(
                f"- **{name}: roughly linear in the work.** Time per 1k examples stays within "
                f"×{ratio:.2f} across all points ({lo.per_1k_examples:.3g}–"
                f"{hi.per_1k_examples:.3g} s){slope_text} (1 = linear)."
            )
            continue
        lines.append(
            f"- **{name}: not linear in the work.** Time per 1k examples varies ×{ratio:.2f}: "
            f"{hi.per_1k_examples:.3g} s at {hi.users:,} users × {hi.clients_per_round:,} "
            f"clients/round, {lo.per_1k_examples:.3g} s at {lo.users:,} users × "
            f"{lo.clients_per_round:,}{slope_text} (1 = linear)."
        )
        for fixed, varied in (("users", "clients_per_round"), ("clients_per_round", "users")):
            lines += _span_lines(ps, fixed=fixed, varied=varied)
    return lines


def report(points: list[PointResult], *, header: list[str]) -> str:
    lines = [
        *header,
        "",
        *markdown_table(points),
        "",
        f"Linear in the work means s / 1k examples roughly constant (within ×{LINEAR_TOLERANCE}):",
        "",
        *linearity_lines(points),
    ]
    return "\n".join(lines) + "\n"


def write_outputs(points: list[PointResult], text: str, out: Path) -> Path:
    """Write the Markdown report to ``out`` and the CSV beside it; returns the CSV's path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    csv_path = out.with_suffix(".csv")
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(csv_row(p) for p in points)
    return csv_path


# ------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["gmf"],
        choices=["gmf", "mlp", "neumf"],
        help="NCF models (default: gmf)",
    )
    parser.add_argument(
        "--users",
        nargs="+",
        type=int,
        help="synthetic population sizes (default 943 10000 100000; --quick: 40 120)",
    )
    parser.add_argument(
        "--clients-per-round",
        nargs="+",
        type=int,
        help="clients per aggregation round (default 20 100 1000; --quick: 5 30)",
    )
    parser.add_argument(
        "--rounds", type=int, help="timed aggregation rounds per repeat (default 5; --quick: 2)"
    )
    parser.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds before timing (default 1)"
    )
    parser.add_argument(
        "--repeats", type=int, help="repeats of the timed rounds (default 3; --quick: 2)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the data, model and sampling (default 0)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"Markdown report, CSV beside it (default {DEFAULT_OUT}; results/ only when named)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace output files of an earlier run (refused without it)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every point in this process (faster; peak RSS then is not the point's own)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (200 items, ~12 interactions per user)"
    )
    parser.add_argument("--point", help=argparse.SUPPRESS)  # internal: one point, JSON in and out
    args = parser.parse_args(argv)
    quick = args.quick
    args.users = args.users or ([40, 120] if quick else [943, 10_000, 100_000])
    args.clients_per_round = args.clients_per_round or ([5, 30] if quick else [20, 100, 1000])
    args.rounds = args.rounds or (2 if quick else 5)
    args.repeats = args.repeats or (2 if quick else 3)
    for name in ("rounds", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if min(args.users) < 2 or min(args.clients_per_round) < 1:
        parser.error("--users must be >= 2 and --clients-per-round >= 1")
    return args


def main(argv: list[str] | None = None) -> list[PointResult]:
    """Measure every (model, users, clients per round) point, print and write the report."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.point is not None:
        print(json.dumps(asdict(measure_point(_spec_from_json(args.point), isolated=True))))
        return []
    claim_outputs([args.out, args.out.with_suffix(".csv")], overwrite=args.overwrite)
    shape = QUICK_SHAPE if args.quick else Shape()
    specs = [
        PointSpec(model, users, c, args.rounds, args.warmup, args.repeats, args.seed, shape)
        for model in args.models
        for users in args.users
        for c in args.clients_per_round
    ]
    mode = "in one process" if args.in_process else "one fresh process per point"
    header = [
        f"FedNCF scaling on synthetic ML-100K-shaped data ({shape.num_items:,} items, about "
        f"{shape.mean_interactions:g} interactions per user): {args.warmup} warm-up + "
        f"{args.rounds} timed aggregation rounds x {args.repeats} repeats per point, "
        f"{FedNCFConfig().local_epochs} local epochs, {FedNCFConfig().num_negatives} negatives "
        f"per positive, batch {FedNCFConfig().batch_size}, MF-FedAvg, batched simulation, "
        f"1 thread, {mode}; {os.cpu_count()} CPUs, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at start."
    ]
    print(header[0], flush=True)
    points = []
    for spec in specs:
        point = (
            measure_point(spec, isolated=False) if args.in_process else measure_in_subprocess(spec)
        )
        points.append(point)
        print(
            f"  {spec.model} U={spec.users:,} c={spec.clients_per_round:,}: "
            f"{point.median:.4f} s/round, {point.global_seconds:.1f} s/global round, "
            f"peak {point.peak_rss_mib:,.0f} MiB (data {point.data_seconds:.1f} s)",
            flush=True,
        )
    text = report(points, header=header)
    print("\n" + text)
    csv_path = write_outputs(points, text, args.out)
    print(f"wrote {args.out} and {csv_path}")
    return points


if __name__ == "__main__":
    run_script(main)
