"""Evaluation mode of the logged-data environments: leave-one-out HR@K / NDCG@K, single and vector.

Each episode is one user and one step: the agent ranks the user's held-out item among sampled
negatives (the FedNCF / NCF protocol). One batched core (:class:`_EvaluationCore`) serves the
single env (one slot) and the vector env (B slots), so both consume the same random numbers and
agree exactly for the same seed. :func:`score_rankings` is the metric itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from fedrec.envs.datasets.core_envs import (
    AutoresetVectorEnv,
    CoreEnvState,
    Observation,
    StepResult,
    load_logged_data,
)
from fedrec.envs.datasets.logged_features import feature_observation, feature_spaces
from fedrec.envs.datasets.preprocess import PreparedData
from fedrec.envs.datasets.user_sweep import SweepEnv, UserSweep, read_order
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.slates import SlateBatchSpace, SlateSpace, validate_slates
from fedrec.envs.state import StateReader
from fedrec.envs.vector_utils import check_vector_args

#: Evaluation mode's hidden info keys (``metadata["hidden_info_keys"]``): the held-out item's
#: column and id are the test's answer, which a learner could memorise over repeated sweeps.
EVALUATION_HIDDEN_KEYS = frozenset({"target_index", "test_item"})


def _read_ids(
    read: StateReader, key: str, shape: tuple[int, ...], upper: int, hint: str
) -> np.ndarray:
    """An int64 array of ids in ``[0, upper)`` from a state being loaded."""
    ids = read.array(key, shape, np.int64, hint=hint)
    if ids.size and (ids.min() < 0 or ids.max() >= upper):
        raise read.fail(key, f"holds ids outside [0, {upper})")
    return ids


class _EvaluationCore(UserSweep):
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
            "order": read_order(read, "order", u),
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
        return spaces.Dict({**entries, **feature_spaces(d, c)})

    def assign(self, mask: np.ndarray, users: np.ndarray | None = None) -> None:
        """Give the masked slots their users: explicit ones, else the next of the sweep."""
        count = int(mask.sum())
        if users is None:
            users = self.next_users(count)
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
        return {**obs, **feature_observation(d, self.users, candidates)}

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


class LoggedEvaluationEnv(SweepEnv, CoreEnvState, gym.Env[Observation, np.ndarray]):
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
    OWN_STATE = {"done": "bool", "shuffled": "bool", "last": "raw"}

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
        self._set_render_mode(render_mode)
        self.data = load_logged_data(
            dataset, data_dir, min_interactions, split_seed, rating_threshold, num_test_negatives
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
        user = self._reset_sweep(seed, options)
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

    def _saved(self, name: str, kind: str) -> Any:
        if name != "last":
            return super()._saved(name, kind)
        return None if self._last is None else {k: v.copy() for k, v in self._last.items()}

    def _checked(self, read: StateReader, checked: dict[str, Any]) -> dict[str, Any]:
        last = checked["last"]
        if last is not None:
            keys = ("hit", "ndcg", "rank", "target_index", "test_item")
            last_read = StateReader(last, f"{read.who} last")
            last = {key: last_read.raw(key) for key in keys}
            last_read.finish()
            if not all(type(v) is np.ndarray and v.shape == (1,) for v in last.values()):
                raise read.fail("last", "must be None or the step's scores, arrays of shape (1,)")
            last = {key: value.copy() for key, value in last.items()}
        return {**checked, "last": last}

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        user = int(self._core.users[0])
        text = f"{self.data.name} user {self.data.user_ids[user]} (id {user})"
        if self._last is not None:
            text += f" hit={self._last['hit'][0]:.0f} rank={self._last['rank'][0]}"
        return text


class LoggedEvaluationVectorEnv(AutoresetVectorEnv):
    """``num_envs`` users evaluated at once (see :class:`LoggedEvaluationEnv` for the card).

    Users are assigned in the order of a seeded sweep (slot ``i`` of the first reset gets the
    ``i``-th user of the permutation), so ``num_envs = num_users`` evaluates every user in one
    step. ``reset(options={"users": ids})`` assigns explicit users. Autoreset follows Gymnasium
    1.x (``NEXT_STEP`` default, ``SAME_STEP``, ``DISABLED`` with ``reset_mask``).
    ``state_dict()`` / ``load_state_dict(state)`` save and restore its dynamic state as plain data.
    """

    metadata = {**AutoresetVectorEnv.metadata, HIDDEN_INFO_KEYS: EVALUATION_HIDDEN_KEYS}

    # :class:`LoggedEvaluationEnv`'s arguments again, listed rather than taken as
    # ``**kwargs``: the constructors' signatures are public, documented and introspected.
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
        self.data = load_logged_data(
            dataset, data_dir, min_interactions, split_seed, rating_threshold, num_test_negatives
        )
        self._vector_setup(num_envs, autoreset_mode)
        self._core = _EvaluationCore(self.data, top_k, num_envs)
        num_candidates = self._core.num_candidates
        self._vector_spaces(
            self._core.observation_space(),
            SlateSpace(num_candidates, top_k),
            SlateBatchSpace(num_candidates, top_k, num_envs),
        )

    def _step_active(
        self, actions: np.ndarray, active: np.ndarray, resetting: np.ndarray | None
    ) -> StepResult:
        # the whole action is checked before anything changes (the resetting rows are ignored)
        rankings = validate_slates(
            actions,
            num_candidates=self._core.num_candidates,
            slate_size=self._core.top_k,
            batch_size=self.num_envs,
            who="rankings",
            ignore=resetting,
        )
        scores = self._core.score(rankings)
        rewards = np.where(active, scores["hit"], 0.0)
        terminated = active.copy()
        truncated = np.zeros(self.num_envs, dtype=bool)
        info = {k: np.where(active, v, 0) for k, v in scores.items()}
        if resetting is not None and resetting.any():
            self._core.assign(resetting)
        return rewards, terminated, truncated, info
