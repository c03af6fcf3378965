"""Loader of the Taobao display-ad click files (Ali_Display_Ad_Click): impressions, ads, users.

:func:`load_taobao` validates the three files and returns them as a :class:`TaobaoLog`; the
environment that replays them is :mod:`fedrec.envs.datasets.taobao`. Every field is checked by the
parser engine (:mod:`fedrec.envs.datasets.parsing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedrec.envs.datasets.parsing import (
    Field,
    id_field,
    one_of,
    parse_delimited,
    require,
    unix_seconds_field,
)

TAOBAO_RAW_SAMPLE_HEADER = ("user", "time_stamp", "adgroup_id", "pid", "nonclk", "clk")
TAOBAO_AD_FEATURE_HEADER = ("adgroup_id", "cate_id", "campaign_id", "customer", "brand", "price")
TAOBAO_USER_PROFILE_HEADER = (
    "userid",
    "cms_segid",
    "cms_group_id",
    "final_gender_code",
    "age_level",
    "pvalue_level",
    "shopping_level",
    "occupation",
    "new_user_class_level",
)


@dataclass
class TaobaoLog:
    """The three Taobao display-ad files, validated, with headers as published (stripped)."""

    impressions: pd.DataFrame  # user, time_stamp, adgroup_id, pid, nonclk, clk (file order)
    ads: pd.DataFrame  # adgroup_id, cate_id, campaign_id, customer, brand ("NULL" kept), price
    users: pd.DataFrame  # userid and the 8 profile columns (strings; "" = empty)
    files: tuple[Path, ...]


TAOBAO_PIDS = ("430548_1007", "430539_1007")


def load_taobao(directory: Path) -> TaobaoLog:
    """Taobao Ali_Display_Ad_Click: ``raw_sample.csv``, ``ad_feature.csv``, ``user_profile.csv``.

    Checks the exact headers (``user_profile.csv``'s trailing space is stripped); ids are
    non-negative integers, ``time_stamp`` Unix seconds (1995-2099), ``pid`` one of the two
    positions, ``clk`` 0 or 1 and ``nonclk = 1 - clk`` on every row; ``brand`` is an integer or
    ``NULL``, ``price`` a finite number >= 0; the profile fields are integers or empty; each ad
    and each user has at most one feature row.
    """
    directory = Path(directory)
    sample_path, ad_path, user_path = require(
        directory, "raw_sample.csv", "ad_feature.csv", "user_profile.csv"
    )
    flag = {"kind": "int", "low": 0, "high": 1, "expect": "0 or 1"}
    parsed = parse_delimited(
        sample_path,
        sep=",",
        fields=(
            id_field("user"),
            unix_seconds_field("time_stamp"),
            id_field("adgroup_id"),
            Field(
                "pid", "str", pattern=one_of(TAOBAO_PIDS), expect="be " + " or ".join(TAOBAO_PIDS)
            ),
            Field("nonclk", **flag),
            Field("clk", **flag),
        ),
        header=TAOBAO_RAW_SAMPLE_HEADER,
    )
    impressions = parsed.frame
    clk, nonclk = impressions["clk"].to_numpy(), impressions["nonclk"].to_numpy()
    parsed.require(
        np.isin(clk, (0, 1)) & (nonclk == 1 - clk),
        lambda row: (
            f"expected clk in {{0, 1}} and nonclk = 1 - clk, got clk={clk[row]}, "
            f"nonclk={nonclk[row]}"
        ),
    )
    parsed = parse_delimited(
        ad_path,
        sep=",",
        fields=(
            *(id_field(name) for name in TAOBAO_AD_FEATURE_HEADER[:4]),
            Field("brand", "str", pattern="NULL|[0-9]+", expect="be an integer or NULL"),
            Field("price", "float", low=0),
        ),
        header=TAOBAO_AD_FEATURE_HEADER,
    )
    parsed.require_unique(["adgroup_id"], "adgroup_id")
    ads = parsed.frame
    code = {"kind": "opt", "pattern": "[0-9]*", "expect": "be an integer code or empty"}
    parsed = parse_delimited(
        user_path,
        sep=",",
        fields=(
            id_field("userid"),
            *(Field(name, **code) for name in TAOBAO_USER_PROFILE_HEADER[1:]),
        ),
        header=TAOBAO_USER_PROFILE_HEADER,
    )
    parsed.require_unique(["userid"], "userid")
    return TaobaoLog(
        impressions=impressions,
        ads=ads,
        users=parsed.frame,
        files=(sample_path, ad_path, user_path),
    )
