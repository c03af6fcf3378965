"""The multi-platform training loop (FedSlate and baselines) on the batched multi-platform env.

CleanRL-flat: build :class:`~fedrec.envs.multi_platform.ChocKaleMultiPlatformBatchEnv` with U
users, then repeat ``agent.explore -> env.step -> agent.observe`` until every user's episode ends
(all users are synchronised), log U episodes, reset. A run directory holds

* ``config.json`` -- method (``agent``), env id and kwargs, seed, users, the agent's config;
* ``episodes.csv`` -- ``episode,step,length,return/platform_a,return/platform_b,...``: each
  platform's *true* engagement in the episode. For a platform without feedback it is read from
  ``env.evaluation_engagement()``, used here **only for logging**: learners get observations,
  the rewards of platforms with feedback, and nothing else;
* ``checkpoint.pt`` -- atomic, at episode boundaries: the pickled env, the agent's state and the
  loop's counters; ``resume=True`` continues bit-for-bit;
* ``final_eval.json`` -- per-platform greedy evaluation of the trained agent on held-out episodes,
  beside random (and the joint optimal planner), as ``{"policies": {"agent": {"platform_a":
  {"mean", "half_width", "returns"}, ..., "total": ...}, "random": ..., "planner": ...}}``, plus
  the training wall time and the communication per user-episode and party.

``fedrec eval RUN_DIR`` reads these runs (``docs/metrics.md``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import pickle
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.agents.fedslate import ALL_METHODS, make_agent
from fedrec.agents.registry import json_ready
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.train.checkpoint import load_checkpoint, save_checkpoint, write_json, write_text

ENV_ID = "fedrec/ChocKaleMultiPlatform-v0"
#: Evaluation episodes are seeded far from training seeds so they are held out.
EVAL_SEED_OFFSET = 1_000_000


@dataclasses.dataclass(frozen=True)
class MultiPlatformTrainConfig:
    """What to train, on which multi-platform env, for how long."""

    method: str = "fedslate"
    """fedslate | fedslate_exp | fedq | slateq | random"""
    episodes: int = 5000
    """user-episodes to train (logged one row each)"""
    num_users: int = 16
    """users simulated in parallel (one batched env step = U transitions per platform)"""
    seed: int = 0
    """seeds the env and the agent"""
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """ChocKaleMultiPlatformBatchEnv kwargs: num_platforms, feedback, reward_mode, N, n, ..."""
    agent_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """FedSlateConfig overrides (e.g. global_network='linear')"""
    checkpoint_every: int = 500
    """user-episodes between atomic checkpoints (0: only at the end)"""
    eval_episodes: int = 500
    """held-out user-episodes for the final greedy evaluation (0: skip)"""
    planner: bool = True
    """also evaluate the joint optimal planner (an oracle upper bound) in the final evaluation"""
    progress: bool = True
    """show a progress bar"""
    torch_threads: int = 1
    """PyTorch intra-op threads"""
    label: str | None = None
    """group label for ``fedrec eval`` (default: grouped by config)"""

    def __post_init__(self) -> None:
        if self.method not in ALL_METHODS:
            raise ValueError(f"method must be one of {ALL_METHODS}, got {self.method!r}")
        if self.episodes < 1 or self.num_users < 1:
            raise ValueError("episodes and num_users must be >= 1")
        if self.checkpoint_every < 0 or self.eval_episodes < 0:
            raise ValueError("checkpoint_every and eval_episodes must be >= 0")


@dataclasses.dataclass
class MultiPlatformResult:
    """What a finished run produced (also on disk in ``out_dir``)."""

    out_dir: Path | None
    returns: dict[str, np.ndarray]
    steps: int
    wall_time: float
    final_eval: dict[str, Any] | None
    traffic: dict[str, dict[str, float]]


def make_env(config: MultiPlatformTrainConfig, num_users: int | None = None) -> Any:
    return ChocKaleMultiPlatformBatchEnv(num_users or config.num_users, **dict(config.env_kwargs))


def _header(platforms: list[str]) -> list[str]:
    return ["episode", "step", "length", *[f"return/{p}" for p in platforms]]


def _write_rows(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_text(path, buffer.getvalue())


def _read_rows(path: Path, header: list[str]) -> list[list[Any]]:
    with path.open(newline="") as file:
        reader = csv.reader(file)
        found = next(reader, None)
        if found != header:
            raise ValueError(f"{path}: expected header {','.join(header)}, got {found}")
        return [[int(r[0]), int(r[1]), int(r[2]), *map(float, r[3:])] for r in reader]


def train_multi_platform(
    config: MultiPlatformTrainConfig,
    *,
    out_dir: Path | str | None = None,
    resume: bool = False,
) -> MultiPlatformResult:
    """Train ``config.method`` on the multi-platform env; see the module doc for the files."""
    torch.set_num_threads(config.torch_threads)
    out = Path(out_dir) if out_dir is not None else None
    env = make_env(config)
    agent = make_agent(config.method, env, seed=config.seed, **dict(config.agent_kwargs))
    platforms = list(env.possible_agents)
    agent_config = getattr(agent, "config", None)
    run_config = json_ready(
        {
            "agent": config.method,
            "env_id": ENV_ID,
            "seed": config.seed,
            "episodes": config.episodes,
            "num_envs": config.num_users,
            "env_kwargs": dict(config.env_kwargs),
            "agent_config": dataclasses.asdict(agent_config) if agent_config else {},
            "feedback": env.feedback,
            **({"label": config.label} if config.label else {}),
        }
    )
    header = _header(platforms)
    checkpoint_path = out / "checkpoint.pt" if out is not None else None
    rows: list[list[Any]] = []
    state = None
    if resume:
        if out is None or not (out / "config.json").is_file():
            raise FileNotFoundError(f"--resume: no run at {out}")
        saved = json.loads((out / "config.json").read_text())
        keys = ("agent", "seed", "num_envs", "env_kwargs", "agent_config")
        differ = [k for k in keys if saved.get(k) != run_config.get(k)]
        if differ:
            raise ValueError(f"--resume: {out} was made with a different setup ({differ})")
        if checkpoint_path.is_file():
            state = load_checkpoint(checkpoint_path)
    if out is not None:
        write_json(out / "config.json", run_config)

    if state is not None:
        env = pickle.loads(state["env"])
        agent.load_state_dict(state["agent"])
        loop = state["loop"]
        rows = _read_rows(out / "episodes.csv", header)[: loop["episodes_done"]]
        steps, elapsed, started = loop["steps"], loop["elapsed"], loop["started"]
    else:
        steps, elapsed, started = 0, 0.0, False
    if out is not None:
        _write_rows(out / "episodes.csv", header, rows)

    from tqdm.auto import tqdm

    bar = tqdm(
        total=config.episodes,
        initial=len(rows),
        unit=" episodes",
        disable=not config.progress,
        dynamic_ncols=True,
    )
    start = time.perf_counter()
    next_checkpoint = _next_multiple(len(rows), config.checkpoint_every)
    first = platforms[0]

    def checkpoint() -> None:
        if checkpoint_path is None:
            return
        _write_rows(out / "episodes.csv", header, rows)
        loop_state = {
            "episodes_done": len(rows),
            "steps": steps,
            "elapsed": elapsed + time.perf_counter() - start,
            "started": True,
        }
        save_checkpoint(
            checkpoint_path,
            {"loop": loop_state, "env": pickle.dumps(env), "agent": agent.state_dict()},
        )

    try:
        while len(rows) < config.episodes:
            obs, _ = env.reset(seed=None if started else config.seed)
            started = True
            length, running = 0, True
            while running:
                slates = agent.explore(obs)
                next_obs, rewards, terminated, truncated, _ = env.step(slates)
                feedback_rewards = {p: rewards[p] for p in platforms if env.feedback[p]}
                agent.observe(obs, slates, feedback_rewards, next_obs, terminated[first])
                obs = next_obs
                steps += config.num_users
                length += 1
                running = not (terminated[first].all() or truncated[first].all())
            # Logging only: true engagement of every platform (never handed to the agent).
            engagement = env.evaluation_engagement()
            agent.end_episode(config.num_users)
            room = config.episodes - len(rows)
            for user in range(min(config.num_users, room)):
                rows.append(
                    [len(rows) + 1, steps, length] + [float(engagement[p][user]) for p in platforms]
                )
            bar.update(min(config.num_users, room))
            recent = {
                p[9:]: f"{np.mean([r[3 + i] for r in rows[-100:]]):.0f}"
                for i, p in enumerate(platforms)
            }
            bar.set_postfix(recent, refresh=False)
            if next_checkpoint and len(rows) >= next_checkpoint and len(rows) < config.episodes:
                checkpoint()
                next_checkpoint = _next_multiple(len(rows), config.checkpoint_every)
        checkpoint()
    finally:
        bar.close()
    wall_time = elapsed + time.perf_counter() - start
    if out is not None:
        _write_rows(out / "episodes.csv", header, rows)
    traffic = agent.traffic()
    final_eval = None
    if config.eval_episodes:
        final_eval = final_evaluation(agent, config=config)
        final_eval["train_wall_time_s"] = wall_time
        final_eval["traffic_bytes_per_episode"] = traffic
        if out is not None:
            write_json(out / "final_eval.json", json_ready(final_eval))
    returns = {p: np.array([r[3 + i] for r in rows]) for i, p in enumerate(platforms)}
    return MultiPlatformResult(out, returns, steps, wall_time, final_eval, traffic)


def final_evaluation(agent: Any, *, config: MultiPlatformTrainConfig) -> dict[str, Any]:
    """Greedy per-platform returns of ``agent``, random and (optionally) the joint planner, on
    the same held-out episodes (true engagement, read through the env's evaluation channel)."""
    from fedrec.agents.fedslate import RandomMultiPolicy
    from fedrec.agents.reference import JointReferencePolicy, OptimalPlanner
    from fedrec.eval.rollout import evaluate_joint_policy

    seed = EVAL_SEED_OFFSET + config.seed
    probe = make_env(config, 1)
    policies: dict[str, Any] = {
        "agent": agent,
        "random": RandomMultiPolicy(probe.possible_agents, probe.params, seed=seed),
    }
    if config.planner:
        planner = OptimalPlanner(probe.params, seed=seed)
        policies["planner"] = JointReferencePolicy(planner, probe.params, probe.possible_agents)
    results = {}
    for name, policy in policies.items():
        summaries = evaluate_joint_policy(
            policy,
            episodes=config.eval_episodes,
            num_envs=min(config.eval_episodes, 500),
            seed=seed,
            env_kwargs=config.env_kwargs,
        )
        results[name] = {
            platform: {
                "mean": s.mean,
                "half_width": s.half_width,
                "returns": s.returns.tolist(),
            }
            for platform, s in summaries.items()
        }
    return {"episodes": config.eval_episodes, "seed": seed, "policies": results}


def _next_multiple(value: int, every: int) -> int:
    return 0 if every <= 0 else (value // every + 1) * every
