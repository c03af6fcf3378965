"""Small synthetic data sets written in each real file format (for tests, examples and smoke runs).

The files are byte-for-byte in the published layouts (separators, headers, encodings, line endings,
quirks such as Taobao's trailing header space and ``NULL`` brands) but the content is random:
users pick items with Zipf-like popularity, timestamps increase per user with deliberate ties at
the latest time, and a few users have fewer than 5 interactions so that filters have work to do.
Nothing here comes from the real data sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedrec.envs.datasets.formats import (
    ML1M_GENRES,
    ML100K_GENRES,
    ML100K_OCCUPATIONS,
    TAOBAO_AD_FEATURE_HEADER,
    TAOBAO_RAW_SAMPLE_HEADER,
    TAOBAO_USER_PROFILE_HEADER,
)


@dataclass(frozen=True)
class SyntheticLog:
    """The generated interactions in file order (raw ids start at 1)."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray


def synthetic_log(
    num_users: int = 40,
    num_items: int = 300,
    *,
    min_per_user: int = 5,
    max_per_user: int = 25,
    sparse_users: int = 2,
    seed: int = 0,
    start: int = 874_724_710,
) -> SyntheticLog:
    """Random interactions: ``num_users`` users (the last ``sparse_users`` with 2-4 items).

    Each user's items are distinct; its last two rows share the latest timestamp (a tie). Rows of
    all users are interleaved by time, as real logs are.
    """
    if max_per_user > num_items or min_per_user < 2:
        raise ValueError("need 2 <= min_per_user <= max_per_user <= num_items")
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, num_items + 1) ** 0.8
    weights /= weights.sum()
    users, items, ratings, stamps = [], [], [], []
    for user in range(1, num_users + 1):
        sparse = user > num_users - sparse_users
        count = (
            int(rng.integers(2, 5)) if sparse else int(rng.integers(min_per_user, max_per_user + 1))
        )
        chosen = rng.choice(num_items, count, replace=False, p=weights) + 1
        times = start + np.sort(rng.integers(0, 10_000_000, count))
        times[-1] = times[-2]  # a tie at the latest timestamp
        users.append(np.full(count, user))
        items.append(chosen)
        ratings.append(rng.integers(1, 6, count))
        stamps.append(times)
    users_a, items_a = np.concatenate(users), np.concatenate(items)
    ratings_a, stamps_a = np.concatenate(ratings), np.concatenate(stamps)
    within = np.concatenate([np.arange(len(chunk)) for chunk in users])
    # interleave users by time; a user's tied rows keep their order (the tie rule's file order)
    order = np.lexsort((within, users_a, stamps_a))
    return SyntheticLog(users_a[order], items_a[order], ratings_a[order], stamps_a[order])


def _write(path: Path, lines: list[str], *, encoding: str = "utf-8", newline: str = "\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((newline.join(lines) + newline).encode(encoding))
    return path


def _genres(rng: np.random.Generator, count: int) -> np.ndarray:
    flags = rng.random((count, len(ML100K_GENRES))) < 0.15
    flags[np.arange(count), rng.integers(1, len(ML100K_GENRES), count)] = True
    flags[:, 0] = False
    return flags


def write_ml100k(directory: Path | str, log: SyntheticLog | None = None, *, seed: int = 0) -> Path:
    """``u.data``, ``u.user`` and ``u.item`` (Latin-1, ``|``-separated) as in ML-100K."""
    directory = Path(directory)
    log = log or synthetic_log(seed=seed)
    rng = np.random.default_rng(seed + 1)
    _write(
        directory / "u.data",
        [
            f"{u}\t{i}\t{r}\t{t}"
            for u, i, r, t in zip(log.users, log.items, log.ratings, log.timestamps, strict=True)
        ],
    )
    users = np.unique(log.users)
    _write(
        directory / "u.user",
        [
            f"{u}|{rng.integers(7, 74)}|{'MF'[rng.integers(2)]}|"
            f"{ML100K_OCCUPATIONS[rng.integers(len(ML100K_OCCUPATIONS))]}|{rng.integers(10000, 99999):05d}"
            for u in users
        ],
    )
    num_items = int(log.items.max())
    flags = _genres(rng, num_items)
    _write(
        directory / "u.item",
        [
            f"{i}|Caf\u00e9 Movie {i} (199{i % 10})|01-Jan-199{i % 10}||"
            f"http://us.imdb.com/M/title-exact?Movie%20{i}|"
            + "|".join(str(int(f)) for f in flags[i - 1])
            for i in range(1, num_items + 1)
        ],
        encoding="latin-1",
    )
    return directory


def write_ml1m(directory: Path | str, log: SyntheticLog | None = None, *, seed: int = 0) -> Path:
    """``ratings.dat``, ``users.dat`` and ``movies.dat`` (``::``-separated, Latin-1) as in ML-1M."""
    directory = Path(directory)
    log = log or synthetic_log(seed=seed)
    rng = np.random.default_rng(seed + 1)
    _write(
        directory / "ratings.dat",
        [
            f"{u}::{i}::{r}::{t}"
            for u, i, r, t in zip(log.users, log.items, log.ratings, log.timestamps, strict=True)
        ],
    )
    ages = (1, 18, 25, 35, 45, 50, 56)
    _write(
        directory / "users.dat",
        [
            f"{u}::{'MF'[rng.integers(2)]}::{ages[rng.integers(7)]}::{rng.integers(21)}::"
            f"{rng.integers(10000, 99999)}"
            for u in np.unique(log.users)
        ],
    )
    num_items = int(log.items.max())
    flags = _genres(rng, num_items)[:, 1:]
    _write(
        directory / "movies.dat",
        [
            f"{i}::Movie {i}, The (19{50 + i % 50})::"
            + "|".join(g for g, f in zip(ML1M_GENRES, flags[i - 1], strict=True) if f)
            for i in range(1, num_items + 1)
        ],
        encoding="latin-1",
    )
    return directory


def write_ml_csv(directory: Path | str, log: SyntheticLog | None = None, *, seed: int = 0) -> Path:
    """``ratings.csv`` with header ``userId,movieId,rating,timestamp`` as in ML-20M/25M."""
    directory = Path(directory)
    log = log or synthetic_log(seed=seed)
    halves = (log.ratings + np.where(log.ratings < 5, 0.5, 0.0) * (log.timestamps % 2)).astype(
        float
    )
    _write(
        directory / "ratings.csv",
        ["userId,movieId,rating,timestamp"]
        + [
            f"{u},{i},{r:.1f},{t}"
            for u, i, r, t in zip(log.users, log.items, halves, log.timestamps, strict=True)
        ],
    )
    return directory


def write_lastfm2k(
    directory: Path | str, log: SyntheticLog | None = None, *, seed: int = 0
) -> Path:
    """``user_taggedartists-timestamps.dat`` (ms, several tags per pair) and ``user_artists.dat``.

    Tab-separated with a header and CRLF line endings, as in the HetRec 2011 release. About a third
    of the (user, artist) pairs get a second tag at a later time, so de-duplication has work to do.
    """
    directory = Path(directory)
    log = log or synthetic_log(seed=seed)
    rng = np.random.default_rng(seed + 1)
    rows = []
    for u, i, t in zip(log.users, log.items, log.timestamps, strict=True):
        rows.append((u, i, int(rng.integers(1, 500)), int(t) * 1000))
        if rng.random() < 0.33:
            rows.append((u, i, int(rng.integers(1, 500)), int(t) * 1000 - 86_400_000))
    _write(
        directory / "user_taggedartists-timestamps.dat",
        ["userID\tartistID\ttagID\ttimestamp"] + [f"{u}\t{i}\t{g}\t{t}" for u, i, g, t in rows],
        newline="\r\n",
    )
    pairs = sorted({(int(u), int(i)) for u, i in zip(log.users, log.items, strict=True)})
    _write(
        directory / "user_artists.dat",
        ["userID\tartistID\tweight"] + [f"{u}\t{i}\t{rng.integers(1, 5000)}" for u, i in pairs],
        newline="\r\n",
    )
    return directory


def write_foursquare_nyc(
    directory: Path | str, log: SyntheticLog | None = None, *, seed: int = 0
) -> Path:
    """``dataset_TSMC2014_NYC.txt``: 8 tab-separated fields, UTC time like ``Tue Apr 03 18:00:09 +0000 2012``."""
    import datetime as dt

    directory = Path(directory)
    log = log or synthetic_log(seed=seed, start=1_333_476_009)
    rng = np.random.default_rng(seed + 1)
    categories = ("Bar", "Café", "Gym / Fitness Center", "Subway", "Home (private)")
    num_items = int(log.items.max())
    venue = [rng.bytes(12).hex() for _ in range(num_items)]
    cat = rng.integers(len(categories), size=num_items)
    lat = 40.6 + 0.3 * rng.random(num_items)
    lon = -74.1 + 0.3 * rng.random(num_items)
    lines = []
    for u, i, t in zip(log.users, log.items, log.timestamps, strict=True):
        when = dt.datetime.fromtimestamp(int(t), tz=dt.UTC).strftime("%a %b %d %H:%M:%S +0000 %Y")
        c = cat[i - 1]
        lines.append(
            f"{u}\t{venue[i - 1]}\t4bf58dd8d48988d1{c:02d}941735\t{categories[c]}\t"
            f"{lat[i - 1]:.9f}\t{lon[i - 1]:.9f}\t-240\t{when}"
        )
    return _write(directory / "dataset_TSMC2014_NYC.txt", lines).parent


def write_atomic(
    directory: Path | str,
    prefix: str = "ml-100k",
    log: SyntheticLog | None = None,
    *,
    seed: int = 0,
) -> Path:
    """RecBole atomic files ``<prefix>.inter``, ``.user``, ``.item`` (as RecBole's bundled ML-100K)."""
    directory = Path(directory)
    log = log or synthetic_log(seed=seed)
    rng = np.random.default_rng(seed + 1)
    _write(
        directory / f"{prefix}.inter",
        ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
        + [
            f"{u}\t{i}\t{r}\t{t}"
            for u, i, r, t in zip(log.users, log.items, log.ratings, log.timestamps, strict=True)
        ],
    )
    _write(
        directory / f"{prefix}.user",
        ["user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token"]
        + [
            f"{u}\t{rng.integers(7, 74)}\t{'MF'[rng.integers(2)]}\t"
            f"{ML100K_OCCUPATIONS[rng.integers(len(ML100K_OCCUPATIONS))]}\t{rng.integers(10000, 99999)}"
            for u in np.unique(log.users)
        ],
    )
    num_items = int(log.items.max())
    flags = _genres(rng, num_items)
    _write(
        directory / f"{prefix}.item",
        ["item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq"]
        + [
            f"{i}\tMovie {i}\t199{i % 10}\t"
            + " ".join(g for g, f in zip(ML100K_GENRES, flags[i - 1], strict=True) if f)
            for i in range(1, num_items + 1)
        ],
    )
    return directory


def write_taobao(
    directory: Path | str,
    *,
    num_users: int = 40,
    num_ads: int = 60,
    impressions_per_user: tuple[int, int] = (3, 15),
    seed: int = 0,
) -> Path:
    """``raw_sample.csv``, ``ad_feature.csv`` and ``user_profile.csv`` with the exact headers.

    Schema-faithful quirks: the user profile header ends with a space; the two ``pid`` values;
    ``NULL`` brands (~29 %); empty ``pvalue_level`` / ``new_user_class_level``; times within
    2017-05-06..13 (Asia/Shanghai); clicks with CTR about 5 % (higher for cheap ads); a few
    impressions of users without a profile and of ads without a feature row.
    """
    directory = Path(directory)
    rng = np.random.default_rng(seed)
    start = 1_494_000_000  # 2017-05-06 00:00 Asia/Shanghai (2017-05-05T16:00Z)
    ads = np.arange(1, num_ads + 1) * 7 + 100
    price = np.round(np.exp(rng.normal(4.0, 1.5, num_ads)), 2) + 0.01
    brand = np.where(
        rng.random(num_ads) < 0.29, "NULL", rng.integers(1000, 9999, num_ads).astype(str)
    )
    _write(
        directory / "ad_feature.csv",
        [",".join(TAOBAO_AD_FEATURE_HEADER)]
        + [
            f"{a},{rng.integers(1, 50)},{rng.integers(1, 300)},{rng.integers(1, 200)},{b},{p:.2f}"
            for a, b, p in zip(ads[:-1], brand[:-1], price[:-1], strict=True)  # last ad: no row
        ],
    )
    users = np.arange(1, num_users + 1) * 13
    profile_lines = [",".join(TAOBAO_USER_PROFILE_HEADER) + " "]
    for u in users[:-1]:  # the last user has no profile row
        pvalue = "" if rng.random() < 0.54 else str(rng.integers(1, 4))
        newcls = "" if rng.random() < 0.32 else str(rng.integers(1, 5))
        profile_lines.append(
            f"{u},{rng.integers(0, 97)},{rng.integers(0, 13)},{rng.integers(1, 3)},"
            f"{rng.integers(0, 7)},{pvalue},{rng.integers(1, 4)},{rng.integers(0, 2)},{newcls}"
        )
    _write(directory / "user_profile.csv", profile_lines)
    rows = []
    appeal = -3.3 - 0.2 * (np.log(price) - 4.0)
    for u in users:
        count = int(rng.integers(*impressions_per_user))
        times = np.sort(start + rng.integers(0, 8 * 86_400, count))
        shown = rng.integers(num_ads, size=count)
        clk = (rng.random(count) < 1 / (1 + np.exp(-appeal[shown]))).astype(int)
        pid = np.where(rng.random(count) < 0.62, "430548_1007", "430539_1007")
        rows += [
            f"{u},{t},{ads[s]},{p},{1 - c},{c}"
            for t, s, p, c in zip(times, shown, pid, clk, strict=True)
        ]
    order = rng.permutation(len(rows))
    _write(
        directory / "raw_sample.csv",
        [",".join(TAOBAO_RAW_SAMPLE_HEADER)] + [rows[i] for i in order],
    )
    return directory


WRITERS = {
    "ml-100k": write_ml100k,
    "ml-1m": write_ml1m,
    "ml-20m": write_ml_csv,
    "ml-25m": write_ml_csv,
    "lastfm-2k": write_lastfm2k,
    "foursquare-nyc": write_foursquare_nyc,
    "taobao-ads": write_taobao,
}


def write_synthetic(name: str, directory: Path | str, *, seed: int = 0, **kwargs: object) -> Path:
    """Write a small synthetic copy of data set ``name`` into ``directory`` (returns it)."""
    if name not in WRITERS:
        raise ValueError(f"no synthetic writer for {name!r}; known: {', '.join(WRITERS)}")
    return WRITERS[name](directory, seed=seed, **kwargs)  # type: ignore[operator]
