"""Start-up time of the ``fedrec`` command line against ``python -c "import numpy"``.

Runs each command ``--runs`` times in a fresh process (after one untimed warm-up run of each, so
the file-system cache is warm) and prints the median wall time and its ratio to the median of
``python -c "import numpy"``; the target of issue 33 is ``fedrec --help`` at most 3x that. The
commands are run interleaved, so load on a shared machine hits them alike; the CPU time (user +
system) of each run is reported too, as it depends less on that load. Usage::

    python benchmarks/cli_startup.py [--runs 11] [--json PATH] [--overwrite]

``--json`` writes nothing by default; an existing file there is replaced only with
``--overwrite``.

The console script is ``fedrec`` beside the interpreter when present (else ``python -m
fedrec.cli``); ``OMP_NUM_THREADS=1`` as in every fedrec benchmark. Bytecode is cached as in an
ordinary installation, in a temporary ``PYTHONPYCACHEPREFIX`` folder (nothing is written into the
checkout), even where ``PYTHONDONTWRITEBYTECODE`` is set: without a cache every run compiles
fedrec's ~50 modules from source, which is not what a user waits for. ``--as-is`` keeps the
environment's bytecode settings.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedrec.experiments.harness import claim_outputs, run_script

#: The target: ``fedrec --help`` within this multiple of ``python -c "import numpy"``.
TARGET_RATIO = 3.0


def fedrec_command() -> list[str]:
    """The ``fedrec`` console script of this interpreter, else ``python -m fedrec.cli``."""
    script = Path(sys.executable).with_name("fedrec")
    if script.is_file():
        return [str(script)]
    found = shutil.which("fedrec")
    return [found] if found else [sys.executable, "-m", "fedrec.cli"]


def commands() -> dict[str, list[str]]:
    fedrec = fedrec_command()
    return {
        'python -c "import numpy"': [sys.executable, "-c", "import numpy"],
        "fedrec --help": [*fedrec, "--help"],
        "fedrec envs": [*fedrec, "envs", "--plain"],
        "fedrec data list": [*fedrec, "data", "list"],
    }


def time_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """The wall time and the CPU time (user + system) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(
    runs: int, *, as_is: bool = False, cache: str | None = None
) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) times of every command, ``runs`` each, interleaved, after one warm-up each
    (bytecode cached under ``cache`` unless ``as_is``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not as_is:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache or tempfile.mkdtemp(prefix="fedrec-startup-")
    todo = commands()
    for argv in todo.values():
        time_once(argv, env)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in todo}
    for _ in range(runs):
        for name, argv in todo.items():
            times[name].append(time_once(argv, env))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=11, help="timed runs per command (default 11)")
    parser.add_argument("--json", type=Path, default=None, help="also write the times as JSON")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    parser.add_argument(
        "--as-is",
        action="store_true",
        help="keep the environment's bytecode settings (PYTHONDONTWRITEBYTECODE, ...)",
    )
    args = parser.parse_args(argv)
    if args.json is not None:
        claim_outputs([args.json], overwrite=args.overwrite)
    with tempfile.TemporaryDirectory(prefix="fedrec-startup-") as cache:
        times = measure(args.runs, as_is=args.as_is, cache=cache)
    base_name = 'python -c "import numpy"'
    base = statistics.median(wall for wall, _ in times[base_name])
    base_cpu = statistics.median(cpu for _, cpu in times[base_name])
    print(f"median of {args.runs} runs each ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    print(f"{'command':<28}{'wall s':>8}{'min s':>8}{'ratio':>8}{'CPU s':>8}{'ratio':>8}")
    summary = {}
    for name, values in times.items():
        walls, cpus = [w for w, _ in values], [c for _, c in values]
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        summary[name] = {
            "median_s": wall,
            "min_s": min(walls),
            "ratio": wall / base,
            "cpu_s": cpu,
            "cpu_ratio": cpu / base_cpu,
        }
        print(
            f"{name:<28}{wall:>8.3f}{min(walls):>8.3f}{wall / base:>7.2f}x"
            f"{cpu:>8.3f}{cpu / base_cpu:>7.2f}x"
        )
    ratio = summary["fedrec --help"]["ratio"]
    verdict = "met" if ratio <= TARGET_RATIO else "missed"
    print(
        f"target: fedrec --help <= {TARGET_RATIO:g}x import numpy (wall): {verdict} "
        f"({ratio:.2f}x; CPU time {summary['fedrec --help']['cpu_ratio']:.2f}x)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": args.runs, "times": times, "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
