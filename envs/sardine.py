"""SARDINE's slate environments with fedrec's observation conventions (the ``sardine`` extra).

SARDINE (Deffayet et al., "SARDINE: A Simulator for Automated Recommendation in Dynamic and
Interactive Environments", TOIS 2024; ``pip install "fedrec[sardine]"``, the ``sardine-rec``
package) simulates a user who clicks items of a slate drawn from a *fixed* catalogue of item
embeddings, under a position-based click model, and who gets bored of a topic clicked too often.
:class:`SardineEnv` runs SARDINE's own simulator (``sardine.simulator.Sardine``, built with the
keyword arguments SARDINE registers for ``sardine_id``) and translates its interface:

| SARDINE | fedrec (:class:`SardineEnv`) |
|---|---|
| action: ``MultiDiscrete([N] * n)`` item ids (repeats allowed; ``-1`` = its greedy oracle) | :class:`fedrec.envs.slates.SlateSpace` of n distinct item ids, validated |
| observation ``slate`` (item ids) | ``slate_features`` (n, D): the embeddings of the slate just shown |
| observation ``clicks`` (n,) | ``response_click`` (1, n): the clicks on that slate |
| observation ``hist`` (D,) | ``user`` (D,): the recent clicked-topic histogram, in [0, 1] |
| the catalogue ``item_embedd`` (an attribute) | ``candidates`` (N, D): every item's embedding, the same each step |
| reward ``sum(clicks)`` (an int) | the same, as a float |
| info ``user_state``, ``bored``, ``relevances``, ``scores`` | the same keys, **hidden** (``metadata["hidden_info_keys"]``) |
| ``step([-1] * n)``: the short-term greedy oracle | info ``oracle_slate`` (hidden): the slate that call would serve |

Nothing else changes: the user, the click model, boredom and the episode end are SARDINE's code,
and the random numbers are drawn in SARDINE's order from one generator, so ``reset(seed=s)``
followed by the same slates reproduces ``gym.make(sardine_id).reset(seed=s)`` step for step.
An episode is SARDINE's ``episode_length`` steps (100 for the TopK and SingleItem envs, 10 for
Rerank) and then terminates; the reset itself shows the user one random slate, as in SARDINE.

fedrec registers each of SARDINE's ids ``sardine/<Name>-v0`` as ``sardine/<Name>-fedrec-v0``
(SARDINE registers its own ids on import, so the adapter needs names of its own), when the
``sardine`` package is installed (:data:`SARDINE_IDS`). ``gymnasium.make_vec`` gives
:class:`SardineVectorEnv`: copies stepped one after the other (SARDINE has no batched simulator),
the same episodes as Gymnasium's ``SyncVectorEnv``, with the whole batch validated before any user
steps and fedrec's three autoreset modes; ``state_dict`` /
``load_state_dict`` make training runs resumable.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.slates import SlateBatchSpace, SlateSpace, reject_finished, validate_slates
from fedrec.envs.state import StateReader, generator_state
from fedrec.envs.vector_utils import check_vector_args, parse_autoreset_mode, reset_mask

Observation = dict[str, np.ndarray]

#: SARDINE 1.0.8's registered ids (its ``sardine/__init__.py``), in its order.
SARDINE_IDS: tuple[str, ...] = (
    "sardine/SingleItem-Static-v0",
    "sardine/SingleItem-BoredInf-v0",
    "sardine/SingleItem-Uncertain-v0",
    "sardine/SlateTopK-Bored-v0",
    "sardine/SlateTopK-BoredInf-v0",
    "sardine/SlateTopK-Uncertain-v0",
    "sardine/SlateRerank-Static-v0",
    "sardine/SlateRerank-Bored-v0",
)

#: What the adapter's info reveals of the user that a recommender could not observe: SARDINE's
#: full user state (current embedding, topic history, boredom timers), the bored topics, the
#: true click attractiveness and scores of the slate, and the greedy oracle's next slate.
HIDDEN_KEYS: frozenset[str] = frozenset(
    {"user_state", "bored", "relevances", "scores", "oracle_slate"}
)

MISSING = (
    "SARDINE environments need the optional package sardine-rec: pip install 'fedrec[sardine]' "
    "(or pip install sardine-rec==1.0.8)"
)


def fedrec_id(sardine_id: str) -> str:
    """The fedrec id of SARDINE's ``sardine/<Name>-v0``: ``sardine/<Name>-fedrec-v0``."""
    head, _, version = sardine_id.rpartition("-v")
    return f"{head}-fedrec-v{version}"


def sardine_available() -> bool:
    """Whether the ``sardine`` package can be imported (found without importing it)."""
    return importlib.util.find_spec("sardine") is not None


def _import_sardine() -> Any:
    try:
        return importlib.import_module("sardine")
    except ModuleNotFoundError as error:
        if error.name != "sardine":
            raise
        raise ModuleNotFoundError(MISSING, name="sardine") from error


def sardine_kwargs(sardine_id: str) -> dict[str, Any]:
    """The keyword arguments SARDINE registers for ``sardine_id`` (imports sardine)."""
    _import_sardine()  # registers SARDINE's ids with Gymnasium
    if sardine_id not in gym.registry:
        known = ", ".join(i for i in gym.registry if i.startswith("sardine/") and "fedrec" not in i)
        raise ValueError(f"unknown SARDINE id {sardine_id!r}; SARDINE registers {known}")
    return dict(gym.spec(sardine_id).kwargs)


def _blank_user(sim: Any) -> None:
    """The attributes ``Sardine.reset`` sets, at their reset values (user embedding zero)."""
    d = sim.num_topics
    sim.boredom_counter, sim.t = 0, 0
    sim.clicked_items = deque(maxlen=sim.recent_items_maxlen)
    sim.clicked_item_topics = deque(maxlen=sim.recent_items_maxlen)
    sim.clicked_step = deque(maxlen=sim.recent_items_maxlen)
    sim.all_clicked_items = []
    sim.bored = np.zeros(d, dtype=bool)
    sim.bored_timeout = sim.boredom_moving_window * np.ones(d, dtype=np.int64)
    sim.user_embedd = np.zeros(d)
    sim.cur_user_embedd = np.zeros(d)
    sim.norm_recent_topics_hist = np.zeros(d, dtype=np.float32)


class SardineEnv(gym.Env[Observation, np.ndarray]):
    """One SARDINE user with fedrec's observations and slate actions (see the module doc).

    :param sardine_id: the SARDINE id whose registered parameters to use.
    :param overrides: SARDINE keyword arguments that replace the registered ones (e.g.
        ``episode_length``).

    ## Info
    ``slate`` and ``clicks`` (SARDINE's own observation of the slate just shown) and **hidden**
    ground truth, declared in ``metadata["hidden_info_keys"]`` and stripped by fedrec's loops for
    every agent that is not an oracle: ``user_state`` (SARDINE's user: current embedding, topic
    history, boredom timers), ``bored`` (the bored topics), ``relevances`` and ``scores`` (the
    slate's true attractiveness; after a step only) and ``oracle_slate`` (the next slate of
    SARDINE's short-term greedy oracle, :meth:`oracle_slate`).

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B)`` returns :class:`SardineVectorEnv`.
    """

    metadata = {"render_modes": [], HIDDEN_INFO_KEYS: HIDDEN_KEYS}

    def __init__(self, sardine_id: str = "sardine/SlateTopK-Bored-v0", **overrides: Any) -> None:
        kwargs = {**sardine_kwargs(sardine_id), **overrides}  # imports sardine, or a clear error
        simulator = importlib.import_module("sardine.simulator")
        if kwargs.get("env_embedds") is None:
            raise ValueError(
                "env_embedds=None makes SARDINE draw new item embeddings with the global NumPy "
                "generator and write them into its package folder; use a registered catalogue"
            )
        self.sardine_id = sardine_id
        self._sim = simulator.Sardine(**kwargs)
        sim = self._sim
        _blank_user(sim)  # what reset() sets, so that state_dict() works before the first reset
        self.num_items, self.slate_size = int(sim.num_items), int(sim.slate_size)
        self.num_topics, self.episode_length = int(sim.num_topics), int(sim.H)
        self.items = np.ascontiguousarray(sim.item_embedd, dtype=np.float32)
        low, high = float(min(0.0, self.items.min())), float(max(1.0, self.items.max()))
        n, d = self.slate_size, self.num_topics
        self.observation_space = spaces.Dict(
            {
                "candidates": spaces.Box(low, high, (self.num_items, d), np.float32),
                "response_click": spaces.Box(0.0, 1.0, (1, n), np.float32),
                "slate_features": spaces.Box(low, high, (n, d), np.float32),
                "user": spaces.Box(0.0, 1.0, (d,), np.float32),
            }
        )
        self.action_space = SlateSpace(self.num_items, n)
        self._slate = np.zeros(n, dtype=np.int64)
        self._clicks = np.zeros(n, dtype=np.int64)
        self._needs_reset = True

    # ------------------------------------------------------------------------------ the API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        # One generator for both: SARDINE draws from self.np_random exactly as its own
        # reset(seed=seed) would.
        self._sim._np_random = self._np_random
        obs, info = self._sim.reset()
        self._slate = np.asarray(obs["slate"], dtype=np.int64)
        self._clicks = np.asarray(obs["clicks"], dtype=np.int64)
        self._needs_reset = False
        visible = {"slate": self._slate.copy(), "clicks": self._clicks.copy()}
        return self._observation(), {**visible, **self._hidden(info)}

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        slate = validate_slates(action, num_candidates=self.num_items, slate_size=self.slate_size)
        obs, reward, terminated, truncated, info = self._sim.step(slate.copy())
        self._slate = np.asarray(obs["slate"], dtype=np.int64)
        self._clicks = np.asarray(obs["clicks"], dtype=np.int64)
        self._needs_reset = bool(terminated or truncated)
        visible = {"slate": self._slate.copy(), "clicks": self._clicks.copy()}
        hidden = self._hidden(info)
        hidden["relevances"] = np.asarray(info["relevances"], dtype=np.float64)
        hidden["scores"] = np.asarray(info["scores"], dtype=np.float64)
        return (
            self._observation(),
            float(reward),
            bool(terminated),
            bool(truncated),
            {**visible, **hidden},
        )

    # --------------------------------------------------------------------------- internals
    def _observation(self) -> Observation:
        return {
            "candidates": self.items.copy(),
            "response_click": self._clicks.astype(np.float32)[None, :],
            "slate_features": self.items[self._slate],
            "user": np.asarray(self._sim.norm_recent_topics_hist, dtype=np.float32).copy(),
        }

    def _hidden(self, info: dict[str, Any]) -> dict[str, Any]:
        return {
            "user_state": np.asarray(info["user_state"], dtype=np.float32).copy(),
            "bored": np.asarray(self._sim.bored, dtype=bool).copy(),
            "oracle_slate": self.oracle_slate(),
        }

    def oracle_slate(self) -> np.ndarray:
        """The slate SARDINE's short-term greedy oracle (``step([-1] * n)``) serves next: the n
        items of highest relevance to the user's current (hidden) embedding, best first.

        It repeats the relevance computation of ``Sardine.step`` and calls SARDINE's own
        ``get_st_oracle_slate``; nothing is drawn.
        """
        sim = self._sim
        norm_scores = (sim.item_embedd @ sim.cur_user_embedd) / sim.max_score
        if sim.rel_threshold is None:
            relevances = 1 / (1 + np.exp(-(norm_scores - sim.offset) * sim.slope))
        else:
            relevances = np.where(norm_scores > sim.rel_threshold, 1, 0)
        if sim.rel_penalty:
            relevances = relevances * (0.5 ** (sim.bored == True).sum())  # noqa: E712 (SARDINE's)
        wildcard = -np.ones(self.slate_size, dtype=np.int64)
        return np.asarray(sim.get_st_oracle_slate(wildcard, relevances), dtype=np.int64)

    # ------------------------------------------------------------------- saving and restoring
    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        sim = self._sim
        ints = lambda values: np.asarray(list(values), dtype=np.int64)  # noqa: E731
        return {
            "np_random": generator_state(self._np_random),
            "np_random_seed": self._np_random_seed,
            "boredom_counter": int(sim.boredom_counter),
            "t": int(sim.t),
            "clicked_items": ints(sim.clicked_items),
            "clicked_item_topics": ints(sim.clicked_item_topics),
            "clicked_step": ints(sim.clicked_step),
            "all_clicked_items": ints(sim.all_clicked_items),
            "bored": np.asarray(sim.bored, dtype=bool).copy(),
            "bored_timeout": np.asarray(sim.bored_timeout, dtype=np.int64).copy(),
            "user_embedd": np.asarray(sim.user_embedd, dtype=np.float64).copy(),
            "cur_user_embedd": np.asarray(sim.cur_user_embedd, dtype=np.float64).copy(),
            "norm_recent_topics_hist": np.asarray(
                sim.norm_recent_topics_hist, dtype=np.float32
            ).copy(),
            "slate": self._slate.copy(),
            "clicks": self._clicks.copy(),
            "needs_reset": bool(self._needs_reset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments (checked first).

        A state saved before the first reset restores only the generator.
        """
        read = StateReader(state, type(self).__name__)
        rng = read.generator()
        seed = read.seed()
        d, n = self.num_topics, self.slate_size
        maxlen = self._sim.recent_items_maxlen

        def history(key: str, limit: int | None) -> np.ndarray:
            value = read.raw(key)
            if type(value) is not np.ndarray or value.ndim != 1 or value.dtype.kind not in "iu":
                raise read.fail(key, "must be a 1-d integer numpy array")
            if limit is not None and len(value) > limit:
                raise read.fail(key, f"holds {len(value)} entries, more than {limit}")
            return value.astype(np.int64)

        boredom_counter = read.int("boredom_counter", low=0)
        t = read.int("t", low=0)
        clicked_items = history("clicked_items", maxlen)
        clicked_item_topics = history("clicked_item_topics", maxlen)
        clicked_step = history("clicked_step", maxlen)
        all_clicked_items = history("all_clicked_items", None)
        bored = read.array("bored", (d,), bool)
        bored_timeout = read.array("bored_timeout", (d,), np.int64)
        user_embedd = read.array("user_embedd", (d,), np.float64)
        cur_user_embedd = read.array("cur_user_embedd", (d,), np.float64)
        hist = read.array("norm_recent_topics_hist", (d,), np.float32)
        slate = read.array("slate", (n,), np.int64)
        clicks = read.array("clicks", (n,), np.int64)
        needs_reset = read.bool("needs_reset")
        read.finish()
        if slate.size and (slate.min() < 0 or slate.max() >= self.num_items):
            raise read.fail("slate", f"holds an item outside [0, {self.num_items})")
        sim = self._sim
        self._np_random, self._np_random_seed = rng, seed
        sim._np_random = rng
        sim.boredom_counter, sim.t = boredom_counter, t
        # SARDINE keeps NumPy integer scalars in its deques (it concatenates them as arrays).
        sim.clicked_items = deque(list(clicked_items), maxlen)
        sim.clicked_item_topics = deque(list(clicked_item_topics), maxlen)
        sim.clicked_step = deque(list(clicked_step), maxlen)
        sim.all_clicked_items = list(all_clicked_items)
        sim.bored, sim.bored_timeout = bored, bored_timeout
        sim.user_embedd, sim.cur_user_embedd = user_embedd, cur_user_embedd
        sim.norm_recent_topics_hist = hist
        self._slate, self._clicks = slate, clicks
        self._needs_reset = needs_reset


class SardineVectorEnv(VectorEnv):
    """``num_envs`` SARDINE users (:class:`SardineEnv` copies) as one native batched env.

    There is no batched SARDINE simulator: this steps the users one after the other, as
    Gymnasium's ``SyncVectorEnv`` would, and gives the same observations, rewards and episode
    ends (sub-env i is reset with seed ``seed + i``; an ended episode restarts with the sub-env's
    own generator). What it adds is what fedrec's native vector envs promise:

    * the whole batch of slates is validated before any user steps, so a rejected step
      (``ValueError``) leaves every user as it was (``SyncVectorEnv`` would have stepped the
      users before the faulty row);
    * Gymnasium 1.x autoreset ``NEXT_STEP`` (default), ``SAME_STEP`` (``final_obs`` /
      ``final_info`` as batched dicts, like the other native envs) or ``DISABLED`` (stepping a
      finished user before ``reset(options={"reset_mask": m})`` raises
      :class:`~fedrec.envs.slates.FinishedEpisodeError`);
    * ``state_dict`` / ``load_state_dict`` of every user as plain data, loaded all or nothing.

    :param num_envs: number of users.
    :param sardine_id: the SARDINE id whose registered parameters to use.
    :param overrides: SARDINE keyword arguments, as for :class:`SardineEnv`.
    """

    metadata = {
        "render_modes": [],
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        HIDDEN_INFO_KEYS: HIDDEN_KEYS,
    }

    def __init__(
        self,
        num_envs: int = 1,
        *,
        sardine_id: str = "sardine/SlateTopK-Bored-v0",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
        **overrides: Any,
    ) -> None:
        check_vector_args(num_envs, render_mode, max_episode_steps, who=type(self).__name__)
        self.envs = [SardineEnv(sardine_id, **overrides) for _ in range(num_envs)]
        first = self.envs[0]
        self.num_envs = num_envs
        self.render_mode = None
        self.max_episode_steps = max_episode_steps
        self.metadata = {
            **type(self).metadata,
            "autoreset_mode": parse_autoreset_mode(autoreset_mode),
        }
        self.num_items, self.slate_size = first.num_items, first.slate_size
        self.single_observation_space = first.observation_space
        self.single_action_space = SlateSpace(self.num_items, self.slate_size)
        self.observation_space = batch_space(first.observation_space, num_envs)
        self.action_space = SlateBatchSpace(self.num_items, self.slate_size, num_envs)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._started = False

    @property
    def autoreset_mode(self) -> AutoresetMode:
        return self.metadata["autoreset_mode"]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        mask = reset_mask(options, self.num_envs, started=self._started)
        observations: list[Observation] = []
        infos: dict[str, Any] = {}
        for index, env in enumerate(self.envs):
            if mask[index]:
                obs, info = env.reset(seed=None if seed is None else seed + index)
                infos = self._add_info(infos, info, index)
                self._steps[index] = 0
                self._autoreset[index] = False
            else:
                obs = env._observation()
            observations.append(obs)
        self._started = True
        return self._stack(observations), infos

    def step(
        self, actions: np.ndarray
    ) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        mode = self.autoreset_mode
        if mode == AutoresetMode.DISABLED:
            reject_finished(self._autoreset)
        resetting = self._autoreset.copy() if mode == AutoresetMode.NEXT_STEP else None
        # The whole batch is checked before any user steps or any number is drawn.
        slates = validate_slates(
            actions,
            num_candidates=self.num_items,
            slate_size=self.slate_size,
            batch_size=self.num_envs,
            who="slates",
            ignore=resetting if resetting is not None and resetting.any() else None,
        )
        rewards = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        observations: list[Observation] = []
        infos: dict[str, Any] = {}
        final_obs: dict[int, Observation] = {}
        final_info: dict[str, Any] = {}
        for index, env in enumerate(self.envs):
            if resetting is not None and resetting[index]:  # NEXT_STEP: the action is ignored
                obs, info = env.reset()
                self._steps[index] = 0
            else:
                obs, reward, term, trunc, info = env.step(slates[index])
                self._steps[index] += 1
                limit = self.max_episode_steps
                trunc = trunc or (not term and limit is not None and self._steps[index] >= limit)
                rewards[index], terminated[index], truncated[index] = reward, term, trunc
                if mode == AutoresetMode.SAME_STEP and (term or trunc):
                    final_obs[index] = obs
                    final_info = self._add_info(final_info, info, index)
                    obs, info = env.reset()
                    self._steps[index] = 0
            observations.append(obs)
            infos = self._add_info(infos, info, index)
        done = terminated | truncated
        batch = self._stack(observations)
        if final_obs:
            infos["final_obs"] = self._stack(
                [final_obs.get(i, observations[i]) for i in range(self.num_envs)]
            )
            infos["_final_obs"] = done.copy()
            infos["final_info"] = final_info
            infos["_final_info"] = done.copy()
        if mode != AutoresetMode.SAME_STEP:
            self._autoreset = done
        return batch, rewards, terminated, truncated, infos

    def _stack(self, observations: list[Observation]) -> Observation:
        return {key: np.stack([obs[key] for obs in observations]) for key in observations[0]}

    def state_dict(self) -> dict[str, Any]:
        """Every user's :meth:`SardineEnv.state_dict`, step counters and autoreset flags, as
        plain data (see :mod:`fedrec.envs.state`)."""
        return {
            "np_random": generator_state(self._np_random),
            "np_random_seed": self._np_random_seed,
            "envs": [env.state_dict() for env in self.envs],
            "steps": self._steps.copy(),
            "autoreset": self._autoreset.copy(),
            "started": bool(self._started),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments, all or nothing
        (``ValueError`` naming the problem; nothing changes)."""
        read = StateReader(state, type(self).__name__)
        hint = f"num_envs={self.num_envs}"
        rng = read.generator()
        seed = read.seed()
        users = read.raw("envs")
        if not isinstance(users, list) or len(users) != self.num_envs:
            count = len(users) if isinstance(users, list) else type(users).__name__
            raise read.fail(
                "envs", f"must be a list of {self.num_envs} user states, got {count} ({hint})"
            )
        steps = read.array("steps", (self.num_envs,), np.int64, hint=hint)
        autoreset = read.array("autoreset", (self.num_envs,), bool, hint=hint)
        started = read.bool("started")
        read.finish()
        before = [env.state_dict() for env in self.envs]
        try:
            for env, user in zip(self.envs, users, strict=True):
                env.load_state_dict(user)
        except ValueError:
            for env, saved in zip(self.envs, before, strict=True):
                env.load_state_dict(saved)
            raise
        self._np_random, self._np_random_seed = rng, seed
        self._steps, self._autoreset, self._started = steps, autoreset, started
