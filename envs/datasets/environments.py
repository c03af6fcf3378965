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
from fedrec.envs.slates import SlateBatchSpace, SlateSpace, validate_slates
from fedrec.envs.vector_utils import (
    check_vector_args,
    parse_autoreset_mode,
    reset_mask,
    with_masks,
)

Observation = dict[str, np.ndarray]
Mode = Literal["interaction", "evaluation"]


def _feature_box(values: np.ndarray) -> spaces.Box:
    low = float(values.min()) if values.size else 0.0
    high = float(values.max()) if values.size else 0.0
    return spaces.Box(low, max(high, low), values.shape[1:], np.float32)


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
        match = rankings == target[:, None]
        hit = match.any(axis=1)
        rank = np.where(hit, np.argmax(match, axis=1), -1)
        ndcg = np.where(hit, 1.0 / np.log2(np.maximum(rank, 0) + 2.0), 0.0)
        return {
            "hit": hit.astype(np.float64),
            "ndcg": ndcg,
            "rank": rank.astype(np.int64),
            "target_index": target.copy(),
            "test_item": self.data.test_items[self.users],
        }


_EVAL_CARD_ARGS = """``data_dir=None`` (the data set's folder or the cache root; default ``$FEDREC_DATA``
    or ``~/.cache/fedrec``), ``top_k=10``, ``min_interactions=5``, ``num_test_negatives=100``,
    ``split_seed=0`` (fixes the negatives and candidate order), ``rating_threshold=None``."""


class LoggedEvaluationEnv(gym.Env[Observation, np.ndarray]):
    (
        r"""Leave-one-out evaluation as one-step episodes (FedNCF / NCF protocol).

    ## Description
    Each episode is one user of a logged data set, preprocessed as in FedNCF (implicit feedback,
    users with < 5 interactions removed, leave-latest-out with a documented tie rule; see
    :mod:`fedrec.envs.datasets.preprocess`). The candidates are the user's held-out item and its
    100 fixed negatives, shuffled once by the split seed. The agent returns a top-K ranking;
    the reward is 1 if the held-out item is in it. The mean return over all users is HR@K and the
    mean of ``info["ndcg"]`` is NDCG@K, exactly as supervised models (FedNCF, FEL) are evaluated.

    ## Action Space
    ``SlateSpace(101, K)``: K distinct indices into ``candidate_ids``, best first.

    ## Observation Space
    | key | shape | meaning |
    |---|---|---|
    | ``user_id`` | (1,) int64 | remapped user id (0-based) |
    | ``user_features`` | (du,) float32 | public user features (MovieLens: age, gender, occupation); only if the data set has them |
    | ``candidate_ids`` | (101,) int64 | remapped item ids of the candidates |
    | ``candidate_features`` | (101, di) float32 | item features (genres; venue category and position); only if available |

    ## Rewards
    1.0 if the held-out item is among the K recommended, else 0.0 (HR@K).

    ## Starting State
    ``reset(seed=s)`` draws a permutation of the users from ``self.np_random``; each following
    ``reset()`` takes the next user of that sweep, so U resets visit every user once.
    ``reset(options={"user": u})`` evaluates user ``u``.

    ## Episode End
    Terminates after the single step.

    ## Info
    After the step: ``hit``, ``ndcg`` (1/log2(rank+2) for a 0-based rank < K, else 0), ``rank``
    (-1 if missed), ``target_index`` (the held-out item's column in the candidates) and
    ``test_item``. No logging propensities exist for these data sets.

    ## Arguments
    ``dataset`` (``"ml-100k"``, ``"ml-1m"``, ``"lastfm-2k"``, ``"foursquare-nyc"``, ...),
    """
        + _EVAL_CARD_ARGS
        + """

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B, mode="evaluation")`` returns
    :class:`LoggedEvaluationVectorEnv`; with ``B`` = number of users one step evaluates everyone.
    """
    )

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

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

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None or not hasattr(self, "_shuffled"):
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


class LoggedEvaluationVectorEnv(VectorEnv):
    """``num_envs`` users evaluated at once (see :class:`LoggedEvaluationEnv` for the card).

    Users are assigned in the order of a seeded sweep (slot ``i`` of the first reset gets the
    ``i``-th user of the permutation), so ``num_envs = num_users`` evaluates every user in one
    step. ``reset(options={"users": ids})`` assigns explicit users. Autoreset follows Gymnasium
    1.x (``NEXT_STEP`` default, ``SAME_STEP``, ``DISABLED`` with ``reset_mask``).
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

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
        resetting = self._autoreset.copy() if mode == AutoresetMode.NEXT_STEP else None
        rankings = np.array(actions, copy=True)
        if resetting is not None and resetting.any():
            rankings[resetting] = np.arange(self._core.top_k)
        rankings = validate_slates(
            rankings,
            num_candidates=self._core.num_candidates,
            slate_size=self._core.top_k,
            batch_size=self.num_envs,
            who="rankings",
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
        elif mode == AutoresetMode.NEXT_STEP:
            self._autoreset = terminated.copy()
        return self._core.observation(), rewards, terminated, truncated, info


# --------------------------------------------------------------------------------------------
# Interaction mode


class _InteractionCore:
    """Per-slot state of interaction-mode episodes (one user per slot)."""

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

    def positives_of(self, user: int) -> np.ndarray:
        items = self.data.positives(user)
        return items[:-1] if self.split == "train" else items

    def reset_slot(self, rng: np.random.Generator, slot: int, user: int | None) -> None:
        if user is None:
            user = int(rng.integers(self.data.num_users))
        if not 0 <= user < self.data.num_users:
            raise ValueError(f"user must be in [0, {self.data.num_users}), got {user}")
        self.users[slot] = user
        self.chrono[slot] = -1
        positives = self.positives_of(user)
        self.chrono[slot, positives] = np.arange(len(positives))
        self.recommended[slot] = False
        self.consumed[slot] = False
        self.last_slate[slot] = -1
        self.last_click[slot] = 0.0
        self.steps[slot] = 0
        self.draw_candidates(rng, slot)

    def draw_candidates(self, rng: np.random.Generator, slot: int) -> None:
        """Fresh candidates: up to ``positives_per_step`` unrecommended positives, rest others."""
        available = ~self.recommended[slot]
        is_pos = self.chrono[slot] >= 0
        pos = np.flatnonzero(available & is_pos)
        neg = np.flatnonzero(available & ~is_pos)
        c = self.num_candidates
        if self.positives_per_step is None:
            pool = np.flatnonzero(available)
            chosen = rng.choice(pool, c, replace=False)
        else:
            k = min(self.positives_per_step, len(pos), c)
            k = max(k, c - len(neg))
            chosen = np.concatenate(
                [rng.choice(pos, k, replace=False), rng.choice(neg, c - k, replace=False)]
            )
            chosen = chosen[rng.permutation(c)]
        self.candidates[slot] = chosen

    def exhausted(self, slot: int) -> bool:
        """No unrecommended positive left, or too few items left to fill a candidate set."""
        available = ~self.recommended[slot]
        positives_left = bool((available & (self.chrono[slot] >= 0)).any())
        return not positives_left or int(available.sum()) < self.num_candidates

    def respond(self, slot: int, slate: np.ndarray) -> tuple[int, int]:
        """Consumed slot and item (-1, -1 if none) for a slate of candidate indices."""
        items = self.candidates[slot, slate]
        ranks = self.chrono[slot, items]
        eligible = (ranks >= 0) & ~self.consumed[slot, items]
        self.recommended[slot, items] = True
        self.last_slate[slot] = items
        self.last_click[slot] = 0.0
        if not eligible.any():
            return -1, -1
        choice = int(np.argmin(np.where(eligible, ranks, np.iinfo(np.int64).max)))
        self.consumed[slot, items[choice]] = True
        self.last_click[slot, choice] = 1.0
        return choice, int(items[choice])

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

    def logged(self, slot: int, item: int) -> tuple[float, int]:
        """The logged rating and timestamp of a consumed positive (0.0 and -1 for none)."""
        if item < 0:
            return 0.0, -1
        user = int(self.users[slot])
        start = self.data.indptr[user]
        row = start + int(self.chrono[slot, item])
        return float(self.data.ratings[row]), int(self.data.timestamps[row])


class _InteractionStepper:
    """Shared step logic for the single and vector interaction envs."""

    core: _InteractionCore
    max_steps: int | None

    def _step_slots(
        self, rng: np.random.Generator, slates: np.ndarray, active: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        core = self.core
        b = core.num_envs
        rewards = np.zeros(b)
        terminated = np.zeros(b, dtype=bool)
        truncated = np.zeros(b, dtype=bool)
        slot_of = np.full(b, -1, dtype=np.int64)
        item_of = np.full(b, -1, dtype=np.int64)
        rating = np.zeros(b)
        stamp = np.full(b, -1, dtype=np.int64)
        left = np.zeros(b, dtype=np.int64)
        for i in np.flatnonzero(active):
            slot, item = core.respond(i, slates[i])
            slot_of[i], item_of[i] = slot, item
            rewards[i] = 1.0 if slot >= 0 else 0.0
            rating[i], stamp[i] = core.logged(i, item)
            core.steps[i] += 1
            terminated[i] = core.exhausted(i)
            if not terminated[i]:
                if self.max_steps is not None and core.steps[i] >= self.max_steps:
                    truncated[i] = True
                core.draw_candidates(rng, i)
            available = ~core.recommended[i]
            left[i] = int((available & (core.chrono[i] >= 0)).sum())
        info = {
            "consumed_slot": slot_of,
            "consumed_item": item_of,
            "logged_timestamp": stamp,
            "positives_left": left,
        }
        if not np.isnan(core.data.ratings).all():
            info["logged_rating"] = rating
        return rewards, terminated, truncated, info


_INTERACTION_ARGS = """``dataset``, ``data_dir=None``, ``num_candidates=20``, ``slate_size=5``,
    ``positives_per_step=2`` (None: candidates uniform over the unrecommended items),
    ``max_steps=50`` (truncation; None for none), ``split="train"`` (``"all"`` includes the
    held-out items), ``min_interactions=5``, ``split_seed=0``, ``rating_threshold=None``."""


class LoggedInteractionEnv(_InteractionStepper, gym.Env[Observation, np.ndarray]):
    (
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

    ## Arguments
    """
        + _INTERACTION_ARGS
        + """

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B)`` returns :class:`LoggedInteractionVectorEnv`.
    """
    )

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

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
        self.core.reset_slot(self.np_random, 0, None if user is None else int(user))
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


class LoggedInteractionVectorEnv(_InteractionStepper, VectorEnv):
    """``num_envs`` interaction-mode users stepped together (card: :class:`LoggedInteractionEnv`).

    With ``num_envs=1`` and the same seed it reproduces the single env exactly. Autoreset follows
    Gymnasium 1.x (``NEXT_STEP`` default, ``SAME_STEP``, ``DISABLED`` with ``reset_mask``);
    ``max_episode_steps`` (from ``make_vec``) overrides ``max_steps``.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.NEXT_STEP}

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
        if users is not None:
            users = np.asarray(users).reshape(-1)
            if users.shape != (int(mask.sum()),):
                raise ValueError(f"users must list one user per reset env ({int(mask.sum())})")
        for j, i in enumerate(np.flatnonzero(mask)):
            self.core.reset_slot(self.np_random, i, None if users is None else int(users[j]))
        self._autoreset[mask] = False
        self._started = True
        return self.core.observation(), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        mode = self.metadata["autoreset_mode"]
        slates = np.array(actions, copy=True)
        resetting = self._autoreset.copy() if mode == AutoresetMode.NEXT_STEP else None
        if resetting is not None and resetting.any():
            slates[resetting] = np.arange(self.core.slate_size)
        slates = validate_slates(
            slates,
            num_candidates=self.core.num_candidates,
            slate_size=self.core.slate_size,
            batch_size=self.num_envs,
            who="slates",
        )
        active = np.ones(self.num_envs, bool) if resetting is None else ~resetting
        if resetting is not None:
            for i in np.flatnonzero(resetting):
                self.core.reset_slot(self.np_random, i, None)
        rewards, terminated, truncated, info = self._step_slots(self.np_random, slates, active)
        info = with_masks(info, self.num_envs)
        done = terminated | truncated
        if mode == AutoresetMode.SAME_STEP and done.any():
            info["final_obs"] = self.core.observation()
            info["_final_obs"] = done.copy()
            info["final_info"] = {
                k: v for k, v in info.items() if not k.startswith(("final", "_final"))
            }
            info["_final_info"] = done.copy()
            for i in np.flatnonzero(done):
                self.core.reset_slot(self.np_random, i, None)
        elif mode == AutoresetMode.NEXT_STEP:
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
    """The native vector env of ``dataset`` in ``mode`` (the spec's ``vector_entry_point``)."""
    if mode == "interaction":
        return LoggedInteractionVectorEnv(num_envs, dataset, **kwargs)
    if mode == "evaluation":
        return LoggedEvaluationVectorEnv(num_envs, dataset, **kwargs)
    raise ValueError(f"mode must be 'interaction' or 'evaluation', got {mode!r}")
