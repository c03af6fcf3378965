"""Taobao display-ad impressions as a Gymnasium environment: score each logged impression.

Features follow the 9 / 6 / 2 split of docs/datasets.md ("Taobao display ads"): 8 public user-profile fields (the 9th,
``userid``, is ``user_id``), the ad's 5 sparse ids plus its log price, and the context (``pid``
and day of week in Asia/Shanghai). Impressions whose user has no profile row or whose ad has no
feature row are **kept** with zero features (the counts are in :attr:`TaobaoData.report`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import pandas as pd
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from fedrec.envs.datasets.catalog import _signature, locate
from fedrec.envs.datasets.core_envs import (
    AutoresetVectorEnv,
    CoreEnvState,
    Observation,
    StepResult,
)
from fedrec.envs.datasets.taobao_files import TAOBAO_USER_PROFILE_HEADER, load_taobao
from fedrec.envs.datasets.user_sweep import SweepEnv, UserSweep, read_order
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.slates import validate_scores
from fedrec.envs.state import StateReader
from fedrec.envs.vector_utils import check_vector_args

USER_FIELDS = TAOBAO_USER_PROFILE_HEADER[1:]
AD_FIELDS = ("adgroup_id", "cate_id", "campaign_id", "customer", "brand")
#: 2017-05-13 00:00 Asia/Shanghai: the first second of the standard test day.
TEST_DAY_START = 1_494_604_800
SHANGHAI = 8 * 3600
#: The env's hidden info keys (``metadata["hidden_info_keys"]``): none, see the card's "Info".
HIDDEN_KEYS: frozenset[str] = frozenset()


def _codes(values: pd.Series, missing: tuple[str, ...] = ("", "NULL")) -> np.ndarray:
    text = values.astype(str).str.strip()
    codes, _ = pd.factorize(text.where(~text.isin(missing)))
    return codes.astype(np.int64) + 1  # 0 = missing


@dataclass
class TaobaoData:
    """Joined impressions sorted by (user, time, file order), with per-user CSR offsets."""

    user_ids: np.ndarray  # raw user id per remapped user
    indptr: np.ndarray
    user: np.ndarray  # (M,) remapped user per impression
    user_features: np.ndarray  # (M, 8) int64 codes
    ad_ids: np.ndarray  # (M,) remapped adgroup (0-based)
    ad_features: np.ndarray  # (M, 5) int64 codes
    ad_price: np.ndarray  # (M,) float32 log1p(price), 0 if unknown
    context: np.ndarray  # (M, 2) int64: pid code (1, 2), day of week (0 = Monday)
    clicks: np.ndarray  # (M,) float
    timestamps: np.ndarray
    report: list[str]

    @property
    def num_users(self) -> int:
        return len(self.user_ids)


@functools.lru_cache(maxsize=4)
def _taobao_cached(folder: str, signature: tuple, split: str) -> TaobaoData:
    log = load_taobao(Path(folder))
    imp = log.impressions.copy()
    imp["order"] = np.arange(len(imp))
    report = [f"{len(imp):,} impressions, {int(imp['clk'].sum()):,} clicks"]
    if split != "all":
        test = imp["time_stamp"].to_numpy() >= TEST_DAY_START
        kept = imp[test] if split == "test" else imp[~test]
        report.append(
            f"split={split} (test day 2017-05-13 Asia/Shanghai): kept {len(kept):,} of {len(imp):,}"
        )
        imp = kept
    if len(imp) == 0:
        raise ValueError(f"{folder}: no impressions in split {split!r}")
    # load_taobao has checked that each user and each ad has at most one row: nothing is dropped
    users = log.users.set_index("userid")
    user_codes = pd.DataFrame({f: _codes(users[f]) for f in USER_FIELDS}, index=users.index)
    ads = log.ads.set_index("adgroup_id")
    ad_codes = pd.DataFrame({f: _codes(ads[f]) for f in AD_FIELDS[1:]}, index=ads.index)
    ad_codes["price"] = np.log1p(ads["price"].to_numpy(np.float64))
    no_profile = ~imp["user"].isin(users.index)
    no_ad = ~imp["adgroup_id"].isin(ads.index)
    report.append(
        f"kept with zero features: {int(no_profile.sum()):,} impressions without a user profile, "
        f"{int(no_ad.sum()):,} without an ad feature row"
    )
    order = np.lexsort(
        (imp["order"].to_numpy(), imp["time_stamp"].to_numpy(), imp["user"].to_numpy())
    )
    imp = imp.iloc[order]
    user_ids, user = np.unique(imp["user"].to_numpy(), return_inverse=True)
    counts = np.bincount(user, minlength=len(user_ids))
    uf = user_codes.reindex(imp["user"].to_numpy()).fillna(0).to_numpy(np.int64)
    af = ad_codes.reindex(imp["adgroup_id"].to_numpy()).fillna(0)
    _, ad_index = np.unique(imp["adgroup_id"].to_numpy(), return_inverse=True)
    adgroup_codes, _ = pd.factorize(imp["adgroup_id"])
    pid = np.where(imp["pid"].to_numpy() == "430548_1007", 1, 2)  # the two pids (load_taobao)
    dow = ((imp["time_stamp"].to_numpy() + SHANGHAI) // 86_400 + 3) % 7  # 1970-01-01 was a Thursday
    return TaobaoData(
        user_ids=user_ids,
        indptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        user=user.astype(np.int64),
        user_features=uf,
        ad_ids=ad_index.astype(np.int64),
        ad_features=np.column_stack(
            [adgroup_codes + 1, af[list(AD_FIELDS[1:])].to_numpy(np.int64)]
        ),
        ad_price=af["price"].to_numpy(np.float32),
        context=np.column_stack([pid, dow]).astype(np.int64),
        clicks=imp["clk"].to_numpy(np.float64),
        timestamps=imp["time_stamp"].to_numpy(np.int64),
        report=report,
    )


def load_taobao_prepared(
    data_dir: str | Path | None = None, split: Literal["train", "test", "all"] = "test"
) -> TaobaoData:
    """Load, join and sort the Taobao impressions (cached per process while files are unchanged)."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    folder, _ = locate("taobao-ads", data_dir)
    return _taobao_cached(str(folder.resolve()), _signature(folder), split)


class _TaobaoCore(UserSweep):
    """Impression streams of ``num_envs`` slots (one user each), stepped together with numpy.

    Users come from a seeded sweep (a permutation of all users, :meth:`shuffle`), so the single
    env (one slot) and the vector env run the same code and agree exactly for the same seed.
    """

    def __init__(self, data: TaobaoData, num_envs: int) -> None:
        self.data = data
        self.num_envs = num_envs
        self.order = np.arange(data.num_users)
        self.cursor = 0
        self.users = np.zeros(num_envs, dtype=np.int64)
        self.row = np.zeros(num_envs, dtype=np.int64)  # the impression shown next
        self.end = np.zeros(num_envs, dtype=np.int64)  # one past the user's last impression
        self.steps = np.zeros(num_envs, dtype=np.int64)

    def state_dict(self) -> dict[str, Any]:
        return {
            "order": self.order.copy(),
            "cursor": int(self.cursor),
            "users": self.users.copy(),
            "row": self.row.copy(),
            "end": self.end.copy(),
            "steps": self.steps.copy(),
        }

    def read_state(self, read: StateReader) -> dict[str, Any]:
        """Checked copies of the core's entries (nothing changes yet)."""
        u, b = self.data.num_users, self.num_envs
        hint = f"num_envs={b}"
        checked = {
            "order": read_order(read, "order", u),
            "cursor": read.int("cursor", low=0, high=u - 1),
            **{key: read.array(key, (b,), np.int64, hint=hint) for key in ("users", "row", "end")},
            "steps": read.array("steps", (b,), np.int64, hint=hint),
        }
        users, row, end = checked["users"], checked["row"], checked["end"]
        if users.min() < 0 or users.max() >= u:
            raise read.fail("users", f"holds ids outside [0, {u})")
        # a slot before its first reset holds user 0 and row = end = 0
        start, stop = self.data.indptr[users], self.data.indptr[users + 1]
        fresh = (row == 0) & (end == 0)
        if not (fresh | ((end == stop) & (start <= row) & (row <= end))).all():
            raise read.fail("row", "does not lie within its user's impressions")
        return checked

    def set_state(self, checked: dict[str, Any]) -> None:
        for key, value in checked.items():
            setattr(self, key, value)

    def observation_space(self) -> spaces.Dict:
        d = self.data
        high_u = np.maximum(d.user_features.max(axis=0), 0)
        high_a = np.maximum(d.ad_features.max(axis=0), 0)
        return spaces.Dict(
            {
                "user_id": spaces.Box(0, d.num_users - 1, (1,), np.int64),
                "user_features": spaces.Box(np.zeros(8, np.int64), high_u, (8,), np.int64),
                "ad_features": spaces.Box(np.zeros(5, np.int64), high_a, (5,), np.int64),
                "ad_price": spaces.Box(0.0, max(float(d.ad_price.max()), 0.0), (1,), np.float32),
                "context": spaces.Box(np.array([1, 0]), np.array([2, 6]), (2,), np.int64),
            }
        )

    def assign(self, mask: np.ndarray, users: object = None) -> None:
        """Start the masked slots on explicit users, else on the next users of the sweep."""
        count = int(mask.sum())
        u = self.data.num_users
        if users is None:
            users = self.next_users(count)
        users = np.asarray(users).reshape(-1)
        if users.shape != (count,) or (count and (users.min() < 0 or users.max() >= u)):
            raise ValueError(f"users must be {count} ids in [0, {u}), got {users.tolist()}")
        users = users.astype(np.int64)
        self.users[mask] = users
        self.row[mask] = self.data.indptr[users]
        self.end[mask] = self.data.indptr[users + 1]
        self.steps[mask] = 0

    def finished(self) -> np.ndarray:
        return self.row >= self.end

    def observation(self) -> Observation:
        """The impression each slot shows next (its last one once the episode is over)."""
        d = self.data
        row = np.minimum(self.row, self.end - 1)
        return {
            "user_id": d.user[row][:, None],
            "user_features": d.user_features[row],
            "ad_features": d.ad_features[row],
            "ad_price": d.ad_price[row][:, None].astype(np.float32),
            "context": d.context[row],
        }

    def step(
        self, active: np.ndarray, scores: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """Show the active slots' current impressions; rewards, terminated and the logged info.

        Slots not active get reward 0, are not terminated and hold zeros (-1 for ``action``).
        """
        d = self.data
        row = np.minimum(self.row, self.end - 1)
        on = active[:, None]
        clicks = np.where(active, d.clicks[row], 0.0)
        info = {
            "action": np.where(active, d.ad_ids[row], -1),
            "position": np.where(active, d.context[row, 0], 0),
            "reward": clicks,
            "context": np.where(on, np.concatenate([d.user_features[row], d.context[row]], 1), 0),
            "action_context": np.where(
                on, np.column_stack([d.ad_features[row], d.ad_price[row]]).astype(np.float64), 0.0
            ),
            "score": np.where(active, scores, 0.0),
        }
        self.row[active] += 1
        self.steps[active] += 1
        terminated = active & self.finished()
        return clicks.copy(), terminated, info


_VECTOR_CARD = """
    ## Vectorized environment
    ``gymnasium.make_vec("fedrec/TaobaoAds-v0", num_envs=B)`` returns
    :class:`TaobaoAdsVectorEnv`: ``B`` users' impression streams side by side, actions of shape
    (B, 1). It runs the same batched core as this env, so with ``num_envs=1`` and the same seed it
    reproduces this env exactly (its autoreset takes the next user of the sweep, as ``reset()``
    does here). Autoreset modes ``NEXT_STEP`` (default), ``SAME_STEP`` and ``DISABLED`` (with
    ``reset(options={"reset_mask": m})``).
    """


class TaobaoAdsEnv(SweepEnv, CoreEnvState, gym.Env[Observation, np.ndarray]):
    # built from shared parts, so assigned: a concatenation is not a docstring
    __doc__ = (
        r"""Score logged Taobao display-ad impressions; the reward is the logged click.

    ## Description
    Each episode is one user's impressions (Ali_Display_Ad_Click, ``raw_sample.csv``) in time
    order (file order on ties). Each step shows one logged impression (user, ad, context); the
    agent returns a click score; the reward is the logged click, whatever the score (the log
    cannot say what an unshown ad would have got). The AUC of the scores over a set of episodes
    is computed by :func:`fedrec.eval.ranking_metrics.auc` (see
    :func:`fedrec.eval.ranking_metrics.collect_scores`).

    ## Action Space
    ``Box(0, 1, (1,), float32)``: the predicted click probability (any monotone score in
    [0, 1] works for AUC; squash others, e.g. ``s / (1 + s)`` for ``s >= 0``). A scalar is taken
    as shape (1,). A score that is not a real number, NaN, outside [0, 1] or of the wrong shape
    raises ``ValueError`` before anything changes.

    ## Observation Space
    | key | shape | meaning |
    |---|---|---|
    | ``user_id`` | (1,) int64 | remapped user id |
    | ``user_features`` | (8,) int64 | profile fields cms_segid .. new_user_class_level as codes (0 = empty/missing) |
    | ``ad_features`` | (5,) int64 | adgroup, cate, campaign, customer, brand codes (0 = ``NULL``/missing) |
    | ``ad_price`` | (1,) float32 | log(1 + price) (0 if unknown) |
    | ``context`` | (2,) int64 | pid (1 = 430548_1007, 2 = 430539_1007), day of week (0 = Monday, Shanghai time) |

    ## Rewards
    The logged click (0 or 1).

    ## Starting State
    ``reset(seed=s)`` draws a permutation of the users; each following ``reset()`` takes the next
    user of that sweep (``options={"user": u}`` picks one), so U resets visit every user once.

    ## Episode End
    Terminates after the user's last impression (the final observation repeats it).

    ## Info
    Open Bandit Pipeline keys for the logged data: ``action`` (remapped adgroup id of the shown
    ad), ``position`` (pid code), ``reward`` (logged click), ``context`` (user features + context),
    ``action_context`` (ad features and price); plus ``score`` (the agent's score). The log has no
    propensities, so there is no ``pscore``. No key is hidden (``metadata["hidden_info_keys"]`` is
    empty): each describes the impression just shown, which the agent observed, and its click,
    which is the reward.

    ## Arguments
    ``data_dir=None``, ``split="test"`` (2017-05-13; ``"train"`` = the 7 days before, ``"all"``).

    ## Saving and restoring
    ``state_dict()`` returns what changes while the env runs (the generator state, the user
    sweep, each slot's position in its user's impressions) as plain data, and
    ``load_state_dict(state)`` restores it into an env built with the same arguments; the data set
    is not part of it (it is rebuilt from the arguments). See :mod:`fedrec.envs.state`.
    """
        + _VECTOR_CARD
    )

    metadata = {"render_modes": [], HIDDEN_INFO_KEYS: HIDDEN_KEYS}
    OWN_STATE = {"shuffled": "bool"}

    def __init__(
        self,
        *,
        data_dir: str | Path | None = None,
        split: Literal["train", "test", "all"] = "test",
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None:
            raise ValueError("TaobaoAdsEnv does not render")
        self.render_mode = None
        self.data = load_taobao_prepared(data_dir, split)
        self._core = _TaobaoCore(self.data, 1)
        self.observation_space = self._core.observation_space()
        self.action_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self._shuffled = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        user = self._reset_sweep(seed, options)
        if user is not None and not 0 <= int(user) < self.data.num_users:
            raise ValueError(f"user must be in [0, {self.data.num_users}), got {user}")
        self._core.assign(np.ones(1, bool), None if user is None else [int(user)])
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._core.finished()[0]:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        score = validate_scores(action, (1,))  # in Box(0, 1), before any change
        rewards, terminated, info = self._core.step(np.ones(1, bool), score)
        single = {
            key: value[0] if value.ndim > 1 else value[0].item() for key, value in info.items()
        }
        return self._observation(), float(rewards[0]), bool(terminated[0]), False, single


class TaobaoAdsVectorEnv(AutoresetVectorEnv):
    """``num_envs`` Taobao users' impression streams stepped together (card: :class:`TaobaoAdsEnv`).

    Slot ``i`` of the first reset gets the ``i``-th user of the seeded sweep and every later
    episode (autoreset or ``reset``) the next user of it, so with ``num_envs=1`` and the same seed
    the vector env reproduces the single env exactly; ``reset(options={"users": ids})`` assigns
    explicit users. Autoreset follows Gymnasium 1.x: ``NEXT_STEP`` (default; the step after an
    episode ends starts the next one, ignores its action and returns reward 0), ``SAME_STEP``
    (``info["final_obs"]`` / ``info["final_info"]``) or ``DISABLED`` (reset finished envs with
    ``reset(options={"reset_mask": m})``; stepping one before that raises). ``max_episode_steps``
    truncates long users. ``state_dict()`` / ``load_state_dict(state)`` save and restore its
    dynamic state as plain data (see :mod:`fedrec.envs.state`).
    """

    metadata = {**AutoresetVectorEnv.metadata, HIDDEN_INFO_KEYS: HIDDEN_KEYS}

    STATE_MASKS = ("autoreset", "done")
    FINISHED_MASK = "done"

    def __init__(
        self,
        num_envs: int = 1,
        *,
        data_dir: str | Path | None = None,
        split: Literal["train", "test", "all"] = "test",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int | None = None,
        render_mode: str | None = None,
    ) -> None:
        check_vector_args(num_envs, render_mode, max_episode_steps, who=type(self).__name__)
        self.data = load_taobao_prepared(data_dir, split)
        self._vector_setup(num_envs, autoreset_mode)
        self.max_episode_steps = max_episode_steps
        self._core = _TaobaoCore(self.data, num_envs)
        single_action = spaces.Box(0.0, 1.0, (1,), np.float32)
        self._vector_spaces(
            self._core.observation_space(), single_action, batch_space(single_action, num_envs)
        )

    def _step_active(
        self, actions: np.ndarray, active: np.ndarray, resetting: np.ndarray | None
    ) -> StepResult:
        # in Box(0, 1) before any change; the resetting rows' scores are ignored (may be NaN)
        scores = validate_scores(actions, (self.num_envs, 1), ignore=resetting)
        if resetting is not None and resetting.any():
            self._core.assign(resetting)
        rewards, terminated, info = self._core.step(active, scores)
        truncated = np.zeros(self.num_envs, dtype=bool)
        if self.max_episode_steps is not None:
            truncated = active & ~terminated & (self._core.steps >= self.max_episode_steps)
        return rewards, terminated, truncated, info
