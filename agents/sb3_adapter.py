"""Stable-Baselines3 adapter: train SB3's PPO and A2C on fedrec's slate environments.

SB3 cannot use fedrec's action space directly: a slate must list *distinct* candidates, which
neither a Gaussian nor a categorical policy can guarantee, and SB3 does not accept
``gymnasium.vector`` environments. This module provides

- :class:`SB3SlateWrapper`, a Gymnasium wrapper of one env whose action is a score per candidate
  (a ``Box``); the slate served is the ``slate_size`` highest-scoring candidates, best first
  (distinct by construction). ``action_mapping="repair"`` keeps a ``MultiDiscrete`` action and
  replaces repeated entries instead. The Dict observation is flattened to a ``Box`` by default.
- :class:`SB3SlateVecEnv`, an SB3 :class:`~stable_baselines3.common.vec_env.VecEnv` over a native
  ``gymnasium.vector.VectorEnv`` (e.g. ``ChocKaleVectorEnv``) in ``SAME_STEP`` autoreset mode,
  so SB3 trains on B users per step with one NumPy-batched env instead of B Python env copies.
- :func:`make_sb3_env`, which builds the latter (wrapped in ``VecMonitor``) from a registered id.

The action and observation mappings are shared, so the single wrapper and the VecEnv present the
same spaces and map the same scores to the same slates. Neither hands SB3 an info key the env
declares hidden (:func:`fedrec.envs.hidden.hidden_info_keys`: on Choc-vs-Kale the user's true
state), at any depth: SB3's algorithms and callbacks are learners. See ``docs/sb3.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from fedrec.envs.hidden import hidden_info_keys, strip_hidden

try:
    from stable_baselines3.common.vec_env import VecEnv, VecMonitor
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnvIndices,
        VecEnvObs,
        VecEnvStepReturn,
    )
except ImportError as error:  # an optional dependency: fedrec's core does not need it
    raise ImportError(
        "fedrec.agents.sb3_adapter needs Stable-Baselines3, which is not installed: "
        "pip install 'fedrec[sb3]' (or pip install stable-baselines3)"
    ) from error

ActionMapping = Literal["scores", "repair"]
_MAPPINGS = ("scores", "repair")


# --------------------------------------------------------------------------- action mappings


def scores_to_slates(scores: np.ndarray, slate_size: int) -> np.ndarray:
    """The ``slate_size`` highest-scoring candidate indices, best first, as int64.

    :param scores: shape (..., N), one score per candidate (a batch has a leading axis).
    :return: shape (..., slate_size). Ties go to the lower index (a stable sort), so equal scores,
        e.g. several actions clipped to the Box bound, map to the same slate every time. NaN
        scores rank last.
    """
    scores = np.asarray(scores)
    if scores.ndim < 1 or scores.shape[-1] < slate_size:
        raise ValueError(
            f"scores must have shape (..., N) with N >= slate_size={slate_size}, got {scores.shape}"
        )
    order = np.argsort(-scores.astype(np.float64, copy=False), axis=-1, kind="stable")
    return order[..., :slate_size].astype(np.int64, copy=False)


def repair_slates(actions: np.ndarray, num_candidates: int) -> np.ndarray:
    """Make every slate distinct: a repeated entry becomes the lowest-index unused candidate.

    :param actions: shape (..., n) of integer indices in [0, num_candidates); earlier slots win,
        so a slate that is already distinct is returned unchanged.
    """
    actions = np.asarray(actions)
    if actions.dtype.kind not in "iu":
        raise ValueError(f"MultiDiscrete actions must be integers, got dtype {actions.dtype}")
    shape = actions.shape
    slates = actions.reshape(-1, shape[-1]).astype(np.int64, copy=True)
    if slates.size and (slates.min() < 0 or slates.max() >= num_candidates):
        raise ValueError(f"actions must lie in [0, {num_candidates}), got {actions!r:.80}")
    rows = np.arange(slates.shape[0])
    used = np.zeros((slates.shape[0], num_candidates), dtype=bool)
    for slot in range(slates.shape[1]):
        item = slates[:, slot]
        clash = used[rows, item]
        if clash.any():
            item[clash] = np.argmax(~used[clash], axis=1)  # first unused index
        used[rows, item] = True
    return slates.reshape(shape)


def _slate_dims(space: spaces.Space) -> tuple[int, int]:
    """(num_candidates, slate_size) of a slate action space (SlateSpace or uniform MultiDiscrete)."""
    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1:
        nvec = np.asarray(space.nvec)
        if nvec.size >= 1 and (nvec == nvec[0]).all():
            return int(nvec[0]), int(nvec.size)
    raise ValueError(
        f"expected a slate action space (MultiDiscrete([N] * n), e.g. SlateSpace), got {space}"
    )


def _policy_action_space(
    num_candidates: int, slate_size: int, mapping: str, score_bound: float
) -> spaces.Space:
    """The action space SB3 sees: scores Box(-b, b, (N,)) or MultiDiscrete([N] * n)."""
    if mapping not in _MAPPINGS:
        raise ValueError(f"action_mapping must be one of {_MAPPINGS}, got {mapping!r}")
    if mapping == "repair":
        return spaces.MultiDiscrete([num_candidates] * slate_size, dtype=np.int64)
    if not 0 < score_bound < np.inf:  # SB3 needs finite bounds (it clips actions to them)
        raise ValueError(f"score_bound must be finite and > 0, got {score_bound}")
    bound = float(score_bound)
    return spaces.Box(-bound, bound, (num_candidates,), np.float32)


def _to_slates(
    action: np.ndarray, mapping: str, num_candidates: int, slate_size: int
) -> np.ndarray:
    if mapping == "scores":
        return scores_to_slates(action, slate_size)
    return repair_slates(action, num_candidates)


# --------------------------------------------------------------------------- observations


def _flat_space(space: spaces.Dict) -> spaces.Box:
    """``gymnasium.spaces.flatten_space`` as float32 (SB3's dtype; integer ids become floats)."""
    flat = spaces.flatten_space(space)
    return spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32), dtype=np.float32)


def _flatten_one(space: spaces.Dict, obs: dict[str, np.ndarray]) -> np.ndarray:
    return spaces.flatten(space, obs).astype(np.float32, copy=False)


def _flatten_batch(space: spaces.Dict, obs: dict[str, np.ndarray], batch: int) -> np.ndarray:
    """Row i equals ``_flatten_one(space, obs_i)``: keys in space order, each in C order."""
    parts = [np.asarray(obs[key]).reshape(batch, -1) for key in space.spaces]
    return np.concatenate(parts, axis=1).astype(np.float32, copy=False)


# --------------------------------------------------------------------------- single env


class SB3SlateWrapper(gym.Wrapper):
    """One fedrec slate env with an SB3-friendly action (and, by default, observation) space.

    :param env: a Gymnasium env whose action space is a slate space (``SlateSpace``).
    :param action_mapping: ``"scores"`` (default): the action is ``Box(-b, b, (N,))``, one score
        per candidate, served as the top-``n`` candidates, highest first (slot 0 is the top
        score; ties go to the lower index). ``"repair"``: the action is ``MultiDiscrete([N]*n)``
        and a repeated entry is replaced by the lowest-index unused candidate (the policy
        gradient then treats the repaired slate as if sampled; prefer ``"scores"``).
    :param score_bound: ``b`` (default 1, SB3's recommended normalized Box). SB3 clips actions to
        the bounds, so clipped scores tie; ties are broken by index, deterministically.
    :param flatten_observation: flatten the Dict observation to one float32 ``Box`` (default; use
        ``MlpPolicy``). With False the Dict is kept (use ``MultiInputPolicy``, which flattens and
        concatenates the keys itself, so the networks are the same).

    The slate actually served is reported in ``info["slate"]``; the info keys the env declares
    hidden are left out.
    """

    def __init__(
        self,
        env: gym.Env,
        *,
        action_mapping: ActionMapping = "scores",
        score_bound: float = 1.0,
        flatten_observation: bool = True,
    ) -> None:
        super().__init__(env)
        self.hidden_keys = hidden_info_keys(env)
        self.num_candidates, self.slate_size = _slate_dims(env.action_space)
        self.action_mapping = action_mapping
        self.action_space = _policy_action_space(
            self.num_candidates, self.slate_size, action_mapping, score_bound
        )
        self.flatten_observation = flatten_observation
        if flatten_observation:
            if not isinstance(env.observation_space, spaces.Dict):
                raise ValueError(
                    f"flatten_observation needs a Dict observation, got {env.observation_space}"
                )
            self.observation_space = _flat_space(env.observation_space)

    def slate(self, action: np.ndarray) -> np.ndarray:
        """The slate (n,) that ``action`` is served as."""
        action = np.asarray(action)
        expected = self.action_space.shape
        if action.shape != expected:
            raise ValueError(f"action has shape {action.shape}, expected {expected}")
        return _to_slates(action, self.action_mapping, self.num_candidates, self.slate_size)

    def _obs(self, obs: Any) -> Any:
        if not self.flatten_observation:
            return obs
        return _flatten_one(self.env.observation_space, obs)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return self._obs(obs), strip_hidden(info, self.hidden_keys)

    def step(self, action: np.ndarray) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        slate = self.slate(action)
        obs, reward, terminated, truncated, info = self.env.step(slate)
        info = {**strip_hidden(info, self.hidden_keys), "slate": slate}
        return self._obs(obs), reward, terminated, truncated, info


# --------------------------------------------------------------------------- batched env


def _unbatch_infos(info: dict[str, Any], num_envs: int) -> list[dict[str, Any]]:
    """Per-env dicts of a Gymnasium vector info dict, honouring its ``_key`` masks.

    Each column is converted to Python values once (``tolist``), not indexed per env: SB3 needs a
    list of dicts, and building it is the adapter's main cost for large batches.
    """
    out: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    for key, value in info.items():
        if key.startswith("_") or key in ("final_obs", "final_info"):
            continue
        if isinstance(value, dict):
            column = _unbatch_infos(value, num_envs)
        elif isinstance(value, np.ndarray) and value.dtype != object:
            column = value.tolist()
        else:
            column = list(value)
        mask = info.get(f"_{key}")
        present = range(num_envs) if mask is None else np.flatnonzero(mask).tolist()
        for i in present:
            out[i][key] = column[i]
    return out


def _row(obs: Any, index: int) -> Any:
    if isinstance(obs, dict):
        return {key: np.array(value[index]) for key, value in obs.items()}
    return np.array(obs[index])


class SB3SlateVecEnv(VecEnv):
    """An SB3 ``VecEnv`` over a native batched fedrec env (a ``gymnasium.vector.VectorEnv``).

    All ``num_envs`` users step in one call of the wrapped env; nothing is copied per user. The
    wrapped env must use Gymnasium's ``SAME_STEP`` autoreset, which is SB3's convention: for a
    user whose episode ended, ``step_wait`` returns the first observation of the next episode and
    puts the final one in ``infos[i]["terminal_observation"]``, ``dones = terminated | truncated``
    and ``infos[i]["TimeLimit.truncated"]`` flags truncation without termination. ``infos[i]``
    holds the user's info of the step (for a finished user: its final info) plus ``"slate"``;
    the new episode's reset info goes to ``reset_infos[i]``. Neither holds a key the env declares
    hidden.

    Actions and observations are mapped as in :class:`SB3SlateWrapper` (same options, same
    result). The whole batch shares the wrapped env's one random generator, so :meth:`seed`
    seeds the batch (at the next :meth:`reset`) and per-user seeds are not supported;
    ``get_attr``/``env_method`` read or call the one wrapped env and repeat the answer per index.
    """

    def __init__(
        self,
        env: VectorEnv,
        *,
        action_mapping: ActionMapping = "scores",
        score_bound: float = 1.0,
        flatten_observation: bool = True,
    ) -> None:
        mode = env.metadata.get("autoreset_mode")
        if mode != AutoresetMode.SAME_STEP:
            raise ValueError(
                "SB3SlateVecEnv needs a vector env with autoreset_mode=SAME_STEP (SB3's semantics),"
                f" got {mode!r}; e.g. gymnasium.make_vec(id, num_envs=B, autoreset_mode='SameStep')"
            )
        self.env = env
        self.hidden_keys = hidden_info_keys(env)
        self.num_candidates, self.slate_size = _slate_dims(env.single_action_space)
        self.action_mapping = action_mapping
        self.flatten_observation = flatten_observation
        self._dict_space = env.single_observation_space
        if flatten_observation and not isinstance(self._dict_space, spaces.Dict):
            raise ValueError(
                f"flatten_observation needs a Dict observation, got {self._dict_space}"
            )
        observation_space = (
            _flat_space(self._dict_space) if flatten_observation else self._dict_space
        )
        action_space = _policy_action_space(
            self.num_candidates, self.slate_size, action_mapping, score_bound
        )
        self._seed: int | None = None
        self._slates = np.zeros((env.num_envs, self.slate_size), dtype=np.int64)
        super().__init__(env.num_envs, observation_space, action_space)

    # -- core API

    def _obs(self, obs: Any) -> VecEnvObs:
        if self.flatten_observation:
            return _flatten_batch(self._dict_space, obs, self.num_envs)
        if isinstance(obs, dict):
            return {key: np.asarray(value) for key, value in obs.items()}
        return np.asarray(obs)

    def reset(self) -> VecEnvObs:
        options = self._options[0] if self._options else {}
        if any(opts != options for opts in self._options):
            raise ValueError("SB3SlateVecEnv resets all users together: options must be equal")
        obs, info = self.env.reset(seed=self._seed, options=options or None)
        self.reset_infos = _unbatch_infos(strip_hidden(info, self.hidden_keys), self.num_envs)
        self._seed = None
        self._reset_seeds()
        self._reset_options()
        return self._obs(obs)

    def step_async(self, actions: np.ndarray) -> None:
        actions = np.asarray(actions)
        expected = (self.num_envs, *self.action_space.shape)
        if actions.shape != expected:
            raise ValueError(f"actions have shape {actions.shape}, expected {expected}")
        self._slates = _to_slates(
            actions, self.action_mapping, self.num_candidates, self.slate_size
        )

    def step_wait(self) -> VecEnvStepReturn:
        slates = self._slates
        obs, rewards, terminated, truncated, info = self.env.step(slates)
        info = strip_hidden(info, self.hidden_keys)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        dones = terminated | truncated
        infos = _unbatch_infos(info, self.num_envs)
        if dones.any():
            # SAME_STEP: ``info`` describes the new episodes; the finished step is in final_*.
            final_infos = _unbatch_infos(info.get("final_info", {}), self.num_envs)
            final_obs = self._obs(info["final_obs"])
            for i in np.flatnonzero(dones).tolist():
                self.reset_infos[i] = infos[i]
                infos[i] = {**final_infos[i], "terminal_observation": _row(final_obs, i)}
        truncated_only = (truncated & ~terminated).tolist()
        served = slates.copy()
        for i, step_info in enumerate(infos):
            step_info["TimeLimit.truncated"] = truncated_only[i]
            step_info["slate"] = served[i]
        rewards = np.asarray(rewards, dtype=np.float32)
        return self._obs(obs), rewards, dones, infos

    def close(self) -> None:
        self.env.close()

    def seed(self, seed: int | None = None) -> Sequence[int | None]:
        """Seed the batch's generator at the next :meth:`reset` (one seed for all users)."""
        if seed is None:
            seed = int(np.random.default_rng().integers(np.iinfo(np.uint32).max))
        self._seed = int(seed)
        self.action_space.seed(self._seed)
        return [self._seed] * self.num_envs

    # -- attribute access: one wrapped env for all indices

    def _count(self, indices: VecEnvIndices) -> int:
        return len(list(self._get_indices(indices)))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        value = getattr(self.env, attr_name)
        return [value] * self._count(indices)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        if self._count(indices) != self.num_envs:
            raise ValueError("SB3SlateVecEnv can only set an attribute for all users together")
        setattr(self.env, attr_name, value)

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        result = getattr(self.env, method_name)(*method_args, **method_kwargs)
        return [result] * self._count(indices)

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        wrapped, env = False, self.env
        while env is not None:
            wrapped |= isinstance(env, wrapper_class)
            env = getattr(env, "env", None)
        return [wrapped] * self._count(indices)


# --------------------------------------------------------------------------- convenience


def make_sb3_env(
    env_id: str,
    *,
    num_envs: int = 1,
    seed: int | None = 0,
    action_mapping: ActionMapping = "scores",
    score_bound: float = 1.0,
    flatten_observation: bool = True,
    monitor: bool = True,
    **env_kwargs: Any,
) -> VecEnv:
    """A ready-to-train SB3 ``VecEnv`` of ``num_envs`` users of a registered fedrec env id.

    Always the native batched env (``gymnasium.make_vec`` with ``SAME_STEP`` autoreset; Gymnasium's
    ``SyncVectorEnv`` for an id without one) under :class:`SB3SlateVecEnv`, also for ``num_envs=1``: one code path and the same semantics for
    every B (the batched env reproduces the single env exactly). With ``monitor`` (default) it is
    wrapped in SB3's ``VecMonitor`` so training logs episode returns. ``seed`` seeds the first
    reset (None: unseeded); an SB3 algorithm built with ``seed=s`` reseeds it with ``s``.

    :param env_kwargs: passed to the env constructor (e.g. ``num_candidates=5``).
    """
    same_step = {"autoreset_mode": AutoresetMode.SAME_STEP}
    if gym.spec(env_id).vector_entry_point is not None:  # the native batched env
        vector_env = gym.make_vec(env_id, num_envs=num_envs, **same_step, **env_kwargs)
    else:  # Gymnasium's SyncVectorEnv of single envs
        vector_env = gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs=same_step,
            **env_kwargs,
        )
    venv: VecEnv = SB3SlateVecEnv(
        vector_env,
        action_mapping=action_mapping,
        score_bound=score_bound,
        flatten_observation=flatten_observation,
    )
    if seed is not None:
        venv.seed(seed)
    if monitor:
        venv = VecMonitor(venv)
    return venv
