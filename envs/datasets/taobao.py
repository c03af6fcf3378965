"""Taobao display-ad impressions as a Gymnasium environment: score each logged impression.

Features follow the 9 / 6 / 2 split of the FEL spec: 8 public user-profile fields (the 9th,
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

from fedrec.envs.datasets.catalog import _signature, locate
from fedrec.envs.datasets.formats import TAOBAO_USER_PROFILE_HEADER, load_taobao

Observation = dict[str, np.ndarray]
USER_FIELDS = TAOBAO_USER_PROFILE_HEADER[1:]
AD_FIELDS = ("adgroup_id", "cate_id", "campaign_id", "customer", "brand")
#: 2017-05-13 00:00 Asia/Shanghai: the first second of the standard test day.
TEST_DAY_START = 1_494_604_800
SHANGHAI = 8 * 3600


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
    users = log.users.drop_duplicates("userid").set_index("userid")
    user_codes = pd.DataFrame({f: _codes(users[f]) for f in USER_FIELDS}, index=users.index)
    ads = log.ads.drop_duplicates("adgroup_id").set_index("adgroup_id")
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
    pid = np.where(imp["pid"].to_numpy() == "430548_1007", 1, 2)
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


class TaobaoAdsEnv(gym.Env[Observation, np.ndarray]):
    r"""Score logged Taobao display-ad impressions; the reward is the logged click.

    ## Description
    Each episode is one user's impressions (Ali_Display_Ad_Click, ``raw_sample.csv``) in time
    order (file order on ties). Each step shows one logged impression (user, ad, context); the
    agent returns a click score; the reward is the logged click, whatever the score (the log
    cannot say what an unshown ad would have got). The AUC of the scores over a set of episodes
    is computed by :func:`fedrec.eval.ranking_metrics.auc` (see
    :func:`fedrec.eval.ranking_metrics.collect_scores`).

    ## Action Space
    ``Box(0, 1, (1,), float32)``: the predicted click probability (any monotone score works
    for AUC).

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
    user of that sweep (``options={"user": u}`` picks one).

    ## Episode End
    Terminates after the user's last impression.

    ## Info
    Open Bandit Pipeline keys for the logged data: ``action`` (remapped adgroup id of the shown
    ad), ``position`` (pid code), ``reward`` (logged click), ``context`` (user features + context),
    ``action_context`` (ad features and price); plus ``score`` (the agent's score). The log has no
    propensities, so there is no ``pscore``.

    ## Arguments
    ``data_dir=None``, ``split="test"`` (2017-05-13; ``"train"`` = the 7 days before, ``"all"``).

    ## Vectorized environment
    ``gymnasium.make_vec`` wraps it in a ``SyncVectorEnv`` (no native batched version).
    """

    metadata = {"render_modes": []}

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
        d = self.data
        high_u = np.maximum(d.user_features.max(axis=0), 0)
        high_a = np.maximum(d.ad_features.max(axis=0), 0)
        self.observation_space = spaces.Dict(
            {
                "user_id": spaces.Box(0, d.num_users - 1, (1,), np.int64),
                "user_features": spaces.Box(np.zeros(8, np.int64), high_u, (8,), np.int64),
                "ad_features": spaces.Box(np.zeros(5, np.int64), high_a, (5,), np.int64),
                "ad_price": spaces.Box(0.0, max(float(d.ad_price.max()), 0.0), (1,), np.float32),
                "context": spaces.Box(np.array([1, 0]), np.array([2, 6]), (2,), np.int64),
            }
        )
        self.action_space = spaces.Box(0.0, 1.0, (1,), np.float32)
        self._order = np.arange(d.num_users)
        self._cursor = 0
        self._row = 0
        self._end = 0
        self._shuffled = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None or not self._shuffled:
            self._order = self.np_random.permutation(self.data.num_users)
            self._cursor = 0
            self._shuffled = True
        user = None if options is None else options.get("user")
        if user is None:
            user = int(self._order[self._cursor])
            self._cursor = (self._cursor + 1) % self.data.num_users
        elif not 0 <= int(user) < self.data.num_users:
            raise ValueError(f"user must be in [0, {self.data.num_users}), got {user}")
        self._row = int(self.data.indptr[int(user)])
        self._end = int(self.data.indptr[int(user) + 1])
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._row >= self._end:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        score = np.asarray(action, dtype=np.float64).reshape(-1)
        if score.shape != (1,) or not np.isfinite(score[0]):
            raise ValueError(f"action must be one finite score, shape (1,), got {action!r:.80}")
        d, row = self.data, self._row
        info = {
            "action": int(d.ad_ids[row]),
            "position": int(d.context[row, 0]),
            "reward": float(d.clicks[row]),
            "context": np.concatenate([d.user_features[row], d.context[row]]),
            "action_context": np.concatenate([d.ad_features[row], [d.ad_price[row]]]).astype(
                np.float64
            ),
            "score": float(score[0]),
        }
        self._row += 1
        terminated = self._row >= self._end
        obs = self._observation(min(self._row, self._end - 1))
        return obs, float(d.clicks[row]), terminated, False, info

    def _observation(self, row: int | None = None) -> Observation:
        d = self.data
        row = self._row if row is None else row
        return {
            "user_id": np.array([d.user[row]], dtype=np.int64),
            "user_features": d.user_features[row].copy(),
            "ad_features": d.ad_features[row].copy(),
            "ad_price": np.array([d.ad_price[row]], dtype=np.float32),
            "context": d.context[row].copy(),
        }
