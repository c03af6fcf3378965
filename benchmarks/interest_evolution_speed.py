"""Steps per second of RecSim's interest-evolution env vs fedrec's single and native vector env.

Usage: ``python benchmarks/interest_evolution_speed.py [--repeats 5] [--seconds 2]
[--num-envs 1024 4096 16384] [--out DIR] [--overwrite]``.

Each implementation is stepped with uniformly random slates (drawn in advance, so the policy
costs nothing) for at least ``--seconds`` per run, resetting when an episode ends, at RLlib's
tuned-example configuration (10 candidates, slates of 2):

- ``recsim``: RecSim's ``interest_evolution.create_environment`` (recsim-no-tf), its gym env;
- ``fedrec single``: ``InterestEvolutionEnv`` (the unwrapped class; ``gymnasium.make`` adds
  Gymnasium's checker wrappers);
- ``fedrec vector (B)``: ``gymnasium.make_vec("fedrec/InterestEvolution-v0", num_envs=B)``,
  NEXT_STEP autoreset; a step counts B user-steps.

It reports the median steps/s of ``--repeats`` runs (min-max), the ratio of medians to RecSim's, and
writes ``speed.json`` and ``speed.md`` to ``--out`` (default
``runs/benchmarks/interest_evolution_speed/``; the committed files are in
``results/interest_evolution``; an earlier run's files are replaced only with ``--overwrite``). The
issue's goal: the vector env at least 100x RecSim. The machine is shared: read the min-max range and
the load averages.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import gymnasium as gym
import numpy as np

import fedrec  # noqa: F401  (registers the environments)
from fedrec.envs.interest_evolution import RECSIM_CONFIG, InterestEvolutionEnv
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out

ENV_ID = "fedrec/InterestEvolution-v0"
NUM_CANDIDATES, SLATE_SIZE = RECSIM_CONFIG["num_candidates"], RECSIM_CONFIG["slate_size"]
POOL = 64  # pre-drawn slates (batches) cycled through


def _slates(rng: np.random.Generator, batch: int | None) -> list[np.ndarray]:
    shape = (POOL, NUM_CANDIDATES) if batch is None else (POOL, batch, NUM_CANDIDATES)
    order = np.argsort(rng.random(shape), axis=-1)[..., :SLATE_SIZE].astype(np.int64)
    return list(order)


def _timed(step: Callable[[int], int], seconds: float) -> float:
    """Call ``step(i)`` (returns the user-steps it made) until ``seconds`` pass; steps/s."""
    done, i, start = 0, 0, time.perf_counter()
    while True:
        for _ in range(20):
            done += step(i)
            i += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return done / elapsed


def run_recsim(seconds: float, seed: int) -> float:
    with contextlib.redirect_stderr(io.StringIO()):
        from recsim.environments import interest_evolution
    np.random.seed(seed)  # noqa: NPY002  (RecSim draws its choices from the global RNG)
    env = interest_evolution.create_environment({**RECSIM_CONFIG, "seed": seed})
    env.reset()
    slates = _slates(np.random.default_rng(seed), None)

    def step(i: int) -> int:
        _, _, done, _ = env.step(slates[i % POOL])
        if done:
            env.reset()
        return 1

    return _timed(step, seconds)


def run_single(seconds: float, seed: int) -> float:
    env = InterestEvolutionEnv()
    env.reset(seed=seed)
    slates = _slates(np.random.default_rng(seed), None)

    def step(i: int) -> int:
        _, _, terminated, _, _ = env.step(slates[i % POOL])
        if terminated:
            env.reset()
        return 1

    return _timed(step, seconds)


def run_vector(seconds: float, seed: int, num_envs: int) -> float:
    env = gym.make_vec(ENV_ID, num_envs=num_envs)
    env.reset(seed=seed)
    slates = _slates(np.random.default_rng(seed), num_envs)

    def step(i: int) -> int:
        env.step(slates[i % POOL])
        return num_envs

    return _timed(step, seconds)


def machine() -> str:
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"numpy {np.__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="minimum seconds per run")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1024, 4096, 16384])
    add_out_arguments(parser, "interest_evolution_speed", what="folder of speed.json and speed.md")
    args = parser.parse_args(argv)
    args.out = script_out("interest_evolution_speed", args.out)
    claim_outputs([args.out / "speed.json", args.out / "speed.md"], overwrite=args.overwrite)

    runners: dict[str, Callable[[int], float]] = {
        "recsim": lambda seed: run_recsim(args.seconds, seed),
        "fedrec single": lambda seed: run_single(args.seconds, seed),
    }
    for b in args.num_envs:
        runners[f"fedrec vector ({b})"] = lambda seed, b=b: run_vector(args.seconds, seed, b)
    runs: dict[str, list[float]] = {name: [] for name in runners}
    loads = [os.getloadavg()[0]]
    for repeat in range(args.repeats):  # interleaved, so load changes hit every implementation
        for name, runner in runners.items():
            runs[name].append(runner(repeat))
        loads.append(os.getloadavg()[0])

    base = statistics.median(runs["recsim"])
    rows = []
    for name, values in runs.items():
        median = statistics.median(values)
        rows.append(
            {
                "implementation": name,
                "median_steps_per_s": median,
                "min": min(values),
                "max": max(values),
                "ratio_to_recsim": median / base,
                "runs": values,
            }
        )
    result = {
        "config": {**RECSIM_CONFIG, "repeats": args.repeats, "seconds_per_run": args.seconds},
        "machine": machine(),
        "load_average_1min": loads,
        "results": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Interest evolution: steps per second",
        "",
        f"Machine: {machine()}. Load average (1 min) over the runs: "
        f"{min(loads):.1f}-{max(loads):.1f} (shared machine).",
        "",
        f"Random slates, num_candidates={NUM_CANDIDATES}, slate_size={SLATE_SIZE}; median of "
        f"{args.repeats} runs of at least {args.seconds:g} s each (min-max); a vector step of B "
        "users counts B steps. Produced by `python benchmarks/interest_evolution_speed.py`.",
        "",
        "| implementation | steps/s (median) | min-max | vs RecSim |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['implementation']} | {row['median_steps_per_s']:,.0f} | "
            f"{row['min']:,.0f}-{row['max']:,.0f} | {row['ratio_to_recsim']:.1f}x |"
        )
    (args.out / "speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
