"""A schema-faithful synthetic Taobao ad-click data set whose click model differs across user groups.

:func:`write_taobao_groups` writes ``raw_sample.csv``, ``ad_feature.csv`` and ``user_profile.csv``
in the published Ali_Display_Ad_Click layout (the exact headers, the profile header's trailing
space, the two ``pid`` values, ``NULL`` brands, empty ``pvalue_level`` / ``new_user_class_level``
fields, times within 2017-05-06..13 Asia/Shanghai, a few impressions whose user has no profile row
or whose ad has no feature row), so :func:`fedrec.envs.datasets.taobao.load_taobao_prepared` and
the ``fedrec/TaobaoAds-v0`` env read it unchanged. Unlike the small fixture of
:func:`fedrec.envs.datasets.synthetic.write_taobao`, its scale is configurable and its clicks
follow a known model in which **user groups disagree**: a user's group is its
(``final_gender_code``, age band) pair, with age bands ``age_level`` 0-2, 3-4 and 5-6, so there are
6 groups. The click logit of user u (group g) on ad a is

    base + quality[a] + group_scale * pref[g, cate[a]] + slope[g] * (log price[a] - 4) + pid effect

with ``pref[g]`` an independent standard-normal preference per group over the categories and
``slope[g]`` a per-group price sensitivity (half the groups like cheap ads, half expensive ones);
``base`` is set so that the mean click rate is ``ctr`` (5 % by default, as in the real log). A
single model over user and ad features needs user x ad interactions to fit this; one model per
group does not, which is what makes public-feature clustering matter (``docs/fel.md``). Nothing
here comes from the real data set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedrec.envs.datasets.formats import (
    TAOBAO_AD_FEATURE_HEADER,
    TAOBAO_PIDS,
    TAOBAO_RAW_SAMPLE_HEADER,
    TAOBAO_USER_PROFILE_HEADER,
)

#: 2017-05-06 00:00 Asia/Shanghai, the first second of the real log.
START = 1_494_000_000
#: The number of groups the click model distinguishes: 2 genders x 3 age bands.
NUM_GROUPS = 6


def age_band(age_level: np.ndarray) -> np.ndarray:
    """Age band 0 (``age_level`` 0-2), 1 (3-4) or 2 (5-6)."""
    return np.digitize(np.asarray(age_level), [3, 5])


def group_of(gender: np.ndarray, age_level: np.ndarray) -> np.ndarray:
    """The click model's group of users with raw ``final_gender_code`` (1, 2) and ``age_level``."""
    return (np.asarray(gender) - 1) * 3 + age_band(age_level)


@dataclass(frozen=True)
class TaobaoGroupTruth:
    """What :func:`write_taobao_groups` drew (for tests and for reading results)."""

    user_ids: np.ndarray  # raw user id of each generated user
    group: np.ndarray  # its click-model group (0..5)
    base: float  # the calibrated intercept
    ctr: float  # the realised click rate over all impressions written


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _write_csv(path: Path, header: str, frame: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = frame.to_csv(header=False, index=False, lineterminator="\n")
    path.write_text(header + "\n" + body, encoding="utf-8")


def write_taobao_groups(
    directory: Path | str,
    *,
    num_users: int = 2000,
    num_ads: int = 400,
    num_categories: int = 12,
    impressions_per_user: tuple[int, int] = (20, 60),
    ctr: float = 0.05,
    group_scale: float = 1.5,
    seed: int = 0,
    return_truth: bool = False,
) -> Path | tuple[Path, TaobaoGroupTruth]:
    """Write the three Taobao files with the group-dependent click model above (seeded).

    ``impressions_per_user`` is the half-open range of impressions per user; the last user has no
    profile row and the last ad no feature row (the real log's missing joins). Returns the
    directory, and with ``return_truth=True`` also a :class:`TaobaoGroupTruth`.
    """
    if num_users < 2 or num_ads < 2 or num_categories < 1:
        raise ValueError("need num_users >= 2, num_ads >= 2 and num_categories >= 1")
    if not 0.0 < ctr < 1.0:
        raise ValueError(f"ctr must be in (0, 1), got {ctr}")
    low, high = impressions_per_user
    if not 1 <= low < high:
        raise ValueError(
            f"impressions_per_user must be (low, high) with 1 <= low < high, got {impressions_per_user}"
        )
    directory = Path(directory)
    rng = np.random.default_rng(seed)

    # ads: category, campaign, customer, brand (29 % NULL), price (log-normal around e^4)
    ads = np.arange(1, num_ads + 1) * 7 + 100
    cate = rng.integers(1, num_categories + 1, num_ads)
    campaign = rng.integers(1, max(2, num_ads // 2), num_ads)
    customer = rng.integers(1, max(2, num_ads // 3), num_ads)
    brand = np.where(
        rng.random(num_ads) < 0.29, "NULL", rng.integers(1000, 9999, num_ads).astype(str)
    )
    price = np.round(np.exp(rng.normal(4.0, 1.2, num_ads)), 2) + 0.01
    _write_csv(
        directory / "ad_feature.csv",
        ",".join(TAOBAO_AD_FEATURE_HEADER),
        pd.DataFrame(
            {
                "adgroup_id": ads,
                "cate_id": cate,
                "campaign_id": campaign,
                "customer": customer,
                "brand": brand,
                "price": [f"{p:.2f}" for p in price],
            }
        ).iloc[:-1],  # the last ad has no feature row
    )

    # users: the 8 profile fields; empty pvalue_level (54 %) and new_user_class_level (32 %)
    users = np.arange(1, num_users + 1) * 13
    gender = rng.integers(1, 3, num_users)
    age = rng.integers(0, 7, num_users)
    profile = pd.DataFrame(
        {
            "userid": users,
            "cms_segid": rng.integers(0, 97, num_users),
            "cms_group_id": (gender - 1) * 6 + np.minimum(age, 5) + 1,  # as in the real log
            "final_gender_code": gender,
            "age_level": age,
            "pvalue_level": np.where(
                rng.random(num_users) < 0.54, "", rng.integers(1, 4, num_users).astype(str)
            ),
            "shopping_level": rng.integers(1, 4, num_users),
            "occupation": rng.integers(0, 2, num_users),
            "new_user_class_level": np.where(
                rng.random(num_users) < 0.32, "", rng.integers(1, 5, num_users).astype(str)
            ),
        }
    )
    _write_csv(
        directory / "user_profile.csv",
        ",".join(TAOBAO_USER_PROFILE_HEADER) + " ",  # the real header's trailing space
        profile.iloc[:-1],  # the last user has no profile row
    )

    # the click model
    group = group_of(gender, age)
    pref = rng.normal(0.0, 1.0, (NUM_GROUPS, num_categories + 1))
    slope = np.where(np.arange(NUM_GROUPS) % 2 == 0, -0.6, 0.6) * rng.uniform(0.7, 1.3, NUM_GROUPS)
    quality = rng.normal(0.0, 0.4, num_ads)
    counts = rng.integers(low, high, num_users)
    who = np.repeat(np.arange(num_users), counts)
    shown = rng.integers(num_ads, size=len(who))
    pid = (rng.random(len(who)) >= 0.62).astype(int)  # 62 % the first pid, as in the real log
    g = group[who]
    logit = (
        quality[shown]
        + group_scale * pref[g, cate[shown]]
        + slope[g] * (np.log(price[shown]) - 4.0)
        + 0.2 * (pid == 0)
    )
    lo, hi = -20.0, 20.0  # the intercept that gives the target click rate (bisection)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _sigmoid(mid + logit).mean() < ctr else (lo, mid)
    base = (lo + hi) / 2
    clk = (rng.random(len(who)) < _sigmoid(base + logit)).astype(int)
    times = START + rng.integers(0, 8 * 86_400, len(who))
    order = rng.permutation(len(who))  # the real file is not sorted by user
    _write_csv(
        directory / "raw_sample.csv",
        ",".join(TAOBAO_RAW_SAMPLE_HEADER),
        pd.DataFrame(
            {
                "user": users[who],
                "time_stamp": times,
                "adgroup_id": ads[shown],
                "pid": np.asarray(TAOBAO_PIDS)[pid],
                "nonclk": 1 - clk,
                "clk": clk,
            }
        ).iloc[order],
    )
    if return_truth:
        return directory, TaobaoGroupTruth(users, group, float(base), float(clk.mean()))
    return directory
