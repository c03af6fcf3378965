"""Environment state as plain data: save and restore a running env without pickling it.

Every fedrec environment has ``state_dict()`` (everything that changes while it runs: the
``np_random`` generator's state, users' hidden state, step counters, autoreset flags, ...) and
``load_state_dict(state)`` (restore it into an env built with the same constructor arguments;
the whole state is validated first, so a rejected state leaves the env unchanged). A state holds
only *plain data* (:func:`check_plain_data`): dicts with str keys, lists, tuples, str, int, float,
bool, None and numeric or bool ``numpy.ndarray``\\ s, so it can be stored with
``torch.save`` and read back with ``torch.load(weights_only=True)`` (after turning the arrays
into tensors) instead of running arbitrary code from a pickle.

:func:`env_state` and :func:`load_env_state` work on what ``gymnasium.make`` /
``gymnasium.make_vec`` return: they walk the wrapper chain (saving the state of the wrappers
``make`` adds: ``TimeLimit``, ``OrderEnforcing``, ``PassiveEnvChecker``; a wrapper with its own
``state_dict`` / ``load_state_dict`` is saved through them; Gymnasium's stateful wrappers such as
``RecordEpisodeStatistics`` or ``NormalizeObservation`` are refused with ``TypeError``; other
wrappers are taken to be stateless) and handle Gymnasium's ``SyncVectorEnv`` (each sub-env plus
its autoreset bookkeeping). Envs without the two methods are refused with ``TypeError``.

Helpers for env authors: :func:`generator_state` and :class:`StateReader`, which validates and
copies every entry of a state before ``load_state_dict`` changes anything.
"""

from __future__ import annotations

import copy
from typing import Any

import gymnasium as gym
import numpy as np

#: The dtype kinds a state's arrays may have: bool, signed/unsigned integer, float, complex.
PLAIN_ARRAY_KINDS = "biufc"
_PLAIN_SCALARS = (str, int, float, bool, type(None))
_ALLOWED = (
    "dict with str keys, list, tuple, str, int, float, bool, None, "
    "or numpy.ndarray of a numeric or bool dtype"
)


def check_plain_data(value: Any, path: str = "state") -> None:
    """Raise ``TypeError`` naming the path of the first value that is not plain data.

    Plain data: dicts with str keys, lists, tuples, str, int, float, bool, None, and
    ``numpy.ndarray`` of a numeric or bool dtype. Subclasses (numpy scalars such as
    ``np.float64``, enums, ...) are not plain.
    """
    kind = type(value)
    if kind in _PLAIN_SCALARS:
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(f"{path} has a key {key!r} of type {type(key).__name__}, not str")
            check_plain_data(item, f"{path}[{key!r}]")
        return
    if kind is list or kind is tuple:
        for index, item in enumerate(value):
            check_plain_data(item, f"{path}[{index}]")
        return
    if kind is np.ndarray:
        if value.dtype.kind not in PLAIN_ARRAY_KINDS:
            raise TypeError(f"{path} is an array of dtype {value.dtype}, not numeric or bool")
        return
    raise TypeError(
        f"{path} is a {kind.__module__}.{kind.__qualname__}, not plain data ({_ALLOWED})"
    )


# --------------------------------------------------------------------------------------------
# Helpers for the envs' own state_dict / load_state_dict


def generator_state(rng: np.random.Generator | None) -> dict[str, Any] | None:
    """The bit generator state of ``rng`` as plain data (None for no generator)."""
    if rng is None:
        return None
    return copy.deepcopy(rng.bit_generator.state)


class StateReader:
    """Validating, copying access to a state dict for ``load_state_dict``.

    Every accessor checks one entry and returns a fresh value (arrays are copied), raising
    ``ValueError`` that names the env and the entry; :meth:`finish` rejects unknown keys. Read
    everything first, then mutate the env: a rejected state leaves it unchanged.
    """

    def __init__(self, state: Any, who: str) -> None:
        if not isinstance(state, dict):
            raise ValueError(f"{who} state must be a dict, got {type(state).__name__}")
        self.state = state
        self.who = who
        self._seen: set[str] = set()

    def _get(self, key: str) -> Any:
        if key not in self.state:
            raise ValueError(f"{self.who} state lacks the key {key!r}")
        self._seen.add(key)
        return self.state[key]

    def fail(self, key: str, problem: str) -> ValueError:
        """A ValueError about entry ``key`` (for checks beyond the accessors)."""
        return ValueError(f"{self.who} state: {key!r} {problem}")

    def array(self, key: str, shape: tuple[int, ...], dtype: Any, *, hint: str = "") -> np.ndarray:
        """A copy of the array ``key``, which must have exactly ``shape`` and ``dtype``."""
        value = self._get(key)
        dtype = np.dtype(dtype)
        note = f" ({hint})" if hint else ""
        if type(value) is not np.ndarray:
            raise self.fail(key, f"must be a numpy array, got {type(value).__name__}")
        if value.shape != tuple(shape):
            raise self.fail(key, f"has shape {value.shape}, expected {tuple(shape)}{note}")
        if value.dtype != dtype:
            raise self.fail(key, f"has dtype {value.dtype}, expected {dtype}")
        return value.copy()

    def int(self, key: str, *, low: int | None = None, high: int | None = None) -> int:
        """The int ``key``, optionally within ``[low, high]``."""
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise self.fail(key, f"must be an int, got {value!r}")
        value = int(value)
        if low is not None and value < low:
            raise self.fail(key, f"is {value}, below {low}")
        if high is not None and value > high:
            raise self.fail(key, f"is {value}, above {high}")
        return value

    def optional_int(self, key: str, *, low: int | None = None) -> int | None:
        """The int ``key`` (at least ``low``) or None."""
        if self.state.get(key, 0) is None:
            self._seen.add(key)
            return None
        return self.int(key, low=low)

    def float(self, key: str) -> float:
        """The number ``key`` as a float."""
        value = self._get(key)
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise self.fail(key, f"must be a float, got {value!r}")
        return float(value)

    def bool(self, key: str) -> bool:
        """The bool ``key``."""
        value = self._get(key)
        if not isinstance(value, bool | np.bool_):
            raise self.fail(key, f"must be a bool, got {value!r}")
        return bool(value)

    def dict(self, key: str) -> dict[str, Any]:
        """The nested state ``key`` (not copied; its own reader checks it)."""
        value = self._get(key)
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a dict, got {type(value).__name__}")
        return value

    def raw(self, key: str) -> Any:
        """Entry ``key`` unchecked (the caller checks it)."""
        return self._get(key)

    def generator(self, key: str = "np_random") -> np.random.Generator | None:
        """A new ``numpy.random.Generator`` in the saved bit generator state (None stays None)."""
        value = self._get(key)
        if value is None:
            return None
        name = value.get("bit_generator") if isinstance(value, dict) else None
        cls = getattr(np.random, name, None) if isinstance(name, str) else None
        if not (isinstance(cls, type) and issubclass(cls, np.random.BitGenerator)):
            raise self.fail(key, f"is not a numpy bit generator state (got {value!r:.120})")
        try:
            bit_generator = cls()
            bit_generator.state = value
        except (TypeError, ValueError, KeyError, OverflowError) as error:
            raise self.fail(key, f"is not a valid {name} state: {error}") from error
        return np.random.Generator(bit_generator)

    def seed(self, key: str = "np_random_seed") -> int | None:
        """Gymnasium's ``np_random_seed`` (an int, or None when never seeded)."""
        return self.optional_int(key)

    def finish(self) -> None:
        """Reject keys no accessor asked for (a state of another env class or version)."""
        unknown = sorted(set(self.state) - self._seen, key=str)
        if unknown:
            raise ValueError(f"{self.who} state has unexpected keys {unknown}")


class CoreVectorEnvState:
    """``state_dict`` / ``load_state_dict`` of a vector env whose users live in a core object.

    The state is the env's generator and seed, the core's own state (``core.state_dict()``,
    ``core.read_state(reader)`` to validate, ``core.set_state(value)`` to apply), one bool per
    sub-env for each name in :attr:`STATE_MASKS` (attribute ``_NAME``) and the ``_started`` flag.
    The logged-data and Taobao vector envs share it.
    """

    #: per-sub-env bool arrays kept as attribute ``_name``
    STATE_MASKS: tuple[str, ...] = ("autoreset",)
    num_envs: int

    def _state_core(self) -> Any:
        return self._core

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        return {
            "np_random": generator_state(self._np_random),
            "np_random_seed": self._np_random_seed,
            "core": self._state_core().state_dict(),
            **{name: getattr(self, f"_{name}").copy() for name in self.STATE_MASKS},
            "started": bool(self._started),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments (the data set is
        not part of the state). The whole state is checked first (``ValueError``; no change)."""
        core = self._state_core()
        read = StateReader(state, type(self).__name__)
        rng = read.generator()
        seed = read.seed()
        core_state = core.read_state(StateReader(read.dict("core"), f"{read.who} core"))
        hint = f"num_envs={self.num_envs}"
        masks = {
            name: read.array(name, (self.num_envs,), bool, hint=hint) for name in self.STATE_MASKS
        }
        started = read.bool("started")
        read.finish()
        self._np_random, self._np_random_seed = rng, seed
        core.set_state(core_state)
        for name, mask in masks.items():
            setattr(self, f"_{name}", mask)
        self._started = started


def last_step_state(last: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """A single env's last step ``(slate, slot)`` or ``(slate, slot, reward)`` as plain data."""
    if last is None:
        return None
    slate, slot, *reward = last
    return ([int(item) for item in slate], int(slot), *(float(r) for r in reward))


def parse_last_step(
    read: StateReader, last: Any, *, with_reward: bool, key: str = "last"
) -> tuple[Any, ...] | None:
    """The last step read raw from entry ``key``, checked and converted back (after
    :meth:`StateReader.finish`): ``(slate, slot, reward)`` or, without reward, ``(slate, slot)``."""
    if last is None:
        return None
    try:
        if with_reward:
            slate, slot, reward = last
            return [int(item) for item in slate], int(slot), float(reward)
        slate, slot = last
        return [int(item) for item in slate], int(slot)
    except (TypeError, ValueError) as error:
        form = "(slate, slot, reward)" if with_reward else "(slate, slot)"
        raise read.fail(key, f"must be None or {form}: {error}") from error


class SimulatorEnvState:
    """``state_dict`` / ``load_state_dict`` of a single env whose user lives in a one-user
    simulator (``self._sim``): the generator and seed, the simulator's own state, the last step
    (``self._last``, see :attr:`LAST_HAS_REWARD`) and ``needs_reset``. The cascade and
    interest-evolution envs share it."""

    #: whether ``self._last`` is ``(slate, slot, reward)`` rather than ``(slate, slot)``
    LAST_HAS_REWARD = True

    def _simulator_loaded(self) -> None:
        """Called once the simulator's state is restored (an env may copy it out)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        return {
            "np_random": generator_state(self._np_random),
            "np_random_seed": self._np_random_seed,
            "simulator": self._sim.state_dict(),
            "last": last_step_state(self._last),
            "needs_reset": bool(self._needs_reset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments (checked first)."""
        read = StateReader(state, type(self).__name__)
        rng = read.generator()
        seed = read.seed()
        simulator = read.dict("simulator")
        last = read.raw("last")
        needs_reset = read.bool("needs_reset")
        read.finish()
        last = parse_last_step(read, last, with_reward=self.LAST_HAS_REWARD)
        self._sim.load_state_dict(simulator)  # checks before it changes anything
        self._simulator_loaded()
        self._np_random, self._np_random_seed = rng, seed
        self._last = last
        self._needs_reset = needs_reset


# --------------------------------------------------------------------------------------------
# Wrapper chains and SyncVectorEnv


def _inner(env: Any) -> Any | None:
    """The env a wrapper wraps (None when ``env`` is not a wrapper)."""
    if isinstance(env, gym.Wrapper | gym.vector.VectorWrapper):
        return env.env
    try:
        from pettingzoo.utils.wrappers import BaseParallelWrapper, BaseWrapper
    except ImportError:  # pragma: no cover - pettingzoo is a dependency
        return None
    if isinstance(env, BaseParallelWrapper | BaseWrapper):
        return env.env
    return None


def _unwrap(env: Any) -> tuple[list[Any], Any]:
    """The wrappers around ``env`` (outermost first) and the env inside them."""
    wrappers = []
    inner = _inner(env)
    while inner is not None:
        wrappers.append(env)
        env, inner = inner, _inner(inner)
    return wrappers, env


def _has_state_methods(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _no_state_error(obj: Any) -> TypeError:
    return TypeError(
        f"{type(obj).__qualname__} cannot save its state as data; "
        "exact resume needs state_dict() and load_state_dict()"
    )


_STATEFUL_WRAPPERS = {"RecordEpisodeStatistics", "Autoreset", "AtariPreprocessing"}
_CHECKER_FLAGS = ("checked_reset", "checked_step", "checked_render", "checked_data_reuse")


def _wrapper_state(wrapper: Any) -> dict[str, Any] | None:
    """What a wrapper keeps between calls (None: nothing)."""
    if _has_state_methods(type(wrapper)):  # the wrapper's own methods, not forwarded ones
        return wrapper.state_dict()
    if isinstance(wrapper, gym.wrappers.TimeLimit):
        return {"elapsed_steps": wrapper._elapsed_steps}
    if isinstance(wrapper, gym.wrappers.OrderEnforcing):
        return {"has_reset": bool(wrapper._has_reset)}
    if isinstance(wrapper, gym.wrappers.PassiveEnvChecker):
        return {flag: bool(getattr(wrapper, flag)) for flag in _CHECKER_FLAGS}
    module = type(wrapper).__module__
    if module.startswith("gymnasium.wrappers") and (
        ".stateful_" in module or type(wrapper).__name__ in _STATEFUL_WRAPPERS
    ):
        raise TypeError(
            f"wrapper {type(wrapper).__qualname__} keeps state that env_state cannot save; "
            "exact resume needs state_dict() and load_state_dict()"
        )
    return None


def _wrapper_loader(wrapper: Any, state: Any, path: str) -> tuple[Any, Any]:
    """Validate a wrapper's saved state; returns ``(apply, undo)``.

    ``undo`` is None for the built-in wrappers, whose ``apply`` cannot fail once validated; a
    wrapper with its own ``load_state_dict`` validates when applied and is undone from a snapshot.
    """
    if _has_state_methods(type(wrapper)):
        snapshot = wrapper.state_dict()
        return lambda: wrapper.load_state_dict(state), lambda: wrapper.load_state_dict(snapshot)
    if isinstance(wrapper, gym.wrappers.TimeLimit):
        reader = StateReader(state, f"TimeLimit at {path}")
        elapsed = reader.optional_int("elapsed_steps", low=0)
        reader.finish()
        return lambda: setattr(wrapper, "_elapsed_steps", elapsed), None
    if isinstance(wrapper, gym.wrappers.OrderEnforcing):
        reader = StateReader(state, f"OrderEnforcing at {path}")
        has_reset = reader.bool("has_reset")
        reader.finish()
        return lambda: setattr(wrapper, "_has_reset", has_reset), None
    if isinstance(wrapper, gym.wrappers.PassiveEnvChecker):
        reader = StateReader(state, f"PassiveEnvChecker at {path}")
        flags = {flag: reader.bool(flag) for flag in _CHECKER_FLAGS}
        reader.finish()
        # The data-reuse check compares objects returned before and after the checkpoint; the
        # earlier ones are gone, so a restored checker skips it (it only ever warns).
        flags["checked_step"] |= flags["checked_reset"]
        flags["checked_data_reuse"] |= flags["checked_reset"]

        def apply() -> None:
            for flag, value in flags.items():
                setattr(wrapper, flag, value)
            wrapper._previous_data = None

        return apply, None
    if state is not None:
        raise ValueError(f"{path}: {type(wrapper).__name__} keeps no state, got {state!r:.80}")
    return lambda: None, None


def _plain_obs(obs: Any) -> Any:
    """A deep copy of an observation with numpy scalars turned into 0-d arrays."""
    if isinstance(obs, np.generic):
        return np.asarray(obs)
    if isinstance(obs, np.ndarray):
        return obs.copy()
    if isinstance(obs, dict):
        return {key: _plain_obs(value) for key, value in obs.items()}
    if isinstance(obs, list | tuple):
        return type(obs)(_plain_obs(value) for value in obs)
    return copy.deepcopy(obs)


def _sync_state(env: gym.vector.SyncVectorEnv) -> dict[str, Any]:
    return {
        "autoreset_envs": np.array(env._autoreset_envs, dtype=bool),
        "terminations": np.array(env._terminations, dtype=bool),
        "truncations": np.array(env._truncations, dtype=bool),
        "rewards": np.array(env._rewards, dtype=np.float64),
        "env_obs": [_plain_obs(obs) for obs in env._env_obs],
        "envs": [env_state(sub) for sub in env.envs],
    }


def _sync_loader(env: gym.vector.SyncVectorEnv, state: Any, path: str) -> Any:
    b = env.num_envs
    reader = StateReader(state, f"SyncVectorEnv at {path}")
    hint = f"num_envs={b}"
    arrays = {
        key: reader.array(key, (b,), bool, hint=hint)
        for key in ("autoreset_envs", "terminations", "truncations")
    }
    rewards = reader.array("rewards", (b,), np.float64, hint=hint)
    env_obs = reader.raw("env_obs")
    subs = reader.raw("envs")
    reader.finish()
    for key, value in (("env_obs", env_obs), ("envs", subs)):
        if not isinstance(value, list) or len(value) != b:
            raise reader.fail(key, f"must be a list of {b} entries ({hint})")
    env_obs = [_plain_obs(obs) for obs in env_obs]
    snapshots = [env_state(sub) for sub in env.envs]  # to undo a partial load

    def apply() -> None:
        for index, (sub, sub_state) in enumerate(zip(env.envs, subs, strict=True)):
            try:
                load_env_state(sub, sub_state, _path=f"{path}['envs'][{index}]")
            except Exception:
                for done, snapshot in zip(env.envs[:index], snapshots, strict=False):
                    load_env_state(done, snapshot)
                raise
        env._autoreset_envs = arrays["autoreset_envs"]
        env._terminations = arrays["terminations"]
        env._truncations = arrays["truncations"]
        env._rewards = rewards
        env._env_obs = env_obs

    return apply


# --------------------------------------------------------------------------------------------
# Public entry points


def env_state(env: Any) -> dict[str, Any]:
    """The complete dynamic state of ``env`` (as returned by ``gym.make`` / ``gym.make_vec``).

    :returns: ``{"env_class": name, "wrappers": [{"wrapper": name, "state": ...}, ...]
        (outermost first), "env": the unwrapped env's state_dict()}``, all plain data.
    :raises TypeError: the env (or a sub-env of a ``SyncVectorEnv``) has no ``state_dict`` /
        ``load_state_dict``, or a wrapper keeps state it cannot save.
    """
    wrappers, base = _unwrap(env)
    if isinstance(base, gym.vector.SyncVectorEnv):
        inner = _sync_state(base)
    elif _has_state_methods(base):
        inner = base.state_dict()
    else:
        raise _no_state_error(base)
    return {
        "env_class": type(base).__name__,
        "wrappers": [
            {"wrapper": type(wrapper).__name__, "state": _wrapper_state(wrapper)}
            for wrapper in wrappers
        ],
        "env": inner,
    }


def load_env_state(env: Any, state: dict[str, Any], *, _path: str = "state") -> None:
    """Restore a state from :func:`env_state` into ``env``, built with the same arguments.

    The whole state is validated before anything changes: a ``ValueError`` (wrong wrapper
    chain, env class, missing key, array shape or dtype that does not match this env's
    configuration) leaves ``env`` unchanged.

    :raises TypeError: as :func:`env_state`.
    """
    wrappers, base = _unwrap(env)
    sync = isinstance(base, gym.vector.SyncVectorEnv)
    if not sync and not _has_state_methods(base):
        raise _no_state_error(base)
    reader = StateReader(state, "env_state()" if _path == "state" else f"env_state() at {_path}")
    saved_class = reader.raw("env_class")
    saved_wrappers = reader.raw("wrappers")
    inner = reader.raw("env")
    reader.finish()
    if saved_class != type(base).__name__:
        raise ValueError(f"{_path} was saved from a {saved_class}, not a {type(base).__name__}")
    names = [type(wrapper).__name__ for wrapper in wrappers]
    if not isinstance(saved_wrappers, list) or not all(
        isinstance(entry, dict) and set(entry) == {"wrapper", "state"} for entry in saved_wrappers
    ):
        raise ValueError(f"{_path}['wrappers'] must be a list of {{'wrapper', 'state'}} dicts")
    saved_names = [entry["wrapper"] for entry in saved_wrappers]
    if saved_names != names:
        raise ValueError(f"{_path} was saved with the wrappers {saved_names}, this env has {names}")
    loaders = [
        _wrapper_loader(wrapper, entry["state"], f"{_path}['wrappers'][{index}]")
        for index, (wrapper, entry) in enumerate(zip(wrappers, saved_wrappers, strict=True))
    ]
    if sync:
        load_base = _sync_loader(base, inner, f"{_path}['env']")
    else:
        # the env's load_state_dict validates everything before it changes anything
        def load_base() -> None:
            base.load_state_dict(inner)

    # Steps that may still fail run first, each undone if a later one fails; the built-in
    # wrappers' validated assignments cannot fail and run last.
    fallible = [(apply, undo) for apply, undo in loaders if undo is not None]
    fallible.append((load_base, None))
    done = []
    try:
        for apply, undo in fallible:
            apply()
            done.append(undo)
    except Exception:
        for undo in reversed(done):
            if undo is not None:
                undo()
        raise
    for apply, undo in loaders:
        if undo is None:
            apply()
