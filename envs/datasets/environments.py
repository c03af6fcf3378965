"""Gymnasium environments over logged interaction data: interaction mode and evaluation mode.

Both modes share one batched core per mode, so the single env (``num_envs=1``) and the native
vector env consume the same random numbers and agree exactly for the same seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from fedrec.envs.datasets.catalog import load_prepared
from fedrec.envs.datasets.preprocess import PreparedData
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.slates import (
    SlateBatchSpace,
    SlateSpace,
    reject_finished,
    validate_slates,
)
from fedrec.envs.state import CoreVectorEnvState, StateReader, generator_state
from fedrec.envs.vector_utils import (
    check_vector_args,
    parse_autoreset_mode,
    reset_mask,
    with_masks,
)

Observation = dict[str, np.ndarray]
Mode = Literal["interaction", "evaluation"]

#: Evaluation mode's hidden info keys (``metadata["hidden_info_keys"]``): the held-out item's
#: column and id are the test's answer, which a learner could memorise over repeated sweeps.
EVALUATION_HIDDEN_KEYS = frozenset({"target_index", "test_item"})
#: Interaction mode's hidden info keys: how many logged positives the user has left is what the
#: log holds next, which a deployed recommender cannot know.
INTERACTION_HIDDEN_KEYS = frozenset({"positives_left"})


def _feature_box(values: np.ndarray) -> spaces.Box:
    low = float(values.min()) if values.size else 0.0
    high = float(values.max()) if values.size else 0.0
    return spaces.Box(low, max(high, low), values.shape[1:], np.float32)


def _read_ids(
    read: StateReader, key: str, shape: tuple[int, ...], upper: int, hint: str
) -> np.ndarray:
    """An int64 array of ids in ``[0, upper)`` from a state being loaded."""
    ids = read.array(key, shape, np.int64, hint=hint)
    if ids.size and (ids.min() < 0 or ids.max() >= upper):
        raise read.fail(key, f"holds ids outside [0, {upper})")
    return ids


def _read_order(read: StateReader, key: str, size: int) -> np.ndarray:
    """A permutation of ``range(size)`` from a state being loaded."""
    order = read.array(key, (size,), np.int64, hint=f"{size} users in the data set")
    if not np.array_equal(np.sort(order), np.arange(size)):
        raise read.fail(key, f"is not a permutation of the {size} users")
    return order


# --------------------------------------------------------------------------------------------
# Evaluation mode


class _EvaluationCore:
    """Leave-one-out evaluation for B slots: each episode is one user, one step."""

    def __init__(self, data: PreparedData, top_k: int, num_envs: int) -> None:
        self.data = data
        self.top_k = top_k
        self.num_envs = num_envs
        self.num_candidates = data.eval_candidates.shape[1]
        if not 1 <= top_k <= self.num_candidates:
            raise ValueError(f"top_k must be in [1, {self.num_candidates}], got {top_k}")
        self.users = np.zeros(num_envs, dtype=np.int64)
        self.order = np.arange(data.num_users)
        self.cursor = 0

    def state_dict(self) -> dict[str, Any]:
        return {"users": self.users.copy(), "order": self.order.copy(), "cursor": int(self.cursor)}

    def read_state(self, read: StateReader) -> dict[str, Any]:
        """Checked copies of the core's entries (nothing changes yet)."""
        u = self.data.num_users
        return {
            "users": _read_ids(read, "users", (self.num_envs,), u, f"num_envs={self.num_envs}"),
            "order": _read_order(read, "order", u),
            "cursor": read.int("cursor", low=0, high=u - 1),
        }

    def set_state(self, checked: dict[str, Any]) -> None:
        self.users, self.order, self.cursor = checked["users"], checked["order"], checked["cursor"]

    def observation_space(self) -> spaces.Dict:
        d, c = self.data, self.num_candidates
        entries: dict[str, spaces.Space] = {
            "user_id": spaces.Box(0, d.num_users - 1, (1,), np.int64),
            "candidate_ids": spaces.Box(0, d.num_items - 1, (c,), np.int64),
        }
        if d.user_features is not None:
            entries["user_features"] = _feature_box(d.user_features)
        if d.item_features is not None:
            box = _feature_box(d.item_features)
            entries["candidate_features"] = spaces.Box(
                box.low.min(), box.high.max(), (c, d.item_features.shape[1]), np.float32
            )
        return spaces.Dict(entries)

    def shuffle(self, rng: np.random.Generator) -> None:
        self.order = rng.permutation(self.data.num_users)
        self.cursor = 0

    def assign(self, mask: np.ndarray, users: np.ndarray | None = None) -> None:
        """Give the masked slots their users: explicit ones, else the next of the sweep."""
        count = int(mask.sum())
        if users is None:
            take = (self.cursor + np.arange(count)) % self.data.num_users
            users = self.order[take]
            self.cursor = (self.cursor + count) % self.data.num_users
        users = np.asarray(users, dtype=np.int64).reshape(-1)
        if users.shape != (count,) or users.min() < 0 or users.max() >= self.data.num_users:
            raise ValueError(
                f"users must be {count} ids in [0, {self.data.num_users}), got {users.tolist()}"
            )
        self.users[mask] = users

    def observation(self) -> Observation:
        d = self.data
        candidates = d.eval_candidates[self.users]
        obs = {"user_id": self.users[:, None].copy(), "candidate_ids": candidates.copy()}
        if d.user_features is not None:
            obs["user_features"] = d.user_features[self.users]
        if d.item_features is not None:
            obs["candidate_features"] = d.item_features[candidates]
        return obs

    def score(self, rankings: np.ndarray) -> dict[str, np.ndarray]:
        """Hit, NDCG and 0-based rank (-1 if absent) of each slot's held-out item."""
        target = self.data.eval_target[self.users]
        return {
            **score_rankings(rankings, target),
            "target_index": target.copy(),
            "test_item": self.data.test_items[self.users],
        }


def score_rankings(rankings: np.ndarray, target: np.ndarray) -> dict[str, np.ndarray]:
    """Hit, NDCG@K and 0-based rank (-1 if absent) of each row's held-out candidate ``target``
    in its top-K ``rankings`` (B, K) of candidate positions."""
    match = rankings == np.asarray(target)[:, None]
    hit = match.any(axis=1)
    rank = np.where(hit, np.argmax(match, axis=1), -1)
    ndcg = np.where(hit, 1.0 / np.log2(np.maximum(rank, 0) + 2.0), 0.0)
    return {"hit": hit.astype(np.float64), "ndcg": ndcg, "rank": rank.astype(np.int64)}


_STATE_CARD = """
    ## Saving and restoring
    ``state_dict()`` returns what changes while the env runs (the generator state, the users'
    sweep or episode progress, step and autoreset bookkeeping) as plain data, and
    ``load_state_dict(state)`` restores it into an env built with the same arguments; the data set
    is not part of it (it is rebuilt from the arguments). See :mod:`fedrec.envs.state`.
    """


class LoggedEvaluationEnv(gym.Env[Observation, np.ndarray]):
    r"""Leave-one-out evaluation of a logged data set as one-step episodes (FedNCF / NCF protocol).

    ## Description
    Each episode is one user of a logged interaction data set (MovieLens, Lastfm, Foursquare),
    preprocessed as in FedNCF (:func:`fedrec.envs.datasets.preprocess.prepare`): every logged
    interaction is a positive (or only ratings >= ``rating_threshold``), one row per (user, item)
    is kept, users with fewer than ``min_interactions`` items are removed, and each user's latest
    interaction is held out (among rows sharing the latest timestamp, the later one in the file).
    The candidates are the held-out item and ``num_test_negatives`` items the user never
    interacted with, drawn once from ``split_seed`` and shuffled by it, so the held-out item's
    position carries no signal; every model evaluated with the same arguments sees the same
    candidates. The agent returns a top-K ranking of the candidates; the reward is 1 if the
    held-out item is in it. The mean return over all users is HR@K and the mean of
    ``info["ndcg"]`` is NDCG@K, exactly as supervised models (FedNCF, FEL) are evaluated. This is
    the test set: an agent is trained elsewhere (e.g. on the interaction mode, or offline on
    ``env.unwrapped.data.train()``) and only evaluated here.

    ## Action Space
    ``SlateSpace(C, K)`` with ``C = num_test_negatives + 1`` candidates (101 by default) and
    ``K = top_k``: K distinct indices into ``candidate_ids``, best first. A wrong length, an
    out-of-range or repeated index, or a non-integer dtype raises ``ValueError``.

    ## Observation Space
    A ``Dict``:

    | key | shape | meaning |
    |---|---|---|
    | ``user_id`` | (1,) int64 | the user's remapped id, in ``[0, num_users)`` |
    | ``candidate_ids`` | (C,) int64 | remapped item ids of the candidates, in ``[0, num_items)`` |
    | ``user_features`` | (du,) float32 | public user features (MovieLens: age, gender, occupation); only if the data set has them |
    | ``candidate_features`` | (C, di) float32 | the candidates' item features (MovieLens genres; Foursquare venue category and position); only if the data set has them |

    The remapped ids index ``env.unwrapped.data`` (a
    :class:`~fedrec.envs.datasets.preprocess.PreparedData`: raw ids, training positives).

    ## Rewards
    1.0 if the held-out item is among the K ranked candidates, else 0.0: the episode's return is
    the user's hit, and its mean over users is HR@K.

    ## Starting State
    ``reset(seed=s)`` draws a permutation of the users from ``self.np_random``; each following
    ``reset()`` takes the next user of that sweep, so U resets (U = number of users) visit every
    user exactly once. ``reset(options={"user": u})`` evaluates user ``u`` instead.

    ## Episode End
    The episode **terminates** after its single step (there is no truncation). Stepping again
    before ``reset()`` raises ``RuntimeError``.

    ## Info
    Empty after ``reset()``. After the step: ``hit`` (the reward), ``ndcg``
    (``1 / log2(rank + 2)`` for a 0-based rank below K, else 0), ``rank`` (-1 if the held-out
    item was not ranked), ``target_index`` (the held-out item's column in ``candidate_ids``) and
    ``test_item`` (its remapped id). The logs have no propensities, so there are no off-policy
    estimates.

    ``target_index`` and ``test_item`` are **hidden** (``metadata["hidden_info_keys"]``): they
    give the held-out answer even when the ranking missed it, which an agent run on this env for
    several sweeps could memorise; fedrec's loops, rollouts and SB3 adapters strip them for every
    agent that is not an oracle. ``hit``, ``ndcg`` and ``rank`` stay visible: they are the
    feedback on the agent's own ranking, as a click on a ranked slot would be.

    ## Arguments
    ``dataset`` (``"ml-100k"``, ``"ml-1m"``, ``"lastfm-2k"``, ``"foursquare-nyc"``, ...),
    ``data_dir=None`` (the data set's folder or the cache root; default ``$FEDREC_DATA`` or
    ``~/.cache/fedrec``), ``top_k=10`` (K), ``min_interactions=5``, ``num_test_negatives=100``,
    ``split_seed=0`` (fixes the negatives and the candidate order), ``rating_threshold=None``,
    ``render_mode=None`` (``"ansi"`` renders the user and, after the step, hit and rank).
    Registered as ``gymnasium.make("fedrec/MovieLens100K-v0", mode="evaluation")`` (and the
    other logged-data ids); a missing data set raises an error naming ``fedrec data fetch``.

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B, mode="evaluation")`` returns
    :class:`LoggedEvaluationVectorEnv` (the same core for B users); with B = the number of users
    one step evaluates everyone.

    ## Saving and restoring
    ``state_dict()`` returns what changes while the env runs (the generator state, the users'
    sweep, whether the episode is done and the last step's scores) as plain data, and
    ``load_state_dict(state)`` restores it into an env built with the same arguments; the data set
    is not part of it (it is rebuilt from the arguments). See :mod:`fedrec.envs.state`.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1, HIDDEN_INFO_KEYS: EVALUATION_HIDDEN_KEYS}

    def __init__(
        self,
        dataset: str,
        *,
        data_dir: str | Path | None = None,
        top_k: int = 10,
        min_interactions: int = 5,
        num_test_negatives: int = 100,
        split_seed: int = 0,
        rating_threshold: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None")
        self.render_mode = render_mode
        self.data = load_prepared(
            dataset,
            data_dir,
            min_interactions=min_interactions,
            rating_threshold=rating_threshold,
            num_test_negatives=num_test_negatives,
            seed=split_seed,
        )
        self._core = _EvaluationCore(self.data, top_k, 1)
        self.observation_space = self._core.observation_space()
        self.action_space = SlateSpace(self._core.num_candidates, top_k)
        self._done = True
        self._last: dict[str, np.ndarray] | None = None
        self._shuffled = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None or not self._shuffled:
            self._core.shuffle(self.np_random)
            self._shuffled = True
        user = None if options is None else options.get("user")
        self._core.assign(np.ones(1, bool), None if user is None else np.array([user]))
        self._done = False
        self._last = None
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("call reset() before step(); evaluation episodes last one step")
        ranking = validate_slates(
            action, num_candidates=self._core.num_candidates, slate_size=self._core.top_k
        )
        scores = self._core.score(ranking[None])
        self._done = True
        self._last = scores
        info = {key: value[0].item() for key, value in scores.items()}
        return self._observation(), float(scores["hit"][0]), True, False, info

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        last = None if self._last is None else {k: v.copy() for k, v in self._last.items()}
        return {
            "np_random": generator_state(self._np_random),
            "np_random_seed": self._np_random_seed,
            "core": self._core.state_dict(),
            "done": bool(self._done),
            "shuffled": bool(self._shuffled),
            "last": last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments (the data set is
        not part of the state). The whole state is checked first (``ValueError``; no change)."""
        read = StateReader(state, type(self).__name__)
        rng = read.generator()
        seed = read.seed()
        core = self._core.read_state(StateReader(read.dict("core"), f"{read.who} core"))
        done = read.bool("done")
        shuffled = read.bool("shuffled")
        last = read.raw("last")
        read.finish()
        if last is not None:
            keys = ("hit", "ndcg", "rank", "target_index", "test_item")
            last_read = StateReader(last, f"{read.who} last")
            last = {key: last_read.raw(key) for key in keys}
            last_read.finish()
            if not all(type(v) is np.ndarray and v.shape == (1,) for v in last.values()):
                raise read.fail("last", "must be None or the step's scores, arrays of shape (1,)")
            last = {key: value.copy() for key, value in last.items()}
        self._np_random, self._np_random_seed = rng, seed
        self._core.set_state(core)
        self._done = done
        self._shuffled = shuffled
        self._last = last

    def _observation(self) -> Observation:
        return {key: value[0] for key, value in self._core.observation().items()}

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        user = int(self._core.users[0])
        text = f"{self.data.name} user {self.data.user_ids[user]} (id {user})"
        if self._last is not None:
            text += f" hit={self._last['hit'][0]:.0f} rank={self._last['rank'][0]}"
        return text


class LoggedEvaluationVectorEnv(CoreVectorEnvState, VectorEnv):
    """``num_envs`` users evaluated at once (see :class:`LoggedEvaluationEnv` for the card).

    Users are assigned in the order of a seeded sweep (slot ``i`` of the first reset gets the
    ``i``-th user of the permutation), so ``num_envs = num_users`` evaluates every user in one
    step. ``reset(options={"users": ids})`` assigns explicit users. Autoreset follows Gymnasium
    1.x (``NEXT_STEP`` default, ``SAME_STEP``, ``DISABLED`` with ``reset_mask``).
    ``state_dict()`` / ``load_state_dict(state)`` save and restore its dynamic state as plain data.
    """

    metadata = {
        "render_modes": [],
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        HIDDEN_INFO_KEYS: EVALUATION_HIDDEN_KEYS,
    }

    def __init__(
        self,
        num_envs: int = 1,
        dataset: str = "ml-100k",
        *,
        data_dir: str | Path | None = None,
        top_k: int = 10,
        min_interactions: int = 5,
        num_test_negatives: int = 100,
        split_seed: int = 0,
        rating_threshold: float | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        check_vector_args(num_envs, render_mode, max_episode_steps, who=type(self).__name__)
        self.data = load_prepared(
            dataset,
            data_dir,
            min_interactions=min_interactions,
            rating_threshold=rating_threshold,
            num_test_negatives=num_test_negatives,
            seed=split_seed,
        )
        self.num_envs = num_envs
        self.render_mode = None
        self.metadata = {
            **type(self).metadata,
            "autoreset_mode": parse_autoreset_mode(autoreset_mode),
        }
        self._core = _EvaluationCore(self.data, top_k, num_envs)
        self.single_observation_space = self._core.observation_space()
        self.single_action_space = SlateSpace(self._core.num_candidates, top_k)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = SlateBatchSpace(self._core.num_candidates, top_k, num_envs)
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._started = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        mask = reset_mask(options, self.num_envs, started=self._started)
        if seed is not None or not self._started:
            self._core.shuffle(self.np_random)
        users = None if options is None else options.get("users")
        self._core.assign(mask, users)
        self._autoreset[mask] = False
        self._started = True
        return self._core.observation(), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        mode = self.metadata["autoreset_mode"]
        if mode == AutoresetMode.DISABLED:
            reject_finished(self._autoreset)
        resetting = self._autoreset.copy() if mode == AutoresetMode.NEXT_STEP else None
        # the whole action is checked before anything changes (the resetting rows are ignored)
        rankings = validate_slates(
            actions,
            num_candidates=self._core.num_candidates,
            slate_size=self._core.top_k,
            batch_size=self.num_envs,
            who="rankings",
            ignore=resetting,
        )
        active = np.ones(self.num_envs, bool) if resetting is None else ~resetting
        scores = self._core.score(rankings)
        rewards = np.where(active, scores["hit"], 0.0)
        terminated = active.copy()
        truncated = np.zeros(self.num_envs, dtype=bool)
        info = with_masks(
            {k: np.where(active, v, 0) for k, v in scores.items()}, self.num_envs, active
        )
        if resetting is not None and resetting.any():
            self._core.assign(resetting)
        if mode == AutoresetMode.SAME_STEP:
            info["final_obs"] = self._core.observation()
            info["_final_obs"] = terminated.copy()
            info["final_info"] = {
                k: v for k, v in info.items() if k not in ("final_obs", "_final_obs")
            }
            info["_final_info"] = terminated.copy()
            self._core.assign(terminated)
        else:  # NEXT_STEP: reset at the next step; DISABLED: refuse to step them until reset()
            self._autoreset = terminated.copy()
        return self._core.observation(), rewards, terminated, truncated, info


# --------------------------------------------------------------------------------------------
# Interaction mode


def _first_distinct(
    values: np.ndarray, accept: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the first ``sizes[r]`` distinct accepted ``values`` in column order, -1 padded.

    Returns them as a (R, max(sizes)) array and a mask of the rows that had enough of them.
    Kept in draw order, the distinct accepted values of i.i.d. uniform draws over a universe are
    a uniformly random sample without replacement of its accepted part.
    """
    rows = len(values)
    width = int(sizes.max(initial=0))
    index = np.arange(rows)[:, None]
    order = np.argsort(values, axis=1, kind="stable")
    ordered = values[index, order]
    first = np.ones(values.shape, dtype=bool)
    first[index, order[:, 1:]] = ordered[:, 1:] != ordered[:, :-1]
    keep = first & accept
    rank = np.cumsum(keep, axis=1) - 1  # rank of each kept value among the row's kept ones
    row, col = np.nonzero(keep & (rank < sizes[:, None]))
    out = np.full((rows, width), -1, dtype=np.int64)
    out[row, rank[row, col]] = values[row, col]
    return out, rank[:, -1] + 1 >= sizes


class _InteractionCore:
    """Interaction-mode state of ``num_envs`` slots (one user each), updated for many at once.

    Every method takes an array of slot indices and works on all of them with numpy (no Python
    loop over slots), so the single env (one slot) and the vector env run the same code and,
    for ``num_envs=1``, consume the same random numbers.
    """

    def __init__(
        self,
        data: PreparedData,
        *,
        num_envs: int,
        num_candidates: int,
        slate_size: int,
        positives_per_step: int | None,
        split: Literal["train", "all"],
    ) -> None:
        if split not in ("train", "all"):
            raise ValueError(f"split must be 'train' or 'all', got {split!r}")
        if num_candidates > data.num_items:
            raise ValueError(f"num_candidates={num_candidates} exceeds the {data.num_items} items")
        if positives_per_step is not None and not 0 <= positives_per_step <= num_candidates:
            raise ValueError(f"positives_per_step must be in [0, {num_candidates}] or None")
        self.data = data
        self.num_envs = num_envs
        self.num_candidates = num_candidates
        self.slate_size = slate_size
        self.positives_per_step = positives_per_step
        self.split = split
        self.has_ratings = not np.isnan(data.ratings).all()
        n_items = data.num_items
        self.users = np.zeros(num_envs, dtype=np.int64)
        # chronological rank of each item among the user's positives (-1: not a positive)
        self.chrono = np.full((num_envs, n_items), -1, dtype=np.int64)
        self.recommended = np.zeros((num_envs, n_items), dtype=bool)
        self.consumed = np.zeros((num_envs, n_items), dtype=bool)
        self.candidates = np.zeros((num_envs, num_candidates), dtype=np.int64)
        self.last_slate = np.full((num_envs, slate_size), -1, dtype=np.int64)
        self.last_click = np.zeros((num_envs, slate_size), dtype=np.float32)
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.num_positives = np.zeros(num_envs, dtype=np.int64)  # the user's (train) positives
        self.positives_left = np.zeros(num_envs, dtype=np.int64)  # unrecommended positives
        self.items_left = np.zeros(num_envs, dtype=np.int64)  # unrecommended items

    #: the arrays of the state: name -> dtype and what sets their width (None: one value per slot)
    _STATE_ARRAYS: dict[str, tuple[Any, str | None]] = {
        "users": (np.int64, None),
        "chrono": (np.int64, "items"),
        "recommended": (np.bool_, "items"),
        "consumed": (np.bool_, "items"),
        "candidates": (np.int64, "num_candidates"),
        "last_slate": (np.int64, "slate_size"),
        "last_click": (np.float32, "slate_size"),
        "steps": (np.int64, None),
        "num_positives": (np.int64, None),
        "positives_left": (np.int64, None),
        "items_left": (np.int64, None),
    }

    def state_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key).copy() for key in self._STATE_ARRAYS}

    def read_state(self, read: StateReader) -> dict[str, Any]:
        """Checked copies of the core's arrays (nothing changes yet)."""
        widths = {
            "items": self.data.num_items,
            "num_candidates": self.num_candidates,
            "slate_size": self.slate_size,
        }
        checked = {}
        for key, (dtype, width) in self._STATE_ARRAYS.items():
            shape = (self.num_envs,) if width is None else (self.num_envs, widths[width])
            hint = f"num_envs={self.num_envs}" + ("" if width is None else f", {width}={shape[1]}")
            checked[key] = read.array(key, shape, dtype, hint=hint)
        for key, upper in (("users", self.data.num_users), ("candidates", self.data.num_items)):
            ids = checked[key]
            if ids.size and (ids.min() < 0 or ids.max() >= upper):
                raise read.fail(key, f"holds ids outside [0, {upper})")
        return checked

    def set_state(self, checked: dict[str, Any]) -> None:
        for key, value in checked.items():
            setattr(self, key, value)

    def observation_space(self) -> spaces.Dict:
        d, c, n = self.data, self.num_candidates, self.slate_size
        entries: dict[str, spaces.Space] = {
            "user_id": spaces.Box(0, d.num_users - 1, (1,), np.int64),
            "candidate_ids": spaces.Box(0, d.num_items - 1, (c,), np.int64),
            "last_slate": spaces.Box(-1, d.num_items - 1, (n,), np.int64),
            "last_click": spaces.Box(0.0, 1.0, (n,), np.float32),
        }
        if d.user_features is not None:
            entries["user_features"] = _feature_box(d.user_features)
        if d.item_features is not None:
            box = _feature_box(d.item_features)
            entries["candidate_features"] = spaces.Box(
                box.low.min(), box.high.max(), (c, d.item_features.shape[1]), np.float32
            )
        return spaces.Dict(entries)

    def reset_slots(
        self,
        rng: np.random.Generator,
        slots: np.ndarray,
        users: np.ndarray | None = None,
        *,
        draw: bool = True,
    ) -> None:
        """Start new episodes in ``slots``: given users, else uniform draws (one per slot).

        ``draw=False`` leaves the candidates to a later :meth:`draw_candidates` call.
        """
        d = self.data
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if users is None:
            users = rng.integers(d.num_users, size=len(slots))
        users = np.asarray(users).reshape(-1)
        if users.shape != slots.shape:
            raise ValueError(f"users must list one user per reset env ({len(slots)})")
        if users.size and (users.min() < 0 or users.max() >= d.num_users):
            raise ValueError(f"user must be in [0, {d.num_users}), got {users.tolist()}")
        users = users.astype(np.int64)
        self.users[slots] = users
        start = d.indptr[users]
        length = d.indptr[users + 1] - start - (1 if self.split == "train" else 0)
        length = np.maximum(length, 0)
        within = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
        owner = np.repeat(slots, length)
        items = d.items[np.repeat(start, length) + within]
        self.chrono[slots] = -1
        self.chrono[owner, items] = within
        self.recommended[slots] = False
        self.consumed[slots] = False
        self.last_slate[slots] = -1
        self.last_click[slots] = 0.0
        self.steps[slots] = 0
        self.num_positives[slots] = length
        self.positives_left[slots] = length
        self.items_left[slots] = d.num_items
        if draw:
            self.draw_candidates(rng, slots)

    def draw_candidates(self, rng: np.random.Generator, slots: np.ndarray) -> None:
        """Fresh candidates: up to ``positives_per_step`` unrecommended positives, rest others.

        Each group is a uniformly random subset of the slot's unrecommended items of that kind,
        drawn for all ``slots`` at once: every slot draws ``2 * c + 16`` items with replacement
        (uniformly from its user's positives, or from all items) and keeps the first distinct
        ones of the right kind (:func:`_first_distinct`); the rare slot left short (few such
        items remain) takes a prefix of a random order of them instead. The candidates are then
        shuffled within each slot.
        """
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        r = len(slots)
        if r == 0:
            return
        d, c, n_items = self.data, self.num_candidates, self.data.num_items
        if self.positives_per_step is None:  # one group: every unrecommended item
            owner, sizes, high = slots, np.full(r, c), np.full(r, n_items)
            from_positives = np.zeros(r, dtype=bool)
        else:  # rows 0..r-1 draw the positives, rows r..2r-1 the other items
            left = self.positives_left[slots]
            k = np.minimum(left, min(self.positives_per_step, c))
            k = np.maximum(k, c - (self.items_left[slots] - left))
            owner, sizes = np.concatenate([slots, slots]), np.concatenate([k, c - k])
            high = np.concatenate([self.num_positives[slots], np.full(r, n_items)])
            from_positives = np.arange(2 * r) < r
        width = int(sizes.max())
        # floor(u * n) with a 53-bit uniform u: uniform on range(n) up to n / 2**53 (negligible),
        # and several times faster than Generator.integers with per-row bounds
        u = rng.random((len(owner), 2 * width + 16))
        items = np.minimum((u * high[:, None]).astype(np.int64), np.maximum(high - 1, 0)[:, None])
        if self.positives_per_step is not None:
            start = d.indptr[self.users[slots]]
            items[:r] = d.items[start[:, None] + items[:r]]
        rows = owner[:, None]
        accept = ~self.recommended[rows, items] & (high > 0)[:, None]
        if self.positives_per_step is not None:
            accept[r:] &= self.chrono[rows[r:], items[r:]] < 0
        chosen, enough = _first_distinct(items, accept, sizes)
        short = np.flatnonzero(~enough)
        if short.size:  # exact fallback: a random order of the allowed items
            allowed = ~self.recommended[owner[short]]
            if self.positives_per_step is not None:
                allowed &= (self.chrono[owner[short]] >= 0) == from_positives[short][:, None]
            keys = rng.random((len(short), n_items))
            keys[~allowed] = np.inf
            best = np.argsort(keys, axis=1)[:, :width]
            chosen[short] = np.where(np.arange(width) < sizes[short][:, None], best, -1)
        if self.positives_per_step is not None:
            chosen = np.concatenate([chosen[:r], chosen[r:]], axis=1)
        self.candidates[slots] = rng.permuted(chosen[chosen >= 0].reshape(r, c), axis=1)

    def exhausted(self, slots: np.ndarray) -> np.ndarray:
        """No unrecommended positive left, or too few items left to fill a candidate set."""
        return (self.positives_left[slots] == 0) | (self.items_left[slots] < self.num_candidates)

    def respond(self, slots: np.ndarray, slates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Consumed slot and item per slot (-1, -1 if none) for slates of candidate indices."""
        rows = slots[:, None]
        items = self.candidates[rows, slates]
        ranks = self.chrono[rows, items]
        fresh = ~self.recommended[rows, items]
        eligible = (ranks >= 0) & ~self.consumed[rows, items]
        self.recommended[rows, items] = True
        self.items_left[slots] -= fresh.sum(axis=1)
        self.positives_left[slots] -= (fresh & (ranks >= 0)).sum(axis=1)
        self.last_slate[slots] = items
        hit = eligible.any(axis=1)
        choice = np.argmin(np.where(eligible, ranks, np.iinfo(np.int64).max), axis=1)
        item = items[np.arange(len(slots)), choice]
        clicks = np.zeros((len(slots), self.slate_size), dtype=np.float32)
        clicks[np.flatnonzero(hit), choice[hit]] = 1.0
        self.last_click[slots] = clicks
        self.consumed[slots[hit], item[hit]] = True
        return np.where(hit, choice, -1), np.where(hit, item, -1)

    def observation(self) -> Observation:
        d = self.data
        obs = {
            "user_id": self.users[:, None].copy(),
            "candidate_ids": self.candidates.copy(),
            "last_slate": self.last_slate.copy(),
            "last_click": self.last_click.copy(),
        }
        if d.user_features is not None:
            obs["user_features"] = d.user_features[self.users]
        if d.item_features is not None:
            obs["candidate_features"] = d.item_features[self.candidates]
        return obs

    def logged(self, slots: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Logged rating and timestamp of each consumed positive (0.0 and -1 for none)."""
        hit = items >= 0
        rank = self.chrono[slots, np.maximum(items, 0)]
        rows = np.where(hit, self.data.indptr[self.users[slots]] + rank, 0)
        rating = np.where(hit, self.data.ratings[rows], 0.0).astype(np.float64)
        stamp = np.where(hit, self.data.timestamps[rows], -1).astype(np.int64)
        return rating, stamp


class _InteractionStepper:
    """Shared step logic for the single and vector interaction envs (no loop over slots)."""

    core: _InteractionCore
    max_steps: int | None

    def _step_slots(
        self,
        rng: np.random.Generator,
        slates: np.ndarray,
        active: np.ndarray,
        fresh: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Step the ``active`` slots, then draw candidates (one batched draw) for those still
        running and for the ``fresh`` ones (just reset with ``draw=False``)."""
        core = self.core
        b = core.num_envs
        everyone = bool(active.all())
        slots = np.arange(b) if everyone else np.flatnonzero(active)
        consumed_slot, consumed_item = core.respond(slots, slates if everyone else slates[slots])
        rating, stamp = core.logged(slots, consumed_item)
        core.steps[slots] += 1
        ended = core.exhausted(slots)
        if fresh is None and everyone:
            core.draw_candidates(rng, np.flatnonzero(~ended))
        else:
            redraw = np.zeros(b, dtype=bool) if fresh is None else fresh.copy()
            redraw[slots[~ended]] = True
            core.draw_candidates(rng, np.flatnonzero(redraw))
        truncated = np.zeros(len(slots), dtype=bool)
        if self.max_steps is not None:
            truncated = ~ended & (core.steps[slots] >= self.max_steps)
        columns = {  # name: (values of the stepped slots, value for the others)
            "consumed_slot": (consumed_slot, -1),
            "consumed_item": (consumed_item, -1),
            "logged_timestamp": (stamp, -1),
            "positives_left": (core.positives_left[slots], 0),
        }
        if core.has_ratings:
            columns["logged_rating"] = (rating, 0.0)
        columns["rewards"] = ((consumed_slot >= 0).astype(np.float64), 0.0)
        columns["terminated"] = (ended, False)
        columns["truncated"] = (truncated, False)
        out = {}
        for key, (values, fill) in columns.items():
            if everyone:
                out[key] = values
            else:  # slots not stepped (being autoreset): no reward, not done
                out[key] = np.full(b, fill, dtype=values.dtype)
                out[key][slots] = values
        rewards, terminated, truncated = (
            out.pop(k) for k in ("rewards", "terminated", "truncated")
        )
        return rewards, terminated, truncated, out


_INTERACTION_ARGS = """``dataset``, ``data_dir=None``, ``num_candidates=20``, ``slate_size=5``,
    ``positives_per_step=2`` (None: candidates uniform over the unrecommended items),
    ``max_steps=50`` (truncation; None for none), ``split="train"`` (``"all"`` includes the
    held-out items), ``min_interactions=5``, ``split_seed=0``, ``rating_threshold=None``."""


class LoggedInteractionEnv(_InteractionStepper, gym.Env[Observation, np.ndarray]):
    # built from shared parts, so assigned: a concatenation is not a docstring
    __doc__ = (
        r"""Replay a logged data set as slate recommendation: an episode is a user.

    ## Description
    At reset a user is drawn (uniformly, from ``self.np_random``). Each step offers
    ``num_candidates`` items that have not been recommended to this user yet: up to
    ``positives_per_step`` of the user's logged positives (not yet recommended) and the rest
    other items, in random order. The agent recommends a slate of ``slate_size`` of them.
    **Choice rule:** the user consumes, among the slate's items that are logged positives, the
    one the log shows *earliest* (chronological order, file order on ties), i.e. the next
    interaction the log would replay; if the slate holds none, nothing is consumed. Every
    slate item counts as recommended and is never offered again in the episode.

    ## Action Space
    ``SlateSpace(num_candidates, slate_size)``: distinct indices into ``candidate_ids``.

    ## Observation Space
    | key | shape | meaning |
    |---|---|---|
    | ``user_id`` | (1,) int64 | remapped user id |
    | ``user_features`` | (du,) float32 | public user features, only where the data set has them |
    | ``candidate_ids`` | (N,) int64 | remapped item ids |
    | ``candidate_features`` | (N, di) float32 | item features, only where available |
    | ``last_slate`` | (n,) int64 | item ids of the previous slate (-1 before the first step) |
    | ``last_click`` | (n,) float32 | one-hot consumed slot of the previous slate |

    ## Rewards
    1.0 when an item is consumed, else 0.0.

    ## Starting State
    A uniformly drawn user (``options={"user": u}`` picks one) with nothing recommended yet.

    ## Episode End
    Terminates when every logged positive of the user has been recommended, or fewer than
    ``num_candidates`` unrecommended items remain; truncated after ``max_steps`` steps.

    ## Info
    ``consumed_slot`` / ``consumed_item`` (-1 for none), ``logged_timestamp`` (-1 for none),
    ``logged_rating`` (0.0 for none; only for data sets with ratings), ``positives_left``. These data sets have no logging
    policy, so there is no logged action or propensity (the Taobao env has them, under Open
    Bandit Pipeline's keys).

    ``positives_left`` (the user's logged positives not yet recommended) is **hidden**
    (``metadata["hidden_info_keys"]``): it tells what the log holds next, which a deployed
    recommender cannot know; fedrec's loops, rollouts and SB3 adapters strip it for every agent
    that is not an oracle. The other keys are the response to the agent's own slate (which item
    was consumed, and when and how the log rated it), as a deployed recommender would see it.

    ## Arguments
    """
        + _INTERACTION_ARGS
        + """

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B)`` returns :class:`LoggedInteractionVectorEnv`, which
    steps all ``B`` users with numpy (no Python loop over users). This env runs the same
    batched core with one slot, so ``num_envs=1`` reproduces it exactly for the same seed.
    """
        + _STATE_CARD
    )

    metadata = {
        "render_modes": ["ansi"],
        "render_fps": 4,
        HIDDEN_INFO_KEYS: INTERACTION_HIDDEN_KEYS,
    }

    def __init__(
        self,
        dataset: str,
        *,
        data_dir: str | Path | None = None,
        num_candidates: int = 20,
        slate_size: int = 5,
        positives_per_step: int | None = 2,
        max_steps: int | None = 50,
        split: Literal["train", "all"] = "train",
        min_interactions: int = 5,
        split_seed: int = 0,
        rating_threshold: float | None = None,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None")
        self.render_mode = render_mode
        self.data = load_prepared(
            dataset,
            data_dir,
            min_interactions=min_interactions,
            rating_threshold=rating_threshold,
            seed=split_seed,
        )
        self.max_steps = max_steps
        self.core = _InteractionCore(
            self.data,
            num_envs=1,
            num_candidates=num_candidates,
            slate_size=slate_size,
            positives_per_step=positives_per_step,
            split=split,
        )
        self.observation_space = self.core.observation_space()
        self.action_space = SlateSpace(num_candidates, slate_size)
        self._done = True
        self._reward = 0.0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        user = None if options is None else options.get("user")
        slot = np.zeros(1, dtype=np.int64)
        self.core.reset_slots(self.np_random, slot, None if user is None else [user])
        self._done = False
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        slate = validate_slates(
            action, num_candidates=self.core.num_candidates, slate_size=self.core.slate_size
        )
        rewards, terminated, truncated, info = self._step_slots(
            self.np_random, slate[None], np.ones(1, bool)
        )
        self._done = bool(terminated[0] or truncated[0])
        self._reward = float(rewards[0])
        single = {key: value[0].item() for key, value in info.items()}
        return self._observation(), self._reward, bool(terminated[0]), bool(truncated[0]), single

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        return {
            "np_random": generator_state(self._np_random),
            "np_random_seed": self._np_random_seed,
            "core": self.core.state_dict(),
            "done": bool(self._done),
            "reward": float(self._reward),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments (the data set is
        not part of the state). The whole state is checked first (``ValueError``; no change)."""
        read = StateReader(state, type(self).__name__)
        rng = read.generator()
        seed = read.seed()
        core = self.core.read_state(StateReader(read.dict("core"), f"{read.who} core"))
        done = read.bool("done")
        reward = read.float("reward")
        read.finish()
        self._np_random, self._np_random_seed = rng, seed
        self.core.set_state(core)
        self._done = done
        self._reward = reward

    def _observation(self) -> Observation:
        return {key: value[0] for key, value in self.core.observation().items()}

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        core = self.core
        return (
            f"user {int(core.users[0])} step {int(core.steps[0])} "
            f"last slate {core.last_slate[0].tolist()} clicks {core.last_click[0].tolist()}"
        )


class LoggedInteractionVectorEnv(_InteractionStepper, CoreVectorEnvState, VectorEnv):
    """``num_envs`` interaction-mode users stepped together (card: :class:`LoggedInteractionEnv`).

    With ``num_envs=1`` and the same seed it reproduces the single env exactly. Autoreset follows
    Gymnasium 1.x (``NEXT_STEP`` default, ``SAME_STEP``, ``DISABLED`` with ``reset_mask``);
    ``max_episode_steps`` (from ``make_vec``) overrides ``max_steps``.
    ``state_dict()`` / ``load_state_dict(state)`` save and restore its dynamic state as plain data.
    """

    metadata = {
        "render_modes": [],
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        HIDDEN_INFO_KEYS: INTERACTION_HIDDEN_KEYS,
    }

    def __init__(
        self,
        num_envs: int = 1,
        dataset: str = "ml-100k",
        *,
        data_dir: str | Path | None = None,
        num_candidates: int = 20,
        slate_size: int = 5,
        positives_per_step: int | None = 2,
        max_steps: int | None = 50,
        split: Literal["train", "all"] = "train",
        min_interactions: int = 5,
        split_seed: int = 0,
        rating_threshold: float | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        check_vector_args(num_envs, render_mode, max_episode_steps, who=type(self).__name__)
        self.data = load_prepared(
            dataset,
            data_dir,
            min_interactions=min_interactions,
            rating_threshold=rating_threshold,
            seed=split_seed,
        )
        self.num_envs = num_envs
        self.render_mode = None
        self.max_steps = max_episode_steps if max_episode_steps is not None else max_steps
        self.metadata = {
            **type(self).metadata,
            "autoreset_mode": parse_autoreset_mode(autoreset_mode),
        }
        self.core = _InteractionCore(
            self.data,
            num_envs=num_envs,
            num_candidates=num_candidates,
            slate_size=slate_size,
            positives_per_step=positives_per_step,
            split=split,
        )
        self.single_observation_space = self.core.observation_space()
        self.single_action_space = SlateSpace(num_candidates, slate_size)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = SlateBatchSpace(num_candidates, slate_size, num_envs)
        self._autoreset = np.zeros(num_envs, dtype=bool)
        self._started = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        mask = reset_mask(options, self.num_envs, started=self._started)
        users = None if options is None else options.get("users")
        self.core.reset_slots(self.np_random, np.flatnonzero(mask), users)
        self._autoreset[mask] = False
        self._started = True
        return self.core.observation(), {}

    def _state_core(self) -> Any:
        return self.core

    def step(
        self, actions: np.ndarray
    ) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        mode = self.metadata["autoreset_mode"]
        if mode == AutoresetMode.DISABLED:
            reject_finished(self._autoreset)
        resetting = self._autoreset.copy() if mode == AutoresetMode.NEXT_STEP else None
        # the whole action is checked before anything changes (the resetting rows are ignored)
        slates = validate_slates(
            actions,
            num_candidates=self.core.num_candidates,
            slate_size=self.core.slate_size,
            batch_size=self.num_envs,
            who="slates",
            ignore=resetting,
        )
        active = np.ones(self.num_envs, bool) if resetting is None else ~resetting
        if resetting is not None and resetting.any():  # their candidates come with the step's
            self.core.reset_slots(self.np_random, np.flatnonzero(resetting), draw=False)
        rewards, terminated, truncated, info = self._step_slots(
            self.np_random, slates, active, fresh=resetting
        )
        info = with_masks(info, self.num_envs, active)
        done = terminated | truncated
        if mode == AutoresetMode.SAME_STEP and done.any():
            info["final_obs"] = self.core.observation()
            info["_final_obs"] = done.copy()
            info["final_info"] = {
                k: v for k, v in info.items() if not k.startswith(("final", "_final"))
            }
            info["_final_info"] = done.copy()
            self.core.reset_slots(self.np_random, np.flatnonzero(done))
        elif mode != AutoresetMode.SAME_STEP:
            # NEXT_STEP: reset at the next step; DISABLED: refuse to step them until reset()
            self._autoreset = done
        return self.core.observation(), rewards, terminated, truncated, info


# --------------------------------------------------------------------------------------------
# Factories (the registered entry points)


def make_logged_env(
    dataset: str, mode: Mode = "interaction", **kwargs: Any
) -> LoggedInteractionEnv | LoggedEvaluationEnv:
    """The single env of ``dataset`` in ``mode`` ("interaction" or "evaluation")."""
    if mode == "interaction":
        return LoggedInteractionEnv(dataset, **kwargs)
    if mode == "evaluation":
        return LoggedEvaluationEnv(dataset, **kwargs)
    raise ValueError(f"mode must be 'interaction' or 'evaluation', got {mode!r}")


def make_logged_vector_env(
    num_envs: int = 1, *, dataset: str, mode: Mode = "interaction", **kwargs: Any
) -> LoggedInteractionVectorEnv | LoggedEvaluationVectorEnv:
    """The native vector env of ``dataset`` in ``mode`` (the EnvSpec's ``vector_entry_point``)."""
    if mode == "interaction":
        return LoggedInteractionVectorEnv(num_envs, dataset, **kwargs)
    if mode == "evaluation":
        return LoggedEvaluationVectorEnv(num_envs, dataset, **kwargs)
    raise ValueError(f"mode must be 'interaction' or 'evaluation', got {mode!r}")
