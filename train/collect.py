"""Logged data for off-policy evaluation: roll a logging policy and record its propensities.

:func:`collect` rolls a registered single-platform env (batched, ``gymnasium.make_vec``) with a
logging policy and records, per step, the observation, the slate, the reward, the clicks and the
*exact* logging propensities of the slate, of each slot and of each top-k prefix -- what the
estimators of :mod:`fedrec.eval.ope` need. :func:`save_minari` writes the result as a Minari
dataset (Arrow storage) that ``minari.load_dataset`` reads back.

**Logging policies with exact propensities.** The logger is ``(1 − ε) · policy + ε · other``
with ``other = mixture_with`` (default ``"random"``). Each component must have known
propensities:

* ``"random"`` -- uniformly random slates of K distinct candidates out of N (drawn here):
  ``P(s) = 1 / (N!/(N−K)!)``, ``P(a_k = j) = 1/N``, ``P(a_{1:k}) = (N−k)!/N!``;
* any other agent (a built-in name, ``module:Class`` or ``file.py:Class``) must be
  deterministic: ``P(s) = 1{s = d(x)}``, and likewise per slot and per prefix. It is checked on
  the first batch (two calls with differently seeded generators must agree); a stochastic agent
  is refused, since its propensities are unknown.

The mixture's propensities are the ε-weighted sums of the components'; they are exact.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from fedrec.agents.base import SlateAgent, random_slates, visible_infos
from fedrec.agents.registry import make_config, resolve_agent
from fedrec.envs.hidden import hidden_info_keys

__all__ = ["UNIFORM", "CollectedData", "collect", "default_dataset_id", "save_minari"]

#: The name of the uniformly random logging component.
UNIFORM = "random"
#: How the per-step fields line up in the saved infos (written into the metadata).
INFO_ALIGNMENT = (
    "infos[key][t] for t < T describes actions[t] (the logging propensities of that slate and "
    "the clicks/slot rewards it earned); row T (after the last action) is padding: NaN "
    "propensities, no clicks"
)


@dataclasses.dataclass
class CollectedData:
    """Episodes logged by :func:`collect`, with what produced them.

    Each episode is a dict of arrays over its T steps: ``observations`` (a dict of (T+1, ...)
    arrays: the reset observation and every next one), ``actions`` (T, K), ``rewards`` (T,),
    ``terminations`` / ``truncations`` (T,), ``propensity_slate`` (T,), ``propensity_slot``
    (T, K), ``propensity_prefix`` (T, K) and, where the env reports ``clicked_slot``, ``clicks``
    (T, K, 0/1) and ``slot_rewards`` (T, K: the step's reward at its clicked slot).
    """

    episodes: list[dict[str, Any]]
    metadata: dict[str, Any]
    observation_space: gym.spaces.Space
    action_space: gym.spaces.Space


def policy_components(name: str, env: Any, seed: int) -> tuple[str, SlateAgent | None]:
    if name == UNIFORM:
        return UNIFORM, None
    cls = resolve_agent(name)
    return name, cls.from_env(env, config=make_config(cls), seed=seed)


def check_deterministic(name: str, agent: SlateAgent, observations: Any, infos: Any) -> None:
    """Refuse an agent whose slates change with its random generator (unknown propensities).

    The two probes act on copies, so the agent's own state (its generator, a per-user step count)
    is left as it was."""
    first = copy.deepcopy(agent).act_batch(observations, infos=infos)
    probe = copy.deepcopy(agent)
    probe.reset(seed=int(np.random.SeedSequence(12345).generate_state(1)[0]))
    second = probe.act_batch(observations, infos=infos)
    if not np.array_equal(first, second):
        raise ValueError(
            f"policy {name!r} is stochastic (its slates change with its random generator) and "
            "does not report its propensities, so the logged propensities would be unknown. Use "
            "a deterministic policy, 'random', or an epsilon-mixture of the two (--epsilon)"
        )


def component_propensities(
    kind: str, proposed: np.ndarray | None, slates: np.ndarray, num_candidates: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(slate (B,), slot (B, K), prefix (B, K)) probabilities of ``slates`` under a component."""
    batch, size = slates.shape
    if kind == UNIFORM:
        prefix = np.array([1.0 / math.perm(num_candidates, k + 1) for k in range(size)])
        return (
            np.full(batch, prefix[-1]),
            np.full((batch, size), 1.0 / num_candidates),
            np.tile(prefix, (batch, 1)),
        )
    assert proposed is not None
    same = slates == proposed
    prefix = np.cumprod(same, axis=1).astype(np.float64)
    return prefix[:, -1].copy(), same.astype(np.float64), prefix


def default_dataset_id(env_id: str, policy: str, epsilon: float, mixture_with: str) -> str:
    """``fedrec/<EnvName>/<policy>[-eps<ε>-<other>]-v0`` in Minari's id syntax (letters, digits,
    ``_`` and ``-``: ε = 0.1 is written ``0p1``)."""
    env_name = env_id.split("/")[-1].rsplit("-v", 1)[0]
    stem = Path(policy.split(":")[-1]).stem if ":" in policy else policy
    label = stem if epsilon == 0 else f"{stem}-eps{epsilon:g}-{mixture_with.split(':')[-1]}"
    label = "".join(c if c.isalnum() or c in "_-" else "p" if c == "." else "_" for c in label)
    return f"fedrec/{env_name}/{label}-v0"


def collect(
    env_id: str,
    policy: str,
    *,
    episodes: int,
    seed: int,
    epsilon: float = 0.0,
    mixture_with: str = UNIFORM,
    env_kwargs: Mapping[str, Any] | None = None,
    num_envs: int = 256,
    progress: bool = True,
) -> CollectedData:
    """Roll ``episodes`` episodes of ``env_id`` with the logger
    ``(1 − epsilon) · policy + epsilon · mixture_with`` and record exact propensities.

    ``policy`` and ``mixture_with`` are ``"random"`` (uniform slates) or a deterministic agent
    (built-in name, ``module:Class``, ``file.py:Class``; built with its default Config and
    ``seed``). Batch b of at most ``num_envs`` users is reset with seed ``seed + b``; the mixture
    draws come from ``numpy.random.default_rng(seed)``. Raises ValueError for an env that is not
    a registered single-platform Gymnasium id, a stochastic agent, or ε outside [0, 1].
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    import fedrec.registration  # noqa: F401  (registers the ids)

    try:
        spec = gym.spec(env_id)
    except gym.error.Error as error:
        raise ValueError(
            f"{env_id!r} is not a registered single-platform (Gymnasium) environment: {error}"
        ) from None
    env_kwargs = dict(env_kwargs or {})
    components = [(1.0 - epsilon, policy), (epsilon, mixture_with)]
    from tqdm.auto import tqdm

    rng = np.random.default_rng(seed)
    logged: list[dict[str, Any]] = []
    bar = tqdm(total=episodes, desc=f"collect {env_id}", unit="ep", disable=not progress)
    agents: list[tuple[float, str, SlateAgent | None]] | None = None
    observation_space = action_space = None
    num_candidates = slate_size = 0
    batch_index = 0
    while len(logged) < episodes:
        size = min(num_envs, episodes - len(logged))
        env = gym.make_vec(env_id, num_envs=size, **env_kwargs)
        hidden = hidden_info_keys(env)
        space = env.single_action_space
        num_candidates = int(getattr(space, "num_candidates", 0))
        slate_size = int(space.shape[-1])
        if num_candidates < slate_size:
            raise ValueError(f"{env_id}: cannot read the number of candidates from {space!r}")
        if agents is None:
            agents = []
            for weight, name in components:
                kind, agent = policy_components(name, env, seed)
                agents.append((weight, kind, agent))
            observation_space = env.single_observation_space
            action_space = gym.spaces.MultiDiscrete(np.full(slate_size, num_candidates))
        observations, infos = env.reset(seed=seed + batch_index)
        for _, kind, agent in agents:
            if agent is not None:
                agent.begin_episodes(np.ones(size, dtype=bool))
                if batch_index == 0:
                    check_deterministic(
                        kind, agent, observations, visible_infos(agent, infos, hidden)
                    )
        episodes_of = [
            {"observations": [{k: np.asarray(v[i]) for k, v in observations.items()}]}
            for i in range(size)
        ]
        steps: list[list[dict[str, Any]]] = [[] for _ in range(size)]
        done = np.zeros(size, dtype=bool)
        while not done.all():
            proposals = [
                None
                if agent is None
                else np.asarray(
                    agent.act_batch(observations, infos=visible_infos(agent, infos, hidden))
                )
                for _, _, agent in agents
            ]
            uniform = random_slates(rng, size, num_candidates, slate_size)
            use_other = rng.random(size) < epsilon
            chosen = [p if p is not None else uniform for p in proposals]
            slates = np.where(use_other[:, None], chosen[1], chosen[0]).astype(np.int64)
            slate_p = np.zeros(size)
            slot_p = np.zeros((size, slate_size))
            prefix_p = np.zeros((size, slate_size))
            for (weight, kind, _), proposed in zip(agents, proposals, strict=True):
                if weight == 0:
                    continue
                a, b, c = component_propensities(kind, proposed, slates, num_candidates)
                slate_p += weight * a
                slot_p += weight * b
                prefix_p += weight * c
            observations, rewards, terminated, truncated, infos = env.step(slates)
            clicked = infos.get("clicked_slot")
            for i in np.flatnonzero(~done):
                step = {
                    "action": slates[i],
                    "reward": float(rewards[i]),
                    "terminated": bool(terminated[i]),
                    "truncated": bool(truncated[i]),
                    "propensity_slate": slate_p[i],
                    "propensity_slot": slot_p[i],
                    "propensity_prefix": prefix_p[i],
                }
                if clicked is not None:
                    clicks = np.arange(slate_size) == int(clicked[i])
                    step["clicks"] = clicks.astype(np.int8)
                    step["slot_rewards"] = np.where(clicks, float(rewards[i]), 0.0)
                steps[i].append(step)
                episodes_of[i]["observations"].append(
                    {k: np.asarray(v[i]) for k, v in observations.items()}
                )
            ended = ~done & (terminated | truncated)
            done |= terminated | truncated
            bar.update(int(ended.sum()))
        env.close()
        for record, trajectory in zip(episodes_of, steps, strict=True):
            logged.append(_episode(record["observations"], trajectory))
        batch_index += 1
    bar.close()
    metadata = {
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "policy": policy,
        "epsilon": epsilon,
        "mixture_with": mixture_with,
        "logger": f"(1 - {epsilon:g}) * {policy} + {epsilon:g} * {mixture_with}",
        "seed": seed,
        "num_envs": num_envs,
        "episodes": episodes,
        "num_candidates": num_candidates,
        "slate_size": slate_size,
        "info_alignment": INFO_ALIGNMENT,
        "env_spec_kwargs": dict(spec.kwargs),
    }
    assert observation_space is not None and action_space is not None
    return CollectedData(logged, metadata, observation_space, action_space)


def _episode(observations: list[dict[str, np.ndarray]], steps: list[dict[str, Any]]) -> dict:
    episode: dict[str, Any] = {
        "observations": {k: np.stack([o[k] for o in observations]) for k in observations[0]},
        "actions": np.stack([s["action"] for s in steps]),
        "rewards": np.array([s["reward"] for s in steps]),
        "terminations": np.array([s["terminated"] for s in steps]),
        "truncations": np.array([s["truncated"] for s in steps]),
    }
    for key in (
        "propensity_slate",
        "propensity_slot",
        "propensity_prefix",
        "clicks",
        "slot_rewards",
    ):
        if key in steps[0]:
            episode[key] = np.stack([s[key] for s in steps])
    return episode


def _padded(values: np.ndarray) -> np.ndarray | list:
    """One padding row after the last action (NaN for floats, 0 for integers). A 1-D column is
    a list: Minari 0.5.3's Arrow storage cannot read back a 1-D array info (empty shape)."""
    pad = np.full((1, *values.shape[1:]), np.nan if values.dtype.kind == "f" else 0, values.dtype)
    padded = np.concatenate([values, pad])
    return padded.tolist() if padded.ndim == 1 else padded


def save_minari(data: CollectedData, root: str | Path, dataset_id: str | None = None) -> Path:
    """Write ``data`` as a Minari dataset (Arrow storage) at ``root/<dataset_id>/data``.

    ``minari.load_dataset(dataset_id)`` reads it back with ``MINARI_DATASETS_PATH=root`` (or
    ``minari.MinariDataset(path)`` with the returned path). The per-step propensities, clicks and
    slot rewards are the episode ``infos`` (aligned as ``metadata["fedrec"]["info_alignment"]``
    says); the collection's settings (env id and kwargs, policy, ε, seed) are
    ``dataset.storage.metadata["fedrec"]``. Raises ImportError without ``fedrec[offline]`` and
    FileExistsError if the dataset exists.
    """
    try:
        from minari.data_collector import EpisodeBuffer
        from minari.dataset.minari_storage import MinariStorage
    except ImportError as error:
        raise ImportError(
            "writing a Minari dataset needs minari: pip install 'fedrec[offline]'"
        ) from error
    meta = data.metadata
    dataset_id = dataset_id or default_dataset_id(
        meta["env_id"], meta["policy"], meta["epsilon"], meta["mixture_with"]
    )
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(dataset_id)
    except ValueError as error:
        raise ValueError(f"invalid Minari dataset id {dataset_id!r}: {error}") from None
    path = Path(root) / dataset_id / "data"
    if path.parent.exists():
        raise FileExistsError(f"a dataset already exists at {path.parent}")
    path.mkdir(parents=True)
    spec = gym.spec(meta["env_id"])
    spec = dataclasses.replace(spec, kwargs={**spec.kwargs, **meta["env_kwargs"]})
    storage = MinariStorage.new(
        path,
        observation_space=data.observation_space,
        action_space=data.action_space,
        env_spec=spec,
        data_format="arrow",
    )
    storage.update_metadata(
        {
            "dataset_id": dataset_id,
            "algorithm_name": meta["logger"],
            "author": {"fedrec"},
            "author_email": {"fedrec"},
            "code_permalink": "fedrec.train.collect",
            "description": f"{meta['episodes']} episodes of {meta['env_id']} logged by "
            f"{meta['logger']} with exact per-slate, per-slot and per-prefix propensities.",
            "fedrec": json.loads(json.dumps(meta, default=_jsonable)),
        }
    )
    from minari import __version__ as minari_version

    storage.update_metadata({"minari_version": minari_version})
    buffers = []
    info_keys = [
        k
        for k in (
            "propensity_slate",
            "propensity_slot",
            "propensity_prefix",
            "clicks",
            "slot_rewards",
        )
        if k in data.episodes[0]
    ]
    for index, episode in enumerate(data.episodes):
        buffers.append(
            EpisodeBuffer(
                id=index,
                observations=episode["observations"],
                actions=episode["actions"],
                rewards=list(episode["rewards"]),
                terminations=list(episode["terminations"]),
                truncations=list(episode["truncations"]),
                infos={key: _padded(episode[key]) for key in info_keys},
            )
        )
    storage.update_episodes(buffers)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
