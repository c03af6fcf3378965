"""PPO and recurrent PPO (Stable-Baselines3, sb3-contrib) as ordinary fedrec slate agents.

:class:`PPOAgent` and :class:`RecurrentPPOAgent` train in fedrec's own loop
(``fedrec train ppo --env ...``), so they get its checkpoints, exact resume and final evaluation
like any other agent. They are thin: the networks are SB3's policy classes
(``ActorCriticPolicy`` for PPO, sb3-contrib's ``RecurrentActorCriticPolicy`` for recurrent PPO)
and the update is the algorithm's own ``train()``. What the agent does itself is what SB3's
``collect_rollouts`` would do, one loop step at a time:

* ``explore_batch``: flatten (and normalise) the B users' observations, sample an action from
  the policy, remember its value and log-probability; serve the slate;
* ``learn``: put the step into SB3's rollout buffer (a truncated episode's reward gets SB3's
  bootstrap ``+ gamma * V(final observation)``); when the buffer holds ``n_steps`` steps of every
  user, compute returns and GAE advantages and run ``train()``.

The action is one score per candidate, ``Box(-b, b, (N,))``; the slate is the n highest scores,
best first (:func:`fedrec.agents.sb3_adapter.scores_to_slates`, after SB3's clipping to the box), so
slates are distinct by construction. The algorithm object is built on a VecEnv with the right
spaces and number of users that is never stepped. See ``docs/sb3.md``, "PPO and recurrent PPO as
fedrec agents".

Reproducibility: SB3 samples actions from torch's global generator and shuffles minibatches with
NumPy's. Every SB3 call that draws runs inside :func:`_global_rngs_from`, which seeds both global
generators from the agent's own ``rng`` and restores them afterwards, so every number depends
only on the agent's checkpointed state.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

try:
    import torch as th
    from sb3_contrib import RecurrentPPO
    from sb3_contrib.common.recurrent.type_aliases import RNNStates
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.running_mean_std import RunningMeanStd
    from stable_baselines3.common.vec_env import VecEnv
except ImportError as error:  # an optional dependency: fedrec's core does not need it
    raise ImportError(
        "the ppo and recurrent_ppo agents need Stable-Baselines3 and sb3-contrib, which are not "
        "installed: pip install 'fedrec[sb3]' (or pip install stable-baselines3 sb3-contrib)"
    ) from error

from fedrec.agents.base import Info, Observation, SlateAgent, Transitions
from fedrec.agents.sb3_adapter import (
    _flat_space,
    _flatten_batch,
    _policy_action_space,
    _slate_dims,
    scores_to_slates,
)

#: Clip of normalised observations and rewards (SB3's ``VecNormalize`` defaults).
CLIP = 10.0
EPSILON = 1e-8
#: The rollout buffer's arrays that a partially filled buffer holds (returns and advantages are
#: computed when it is full, right before the update).
BUFFER_FIELDS = ("observations", "actions", "rewards", "episode_starts", "values", "log_probs")
LSTM_FIELDS = ("hidden_states_pi", "cell_states_pi", "hidden_states_vf", "cell_states_vf")


def _help(default: Any, text: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": text})


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """SB3's PPO defaults for a rollout of 2,048 transitions (128 steps of 16 users) in
    minibatches of 256, with observation and reward normalisation (the RL Zoo's ``normalize``,
    i.e. SB3's ``VecNormalize``). ``docs/sb3.md`` gives the reasons and what they measured."""

    n_steps: int = _help(128, "steps per user between updates (x num_envs users per update)")
    batch_size: int = _help(256, "minibatch size (transitions)")
    n_epochs: int = _help(10, "passes over the rollout per update")
    learning_rate: float = _help(3e-4, "Adam learning rate")
    gamma: float = _help(0.99, "discount factor")
    gae_lambda: float = _help(0.95, "GAE lambda")
    clip_range: float = _help(0.2, "PPO clipping of the probability ratio")
    ent_coef: float = _help(0.0, "entropy bonus coefficient")
    vf_coef: float = _help(0.5, "value loss coefficient")
    max_grad_norm: float = _help(0.5, "gradient norm clip")
    net_arch: tuple[int, ...] = _help((64, 64), "hidden layers of the policy and value networks")
    score_bound: float = _help(3.0, "scores (actions) lie in [-b, b]; the slate is the top n")
    normalize_observations: bool = _help(True, "running mean/std normalisation of observations")
    normalize_rewards: bool = _help(True, "scale rewards by the running std of the return")

    def __post_init__(self) -> None:
        for name in ("n_steps", "batch_size", "n_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ValueError(f"batch_size must be >= 2, got {self.batch_size}")
        if not 0 < self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"need 0 < gamma <= 1 and 0 <= gae_lambda <= 1, got {self}")
        for name in ("learning_rate", "clip_range", "max_grad_norm", "score_bound"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.net_arch or min(self.net_arch) < 1:
            raise ValueError(f"net_arch must be positive layer sizes, got {self.net_arch}")


@dataclasses.dataclass(frozen=True)
class RecurrentPPOConfig(PPOConfig):
    """PPOConfig plus the LSTM (one layer each for the actor and the critic, as sb3-contrib's),
    with larger minibatches: sb3-contrib pads each minibatch into episode sequences and steps
    the LSTMs one time step at a time, so an update's cost grows with the number of minibatches.
    """

    batch_size: int = _help(512, "minibatch size (transitions, cut into episode sequences)")
    lstm_hidden_size: int = _help(64, "LSTM units (actor and critic LSTMs)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lstm_hidden_size < 1:
            raise ValueError(f"lstm_hidden_size must be >= 1, got {self.lstm_hidden_size}")


class _SpacesOnly(VecEnv):
    """What the SB3 algorithm is built on: the agent's spaces and number of users. fedrec's loop
    steps the real env and the agent fills the rollout buffer, so this is never stepped."""

    def __init__(self, num_envs: int, observation_space: Any, action_space: Any) -> None:
        self.render_mode = None
        super().__init__(num_envs, observation_space, action_space)

    def _never(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the agent's SB3 VecEnv is never stepped; fedrec's loop runs the env")

    reset = step_async = step_wait = set_attr = env_method = _never

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(self, attr_name)] * len(list(self._get_indices(indices)))

    def env_is_wrapped(self, wrapper_class: Any, indices: Any = None) -> list[bool]:
        return [False] * len(list(self._get_indices(indices)))

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _global_rngs_from(rng: np.random.Generator) -> Iterator[None]:
    """Seed torch's and NumPy's global generators from ``rng`` for one SB3 call that draws from
    them (action sampling, minibatch shuffling, weight initialisation), then restore them: the
    agent's draws depend only on its own (checkpointed) generator, and nobody else's change."""
    seed = int(rng.integers(2**32))
    # SB3 draws from NumPy's legacy global generator, so this is the one to seed.
    numpy_state = np.random.get_state()  # noqa: NPY002
    with th.random.fork_rng(devices=[]):
        th.manual_seed(seed)
        np.random.seed(seed)  # noqa: NPY002
        try:
            yield
        finally:
            np.random.set_state(numpy_state)  # noqa: NPY002


def _copy(value: Any) -> Any:
    """A tensor or array, copied (tensors stay tensors, anything else becomes an array)."""
    return value.clone() if isinstance(value, th.Tensor) else np.array(value)


def _rms_state(rms: RunningMeanStd) -> dict[str, Any]:
    return {"mean": np.array(rms.mean), "var": np.array(rms.var), "count": float(rms.count)}


def _load_rms(rms: RunningMeanStd, state: Mapping[str, Any]) -> None:
    rms.mean = np.array(state["mean"], dtype=np.float64)
    rms.var = np.array(state["var"], dtype=np.float64)
    rms.count = float(state["count"])


class PPOAgent(SlateAgent):
    """Stable-Baselines3's PPO (``MlpPolicy``, Gaussian scores per candidate) on B users.

    Build it with :meth:`from_env` on the training env: the rollout buffer holds ``n_steps``
    steps of each of that env's ``num_envs`` users. Greedy slates (``act_batch``) rank the
    policy's mean scores. Reads no hidden state.
    """

    Config: ClassVar[type] = PPOConfig
    algorithm: ClassVar[type] = PPO
    policy_name: ClassVar[str] = "MlpPolicy"

    def __init__(
        self,
        *,
        observation_space: Any,
        action_space: Any,
        num_users: int = 1,
        config: PPOConfig | None = None,
        seed: int | None = None,
    ) -> None:
        num_candidates, slate_size = _slate_dims(action_space)
        super().__init__(slate_size=slate_size, seed=seed)
        self.config = config if config is not None else self.Config()
        self.num_users = int(num_users)
        self.dict_space = observation_space
        flat_space = _flat_space(observation_space)
        score_space = _policy_action_space(
            num_candidates, slate_size, "scores", self.config.score_bound
        )
        self.low, self.high = score_space.low, score_space.high
        with _global_rngs_from(self.rng):  # the policy's initial weights
            self.model = self._build(_SpacesOnly(self.num_users, flat_space, score_space))
        self.model.set_logger(Logger(folder=None, output_formats=[]))  # metrics: learn()'s return
        self.policy, self.buffer = self.model.policy, self.model.rollout_buffer
        self.obs_rms = RunningMeanStd(shape=flat_space.shape)
        self.ret_rms = RunningMeanStd(shape=())
        self.discounted_returns = np.zeros(self.num_users)  # per user, for the reward scale
        self.episode_starts = np.zeros(0, dtype=np.float32)  # per user: starts an episode now
        self._ensure_users(self.num_users)
        self.pending: dict[str, Any] = {}  # the step explore_batch took, until learn() stores it
        self.updates = 0

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        """For a vector env (its ``num_envs`` users) or a single env (one user)."""
        return cls(
            observation_space=getattr(env, "single_observation_space", env.observation_space),
            action_space=getattr(env, "single_action_space", env.action_space),
            num_users=getattr(env, "num_envs", 1),
            config=config,
            seed=seed,
        )

    def _sb3_kwargs(self) -> dict[str, Any]:
        c = self.config
        layers = list(c.net_arch)
        return {
            "n_steps": c.n_steps,
            "batch_size": c.batch_size,
            "n_epochs": c.n_epochs,
            "learning_rate": c.learning_rate,
            "gamma": c.gamma,
            "gae_lambda": c.gae_lambda,
            "clip_range": c.clip_range,
            "ent_coef": c.ent_coef,
            "vf_coef": c.vf_coef,
            "max_grad_norm": c.max_grad_norm,
            "policy_kwargs": {"net_arch": {"pi": layers, "vf": layers}},
            "device": "cpu",
        }

    def _build(self, venv: VecEnv) -> Any:
        return self.algorithm(self.policy_name, venv, **self._sb3_kwargs())

    # ------------------------------------------------------------------ per-user memory

    def _ensure_users(self, users: int) -> None:
        """Per-user memory for a batch of ``users`` (a new batch size, e.g. the evaluation's,
        starts everyone afresh)."""
        if len(self.episode_starts) != users:
            self.episode_starts = np.ones(users, dtype=np.float32)

    def begin_episodes(self, mask: np.ndarray) -> None:
        mask = np.asarray(mask, dtype=bool)
        self._ensure_users(len(mask))
        self.episode_starts[mask] = 1.0

    # ------------------------------------------------------------------ acting

    def _flat(self, observations: Observation, *, update: bool) -> np.ndarray:
        """The observations flattened (``fedrec.agents.sb3_adapter``'s layout) and normalised."""
        first = next(iter(self.dict_space.spaces))
        flat = _flatten_batch(self.dict_space, observations, len(observations[first]))
        if not self.config.normalize_observations:
            return flat
        if update:
            self.obs_rms.update(flat)
        scaled = (flat - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + EPSILON)
        return np.clip(scaled, -CLIP, CLIP).astype(np.float32)

    def _forward(self, obs: th.Tensor, deterministic: bool) -> tuple[th.Tensor, ...]:
        """Actions, values and log-probabilities of the policy for the batch."""
        return self.policy(obs, deterministic=deterministic)

    def _values(self, obs: th.Tensor, users: np.ndarray) -> th.Tensor:
        """V(obs) of ``users`` (obs: their next observations), for bootstrapping."""
        return self.policy.predict_values(obs)

    def _slates(self, actions: np.ndarray) -> np.ndarray:
        # What SB3 does before env.step (clip to the box), then the adapter's mapping.
        return scores_to_slates(np.clip(actions, self.low, self.high), self.slate_size)

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        obs = th.as_tensor(self._flat(observations, update=False))
        self._ensure_users(len(obs))
        with th.no_grad():
            actions = self._forward(obs, True)[0]
        self.episode_starts[:] = 0.0
        return self._slates(actions.numpy())

    def explore_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        flat = self._flat(observations, update=True)
        self._ensure_users(len(flat))
        starts = self.episode_starts.copy()
        self.pending = {"observations": flat, "episode_starts": starts, **self._memory()}
        with th.no_grad(), _global_rngs_from(self.rng):  # SB3 samples from torch's generator
            actions, values, log_probs = self._forward(th.as_tensor(flat), False)[:3]
        self.pending.update(actions=actions.numpy(), values=values, log_probs=log_probs)
        self.episode_starts[:] = 0.0
        return self._slates(self.pending["actions"])

    def _memory(self) -> dict[str, Any]:
        """The per-user memory before the step, for the rollout buffer (PPO: none)."""
        return {}

    # ------------------------------------------------------------------ learning

    def _scale_rewards(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Rewards divided by the running std of the discounted return (SB3's VecNormalize)."""
        rewards = np.asarray(rewards, dtype=np.float64)
        if not self.config.normalize_rewards:
            return rewards.astype(np.float32)
        self.discounted_returns = self.discounted_returns * self.config.gamma + rewards
        self.ret_rms.update(self.discounted_returns)
        self.discounted_returns[done] = 0.0
        scaled = rewards / np.sqrt(self.ret_rms.var + EPSILON)
        return np.clip(scaled, -CLIP, CLIP).astype(np.float32)

    def learn(self, transitions: Transitions) -> dict[str, float]:
        step = self.pending
        if not step:
            raise RuntimeError(f"{type(self).__name__}.learn needs the step explore_batch took")
        if transitions.batch_size != self.num_users:
            raise ValueError(
                f"{type(self).__name__} was built for {self.num_users} users, got a batch of "
                f"{transitions.batch_size}"
            )
        terminated = np.asarray(transitions.terminated, dtype=bool)
        done = terminated | np.asarray(transitions.truncated, dtype=bool)
        rewards = self._scale_rewards(transitions.rewards, done)
        next_obs = th.as_tensor(self._flat(transitions.next_observations, update=False))
        # SB3's bootstrap of an episode cut by a time limit: + gamma V(its final observation).
        cut = np.flatnonzero(done & ~terminated)
        if len(cut):
            with th.no_grad():
                values = self._values(next_obs[cut], cut).flatten().numpy()
            rewards[cut] += self.config.gamma * values
        self._add(step, rewards)
        self.pending = {}
        self.episode_starts[done] = 1.0
        if not self.buffer.full:
            return {}
        with th.no_grad():
            last_values = self._values(next_obs, np.arange(self.num_users))
        self.buffer.compute_returns_and_advantage(last_values=last_values, dones=done)
        with _global_rngs_from(self.rng):  # SB3 shuffles minibatches with NumPy's generator
            self.model.train()
        self.updates += 1
        logged = self.model.logger.name_to_value
        metrics = {key.removeprefix("train/"): float(v) for key, v in logged.items()}
        self.model.logger.dump()  # clears the values (no output formats)
        self.buffer.reset()
        return {**metrics, "updates": float(self.updates)}

    def _add(self, step: Mapping[str, Any], rewards: np.ndarray) -> None:
        self.buffer.add(
            step["observations"],
            step["actions"],
            rewards,
            step["episode_starts"],
            step["values"],
            step["log_probs"],
        )

    # ------------------------------------------------------------------ checkpoints

    def _buffer_fields(self) -> tuple[str, ...]:
        return BUFFER_FIELDS

    def state_dict(self) -> dict[str, Any]:
        pending = {key: _copy(value) for key, value in self.pending.items()}
        return {
            **super().state_dict(),
            "policy": {k: v.detach().clone() for k, v in self.policy.state_dict().items()},
            "optimizer": copy.deepcopy(self.policy.optimizer.state_dict()),
            "sb3_updates": self.model._n_updates,
            "buffer": {name: getattr(self.buffer, name).copy() for name in self._buffer_fields()},
            "buffer_pos": self.buffer.pos,
            "obs_rms": _rms_state(self.obs_rms),
            "ret_rms": _rms_state(self.ret_rms),
            "discounted_returns": self.discounted_returns.copy(),
            "episode_starts": self.episode_starts.copy(),
            "pending": pending,
            "updates": self.updates,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.policy.load_state_dict(state["policy"])
        self.policy.optimizer.load_state_dict(state["optimizer"])
        self.model._n_updates = int(state["sb3_updates"])
        self.buffer.reset()
        for name in self._buffer_fields():
            saved = np.array(state["buffer"][name], dtype=np.float32)
            if saved.shape != getattr(self.buffer, name).shape:
                raise ValueError(
                    f"saved rollout buffer {name} has shape {saved.shape}, expected "
                    f"{getattr(self.buffer, name).shape} (another num_envs or n_steps?)"
                )
            setattr(self.buffer, name, saved)
        self.buffer.pos = int(state["buffer_pos"])
        _load_rms(self.obs_rms, state["obs_rms"])
        _load_rms(self.ret_rms, state["ret_rms"])
        self.discounted_returns = np.array(state["discounted_returns"], dtype=np.float64)
        self.episode_starts = np.array(state["episode_starts"], dtype=np.float32)
        self.pending = {key: _copy(value) for key, value in state["pending"].items()}
        self.updates = int(state["updates"])


class RecurrentPPOAgent(PPOAgent):
    """sb3-contrib's RecurrentPPO (``MlpLstmPolicy``: an LSTM before the actor and one before the
    critic) on B users, with one LSTM state per user.

    :meth:`begin_episodes` clears the rows of the users whose episode starts; the rollout buffer
    stores each step's LSTM states and episode starts, as sb3-contrib's own rollouts do.
    """

    Config: ClassVar[type] = RecurrentPPOConfig
    algorithm: ClassVar[type] = RecurrentPPO
    policy_name: ClassVar[str] = "MlpLstmPolicy"

    def _sb3_kwargs(self) -> dict[str, Any]:
        kwargs = super()._sb3_kwargs()
        kwargs["policy_kwargs"]["lstm_hidden_size"] = self.config.lstm_hidden_size
        return kwargs

    def _ensure_users(self, users: int) -> None:
        if len(self.episode_starts) != users:
            super()._ensure_users(users)
            lstm = self.policy.lstm_actor
            shape = (lstm.num_layers, users, lstm.hidden_size)
            self.lstm_states = RNNStates(
                (th.zeros(shape), th.zeros(shape)), (th.zeros(shape), th.zeros(shape))
            )

    def _flat_states(self) -> tuple[th.Tensor, ...]:
        return (*self.lstm_states.pi, *self.lstm_states.vf)

    def begin_episodes(self, mask: np.ndarray) -> None:
        super().begin_episodes(mask)
        rows = th.as_tensor(np.asarray(mask, dtype=bool))
        for state in self._flat_states():
            state[:, rows] = 0.0

    def _forward(self, obs: th.Tensor, deterministic: bool) -> tuple[th.Tensor, ...]:
        starts = th.as_tensor(self.episode_starts)
        actions, values, log_probs, self.lstm_states = self.policy(
            obs, self.lstm_states, starts, deterministic
        )
        return actions, values, log_probs

    def _values(self, obs: th.Tensor, users: np.ndarray) -> th.Tensor:
        # The critic's LSTM state after the step just taken (continuing the same episode).
        vf = tuple(state[:, th.as_tensor(users)].contiguous() for state in self.lstm_states.vf)
        return self.policy.predict_values(obs, vf, th.zeros(len(users)))

    def _memory(self) -> dict[str, Any]:
        return {"lstm_states": th.stack(self._flat_states())}  # (4, layers, users, units)

    def _add(self, step: Mapping[str, Any], rewards: np.ndarray) -> None:
        h_pi, c_pi, h_vf, c_vf = step["lstm_states"]
        self.buffer.add(
            step["observations"],
            step["actions"],
            rewards,
            step["episode_starts"],
            step["values"],
            step["log_probs"],
            lstm_states=RNNStates((h_pi, c_pi), (h_vf, c_vf)),
        )

    def _buffer_fields(self) -> tuple[str, ...]:
        return BUFFER_FIELDS + LSTM_FIELDS

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["lstm_states"] = th.stack(self._flat_states())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        h_pi, c_pi, h_vf, c_vf = th.as_tensor(state["lstm_states"]).clone()
        self.lstm_states = RNNStates((h_pi, c_pi), (h_vf, c_vf))
