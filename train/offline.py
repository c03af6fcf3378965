"""Offline training: an offline agent learns from a logged Minari dataset, then plays the env.

:func:`load_offline_dataset` reads a dataset written by :mod:`fedrec.train.collect` (``fedrec
data collect``) and validates it whole before anything trains: a path that is not there or not a
Minari dataset, a dataset not written by fedrec (no ``fedrec`` metadata), one collected on
another env than asked for, an observation layout or slate shape that is not the env's, and
malformed rows (missing click records, slates out of range or with repeated items, non-finite
rewards, episodes of inconsistent lengths) are each one ``ValueError`` naming the dataset and the
problem. It returns the transitions as flat arrays (:mod:`fedrec.agents.offline`'s layout:
``obs/<key>``, ``next_obs/<key>``, ``slate``, ``clicked_slot``, ``reward``, ``terminated``,
``truncated``) with a SHA-256 fingerprint of their bytes.

:func:`train_offline` runs the gradient steps on the shared training core
(:mod:`fedrec.train.core`), so an offline run has the online runs' guarantees: ``config.json``
(with the dataset's path and fingerprint, so a resume on a changed dataset is refused), a CSV log
``updates.csv`` (``step,loss``: the mean loss of every ``log_every`` gradient steps), atomic
``checkpoint.pt`` every ``checkpoint_every`` gradient steps (the agent's ``state_dict``: network,
optimiser, normalisation and its random generator, which draws the minibatches), an exact resume
(byte-identical log and final evaluation after a kill and ``--resume``), and ``final_eval.json``:
the agent's greedy policy online on held-out episodes of the env, beside the *logging policy*
rebuilt from the dataset's metadata (``logger``) and, on Choc-vs-Kale, the reference policies
(random, top_x, bottom_x, best open-loop rule, myopic, planner), all on the same episodes as an
online run with the same seed (:func:`fedrec.train.loop.final_evaluation`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from fedrec.agents.base import SlateAgent, random_slates
from fedrec.agents.offline import is_offline
from fedrec.agents.registry import make_config, resolve_agent
from fedrec.eval.rollout import EVAL_SEED_OFFSET, evaluate_policy
from fedrec.train.core import Trainer, config_dict, default_config_dict, env_kwargs_errors
from fedrec.util import json_ready

CSV_HEADER = ("step", "loss")
#: What defines an offline run: resuming with any of these changed is refused.
OFFLINE_SETUP_KEYS = (
    "agent",
    "env_id",
    "seed",
    "env_kwargs",
    "agent_config",
    "dataset_sha256",
    "log_every",
)
#: Per-step infos an offline agent needs from the dataset (written by fedrec data collect).
REQUIRED_INFOS = ("clicks",)


@dataclasses.dataclass
class OfflineDataset:
    """A validated logged dataset as flat transitions (one row per logged step)."""

    path: Path
    env_id: str
    env_kwargs: dict[str, Any]
    metadata: dict[str, Any]
    """``dataset.storage.metadata["fedrec"]``: the logger, ε, seed, ..."""
    data: dict[str, np.ndarray]
    episodes: int
    sha256: str
    lengths: np.ndarray | None = None
    """steps of each episode, in order (the rows of ``data`` are the episodes' steps in turn)"""
    infos: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """the per-step infos asked for with ``infos=`` (one row per logged step, as ``data``)"""

    @property
    def transitions(self) -> int:
        return len(self.data["slate"])


def _data_folder(path: Path) -> Path:
    if not path.exists():
        raise ValueError(f"dataset {path} does not exist (write one with `fedrec data collect`)")
    for folder in (path, path / "data"):
        if (folder / "metadata.json").is_file():
            return folder
    raise ValueError(
        f"{path} is not a Minari dataset (no metadata.json in it or in its data/ folder); "
        "write one with `fedrec data collect`"
    )


def _bad(path: Path, problem: str) -> ValueError:
    return ValueError(f"dataset {path}: {problem}")


def _read_episodes(folder: Path, path: Path) -> tuple[dict[str, Any], Any, list[Any]]:
    try:
        from minari import MinariDataset
    except ImportError as error:
        raise ImportError(
            "reading a Minari dataset needs minari: pip install 'fedrec[offline]'"
        ) from error
    try:
        dataset = MinariDataset(folder)
        metadata = dict(dataset.storage.metadata)
        episodes = list(dataset.iterate_episodes())
    except Exception as error:  # a damaged file: Arrow, JSON or Minari's own checks
        message = " ".join(str(error).split()) or type(error).__name__
        raise _bad(path, f"cannot be read as a Minari dataset ({message})") from error
    return metadata, dataset.storage.observation_space, episodes


def load_offline_dataset(
    path: str | Path,
    *,
    env_id: str | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    infos: Mapping[str, str] | None = None,
) -> OfflineDataset:
    """Read and validate a dataset of ``fedrec data collect`` (see the module doc).

    ``path`` is the dataset's folder (``OUT/<dataset id>``) or its ``data`` folder. ``env_id`` and
    ``env_kwargs`` (None: the dataset's) must be the ones it was collected with. ``infos``: more
    per-step infos to read (``{key: why it is needed}``, for the error when one is missing), each
    checked to be finite on every logged step and returned in ``OfflineDataset.infos``.
    """
    import fedrec.registration  # noqa: F401  (registers the ids)

    path = Path(path)
    folder = _data_folder(path)
    metadata, observation_space, episodes = _read_episodes(folder, path)
    meta = metadata.get("fedrec")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("env_id"), str):
        raise _bad(
            path, "no 'fedrec' metadata with an env id: it was not written by fedrec data collect"
        )
    recorded_id, recorded_kwargs = meta["env_id"], dict(meta.get("env_kwargs") or {})
    if env_id is not None and env_id != recorded_id:
        raise _bad(
            path,
            f"it was collected on {recorded_id}, not {env_id}: train on {recorded_id} (omit "
            f"--env) or collect a dataset on {env_id}",
        )
    if env_kwargs is not None and dict(env_kwargs) != recorded_kwargs:
        raise _bad(
            path,
            f"it was collected with env kwargs {recorded_kwargs}, not {dict(env_kwargs)} "
            "(omit --env-kwarg: the dataset's are used)",
        )
    if not episodes:
        raise _bad(path, "it holds no episodes")
    env = single_env(recorded_id, recorded_kwargs)
    space = env.single_observation_space
    action_shape = env.single_action_space.shape
    num_candidates = int(getattr(env.single_action_space, "num_candidates", 0) or 0)
    env.close()
    slate_size = int(action_shape[-1])
    if not isinstance(space, gym.spaces.Dict) or not isinstance(observation_space, gym.spaces.Dict):
        raise _bad(path, "offline agents need Dict observations")
    if set(observation_space.spaces) != set(space.spaces):
        raise _bad(
            path,
            f"observation keys {sorted(observation_space.spaces)} are not {recorded_id}'s "
            f"{sorted(space.spaces)}",
        )
    for key, sub in space.spaces.items():
        if observation_space[key].shape != sub.shape:
            raise _bad(
                path,
                f"observation {key!r} has shape {observation_space[key].shape}, "
                f"{recorded_id} has {sub.shape}",
            )
    columns: dict[str, list[np.ndarray]] = {}
    extra: dict[str, list[np.ndarray]] = {}
    for index, episode in enumerate(episodes):
        _episode_columns(path, index, episode, space, slate_size, num_candidates, columns)
        _episode_infos(path, index, episode, dict(infos or {}), extra)
    data = {key: np.concatenate(parts) for key, parts in columns.items()}
    return OfflineDataset(
        path=path,
        env_id=recorded_id,
        env_kwargs=recorded_kwargs,
        metadata=json_ready(dict(meta)),
        data=data,
        episodes=len(episodes),
        sha256=fingerprint(data),
        lengths=np.array([len(part) for part in columns["slate"]], dtype=np.int64),
        infos={key: np.concatenate(parts) for key, parts in extra.items()},
    )


def _episode_infos(
    path: Path,
    index: int,
    episode: Any,
    wanted: Mapping[str, str],
    extra: dict[str, list[np.ndarray]],
) -> None:
    """The per-step infos ``wanted`` of one episode (its T logged rows; row T is padding)."""
    if not wanted:
        return
    steps = len(np.asarray(episode.actions))
    infos = episode.infos if isinstance(episode.infos, Mapping) else {}
    for key, why in wanted.items():
        if key not in infos:
            raise _bad(path, f"episode {index}: no {key!r} in the infos ({why})")
        value = np.asarray(infos[key])
        if value.ndim == 0 or len(value) != steps + 1:
            raise _bad(
                path, f"episode {index}: {key!r} has {value.shape[:1]} rows, expected {steps + 1}"
            )
        value = value[:-1]
        if value.dtype.kind not in "biuf" or not np.isfinite(value.astype(np.float64)).all():
            raise _bad(path, f"episode {index}: {key!r} is not finite on every logged step")
        first = extra.get(key)
        if first and first[0].shape[1:] != value.shape[1:]:
            raise _bad(
                path,
                f"episode {index}: {key!r} rows have shape {value.shape[1:]}, episode 0's "
                f"{first[0].shape[1:]}",
            )
        extra.setdefault(key, []).append(value)


def single_env(env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
    """A one-user batched env of a dataset's id and kwargs (kwargs errors named in one line)."""
    try:
        with env_kwargs_errors(env_id, env_kwargs):
            return gym.make_vec(env_id, num_envs=1, **dict(env_kwargs))
    except gym.error.Error as error:
        raise ValueError(f"cannot build {env_id!r}: {error}") from error


def _episode_columns(
    path: Path,
    index: int,
    episode: Any,
    space: gym.spaces.Dict,
    slate_size: int,
    num_candidates: int,
    columns: dict[str, list[np.ndarray]],
) -> None:
    where = f"episode {index}"
    actions = np.asarray(episode.actions)
    steps = len(actions)
    if actions.ndim != 2 or actions.shape[1] != slate_size or steps == 0:
        raise _bad(path, f"{where}: slates of shape {actions.shape}, expected (T, {slate_size})")
    if actions.dtype.kind not in "iu":
        raise _bad(path, f"{where}: slates are not integers ({actions.dtype})")
    if num_candidates and (actions.min() < 0 or actions.max() >= num_candidates):
        raise _bad(path, f"{where}: a slate item outside 0..{num_candidates - 1}")
    if (np.sort(actions, axis=1)[:, 1:] == np.sort(actions, axis=1)[:, :-1]).any():
        raise _bad(path, f"{where}: a slate repeats an item")
    observations = episode.observations
    if not isinstance(observations, Mapping):
        raise _bad(path, f"{where}: observations are not a dict")
    for key, sub in space.spaces.items():
        value = np.asarray(observations[key])
        if value.shape != (steps + 1, *sub.shape):
            raise _bad(
                path,
                f"{where}: observation {key!r} has shape {value.shape}, expected "
                f"{(steps + 1, *sub.shape)}",
            )
        columns.setdefault(f"obs/{key}", []).append(value[:-1])
        columns.setdefault(f"next_obs/{key}", []).append(value[1:])
    rewards = np.asarray(episode.rewards, dtype=np.float64)
    terminated = np.asarray(episode.terminations, dtype=bool)
    truncated = np.asarray(episode.truncations, dtype=bool)
    for name, value in (("rewards", rewards), ("terminations", terminated), ("truncations", truncated)):  # fmt: skip
        if value.shape != (steps,):
            raise _bad(path, f"{where}: {name} have shape {value.shape}, expected ({steps},)")
    if not np.isfinite(rewards).all():
        raise _bad(path, f"{where}: a reward is not finite")
    infos = episode.infos if isinstance(episode.infos, Mapping) else {}
    missing = [key for key in REQUIRED_INFOS if key not in infos]
    if missing:
        raise _bad(
            path,
            f"{where}: no {missing} in the infos (the env reports no clicked slot?); offline "
            "agents learn from the logged clicks",
        )
    clicks = np.asarray(infos["clicks"])
    if clicks.shape != (steps + 1, slate_size):
        raise _bad(path, f"{where}: clicks of shape {clicks.shape}, expected {(steps + 1, slate_size)}")  # fmt: skip
    clicks = clicks[:-1] > 0
    if (clicks.sum(axis=1) > 1).any():
        raise _bad(path, f"{where}: a step with more than one click")
    columns.setdefault("slate", []).append(actions.astype(np.int64))
    columns.setdefault("clicked_slot", []).append(
        np.where(clicks.any(axis=1), clicks.argmax(axis=1), -1).astype(np.int64)
    )
    columns.setdefault("reward", []).append(rewards)
    columns.setdefault("terminated", []).append(terminated)
    columns.setdefault("truncated", []).append(truncated)


def fingerprint(data: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of the arrays' names, dtypes, shapes and bytes (in key order)."""
    digest = hashlib.sha256()
    for key in sorted(data):
        value = np.ascontiguousarray(data[key])
        digest.update(f"{key}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


class LoggingPolicy(SlateAgent):
    """The logger of a dataset, rebuilt from its metadata: ``(1 − ε) · policy + ε · other``,
    each component a deterministic agent (built as :func:`fedrec.train.collect.collect` built
    it) or uniformly random slates; the mixture draws come from this agent's generator."""

    def __init__(self, env: Any, metadata: Mapping[str, Any], *, seed: int | None = None) -> None:
        space = env.single_action_space
        super().__init__(slate_size=int(space.shape[-1]), seed=seed)
        self.num_candidates = int(space.num_candidates)
        self.epsilon = float(metadata["epsilon"])
        self.components: list[SlateAgent | None] = []
        for name in (metadata["policy"], metadata["mixture_with"]):
            if name == "random":
                self.components.append(None)
            else:
                cls = resolve_agent(name)
                self.components.append(cls.from_env(env, config=make_config(cls), seed=seed))

    def begin_episodes(self, mask: np.ndarray) -> None:
        for agent in self.components:
            if agent is not None:
                agent.begin_episodes(mask)

    def act_batch(self, observations: Any, *, infos: Any = None) -> np.ndarray:
        size = len(np.asarray(observations["candidates"]))
        proposals = [
            random_slates(self.rng, size, self.num_candidates, self.slate_size)
            if agent is None
            else np.asarray(agent.act_batch(observations, infos=infos), dtype=np.int64)
            for agent in self.components
        ]
        other = self.rng.random(size) < self.epsilon
        return np.where(other[:, None], proposals[1], proposals[0]).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class OfflineTrainConfig:
    """What to learn from and for how long. The agent's hyperparameters live in its Config."""

    dataset: str
    """the dataset folder (``OUT/<dataset id>``) or its ``data`` folder"""
    env_id: str | None = None
    """None: the dataset's env; given, it must be the dataset's"""
    env_kwargs: Mapping[str, Any] | None = None
    """None: the dataset's; given, they must be the dataset's"""
    steps: int = 5000
    """gradient steps"""
    seed: int = 0
    """seeds the agent (its network and minibatches) and the evaluation episodes"""
    log_every: int = 100
    """gradient steps per row of ``updates.csv`` (their mean loss)"""
    checkpoint_every: int = 1000
    """gradient steps between atomic checkpoints (0: only at the end)"""
    eval_episodes: int = 500
    """held-out episodes for the final online evaluation (0: skip)"""
    references: bool = True
    """also evaluate the logging policy and, on Choc-vs-Kale, the reference policies"""
    progress: bool = True
    torch_threads: int = 1

    def __post_init__(self) -> None:
        for name in ("steps", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every < 0 or self.eval_episodes < 0:
            raise ValueError("checkpoint_every and eval_episodes must be >= 0")


@dataclasses.dataclass
class OfflineResult:
    """What a finished offline run produced (also on disk in ``out_dir``)."""

    out_dir: Path | None
    losses: np.ndarray
    steps: int
    wall_time: float
    final_eval: dict[str, Any] | None
    dataset: OfflineDataset


AgentFactory = Callable[[Any], SlateAgent]


class OfflineTrainer(Trainer):
    """Gradient steps of an offline agent on a logged dataset, on the shared training core."""

    header = CSV_HEADER
    row_tag = "update"
    unit = "steps"
    log_name = "updates.csv"

    def __init__(
        self,
        agent: SlateAgent | AgentFactory,
        *,
        config: OfflineTrainConfig,
        out_dir: Path | str | None = None,
        resume: bool = False,
        run_info: Mapping[str, Any] | None = None,
        dataset: OfflineDataset | None = None,
    ) -> None:
        self.config = config
        self.dataset = dataset or load_offline_dataset(
            config.dataset, env_id=config.env_id, env_kwargs=config.env_kwargs
        )
        env = single_env(self.dataset.env_id, self.dataset.env_kwargs)
        self.agent = agent if isinstance(agent, SlateAgent) else agent(env)
        env.close()
        if not is_offline(type(self.agent)):
            raise ValueError(
                f"{type(self.agent).__name__} learns online, not from a dataset: train it with "
                "--env (an offline agent, e.g. bc or cql_slateq, takes --dataset)"
            )
        run_config = {
            "env_id": self.dataset.env_id,
            "seed": config.seed,
            "steps": config.steps,
            "env_kwargs": self.dataset.env_kwargs,
            "agent": type(self.agent).__name__,
            "agent_config": config_dict(getattr(self.agent, "config", None)),
            "dataset": str(self.dataset.path),
            "dataset_sha256": self.dataset.sha256,
            "dataset_episodes": self.dataset.episodes,
            "dataset_transitions": self.dataset.transitions,
            "logger": self.dataset.metadata.get("logger"),
            "log_every": config.log_every,
            **dict(run_info or {}),
        }
        super().__init__(
            run_config=run_config,
            setup_keys=OFFLINE_SETUP_KEYS,
            out_dir=out_dir,
            resume=resume,
            progress=config.progress,
            checkpoint_every=config.checkpoint_every,
            total=config.steps,
            torch_threads=config.torch_threads,
            config_defaults=default_config_dict(type(self.agent).Config),
        )
        self.steps_done = 0
        self.metrics: dict[str, float] = {}

    def start(self) -> None:
        self.agent.prepare(self.dataset.data)  # type: ignore[attr-defined]

    def finished(self) -> bool:
        return self.steps_done >= self.config.steps

    def progress(self) -> float:
        return self.steps_done

    def step(self) -> tuple[list[Any], Mapping[str, float]]:
        todo = min(self.config.log_every, self.config.steps - self.steps_done)
        losses = []
        for _ in range(todo):
            self.metrics = self.agent.offline_step(self.dataset.data)  # type: ignore[attr-defined]
            losses.append(self.metrics["loss"])
        self.steps_done += todo
        loss = float(np.mean(losses))
        if not math.isfinite(loss):
            raise ValueError(f"the loss diverged ({loss}) at gradient step {self.steps_done}")
        return [[self.steps_done, loss]], self.metrics

    def parse_row(self, row: list[str]) -> list[Any]:
        return [int(row[0]), float(row[1])]

    def postfix(self) -> dict[str, str]:
        return {name: f"{value:.3g}" for name, value in self.metrics.items()}

    def loop_state(self) -> dict[str, Any]:
        return {"steps_done": self.steps_done, "metrics": dict(self.metrics)}

    def load_loop_state(self, state: Mapping[str, Any]) -> None:
        self.steps_done = int(state["steps_done"])
        self.metrics = {k: float(v) for k, v in state["metrics"].items()}

    def component_states(self) -> dict[str, Any]:
        return {"agent": self.agent.state_dict()}

    def load_component_states(self, states: Mapping[str, Any]) -> None:
        self.agent.load_state_dict(states["agent"])

    def evaluate(self) -> dict[str, Any] | None:
        if not self.config.eval_episodes:
            return None
        return offline_evaluation(
            self.agent,
            self.dataset,
            seed=self.config.seed,
            episodes=self.config.eval_episodes,
            references=self.config.references,
        )


def offline_evaluation(
    agent: SlateAgent,
    dataset: OfflineDataset,
    *,
    seed: int,
    episodes: int,
    references: bool = True,
) -> dict[str, Any]:
    """Greedy returns of ``agent`` online, and of the logging policy and the reference policies
    (``references``), on the same held-out episodes as an online run with ``seed``."""
    from fedrec.agents.reference import env_params, reference_policies

    eval_seed = EVAL_SEED_OFFSET + seed
    policies: dict[str, SlateAgent] = {"agent": agent}
    if references:
        env = single_env(dataset.env_id, dataset.env_kwargs)
        policies["logger"] = LoggingPolicy(env, dataset.metadata, seed=eval_seed)
        try:
            params = env_params(env)
        except ValueError:
            params = None
        env.close()
        if params is not None:
            policies.update(reference_policies(params, seed=eval_seed))
    results = {}
    for name, policy in policies.items():
        summary = evaluate_policy(
            dataset.env_id,
            policy,
            episodes=episodes,
            num_envs=min(episodes, 500),
            seed=eval_seed,
            env_kwargs=dataset.env_kwargs,
        )
        results[name] = {
            "mean": summary.mean,
            "half_width": summary.half_width,
            "returns": summary.returns.tolist(),
        }
    return {"episodes": episodes, "seed": eval_seed, "policies": results}


def train_offline(
    agent: SlateAgent | AgentFactory,
    *,
    config: OfflineTrainConfig,
    out_dir: Path | str | None = None,
    resume: bool = False,
    run_info: Mapping[str, Any] | None = None,
    dataset: OfflineDataset | None = None,
) -> OfflineResult:
    """Train the offline ``agent`` (or ``agent(env)`` for a factory) on ``config.dataset``; see
    the module doc. ``dataset``: an already loaded :class:`OfflineDataset` (not read again)."""
    trainer = OfflineTrainer(
        agent, config=config, out_dir=out_dir, resume=resume, run_info=run_info, dataset=dataset
    )
    record = trainer.run()
    losses = np.asarray([row[1] for row in record.rows])
    return OfflineResult(
        trainer.out,
        losses,
        trainer.steps_done,
        record.wall_time,
        record.final_eval,
        trainer.dataset,
    )
