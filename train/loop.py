"""One training loop for any slate agent on any registered environment, single or batched.

The loop is flat on purpose (CleanRL style): build the batched env with ``gymnasium.make_vec``,
then repeat ``explore_batch -> env.step -> learn`` and log every finished episode
(:meth:`SlateTrainer.step`); the run directory, checkpoints, resume, logs and progress are the
shared training core's (:mod:`fedrec.train.core`). A run writes

* ``config.json`` -- agent, env, seed and hyperparameters (what ``--resume`` checks against);
* ``episodes.csv`` -- ``episode,step,return,length``, one row per finished training episode;
* ``checkpoint.pt`` -- written atomically every ``checkpoint_every`` episodes: the agent's
  :meth:`state_dict`, the environment's state as data (its RNG and users mid-episode, never a
  pickle) and the loop's own state, so that a resumed run continues bit-for-bit as if never
  interrupted; it is loaded with ``torch.load(weights_only=True)`` and refused in another run's
  directory (:mod:`fedrec.train.checkpoint`);
* ``final_eval.json`` -- the final greedy policy, and on Choc-vs-Kale the random, myopic and
  optimal-planner policies, on the same held-out evaluation episodes.

Read the run with ``fedrec eval RUN_DIR`` (:mod:`fedrec.eval.etror`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from fedrec.agents.base import SlateAgent, Transitions, visible_infos
from fedrec.envs.hidden import hidden_info_keys
from fedrec.eval.rollout import EVAL_SEED_OFFSET, evaluate_policy
from fedrec.train.core import (
    AGENT_SETUP_KEYS,
    CsvLog,
    Trainer,
    config_dict,
    default_config_dict,
    env_kwargs_errors,
)

CSV_HEADER = ("episode", "step", "return", "length")


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
    """episodes between atomic checkpoints (0: only at the end; an env that cannot save its
    state as data, e.g. a Gymnasium env without ``state_dict()``, trains only with 0, and then
    without any checkpoint)"""
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

    The env's native batched version when it registers one that takes ``autoreset_mode``
    (every fedrec env does); otherwise Gymnasium's ``SyncVectorEnv`` over copies of the single env
    (e.g. for ``CartPole-v1``, whose native ``CartPoleVectorEnv`` only resets on the next step),
    so any registered env trains. An env that cannot be built -- unknown id, or env kwargs it
    refuses or of the wrong type -- raises ``ValueError``.
    """
    try:
        with env_kwargs_errors(config.env_id, config.env_kwargs):
            spec = gym.spec(config.env_id)
            if _native_same_step(spec):
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


def _native_same_step(spec: Any) -> bool:
    """Whether ``spec`` registers a native batched env that accepts ``autoreset_mode``."""
    creator = spec.vector_entry_point
    if creator is None:
        return False
    if isinstance(creator, str):
        from gymnasium.envs.registration import load_env_creator

        creator = load_env_creator(creator)
    try:
        parameters = inspect.signature(creator).parameters
    except (TypeError, ValueError):  # no signature to read: try it natively
        return True
    return "autoreset_mode" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


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


def _plain_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The info dict as checkpointable data: SyncVectorEnv's object arrays of final observations
    are left out (they belong to the step already learned from; agents act on the rest)."""
    return {
        key: value
        for key, value in info.items()
        if not (isinstance(value, np.ndarray) and value.dtype == object)
    }


class SlateTrainer(Trainer):
    """The single-platform loop: ``explore_batch -> env.step -> learn`` on a batched env."""

    header = CSV_HEADER
    row_tag = "episode"

    def __init__(
        self,
        agent: SlateAgent | AgentFactory,
        *,
        config: TrainConfig,
        out_dir: Path | str | None = None,
        resume: bool = False,
        run_info: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.env = make_env(config)
        self.hidden_keys = hidden_info_keys(self.env)  # stripped from the infos of a non-oracle
        self.agent = agent if isinstance(agent, SlateAgent) else agent(self.env)
        run_config = {
            "env_id": config.env_id,
            "seed": config.seed,
            "episodes": config.episodes,
            "steps": config.steps,
            "num_envs": config.num_envs,
            "env_kwargs": dict(config.env_kwargs),
            "agent": type(self.agent).__name__,
            "agent_config": config_dict(getattr(self.agent, "config", None)),
            **dict(run_info or {}),
        }
        self.unit = "episodes" if config.episodes is not None else "steps"
        super().__init__(
            run_config=run_config,
            setup_keys=AGENT_SETUP_KEYS,
            out_dir=out_dir,
            resume=resume,
            progress=config.progress,
            checkpoint_every=config.checkpoint_every,
            total=config.episodes if config.episodes is not None else config.steps,
            torch_threads=config.torch_threads,
            config_defaults=default_config_dict(type(self.agent).Config),
        )
        self.steps_done = 0
        # Episodes past the target wait in `pending` (checkpointed), so extending a finished
        # run with --resume logs exactly what one longer run would have.
        self.pending: list[tuple[int, float, int]] = []
        self.episodes_logged = 0
        self.metrics: dict[str, float] = {}

    def start(self) -> None:
        n = self.config.num_envs
        self.obs, self.info = self.env.reset(seed=self.config.seed)
        self.agent.begin_episodes(np.ones(n, dtype=bool))
        self.episode_return = np.zeros(n)
        self.episode_length = np.zeros(n, dtype=np.int64)

    def _room(self) -> bool:
        return self.config.episodes is None or self.episodes_logged < self.config.episodes

    def finished(self) -> bool:
        if self.config.episodes is not None:
            return self.episodes_logged >= self.config.episodes
        return self.steps_done >= self.config.steps

    def progress(self) -> float:
        return self.episodes_logged if self.config.episodes is not None else self.steps_done

    def _drain(self) -> list[tuple[int, int, float, int]]:
        rows = []
        while self.pending and self._room():
            step, episode_return, length = self.pending.pop(0)
            self.episodes_logged += 1
            rows.append((self.episodes_logged, step, episode_return, length))
        return rows

    def step(self) -> tuple[list[Any], Mapping[str, float]]:
        rows = self._drain()  # episodes left pending by a finished run that is being extended
        if rows:
            return rows, {}
        agent, env = self.agent, self.env
        slates = agent.explore_batch(
            self.obs, infos=visible_infos(agent, self.info, self.hidden_keys)
        )
        next_obs, rewards, terminated, truncated, next_info = env.step(slates)
        done = np.asarray(terminated) | np.asarray(truncated)
        transitions = Transitions(
            observations=self.obs,
            slates=np.asarray(slates),
            rewards=np.asarray(rewards, dtype=np.float64),
            next_observations=_final_next_observations(next_obs, next_info, done),
            terminated=np.asarray(terminated),
            truncated=np.asarray(truncated),
        )
        self.metrics = agent.learn(transitions) or self.metrics
        self.obs, self.info = next_obs, next_info
        self.steps_done += self.config.num_envs
        self.episode_return += rewards
        self.episode_length += 1
        self.pending += [
            (self.steps_done, float(self.episode_return[u]), int(self.episode_length[u]))
            for u in np.flatnonzero(done)
        ]
        if done.any():
            agent.begin_episodes(done)
        self.episode_return[done] = 0.0
        self.episode_length[done] = 0
        return self._drain(), self.metrics

    def parse_row(self, row: list[str]) -> list[Any]:
        return _parse_episode_row(row)

    def postfix(self) -> dict[str, str]:
        return _postfix([r[2] for r in self.log.rows[-100:]], self.metrics)

    def loop_state(self) -> dict[str, Any]:
        return {
            "obs": dict(self.obs),
            "info": _plain_info(self.info),
            "episode_return": self.episode_return,
            "episode_length": self.episode_length,
            "steps_done": self.steps_done,
            "episodes_logged": self.episodes_logged,
            "pending": [list(p) for p in self.pending],
            "metrics": dict(self.metrics),
        }

    def load_loop_state(self, state: Mapping[str, Any]) -> None:
        self.obs, self.info = dict(state["obs"]), dict(state["info"])
        self.episode_return = np.array(state["episode_return"], dtype=np.float64)
        self.episode_length = np.array(state["episode_length"], dtype=np.int64)
        self.steps_done = int(state["steps_done"])
        self.episodes_logged = int(state["episodes_logged"])
        self.pending = [(int(s), float(r), int(n)) for s, r, n in state["pending"]]
        self.metrics = {k: float(v) for k, v in state["metrics"].items()}

    def evaluate(self) -> dict[str, Any] | None:
        if not self.config.eval_episodes:
            return None
        return final_evaluation(self.agent, config=self.config)


def _parse_episode_row(row: list[str]) -> list[Any]:
    return [int(row[0]), int(row[1]), float(row[2]), int(row[3])]


def read_episodes_csv(path: Path | str) -> list[tuple[int, int, float, int]]:
    """Rows ``(episode, step, return, length)`` of a run's ``episodes.csv``."""
    rows = CsvLog(Path(path), CSV_HEADER).read(_parse_episode_row)
    return [tuple(row) for row in rows]


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
    trainer = SlateTrainer(agent, config=config, out_dir=out_dir, resume=resume, run_info=run_info)
    record = trainer.run()
    returns = np.asarray([row[2] for row in record.rows])
    return TrainResult(
        trainer.out, returns, trainer.steps_done, record.wall_time, record.final_eval
    )


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


def _postfix(returns: list[float], metrics: Mapping[str, float]) -> dict[str, str]:
    postfix = {"return": f"{np.mean(returns[-100:]):.1f}"}
    if "epsilon" in metrics:
        postfix["eps"] = f"{metrics['epsilon']:.3f}"
    if "loss" in metrics:
        postfix["loss"] = f"{metrics['loss']:.3g}"
    return postfix
