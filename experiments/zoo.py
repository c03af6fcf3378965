"""``fedrec bench zoo``: one leaderboard of the single-platform slate agents on every simulated env.

Every learning agent (:data:`LEARNERS`) is trained on every environment (:data:`ENVS`) for the
env's budget of env steps (user-steps, the same for every agent of an env) and ``--seeds`` seeds
with fedrec's training loop (:func:`fedrec.train.loop.train`, in memory, no checkpoints), then
its greedy policy is evaluated on ``--eval-episodes`` held-out episodes; the reference policies
(:data:`REFERENCES`: random, the fixed heuristics top-x and bottom-x, the best open-loop rule,
and the oracles myopic, planner, belief planner and the cascade optimum, which read the hidden
user) are evaluated on the same held-out episodes of each seed. An agent that refuses an env
(its ``from_env`` raises, e.g. SlateQ without Choc-vs-Kale's choice model) and a reference an
env does not define are rows with the reason instead of a number. The table gives the mean
return over seeds with its 95% t-interval, the gain over the best no-learning policy (random,
top-x, bottom-x, best open-loop; paired per seed on the same episodes), the training wall time per run
and the training throughput in env steps per second. In the same run the training throughput of
``sac_topk`` and ``reinforce_topk`` is measured against Stable-Baselines3's SAC and PPO (the
nearest outside implementations, on fedrec's SB3 adapter; median of ``--speed-runs``
alternating runs) and reported as a ratio. The default run's records took 93 min of run time on this project's
2-core machine under heavy load (an estimated 15-20 min on a free core); ``--quick`` takes seconds.

Each run's record is ``OUT/runs/ENV/AGENT/seedS.json`` (the references'
``OUT/runs/ENV/references/seedS.json``); a record whose setup matches is read, not rerun, so an
interrupted leaderboard completes when the command is run again, and ``OUT/config.json`` refuses
a folder of another configuration. Writes ``leaderboard.md``, ``leaderboard.csv``,
``leaderboard.json``, ``headline.md`` and ``speed.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedrec.experiments import harness
from fedrec.experiments.zoo_config import (
    BENCH,
    ENVS,
    LEARNERS,
    NO_LEARNING,
    NUM_ENVS,
    QUICK,
    REFERENCES,
    EnvSpec,
    ZooConfig,
    default_envs,
    sardine_installed,
)
from fedrec.experiments.zoo_speed import SPEED_ENV, SPEED_PAIRS, measure_speed, speed_key
from fedrec.experiments.zoo_tables import Row, build_rows, render, write_outputs

__all__ = [
    "BENCH", "ENVS", "LEARNERS", "NO_LEARNING", "NUM_ENVS", "QUICK", "REFERENCES", "SPEED_ENV",
    "SPEED_PAIRS", "EnvSpec", "Row", "ZooConfig", "add_parser", "build_rows", "collect",
    "default_envs", "evaluate_references", "measure_speed", "read_speed", "rebuild", "render",
    "run", "run_path", "sardine_installed", "train_one", "write_outputs",
]  # fmt: skip


# ------------------------------------------------------------------------------------ runs


def _agent_key(env: str, agent: str, seed: int, config: ZooConfig) -> dict[str, Any]:
    """The setup of one learner's run (checked against its cached record)."""
    from fedrec.agents.registry import json_ready, make_config, resolve_agent

    spec = ENVS[env]
    overrides = dict(spec.overrides.get(agent, {}))
    agent_config = make_config(resolve_agent(agent), overrides)
    return {
        "env_id": spec.env_id,
        "agent": agent,
        "agent_config": json_ready(dataclasses.asdict(agent_config)),
        "steps": config.budget(env),
        "num_envs": NUM_ENVS,
        "seed": seed,
        "eval_episodes": config.eval_budget(env),
    }


def _eval_seed(seed: int) -> int:
    from fedrec.eval.rollout import EVAL_SEED_OFFSET

    return EVAL_SEED_OFFSET + seed


def _evaluate(env_id: str, policy: Any, episodes: int, seed: int) -> dict[str, float]:
    from fedrec.eval.rollout import evaluate_policy

    start = time.perf_counter()
    summary = evaluate_policy(
        env_id, policy, episodes=episodes, num_envs=min(episodes, 200), seed=_eval_seed(seed)
    )
    return {
        "mean": float(summary.mean),
        "episode_half_width": float(summary.half_width),
        "eval_seconds": time.perf_counter() - start,
    }


def train_one(key: Mapping[str, Any]) -> dict[str, Any]:
    """Train one learner (``key`` from :func:`_agent_key`) and evaluate its greedy policy; a
    learner that refuses the env is a record with the reason."""
    import torch

    from fedrec.agents.registry import config_from_json, resolve_agent
    from fedrec.train.loop import TrainConfig, train

    torch.set_num_threads(1)
    cls = resolve_agent(key["agent"])
    agent_config = config_from_json(cls, key["agent_config"])
    built: list[Any] = []

    def factory(env: Any) -> Any:
        built.append(cls.from_env(env, config=agent_config, seed=key["seed"]))
        return built[-1]

    run = TrainConfig(
        env_id=key["env_id"],
        episodes=None,
        steps=key["steps"],
        num_envs=key["num_envs"],
        seed=key["seed"],
        checkpoint_every=0,
        eval_episodes=0,
        references=False,
        progress=False,
    )
    start = time.perf_counter()
    try:
        result = train(factory, config=run)
    except ValueError as error:
        if built:  # the agent accepted the env and then failed: a bug, not a skip
            raise
        return {"key": dict(key), "skipped": " ".join(str(error).split())}
    seconds = time.perf_counter() - start
    evaluation = _evaluate(key["env_id"], built[0], key["eval_episodes"], key["seed"])
    return {
        "key": dict(key),
        **evaluation,
        "train_seconds": seconds,
        "env_steps": int(result.steps),
        "steps_per_second": result.steps / seconds,
    }


def _reference_key(env: str, seed: int, config: ZooConfig) -> dict[str, Any]:
    return {
        "env_id": ENVS[env].env_id,
        "seed": seed,
        "eval_episodes": config.eval_budget(env),
        "references": list(REFERENCES),
    }


def _slate_size(env_id: str) -> int:
    import gymnasium as gym

    from fedrec.agents.base import slate_size_of

    probe = gym.make(env_id)
    try:
        return slate_size_of(probe)
    finally:
        probe.close()


def evaluate_references(key: Mapping[str, Any]) -> dict[str, Any]:
    """Every reference policy the env defines, on the held-out episodes of ``key["seed"]``;
    the others with the reason they do not apply."""
    import gymnasium as gym
    import torch

    from fedrec.agents.cascade_oracle import CascadeOraclePolicy
    from fedrec.agents.reference import (
        HighestFeaturePolicy,
        LowestFeaturePolicy,
        RandomPolicy,
        env_params,
        reference_policies,
    )

    torch.set_num_threads(1)
    env_id, seed = key["env_id"], key["seed"]
    eval_seed = _eval_seed(seed)
    probe = gym.make(env_id)
    try:
        params = env_params(probe)
    except ValueError:
        params = None
    finally:
        probe.close()
    size = _slate_size(env_id)
    policies: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    if params is not None:
        policies = dict(reference_policies(params, seed=eval_seed))
        if "belief_planner" not in policies:
            skipped["belief_planner"] = "no hidden user types (it is the planner here)"
    else:
        policies = {
            "random": RandomPolicy(slate_size=size, seed=eval_seed),
            "top_x": HighestFeaturePolicy(slate_size=size, seed=eval_seed),
            "bottom_x": LowestFeaturePolicy(slate_size=size, seed=eval_seed),
        }
        for name in ("best_open_loop", "myopic", "planner", "belief_planner"):
            skipped[name] = "needs the Choc-vs-Kale model (the env has none)"
    policies["cascade_oracle"] = CascadeOraclePolicy(slate_size=size, seed=eval_seed)
    results: dict[str, Any] = {}
    for name in REFERENCES:
        if name in skipped:
            results[name] = {"skipped": skipped[name]}
            continue
        try:
            results[name] = _evaluate(env_id, policies[name], key["eval_episodes"], seed)
        except ValueError:  # the env lacks what the policy reads
            if name != "cascade_oracle":
                raise
            results[name] = {"skipped": "no cascade attraction probabilities in the env's info"}
    return {"key": dict(key), "policies": results}


_RESULT = harness.record(
    {"mean": harness.finite, "eval_seconds": harness.non_negative},
    {"train_seconds": harness.non_negative, "steps_per_second": harness.non_negative},
)
_SKIP = harness.record({"skipped": harness.string})


def _either(value: Any) -> str | None:
    if isinstance(value, dict) and "skipped" in value:
        return _SKIP(value)
    return _RESULT(value)


def AGENT_RECORD(value: Any) -> str | None:
    """A learner's record: its key and a result or a skip reason."""
    problem = harness.record({"key": harness.record({})})(value)
    return problem or _either({k: v for k, v in value.items() if k != "key"})


REFERENCE_RECORD = harness.record(
    {"key": harness.record({}), "policies": harness.mapping_of(_either, min_length=1)}
)


def _cached(path: Path, key: Mapping[str, Any], check: harness.Check, what: str) -> Any:
    """The record at ``path`` when there is one (refused when of another setup), else None."""
    if not path.exists():
        return None
    saved = harness.read_cached(path, check, what)
    harness.check_same(path, saved["key"], key, what=what)
    return saved


def run_path(out: Path, env: str, name: str, seed: int) -> Path:
    return out / "runs" / env / name / f"seed{seed}.json"


# ------------------------------------------------------------------------------------ driver


def _specs(config: ZooConfig) -> list[tuple[str, str, int, dict[str, Any]]]:
    """Every (env, name, seed, key) of the leaderboard: references first, then learners."""
    specs = []
    for env in config.env_list:
        for seed in range(config.seeds):
            specs.append((env, "references", seed, _reference_key(env, seed, config)))
            for agent in config.agents:
                specs.append((env, agent, seed, _agent_key(env, agent, seed, config)))
    return specs


def collect(config: ZooConfig, out: Path, *, run: bool = True, log: Any = None) -> dict:
    """Every run's record: read when cached, else (with ``run``) run and written; a progress bar
    with the ETA on a terminal (one line per finished run either way)."""
    from tqdm.auto import tqdm

    log = log or harness.log
    records: dict[str, Any] = {
        env: {"agents": {a: [] for a in config.agents}, "references": []} for env in config.env_list
    }
    specs = list(_specs(config))
    bar = tqdm(specs, desc="zoo runs", unit="run", disable=None, leave=False)  # None: a TTY only
    for env, name, seed, key in bar:
        path = run_path(out, env, name, seed)
        is_ref = name == "references"
        check = REFERENCE_RECORD if is_ref else AGENT_RECORD
        what = "fedrec bench zoo run record"
        record = _cached(path, key, check, what)
        if record is None:
            if not run:
                raise harness.BenchError(f"{path} is missing: run the command to make it")
            start = time.perf_counter()
            record = evaluate_references(key) if is_ref else train_one(key)
            harness.write_json(path, record)
            took = time.perf_counter() - start
            shown = "evaluated" if is_ref else record.get("skipped") or f"{record['mean']:.1f}"
            log(f"{env} {name} seed {seed}: {shown} ({took:.1f} s)")
        if is_ref:
            records[env]["references"].append(record)
        else:
            records[env]["agents"][name].append(record)
    return records


def read_speed(config: ZooConfig, out: Path, *, run: bool = True) -> dict[str, Any] | None:
    """The throughput comparison: ``speed.json`` when it matches, else measured (with ``run``)."""
    if config.speed_runs == 0:
        return None
    path, key = out / "speed.json", speed_key(config)
    if path.exists():
        saved = harness.read_cached(
            path, harness.record({"key": harness.record({}), "pairs": harness.record({})}),
            "fedrec bench zoo speed record",
        )  # fmt: skip
        harness.check_same(path, saved["key"], key, what="a throughput comparison")
        return saved["pairs"]
    if not run:
        raise harness.BenchError(f"{path} is missing: run the command to make it")
    pairs = measure_speed(config)
    harness.write_json(path, {"key": key, "pairs": pairs})
    return pairs


def check_config(config: ZooConfig, out: Path) -> None:
    """Refuse ``out`` when it holds another configuration's leaderboard (before anything runs)."""
    path = out / "config.json"
    if path.exists():
        saved = harness.read_cached(path, harness.record({}), "fedrec bench zoo configuration")
        harness.check_same(path, saved, config.key(), what="a leaderboard")
    elif out.exists() and any(out.iterdir()):
        raise harness.BenchError(
            f"{out} is not empty and holds no zoo leaderboard: choose another --out"
        )


def config_from_args(args: argparse.Namespace) -> ZooConfig:
    return harness.config_from_args(
        ZooConfig, args, **(QUICK if getattr(args, "quick", False) else {})
    )


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    """Register ``zoo`` under ``fedrec bench``."""
    harness.add_bench_parser(
        bench_subparsers,
        BENCH,
        ZooConfig,
        help="leaderboard of every single-platform agent on every env, with references and speed",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        handler=run,
        quick="a few seconds: slate and cascade, four agents, 2 seeds, 320 steps",
    )


def run(args: argparse.Namespace) -> int:
    """``fedrec bench zoo``: run (or read) every run, write and print the leaderboard."""
    config = config_from_args(args)
    missing = [env for env in config.env_list if ENVS[env].sardine and not sardine_installed()]
    if missing:
        raise harness.BenchError(
            f"{', '.join(missing)} need(s) the sardine extra: pip install 'fedrec[sardine]'"
        )
    out = config.out_path()
    check_config(config, out)
    out.mkdir(parents=True, exist_ok=True)
    harness.write_json(out / "config.json", config.key())
    start = time.perf_counter()
    records = collect(config, out)
    speed = read_speed(config, out)
    rows = build_rows(config, records)
    markdown = write_outputs(out, config, rows, speed)
    harness.show_markdown(markdown)  # compact by default; --wide prints the Markdown, --csv CSV
    harness.log(f"written to {out} ({time.perf_counter() - start:.0f} s)")
    return 0


def rebuild(out: Path) -> str:
    """The leaderboard Markdown of a finished ``out`` from its records alone (nothing runs):
    what ``leaderboard.md`` there must hold."""
    saved = harness.read_cached(
        out / "config.json", harness.record({}), "fedrec bench zoo configuration"
    )
    steps = saved["steps"]
    uniform = len(set(steps.values())) == 1 and all(
        steps[env] == steps[next(iter(steps))] for env in steps
    )
    config = ZooConfig(
        envs=tuple(saved["envs"]),
        agents=tuple(saved["agents"]),
        seeds=saved["seeds"],
        steps=None if all(steps[e] == ENVS[e].steps for e in steps) or not uniform
        else next(iter(steps.values())),
        eval_episodes=max(saved["eval_episodes"].values()),
        speed_steps=saved["speed_steps"],
        speed_runs=saved["speed_runs"],
        out=str(out),
    )  # fmt: skip
    harness.check_same(out / "config.json", saved, config.key(), what="a leaderboard")
    records = collect(config, out, run=False)
    speed = read_speed(config, out, run=False)
    return render(config, build_rows(config, records), speed)
