"""Loader of Lastfm 2K (HetRec 2011): the timed tag assignments as the interaction log.

Returns a :class:`~fedrec.envs.datasets.logged_dataset.LoggedDataset` (timestamps in ms); every
field is checked by the parser engine (:mod:`fedrec.envs.datasets.parsing`).
"""

from __future__ import annotations

from pathlib import Path

from fedrec.envs.datasets.logged_dataset import LoggedDataset, interactions_frame
from fedrec.envs.datasets.parsing import (
    Field,
    id_field,
    parse_delimited,
    read_delimited,
    require,
)

#: Plausible Unix milliseconds of a Lastfm tag assignment: 1900-01-01 to 2099-12-31 (the HetRec
#: file has tag times as early as 1956, before the Unix epoch, so the bound is wide).
LASTFM_MILLISECONDS = (-2_208_988_800_000, 4_102_444_799_999)


def load_lastfm2k(directory: Path) -> LoggedDataset:
    """Lastfm 2K (HetRec 2011): tag assignments with timestamps as the timed interaction log.

    Leave-one-out needs timestamps, which only ``user_taggedartists-timestamps.dat`` (userID,
    artistID, tagID, timestamp in ms; tab-separated, CRLF) has. Each row is one tag a user gave an
    artist; de-duplication to (user, artist) pairs happens in preprocessing, which reports both
    counts. ``user_artists.dat`` (listening weights), when present, is read and validated (one row
    per user and artist) and its pair count noted, but it is not the log (it has no time).
    """
    directory = Path(directory)
    (data,) = require(directory, "user_taggedartists-timestamps.dat")
    low, high = LASTFM_MILLISECONDS
    stamp = Field(
        "timestamp", "int", low=low, high=high, expect="Unix milliseconds, 1900-01-01 to 2099-12-31"
    )
    log = read_delimited(
        data,
        sep="\t",
        fields=(id_field("userID"), id_field("artistID"), id_field("tagID"), stamp),
        header="auto",
    )
    notes = [f"{len(log):,} tag assignments (one row per user, artist and tag)"]
    files = [data]
    if (directory / "user_artists.dat").is_file():
        path = directory / "user_artists.dat"
        parsed = parse_delimited(
            path,
            sep="\t",
            fields=(id_field("userID"), id_field("artistID"), id_field("weight")),
            header="auto",
        )
        parsed.require_unique(["userID", "artistID"], "(userID, artistID) pair")
        notes.append(
            f"user_artists.dat: {len(parsed.frame):,} user-artist listening pairs (no time)"
        )
        files.append(path)
    return LoggedDataset(
        name="lastfm-2k",
        interactions=interactions_frame(log["userID"], log["artistID"], None, log["timestamp"]),
        files=tuple(files),
        timestamp_unit="ms",
        notes=notes,
    )
