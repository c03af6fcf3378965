"""A trained run's agent, back from its run directory: :func:`load_trained_agent`.

A run directory written by ``fedrec train`` (or :func:`fedrec.train.train`,
:func:`fedrec.train.train_multi_platform`, ``fedrec bench fedslate``) holds ``config.json`` (the
agent's name, env, seed and hyperparameters) and ``checkpoint.pt`` (the agent's weights, written at
the end of the run). :func:`load_trained_agent` rebuilds the agent from the first and loads the
second, safely: the checkpoint is checked (SHA-256, plain data only, ``torch.load`` with
``weights_only=True``, no NaN) and must belong to the run (its setup record matches
``config.json``), so loading a colleague's run never runs code from its files. The only code that
runs is the agent's class: a built-in, or the ``path/file.py:Class`` the run was trained with.

    from fedrec.train import load_trained_agent

    agent = load_trained_agent("runs/slateq-ChocKaleSlate-v0-seed0")
    slates = agent.act_batch(observations)

``fedrec evaluate RUN --env ID`` evaluates such an agent on another env with the same spaces, and
the multi-platform method ``per_platform`` starts each platform's copy from a single-platform run
(``--from-run RUN``; :func:`prepare_multi_platform_agent` loads the weights).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedrec.agents.multi_platform import MultiPlatformAgent, check_requirements
from fedrec.agents.registry import (
    config_from_json,
    resolve_agent,
    resolve_multi_platform_agent,
)
from fedrec.train.checkpoint import load_checkpoint, setup_differences, setup_hash
from fedrec.train.core import AGENT_SETUP_KEYS, default_config_dict, env_kwargs_errors
from fedrec.util import json_ready


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """What a run directory says about its agent (read from ``config.json``, no code run)."""

    path: Path
    config: dict[str, Any]
    """the run's ``config.json``"""
    agent: str
    """the agent's name as trained: a built-in name, ``module:Class`` or ``file.py:Class``"""
    env_id: str
    env_kwargs: dict[str, Any]
    seed: int
    num_envs: int
    multi_platform: bool


def read_run(run_dir: Path | str) -> TrainedRun:
    """The run directory's ``config.json``, checked (a one-line ``ValueError`` naming the file
    and the problem; ``FileNotFoundError`` when there is no run there)."""
    from fedrec.registration import is_multi_platform

    path = Path(run_dir)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{path} is not a run directory: no config.json in it")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_path} is not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} is not a JSON object")
    problems = []
    for key, kind in (("agent", str), ("env_id", str), ("seed", int), ("num_envs", int)):
        if not isinstance(config.get(key), kind) or isinstance(config.get(key), bool):
            problems.append(f"{key} is not a {kind.__name__}")
    for key in ("env_kwargs", "agent_config"):
        if not isinstance(config.get(key, {}), dict):
            problems.append(f"{key} is not an object")
    if problems:
        raise ValueError(f"{config_path}: {'; '.join(problems)} (not a fedrec training run?)")
    return TrainedRun(
        path=path,
        config=config,
        agent=config["agent"],
        env_id=config["env_id"],
        env_kwargs=dict(config.get("env_kwargs") or {}),
        seed=int(config["seed"]),
        num_envs=int(config["num_envs"]),
        multi_platform=is_multi_platform(config["env_id"]),
    )


def agent_class(run: TrainedRun) -> tuple[type, Any]:
    """The run's agent class and its Config as saved (``ValueError`` if it cannot be found)."""
    try:
        if run.multi_platform:
            cls, _ = resolve_multi_platform_agent(run.agent)
        else:
            cls = resolve_agent(run.agent)
    except ImportError as error:
        raise ValueError(
            f"{run.path}: cannot import its agent {run.agent!r} ({error}); a path is relative "
            "to the folder the run was trained from"
        ) from error
    return cls, config_from_json(cls, run.config.get("agent_config") or {})


def trained_state(run: TrainedRun, cls: type) -> dict[str, Any]:
    """The agent's weights in the run's ``checkpoint.pt``, loaded safely and checked to belong to
    the run (its setup record matches ``config.json``)."""
    path = run.path / "checkpoint.pt"
    if not path.is_file():
        raise FileNotFoundError(
            f"{run.path} has no checkpoint.pt: the run wrote no checkpoint (an env that cannot "
            "save its state trains without any), so there are no weights to load"
        )
    state = load_checkpoint(path)
    owner = state.get("setup")
    if not isinstance(owner, Mapping) or state.get("setup_hash") != setup_hash(owner):
        raise ValueError(f"{path} has no valid setup record; refusing it")
    defaults = default_config_dict(cls.Config)
    saved = json_ready({key: run.config.get(key) for key in AGENT_SETUP_KEYS})
    owner = json_ready(dict(owner))
    for record in (saved, owner):
        if isinstance(record.get("agent_config"), Mapping):
            record["agent_config"] = {**defaults, **record["agent_config"]}
    differ = setup_differences(owner, saved)
    if differ:
        raise ValueError(
            f"{path} belongs to another run than {run.path / 'config.json'} ({'; '.join(differ)})"
        )
    if not isinstance(state.get("agent"), Mapping):
        raise ValueError(f"{path} holds no agent state")
    return dict(state["agent"])


def _run_env(run: TrainedRun) -> Any:
    """The env the run trained on, batched as in training (what its agent was built from)."""
    if run.multi_platform:  # as fedrec.train.multi_platform.make_env (which imports this)
        from fedrec.registration import batched_entry_point, entry_of

        build = batched_entry_point(run.env_id)
        with env_kwargs_errors(run.env_id, run.env_kwargs):
            return build(run.num_envs, **{**entry_of(run.env_id).kwargs, **run.env_kwargs})
    from fedrec.train.loop import TrainConfig, make_env

    return make_env(TrainConfig(run.env_id, num_envs=run.num_envs, env_kwargs=run.env_kwargs))


def _named_files(value: Any) -> list[str]:
    """The ``path/file.py:Class`` agents named anywhere in ``value`` (a run's agent and its
    hyperparameters, e.g. per_platform's ``agent``)."""
    if isinstance(value, str):
        return [value] if ".py:" in value else []
    if isinstance(value, Mapping):
        return [name for item in value.values() for name in _named_files(item)]
    if isinstance(value, (list, tuple)):
        return [name for item in value for name in _named_files(item)]
    return []


def _same_agent(a: str, b: str) -> bool:
    (file_a, _, cls_a), (file_b, _, cls_b) = a.rpartition(":"), b.rpartition(":")
    return cls_a == cls_b and Path(file_a).resolve() == Path(file_b).resolve()


def check_agent_files(run: TrainedRun, agent_files: Sequence[str]) -> None:
    """Refuse a run that names an agent file (``path/file.py:Class``) the caller did not name:
    loading a run never runs code its files point to, only the agent files the user names."""
    for name in _named_files([run.agent, run.config.get("agent_config") or {}]):
        if not any(_same_agent(name, mine) for mine in agent_files):
            raise ValueError(
                f"{run.path} was trained with the agent file {name}: a run directory's files "
                "never choose code to run, so name that file yourself to load it "
                f"(fedrec evaluate --agent-file {name}; load_trained_agent(..., "
                "agent_files=[...]))"
            )


def load_trained_agent(run_dir: Path | str, *, agent_files: Sequence[str] = ()) -> Any:
    """The trained agent of a run directory, with its weights (see the module doc).

    A single-platform run gives a :class:`~fedrec.agents.base.SlateAgent` (``act_batch``), a
    multi-platform run a :class:`~fedrec.agents.multi_platform.MultiPlatformAgent` (``act``),
    built as in training (its class, hyperparameters and seed, on the run's env) and loaded
    from ``checkpoint.pt``. A built-in agent needs nothing more; a run of an agent in your own
    file (``path/file.py:Class``) loads only when ``agent_files`` names that file, so a run
    directory from elsewhere cannot make fedrec execute a file it points to. Raises
    ``FileNotFoundError`` (no run or no checkpoint) or ``ValueError`` (a malformed or foreign
    file, an agent file not named, an agent class that cannot be imported), each one line
    naming the file.
    """
    run = read_run(run_dir)
    check_agent_files(run, agent_files)
    cls, config = agent_class(run)
    state = trained_state(run, cls)
    env = _run_env(run)
    try:
        agent = cls.from_env(env, config=config, seed=run.seed)
        agent.load_state_dict(state)
    except (KeyError, IndexError, RuntimeError) as error:  # a state of another shape
        raise ValueError(
            f"{run.path}: its checkpoint does not fit the {cls.__name__} built from its "
            f"config.json ({type(error).__name__}: {error})"
        ) from error
    finally:
        getattr(env, "close", lambda: None)()
    return agent


def prepare_multi_platform_agent(agent: MultiPlatformAgent, env: Any) -> None:
    """Before a multi-platform agent trains or is evaluated on ``env``: refuse an env that lacks
    what its class ``REQUIRES``, and load the weights of a run it starts from (``per_platform``
    with ``from_run``: each feedback platform's copy gets that run's trained agent)."""
    check_requirements(agent, env)
    source = getattr(agent, "pending_run", None)
    if source is None:
        return
    run = read_run(source)
    if run.multi_platform:
        raise ValueError(
            f"from_run {source}: a multi-platform run; per_platform starts from a "
            "single-platform one (fedrec train AGENT --env fedrec/ChocKaleSlate-v0)"
        )
    cls, _ = agent_class(run)
    agent.start_from(trained_state(run, cls))
