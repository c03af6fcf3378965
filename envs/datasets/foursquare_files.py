"""Loader of the Foursquare NYC check-ins (TSMC 2014), with the venues' side features.

Returns a :class:`~fedrec.envs.datasets.logged_dataset.LoggedDataset`; every field is checked by
the parser engine (:mod:`fedrec.envs.datasets.parsing`), and the UTC times become Unix seconds.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from fedrec.envs.datasets.logged_dataset import (
    LoggedDataset,
    category_codes,
    interactions_frame,
)
from fedrec.envs.datasets.parsing import (
    UNIX_SECONDS,
    Field,
    id_field,
    parse_delimited,
    require,
)

FOURSQUARE_TIME_FORMAT = "%a %b %d %H:%M:%S %z %Y"
FOURSQUARE_NAMES = (
    "user",
    "venue",
    "category_id",
    "category",
    "latitude",
    "longitude",
    "tz_offset",
    "utc_time",
)
_HEX_ID = {"kind": "str", "pattern": "[0-9a-fA-F]{24}", "expect": "be a 24-hex-digit Foursquare id"}
FOURSQUARE_FIELDS = (
    id_field("user"),
    Field("venue", **_HEX_ID),
    Field("category_id", **_HEX_ID),
    Field("category", "opt"),
    Field("latitude", "float", low=-90, high=90),
    Field("longitude", "float", low=-180, high=180),
    Field("tz_offset", "int", low=-720, high=840, expect="minutes from UTC"),
    Field(
        "utc_time",
        "str",
        pattern=r"[A-Z][a-z]{2} [A-Z][a-z]{2} [0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2} [+-][0-9]{4} [0-9]{4}",
        expect="look like 'Tue Apr 03 18:00:09 +0000 2012'",
    ),
)


def load_foursquare_nyc(directory: Path) -> LoggedDataset:
    """Foursquare NYC check-ins (Yang et al. 2015): ``dataset_TSMC2014_NYC.txt``, tab-separated.

    Fields: user, venue (24 hex digits), venue-category id (24 hex digits), category name,
    latitude, longitude, timezone offset (minutes) and UTC time ``Tue Apr 03 18:00:09 +0000
    2012``; timestamps become Unix seconds (1995-2099). A venue's features (category, latitude,
    longitude) are those of its first check-in. The file is read as UTF-8, or Latin-1 if it is not
    valid UTF-8.
    """
    directory = Path(directory)
    (data,) = require(directory, "dataset_TSMC2014_NYC.txt")
    raw = data.read_bytes()
    encoding = "utf-8"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        encoding = "latin-1"
    parsed = parse_delimited(data, sep="\t", fields=FOURSQUARE_FIELDS, encoding=encoding)
    log = parsed.frame
    times = log["utc_time"]
    stamps = pd.to_datetime(times, format=FOURSQUARE_TIME_FORMAT, utc=True, errors="coerce")
    parsed.require(
        stamps.notna(),
        lambda row: (
            f"field 'utc_time' must be a valid date like 'Tue Apr 03 18:00:09 +0000 "
            f"2012', got {times.iloc[row]!r}"
        ),
    )
    seconds = (stamps - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)
    low, high = UNIX_SECONDS
    parsed.require(
        (seconds >= low) & (seconds <= high),
        lambda row: (
            f"field 'utc_time' must lie within 1995-01-01 to 2099-12-31, got {times.iloc[row]!r}"
        ),
    )
    venues = log.drop_duplicates("venue").set_index("venue")
    items = pd.DataFrame(
        {
            "category": category_codes(venues["category_id"]).astype(np.float32),
            "latitude": venues["latitude"].to_numpy(np.float32),
            "longitude": venues["longitude"].to_numpy(np.float32),
        },
        index=venues.index,
    )
    return LoggedDataset(
        name="foursquare-nyc",
        interactions=interactions_frame(log["user"], log["venue"], None, seconds),
        files=(data,),
        item_features=items,
    )


def parse_foursquare_time(text: str) -> int:
    """Unix seconds of a Foursquare UTC time string (e.g. ``Tue Apr 03 18:00:09 +0000 2012``)."""
    return int(datetime.strptime(text, FOURSQUARE_TIME_FORMAT).timestamp())
