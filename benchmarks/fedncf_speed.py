"""Speed of in-process FedNCF training (the batched client simulation), one process.

Usage: ``python benchmarks/fedncf_speed.py [--dataset ml-100k] [--models gmf neumf]
[--full gmf] [--runs 3] [--global-rounds 400] [--measure-rounds 10] [--profile-rounds 2]
[--threads 1 2] [--reference-rounds 0] [--client-optimizer fresh] [--simulation batched]
[--kernel-threads N] [--out DIR] [--overwrite]``.

Every run is :func:`fedrec.train.fedncf.train_federated`'s setting (MF-FedAvg, 20 clients per
aggregation round, seed 0), evaluated only at the end, with fresh client optimisers unless
``--client-optimizer`` says otherwise. For each model:

* **400 global rounds.** A model named in ``--full`` trains all ``--global-rounds`` global rounds,
  ``--runs`` times. Any other model trains ``--measure-rounds`` global rounds ``--runs`` times and
  its time is reported per global round x ``--global-rounds`` ("extrapolated"). The time is the
  trainer's training time (sampling, client simulation, aggregation; the evaluation excluded),
  reported as the median of the runs with the min-max range. A full run also gives its wall time,
  final HR@10/NDCG@10 (equal in every run: training is deterministic).
* **Profile.** ``--profile-rounds`` global rounds with the pieces of an aggregation round timed
  (wrappers around the functions, nothing else changed): local sampling (``sample_round``), the
  round's batch plan, the clients' forward and backward passes, the rest of the client simulation
  (row gathers and Adam), the server's aggregation, and the trainer's own work; in milliseconds
  per aggregation round. Then cProfile's top functions by own time over the same rounds.
* **Threads.** Training time per global round with each ``--threads`` thread count: torch's
  (the aggregation and the evaluation; the batched clients run in NumPy on OMP_NUM_THREADS
  threads), or with ``--simulation compiled`` the kernel's Numba threads (torch stays at 1).

``--simulation compiled`` times the Numba kernel (:mod:`fedrec.train.fedncf.simulate_compiled`)
instead of the batched NumPy simulation; its runs use ``--kernel-threads`` Numba threads (default:
Numba's, one per core), and the report gives the kernel's compile time (a fresh process loads it
from Numba's cache; the trainer does this before its timed training).

``--reference-rounds N`` adds the batched simulation against the per-client reference loop over
N aggregation rounds (seconds per round, speed-up, max difference of the trained models).

The load average (``os.getloadavg``) is recorded around every measurement: the machine is
shared, so the times are only comparable at similar loads. Writes ``speed.md`` and ``speed.json``
to ``--out`` (nothing with ``--out ''``; default ``runs/benchmarks/fedncf_speed/``, the committed
files are in ``results/fedncf``; an earlier run's files are replaced only with ``--overwrite``) and
prints the Markdown.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from fedrec.agents.ncf import NCF, NCFConfig
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.federation.aggregators import MFFedAvg
from fedrec.train.fedncf import (
    ClientData,
    FedNCFConfig,
    FedNCFTrainer,
    compile_kernel,
    round_rng,
    sample_round,
    simulate_batched,
    simulate_compiled,
    train_round_batched,
    train_round_reference,
)
from fedrec.train.fedncf import rounds as round_pieces


def load() -> float:
    return os.getloadavg()[0]


#: The clients' optimiser state of every run (``--client-optimizer``; "fresh" by default, the
#: setting of the committed results/fedncf/speed.md).
CLIENT_OPTIMIZER = "fresh"

#: The client simulation of every run (``--simulation``).
SIMULATION = "batched"

#: Numba threads of the compiled simulation's main runs (``--kernel-threads``; None: Numba's).
KERNEL_THREADS: int | None = None


def set_kernel_threads(threads: int | None) -> None:
    """Numba's thread count for the compiled kernel (None: one per core, Numba's default)."""
    if SIMULATION == "compiled":
        import numba

        numba.set_num_threads(threads or numba.config.NUMBA_NUM_THREADS)


def trainer(
    dataset: str, data_dir: str | None, model: str, rounds: int, threads: int | None
) -> Any:
    config = FedNCFConfig(
        client_optimizer=CLIENT_OPTIMIZER,  # type: ignore[arg-type]
        simulation=SIMULATION,  # type: ignore[arg-type]
        model=NCFConfig(model=model),
        global_rounds=rounds,
        eval_every=0,
    )
    run = FedNCFTrainer(dataset=dataset, config=config, data_dir=data_dir, progress=False)
    if SIMULATION == "compiled":  # threads are the kernel's; torch keeps one
        set_kernel_threads(threads)
    else:
        run.torch_threads = threads  # Trainer.run sets it (1 by default)
    return run


def timed_run(
    dataset: str, data_dir: str | None, model: str, rounds: int, threads: int | None
) -> dict:
    """One training run of ``rounds`` global rounds: its times, final metrics and loads."""
    run = trainer(dataset, data_dir, model, rounds, threads)
    before, start = load(), time.perf_counter()
    run.run()
    wall = time.perf_counter() - start
    final = run.history[-1]
    return {
        "train_seconds": run.train_seconds,
        "wall_seconds": wall,
        "hit_rate": final.hit_rate,
        "ndcg": final.ndcg,
        "load": [round(before, 2), round(load(), 2)],
    }


def compile_seconds(simulation: str) -> float | None:
    """Seconds to compile the compiled kernel in this process (or to load it from the cache)."""
    if simulation != "compiled":
        return None
    return compile_kernel()


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def profile(dataset: str, data_dir: str | None, model: str, rounds: int) -> dict:
    """Milliseconds per aggregation round of each piece, and cProfile's top functions."""
    # one global round more than is stepped, so that no evaluation runs
    run = trainer(dataset, data_dir, model, rounds + 1, 1)
    steps = rounds * run.per_global
    torch.set_num_threads(1)
    spent: dict[str, float] = dict.fromkeys(
        ("sampling", "planning", "forward+backward", "training", "aggregation"), 0.0
    )

    def wrap(name: str, function: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start

        return timed

    if SIMULATION == "compiled":
        set_kernel_threads(KERNEL_THREADS)
        patched = [(simulate_compiled, "_train_clients", "forward+backward")]
    else:
        patched = [
            (simulate_batched, "_plan_round", "planning"),
            (run.extra["engine"], "gradients", "forward+backward"),
        ]
    patched.append((round_pieces, "sample_round", "sampling"))
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for owner, name, piece in patched:
        setattr(owner, name, wrap(piece, getattr(owner, name)))
    run.train_round = wrap("training", run.train_round)
    run.aggregator.aggregate = wrap("aggregation", run.aggregator.aggregate)
    before, start = load(), time.perf_counter()
    try:
        for _ in range(steps):
            run.step()
    finally:
        for owner, name, function in originals:
            setattr(owner, name, function)
    total = time.perf_counter() - start
    n = steps
    if SIMULATION == "compiled":
        parts = {
            "sampling (sample_round)": spent["sampling"],
            "compiled kernel (every client's local training)": spent["forward+backward"],
            "round layout, optimiser state in and out (rest of train_round_compiled)": spent[
                "training"
            ]
            - spent["forward+backward"],
        }
    else:
        parts = {
            "sampling (sample_round)": spent["sampling"],
            "batch plan (_plan_round)": spent["planning"],
            "forward + backward": spent["forward+backward"],
            "row gathers + Adam (rest of train_round_batched)": spent["training"]
            - spent["planning"]
            - spent["forward+backward"],
        }
    parts["aggregation"] = spent["aggregation"]
    parts["trainer (selection, user store, bookkeeping)"] = (
        total - spent["training"] - spent["sampling"] - spent["aggregation"]
    )
    # cProfile over the same number of rounds of a fresh run (its overhead inflates small calls)
    run = trainer(dataset, data_dir, model, rounds + 1, 1)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        run.step()
    profiler.disable()
    stats = pstats.Stats(profiler, stream=io.StringIO()).sort_stats("tottime")
    top = []
    for (file, line, name), (_, calls, own, cumulative, _) in list(stats.stats.items()):
        top.append((own, cumulative, calls, f"{Path(file).name}:{line}({name})"))
    top.sort(reverse=True)
    return {
        "aggregation_rounds": n,
        "ms_per_round": {k: 1e3 * v / n for k, v in parts.items()},
        "total_ms_per_round": 1e3 * total / n,
        "load": [round(before, 2), round(load(), 2)],
        "cprofile_top": [
            {"function": f, "calls_per_round": c / n, "own_ms": 1e3 * o / n, "cum_ms": 1e3 * u / n}
            for o, u, c, f in top[:12]
        ],
    }


def simulate(
    model: str, simulation: str, *, data, clients: ClientData, rounds: int, c: int, seed: int
) -> tuple[float, torch.Tensor]:
    """Seconds to simulate ``rounds`` aggregation rounds, and the final flat global model."""
    config = NCFConfig(model=model)
    net = NCF(
        config,
        num_users=data.num_users,
        num_items=data.num_items,
        generator=torch.Generator().manual_seed(seed),
    )
    users_store, items, network = net.user_table(), net.item_table(), net.network_vector()
    selection = np.random.default_rng([seed, 1])
    train = train_round_batched if simulation == "batched" else train_round_reference
    aggregator = MFFedAvg()
    elapsed = 0.0
    for r in range(rounds):
        users = np.sort(selection.choice(data.num_users, c, replace=False))
        start = time.perf_counter()
        samples = sample_round(clients, users, round_rng(seed, r), num_negatives=4, local_epochs=2)
        updates, rows = train(
            config,
            round_samples=samples,
            user_rows=users_store[torch.from_numpy(users)],
            items=items,
            network=network,
            lr=1e-3,
            batch_size=64,
        )
        elapsed += time.perf_counter() - start
        users_store[torch.from_numpy(users)] = rows
        items, network = aggregator.aggregate(items=items, network=network, updates=updates)
    return elapsed, torch.cat([items.reshape(-1), network, users_store.reshape(-1)])


def reference(args: argparse.Namespace, model: str) -> dict:
    torch.set_num_threads(1)
    data = load_prepared(args.dataset, args.data_dir)
    clients = ClientData.of(data)
    times: dict[str, list[float]] = {"batched": [], "reference": []}
    finals = {}
    for _ in range(args.runs):
        for simulation in times:
            seconds, finals[simulation] = simulate(
                model,
                simulation,
                data=data,
                clients=clients,
                rounds=args.reference_rounds,
                c=20,
                seed=0,
            )
            times[simulation].append(seconds / args.reference_rounds)
    return {
        **{k: spread(v) for k, v in times.items()},
        "max_abs_diff": float((finals["batched"] - finals["reference"]).abs().max()),
    }


def simulation_words(report: dict) -> str:
    """How the clients were simulated, for the report's header."""
    cfg = report["config"]
    if cfg.get("simulation", "batched") != "compiled":
        return "batched NumPy simulation"
    threads = cfg.get("kernel_threads") or "one per core"
    return (
        f"compiled simulation (Numba kernel, threads: {threads}; compiled or loaded from the "
        f"cache in {report['compile_seconds']:.1f} s before the timed training)"
    )


def markdown(report: dict) -> str:
    cfg = report["config"]
    lines = [
        f"# FedNCF training speed ({cfg['dataset']}, one process)",
        "",
        f"Machine: {report['machine']}. OMP_NUM_THREADS={report['omp_threads']}. Load average "
        "(1 min) before and after each measurement in brackets: the machine is shared.",
        "",
        f"## {cfg['global_rounds']} global rounds (training time, evaluation excluded)",
        "",
        f"MF-FedAvg, 20 clients per aggregation round, "
        f"{cfg.get('client_optimizer', 'fresh')} client optimisers, {simulation_words(report)}, "
        f"seed 0; median of {cfg['runs']} runs (min-max).",
        "",
        "| model | how | training s | min-max | wall s (median) | HR@10 | NDCG@10 | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, entry in report["models"].items():
        t = entry["train_seconds"]
        how = (
            f"full runs of {cfg['global_rounds']} global rounds"
            if entry["full"]
            else f"extrapolated: {cfg['measure_rounds']} global rounds x "
            f"{cfg['global_rounds'] / cfg['measure_rounds']:g}"
        )
        wall = f"{entry['wall_seconds']['median']:.0f}" if entry["full"] else "-"
        hr = f"{entry['hit_rate']:.4f}" if entry["full"] else "-"
        ndcg = f"{entry['ndcg']:.4f}" if entry["full"] else "-"
        loads = "; ".join(f"{a:.1f}-{b:.1f}" for a, b in entry["loads"])
        lines.append(
            f"| Fed{model.upper() if model != 'neumf' else 'NeuMF'} | {how} | "
            f"**{t['median']:.0f}** | {t['min']:.0f}-{t['max']:.0f} | {wall} | {hr} | {ndcg} | "
            f"{loads} |"
        )
    if report["profiles"]:
        lines += ["", "## Where an aggregation round's time goes", ""]
        for model, prof in report["profiles"].items():
            lines += [
                f"**{model.upper()}**, {prof['aggregation_rounds']} aggregation rounds, "
                f"{prof['total_ms_per_round']:.1f} ms per aggregation round "
                f"(load {prof['load'][0]:.1f}-{prof['load'][1]:.1f}):",
                "",
                "| piece | ms / aggregation round | share |",
                "|---|---|---|",
            ]
            for piece, ms in prof["ms_per_round"].items():
                share = ms / prof["total_ms_per_round"]
                lines.append(f"| {piece} | {ms:.2f} | {share:.0%} |")
            lines += [
                "",
                "cProfile, top functions by own time (ms per aggregation round, "
                "profiler overhead included):",
                "",
                "| function | calls / round | own ms | cumulative ms |",
                "|---|---|---|---|",
            ]
            for row in prof["cprofile_top"]:
                lines.append(
                    f"| `{row['function']}` | {row['calls_per_round']:.1f} | {row['own_ms']:.2f} "
                    f"| {row['cum_ms']:.2f} |"
                )
            lines.append("")
    if report["threads"]:
        lines += [
            "## Kernel (Numba) threads"
            if cfg.get("simulation") == "compiled"
            else "## Torch threads",
            "",
            f"Training seconds per global round ({cfg['measure_rounds']} global rounds, median "
            f"of {cfg['runs']} runs):",
            "",
            "| model | " + " | ".join(f"{t} thread(s)" for t in cfg["threads"]) + " |",
            "|---|" + "---|" * len(cfg["threads"]),
        ]
        for model, by_threads in report["threads"].items():
            cells = " | ".join(f"{by_threads[str(t)]['median']:.3f}" for t in cfg["threads"])
            lines.append(f"| {model.upper()} | {cells} |")
        lines.append("")
    if report["reference"]:
        lines += [
            "## Batched simulation against the per-client reference loop",
            "",
            f"{cfg['reference_rounds']} aggregation rounds, seconds per round, median of "
            f"{cfg['runs']} (min-max):",
            "",
            "| model | batched | reference | speed-up | max abs diff |",
            "|---|---|---|---|---|",
        ]
        for model, ref in report["reference"].items():
            b, r = ref["batched"], ref["reference"]
            lines.append(
                f"| {model.upper()} | {b['median']:.3f} ({b['min']:.3f}-{b['max']:.3f}) | "
                f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) | "
                f"{r['median'] / b['median']:.0f}x | {ref['max_abs_diff']:.1e} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="ml-100k")
    parser.add_argument("--data-dir")
    parser.add_argument("--models", nargs="+", default=["gmf", "neumf"])
    parser.add_argument("--full", nargs="*", default=["gmf"], help="models trained in full")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--global-rounds", type=int, default=400)
    parser.add_argument("--measure-rounds", type=int, default=10, help="global rounds measured")
    parser.add_argument("--profile-rounds", type=int, default=2, help="0: no profile")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--reference-rounds", type=int, default=0)
    parser.add_argument(
        "--client-optimizer", default="fresh", choices=("fresh", "persistent", "federated")
    )
    parser.add_argument("--simulation", default="batched", choices=("batched", "compiled"))
    parser.add_argument(
        "--kernel-threads", type=int, help="Numba threads of the compiled runs (default: per core)"
    )
    add_out_arguments(
        parser, "fedncf_speed", what="folder of speed.md and speed.json ('' for none)"
    )
    args = parser.parse_args()
    if args.out != "":
        args.out = script_out("fedncf_speed", args.out)
        claim_outputs([args.out / "speed.md", args.out / "speed.json"], overwrite=args.overwrite)
    global CLIENT_OPTIMIZER, SIMULATION, KERNEL_THREADS
    CLIENT_OPTIMIZER, SIMULATION, KERNEL_THREADS = (
        args.client_optimizer,
        args.simulation,
        args.kernel_threads,
    )
    report: dict[str, Any] = {
        "config": {
            "client_optimizer": args.client_optimizer,
            "simulation": args.simulation,
            "kernel_threads": args.kernel_threads,
            "dataset": args.dataset,
            "global_rounds": args.global_rounds,
            "measure_rounds": args.measure_rounds,
            "runs": args.runs,
            "threads": args.threads,
            "reference_rounds": args.reference_rounds,
        },
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, numpy {np.__version__}, "
        f"torch {torch.__version__}",
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
        "compile_seconds": compile_seconds(args.simulation),
        "models": {},
        "profiles": {},
        "threads": {},
        "reference": {},
    }
    for model in args.models:
        full = model in args.full
        rounds = args.global_rounds if full else args.measure_rounds
        main_threads = KERNEL_THREADS if SIMULATION == "compiled" else 1
        runs = [
            timed_run(args.dataset, args.data_dir, model, rounds, main_threads)
            for _ in range(args.runs)
        ]
        scale = args.global_rounds / rounds
        entry = {
            "full": full,
            "train_seconds": spread([r["train_seconds"] * scale for r in runs]),
            "per_global_round": spread([r["train_seconds"] / rounds for r in runs]),
            "loads": [r["load"] for r in runs],
            "runs": runs,
        }
        if full:
            entry["wall_seconds"] = spread([r["wall_seconds"] for r in runs])
            entry["hit_rate"], entry["ndcg"] = runs[0]["hit_rate"], runs[0]["ndcg"]
            if any((r["hit_rate"], r["ndcg"]) != (entry["hit_rate"], entry["ndcg"]) for r in runs):
                raise RuntimeError(f"{model}: the runs' final metrics differ")
        report["models"][model] = entry
        if args.profile_rounds:
            report["profiles"][model] = profile(
                args.dataset, args.data_dir, model, args.profile_rounds
            )
        if len(args.threads) > 1:
            report["threads"][model] = {
                str(threads): spread(
                    [
                        timed_run(args.dataset, args.data_dir, model, args.measure_rounds, threads)[
                            "train_seconds"
                        ]
                        / args.measure_rounds
                        for _ in range(args.runs)
                    ]
                )
                for threads in args.threads
            }
        if args.reference_rounds:
            report["reference"][model] = reference(args, model)
    text = markdown(report)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "speed.md").write_text(text)
        (out / "speed.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    run_script(main)
