"""One training loop for any slate agent on any registered environment, single or batched.

The loop is flat on purpose (CleanRL style): build the batched env with ``gymnasium.make_vec``,
then repeat ``explore_batch -> env.step -> learn`` and log every finished episode. A run writes

* ``config.json`` -- agent, env, seed and hyperparameters (what ``--resume`` checks against);
* ``episodes.csv`` -- ``episode,step,return,length``, one row per finished training episode;
* ``checkpoint.pt`` -- written atomically every ``checkpoint_every`` episodes: the agent's
  :meth:`state_dict`, the pickled environment (its RNG and users mid-episode) and the loop's own
  state, so that a resumed run continues bit-for-bit as if never interrupted;
* ``final_eval.json`` -- the final greedy policy, and on Choc-vs-Kale the random, myopic and
  optimal-planner policies, on the same held-out evaluation episodes.

Read the run with ``fedrec eval RUN_DIR`` (:mod:`fedrec.eval.etror`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import pickle
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from fedrec.agents.base import SlateAgent, Transitions
from fedrec.agents.registry import json_ready
from fedrec.eval.rollout import evaluate_policy
from fedrec.train.checkpoint import load_checkpoint, save_checkpoint, write_json, write_text

CSV_HEADER = ("episode", "step", "return", "length")
#: Evaluation episodes are seeded far from training seeds so they are held out.
EVAL_SEED_OFFSET = 1_000_000


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """What to train on and for how long. The agent's own hyperparameters live in its Config."""

    env_id: str
    """registered Gymnasium id, e.g. ``fedrec/ChocKaleSlate-v0``"""
    episodes: int | None = 5000
    """stop after this many finished training episodes (None: use ``steps``)"""
    steps: int | None = None
    """or stop after this many transitions (user-steps)"""
    num_envs: int = 16
    """users simulated in parallel by the native batched env"""
    seed: int = 0
    """seeds the env; the agent is built with the same seed"""
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """keyword arguments for ``gymnasium.make_vec`` (e.g. num_candidates, slate_size)"""
    checkpoint_every: int = 500
    """episodes between atomic checkpoints (0: only at the end)"""
    eval_episodes: int = 500
    """held-out episodes for the final greedy evaluation (0: skip)"""
    references: bool = True
    """also evaluate random/myopic/planner on the same episodes (Choc-vs-Kale envs)"""
    progress: bool = True
    """show a progress bar with the running mean return"""
    torch_threads: int = 1
    """PyTorch intra-op threads (one is fastest for small networks on shared cores)"""

    def __post_init__(self) -> None:
        if (self.episodes is None) == (self.steps is None):
            raise ValueError("give exactly one of episodes or steps")
        for name in ("episodes", "steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        if self.checkpoint_every < 0 or self.eval_episodes < 0:
            raise ValueError("checkpoint_every and eval_episodes must be >= 0")


@dataclasses.dataclass
class TrainResult:
    """What a finished run produced (also on disk in ``out_dir``)."""

    out_dir: Path | None
    returns: np.ndarray
    steps: int
    wall_time: float
    final_eval: dict[str, Any] | None


AgentFactory = Callable[[gym.vector.VectorEnv], SlateAgent]


def make_env(config: TrainConfig) -> gym.vector.VectorEnv:
    """The batched training env, with same-step autoreset (the final observation is in info).

    The env's native batched version when it registers one (every fedrec env does); otherwise
    Gymnasium's ``SyncVectorEnv`` over copies of the single env, so any registered env trains.
    """
    try:
        spec = gym.spec(config.env_id)
        if spec.vector_entry_point is not None:
            return gym.make_vec(
                config.env_id,
                num_envs=config.num_envs,
                vectorization_mode="vector_entry_point",
                autoreset_mode=AutoresetMode.SAME_STEP,
                **dict(config.env_kwargs),
            )
        return gym.make_vec(
            config.env_id,
            num_envs=config.num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            **dict(config.env_kwargs),
        )
    except gym.error.Error as error:
        raise ValueError(f"cannot build {config.env_id!r} batched: {error}") from error


def _final_next_observations(
    next_obs: Mapping[str, np.ndarray], info: Mapping[str, Any], done: np.ndarray
) -> dict[str, np.ndarray]:
    """The true s' of each user: the reset observation is replaced by ``final_obs`` where done."""
    if not done.any():  # the common step: nothing to replace, no copy
        return dict(next_obs)
    true_next = {key: np.array(value, copy=True) for key, value in next_obs.items()}
    final = info["final_obs"]
    for key in true_next:
        if isinstance(final, Mapping):  # native batched envs: one dict of arrays
            true_next[key][done] = np.asarray(final[key])[done]
        else:  # SyncVectorEnv: an object array holding each finished user's observation
            for user in np.flatnonzero(done):
                true_next[key][user] = final[user][key]
    return true_next


def _check_resume_config(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    path: Path,
    *,
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """Refuse to resume a different setup. A hyperparameter the saved run predates (added to the
    agent's Config later) is accepted when it still has its default, which keeps old behaviour."""
    saved = dict(saved)
    if defaults and isinstance(saved.get("agent_config"), Mapping):
        missing = set(defaults) - set(saved["agent_config"])
        saved["agent_config"] = {**{k: defaults[k] for k in missing}, **saved["agent_config"]}
    keys = ("agent", "env_id", "seed", "num_envs", "env_kwargs", "agent_config")
    differ = [k for k in keys if json_ready(saved.get(k)) != json_ready(current.get(k))]
    if differ:
        detail = "; ".join(f"{k}: saved {saved.get(k)!r}, now {current.get(k)!r}" for k in differ)
        raise ValueError(f"--resume: {path} was made with a different setup ({detail})")


class _EpisodeLog:
    """``episodes.csv``: appended as episodes finish, truncated to the checkpoint on resume."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.returns: list[float] = []
        self._file: io.TextIOWrapper | None = None
        self._writer: Any = None

    def open(self, rows: list[tuple[int, int, float, int]]) -> None:
        self.returns = [row[2] for row in rows]
        if self.path is None:
            return
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(CSV_HEADER)
        writer.writerows(rows)
        write_text(self.path, buffer.getvalue())
        self._file = self.path.open("a", newline="")
        self._writer = csv.writer(self._file, lineterminator="\n")

    def add(self, step: int, episode_return: float, length: int) -> None:
        self.returns.append(episode_return)
        if self._writer is not None:
            self._writer.writerow((len(self.returns), step, repr(episode_return), length))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_episodes_csv(path: Path) -> list[tuple[int, int, float, int]]:
    """Rows of an ``episodes.csv`` (used by resume to keep the rows up to the checkpoint)."""
    rows = []
    with path.open(newline="") as file:
        reader = csv.reader(file)
        header = next(reader, None)
        if header is None or tuple(header[:4]) != CSV_HEADER:
            raise ValueError(f"{path}: expected header {','.join(CSV_HEADER)}, got {header}")
        for line, row in enumerate(reader, start=2):
            try:
                rows.append((int(row[0]), int(row[1]), float(row[2]), int(row[3])))
            except (ValueError, IndexError) as error:
                raise ValueError(f"{path}, line {line}: malformed row {row}") from error
    return rows


def _tensorboard_writer(out_dir: Path | None) -> Any:
    """A TensorBoard SummaryWriter when the ``tensorboard`` package is installed, else None."""
    if out_dir is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(log_dir=str(out_dir / "tensorboard"))


def train(
    agent: SlateAgent | AgentFactory,
    *,
    config: TrainConfig,
    out_dir: Path | str | None = None,
    resume: bool = False,
    run_info: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Train ``agent`` (or ``agent(env)`` for a factory) on ``config.env_id``; see module doc.

    :param out_dir: where the run's files go (None: keep everything in memory, no checkpoints).
    :param resume: continue from ``out_dir/checkpoint.pt``; the setup must match ``config.json``.
    :param run_info: extra entries for ``config.json`` (the CLI records the agent's name and
        hyperparameters here so ``--resume`` and ``fedrec eval`` can read them).
    """
    torch.set_num_threads(config.torch_threads)
    out = Path(out_dir) if out_dir is not None else None
    env = make_env(config)
    agent = agent if isinstance(agent, SlateAgent) else agent(env)
    run_config = {
        "env_id": config.env_id,
        "seed": config.seed,
        "episodes": config.episodes,
        "steps": config.steps,
        "num_envs": config.num_envs,
        "env_kwargs": dict(config.env_kwargs),
        "agent": type(agent).__name__,
        "agent_config": _config_dict(getattr(agent, "config", None)),
    }
    run_config.update(run_info or {})
    run_config = json_ready(run_config)

    checkpoint_path = out / "checkpoint.pt" if out is not None else None
    log = _EpisodeLog(out / "episodes.csv" if out is not None else None)
    state: dict[str, Any] | None = None
    if resume:
        if out is None:
            raise ValueError("--resume needs an output directory")
        saved_path = out / "config.json"
        if not saved_path.is_file():
            raise FileNotFoundError(f"--resume: {saved_path} not found (was the run started?)")
        _check_resume_config(
            json.loads(saved_path.read_text()),
            run_config,
            saved_path,
            defaults=json_ready(_config_dict(_default_config(agent))),
        )
        if checkpoint_path.is_file():
            state = load_checkpoint(checkpoint_path)
    if out is not None:
        write_json(out / "config.json", run_config)

    if state is not None:
        env.close()
        env = pickle.loads(state["env"])
        agent.load_state_dict(state["agent"])
        loop = state["loop"]
        rows = read_episodes_csv(out / "episodes.csv")[: loop["episodes_done"]]
        if len(rows) != loop["episodes_done"]:
            raise ValueError(
                f"{out / 'episodes.csv'} has fewer rows than the checkpoint's episodes"
            )
        log.open(rows)
        obs, info = loop["obs"], loop["info"]
        episode_return, episode_length = loop["episode_return"], loop["episode_length"]
        steps_done, elapsed = loop["steps_done"], loop["elapsed"]
        pending = list(loop["pending"])
    else:
        log.open([])
        obs, info = env.reset(seed=config.seed)
        agent.begin_episodes(np.ones(config.num_envs, dtype=bool))
        episode_return = np.zeros(config.num_envs)
        episode_length = np.zeros(config.num_envs, dtype=np.int64)
        steps_done, elapsed = 0, 0.0
        pending: list[tuple[int, float, int]] = []

    def room() -> bool:
        return config.episodes is None or len(log.returns) < config.episodes

    def finished() -> bool:
        if config.episodes is not None:
            return len(log.returns) >= config.episodes
        return steps_done >= config.steps

    def checkpoint() -> None:
        if checkpoint_path is None:
            return
        log.flush()
        loop_state = {
            "obs": obs,
            "info": info,
            "episode_return": episode_return,
            "episode_length": episode_length,
            "steps_done": steps_done,
            "episodes_done": len(log.returns),
            "pending": list(pending),
            "elapsed": elapsed + time.perf_counter() - start,
        }
        save_checkpoint(
            checkpoint_path,
            {"loop": loop_state, "env": pickle.dumps(env), "agent": agent.state_dict()},
        )

    writer = _tensorboard_writer(out)
    total = config.episodes if config.episodes is not None else config.steps
    bar = _progress(config.progress, total, "episodes" if config.episodes else "steps")
    bar.update(len(log.returns) if config.episodes else steps_done)
    start = time.perf_counter()
    next_checkpoint = _next_multiple(len(log.returns), config.checkpoint_every)
    metrics: dict[str, float] = {}
    try:
        while pending and room():
            log.add(*pending.pop(0))
        while not finished():
            slates = agent.explore_batch(obs, infos=info)
            next_obs, rewards, terminated, truncated, next_info = env.step(slates)
            done = np.asarray(terminated) | np.asarray(truncated)
            transitions = Transitions(
                observations=obs,
                slates=np.asarray(slates),
                rewards=np.asarray(rewards, dtype=np.float64),
                next_observations=_final_next_observations(next_obs, next_info, done),
                terminated=np.asarray(terminated),
                truncated=np.asarray(truncated),
            )
            metrics = agent.learn(transitions) or metrics
            obs, info = next_obs, next_info
            steps_done += config.num_envs
            episode_return += rewards
            episode_length += 1
            before = len(log.returns)
            pending += [
                (steps_done, float(episode_return[user]), int(episode_length[user]))
                for user in np.flatnonzero(done)
            ]
            # Episodes past the target wait in `pending` (checkpointed), so extending a finished
            # run with --resume logs exactly what one longer run would have.
            while pending and room():
                log.add(*pending.pop(0))
                if writer is not None:
                    writer.add_scalar("episode/return", log.returns[-1], len(log.returns))
            if done.any():
                agent.begin_episodes(done)
            episode_return[done] = 0.0
            episode_length[done] = 0
            if writer is not None and metrics:
                for name, value in metrics.items():
                    writer.add_scalar(f"train/{name}", value, steps_done)
            bar.update(len(log.returns) - before if config.episodes else config.num_envs)
            if len(log.returns) > before:
                bar.set_postfix(_postfix(log.returns, metrics), refresh=False)
            if next_checkpoint and len(log.returns) >= next_checkpoint and not finished():
                checkpoint()
                next_checkpoint = _next_multiple(len(log.returns), config.checkpoint_every)
        checkpoint()
    finally:
        bar.close()
        log.close()
        if writer is not None:
            writer.close()
    wall_time = elapsed + time.perf_counter() - start

    final_eval = None
    if config.eval_episodes:
        final_eval = final_evaluation(agent, config=config)
        final_eval["train_wall_time_s"] = wall_time
        if out is not None:
            write_json(out / "final_eval.json", final_eval)
    return TrainResult(out, np.asarray(log.returns), steps_done, wall_time, final_eval)


def final_evaluation(agent: SlateAgent, *, config: TrainConfig) -> dict[str, Any]:
    """Greedy returns of ``agent`` (and reference policies) on the same held-out episodes."""
    from fedrec.agents.reference import env_params, reference_policies

    seed = EVAL_SEED_OFFSET + config.seed
    num_envs = min(config.eval_episodes, 500)
    policies: dict[str, SlateAgent] = {"agent": agent}
    if config.references:
        probe = gym.make(config.env_id, **dict(config.env_kwargs))
        try:
            params = env_params(probe)
        except ValueError:
            params = None
        probe.close()
        if params is not None:
            policies.update(reference_policies(params, seed=seed))
    results = {}
    for name, policy in policies.items():
        summary = evaluate_policy(
            config.env_id,
            policy,
            episodes=config.eval_episodes,
            num_envs=num_envs,
            seed=seed,
            env_kwargs=config.env_kwargs,
        )
        results[name] = {
            "mean": summary.mean,
            "half_width": summary.half_width,
            "returns": summary.returns.tolist(),
        }
    return {"episodes": config.eval_episodes, "seed": seed, "policies": results}


def _default_config(agent: SlateAgent) -> Any:
    try:
        return type(agent).Config()
    except TypeError:  # a Config with required fields has no defaults to fill in
        return None


def _config_dict(config: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return {}


def _next_multiple(value: int, every: int) -> int:
    return 0 if every <= 0 else (value // every + 1) * every


def _postfix(returns: list[float], metrics: Mapping[str, float]) -> dict[str, str]:
    postfix = {"return": f"{np.mean(returns[-100:]):.1f}"}
    if "epsilon" in metrics:
        postfix["eps"] = f"{metrics['epsilon']:.3f}"
    if "loss" in metrics:
        postfix["loss"] = f"{metrics['loss']:.3g}"
    return postfix


def _progress(enabled: bool, total: int, unit: str) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total, unit=f" {unit}", disable=not enabled, dynamic_ncols=True, smoothing=0.05
    )
