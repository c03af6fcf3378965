"""The catalogue of logged data sets: where their files live, how to load them, and a load cache.

Data live under a cache directory, ``$FEDREC_DATA`` (default ``~/.cache/fedrec``), one folder per
data set (``ml-100k/``, ``ml-1m/``, ...). Every function that takes ``data_dir`` accepts either
that cache root or the data set's own folder (or a folder one level above the files, as an
unpacked archive leaves them).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the readers load pandas: imported when a data set is loaded
    from fedrec.envs.datasets.formats import LoggedDataset, TaobaoLog
    from fedrec.envs.datasets.preprocess import PreparedData


def _reader(function: str, **fixed: Any) -> Callable[[Path], LoggedDataset | TaobaoLog]:
    """``fedrec.envs.datasets.formats.FUNCTION`` with ``fixed`` keyword arguments, imported when
    called (``fedrec data list`` reads this catalogue without pandas)."""

    def read(directory: Path) -> LoggedDataset | TaobaoLog:
        from fedrec.envs.datasets import formats

        return getattr(formats, function)(directory, **fixed)

    read.__name__ = read.__qualname__ = function
    return read


load_ml100k, load_ml1m, load_lastfm2k, load_foursquare_nyc, load_taobao = (
    _reader(name)
    for name in ("load_ml100k", "load_ml1m", "load_lastfm2k", "load_foursquare_nyc", "load_taobao")
)

DATA_ENV_VAR = "FEDREC_DATA"


def data_root() -> Path:
    """The cache root: ``$FEDREC_DATA`` or ``~/.cache/fedrec``."""
    return Path(os.environ.get(DATA_ENV_VAR) or Path.home() / ".cache" / "fedrec").expanduser()


@dataclass(frozen=True)
class DatasetSpec:
    """One data set: its files, official source and loader.

    :ivar layouts: alternative sets of files that identify the data set in a folder (the first
        whose files are all present is loaded), each paired with its loader.
    :ivar url: the official download (None where a login is required).
    :ivar md5: the archive's MD5 as published by the source, or None where no checksum is published
        (then the unpacked files' structure is verified instead).
    """

    name: str
    title: str
    layouts: tuple[tuple[tuple[str, ...], Callable[[Path], LoggedDataset | TaobaoLog]], ...]
    homepage: str
    licence: str
    url: str | None = None
    md5: str | None = None
    manual: str = ""

    @property
    def files(self) -> tuple[str, ...]:
        """The files of the first (preferred) layout."""
        return self.layouts[0][0]


def _atomic(prefix: str, name: str) -> Callable[[Path], LoggedDataset]:
    """RecBole's MovieLens atomic files, held to MovieLens's rules (integer ids, 1995-2099 times)."""

    def read(directory: Path) -> LoggedDataset:
        from fedrec.envs.datasets.formats import MOVIELENS_ATOMIC, load_atomic

        return load_atomic(directory, prefix, name=name, **MOVIELENS_ATOMIC)

    return read


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="ml-100k",
            title="MovieLens 100K",
            layouts=(
                (("u.data",), load_ml100k),
                (("ml-100k.inter",), _atomic("ml-100k", "ml-100k")),
            ),
            homepage="https://grouplens.org/datasets/movielens/100k/",
            licence="GroupLens terms: research use, no redistribution, cite Harper & Konstan (2015)",
            url="https://files.grouplens.org/datasets/movielens/ml-100k.zip",
            md5="0e33842e24a9c977be4e0107933c0723",
        ),
        DatasetSpec(
            name="ml-1m",
            title="MovieLens 1M",
            layouts=((("ratings.dat",), load_ml1m), (("ml-1m.inter",), _atomic("ml-1m", "ml-1m"))),
            homepage="https://grouplens.org/datasets/movielens/1m/",
            licence="GroupLens terms: research use, no redistribution, cite Harper & Konstan (2015)",
            url="https://files.grouplens.org/datasets/movielens/ml-1m.zip",
            md5="c4d9eecfca2ab87c1945afe126590906",
        ),
        DatasetSpec(
            name="ml-20m",
            title="MovieLens 20M",
            layouts=((("ratings.csv",), _reader("load_ml_csv", name="ml-20m")),),
            homepage="https://grouplens.org/datasets/movielens/20m/",
            licence="GroupLens terms: research use, no redistribution, cite Harper & Konstan (2015)",
            url="https://files.grouplens.org/datasets/movielens/ml-20m.zip",
            md5="cd245b17a1ae2cc31bb14903e1204af3",
        ),
        DatasetSpec(
            name="ml-25m",
            title="MovieLens 25M",
            layouts=((("ratings.csv",), _reader("load_ml_csv", name="ml-25m")),),
            homepage="https://grouplens.org/datasets/movielens/25m/",
            licence="GroupLens terms: research use, no redistribution, cite Harper & Konstan (2015)",
            url="https://files.grouplens.org/datasets/movielens/ml-25m.zip",
            md5="6b51fb2759a8657d3bfcbfc42b592ada",
        ),
        DatasetSpec(
            name="lastfm-2k",
            title="Lastfm 2K (HetRec 2011)",
            layouts=((("user_taggedartists-timestamps.dat",), load_lastfm2k),),
            homepage="https://grouplens.org/datasets/hetrec-2011/",
            licence="HetRec 2011 terms: non-commercial research use",
            url="https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip",
        ),
        DatasetSpec(
            name="foursquare-nyc",
            title="Foursquare NYC check-ins (TSMC 2014)",
            layouts=((("dataset_TSMC2014_NYC.txt",), load_foursquare_nyc),),
            homepage="https://sites.google.com/site/yangdingqi/home/foursquare-dataset",
            licence="research use; cite Yang et al., IEEE T-SMC 2015",
            url="http://www-public.imtbs-tsp.eu/~zhang_da/pub/dataset_tsmc2014.zip",
        ),
        DatasetSpec(
            name="taobao-ads",
            title="Taobao Ali_Display_Ad_Click (Tianchi 56)",
            layouts=((("raw_sample.csv", "ad_feature.csv", "user_profile.csv"), load_taobao),),
            homepage="https://tianchi.aliyun.com/dataset/56",
            licence="Tianchi terms: research use after login",
            manual="Tianchi requires a logged-in download: get raw_sample.csv, ad_feature.csv and "
            "user_profile.csv from https://tianchi.aliyun.com/dataset/56 (unpack the .tar.gz files)",
        ),
    )
}

#: Aliases accepted on the command line and in env kwargs.
ALIASES = {
    "movielens-100k": "ml-100k",
    "ml100k": "ml-100k",
    "movielens-1m": "ml-1m",
    "ml1m": "ml-1m",
    "lastfm": "lastfm-2k",
    "lastfm2k": "lastfm-2k",
    "foursquare": "foursquare-nyc",
    "taobao": "taobao-ads",
}


def spec_of(name: str) -> DatasetSpec:
    """The catalogue entry of ``name`` (case-insensitive, aliases allowed)."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    return DATASETS[key]


class DatasetNotFoundError(FileNotFoundError):
    """The data set's files are not in the data directory; the message says how to get them."""


def fetch_hint(name: str, data_dir: Path | str | None = None) -> str:
    """The command that fetches ``name`` into ``data_dir`` (or the cache)."""
    target = "" if data_dir is None else f" --dir {data_dir}"
    return f"fedrec data fetch {name}{target}"


def locate(name: str, data_dir: Path | str | None = None) -> tuple[Path, int]:
    """The folder holding data set ``name`` and the index of the layout found there.

    Looks in ``data_dir`` itself, ``data_dir/<name>``, and one level of sub-folders of both
    (hidden ones, such as an unfinished fetch's ``.fetch-*`` staging folder, excepted).
    :raises DatasetNotFoundError: naming the folders searched and the fetch command.
    """
    spec = spec_of(name)
    root = data_root() if data_dir is None else Path(data_dir).expanduser()
    places = [root, root / spec.name]
    for base in list(places):
        if base.is_dir():
            places.extend(
                sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith("."))
            )
    for place in places:
        for index, (files, _) in enumerate(spec.layouts):
            if all((place / f).is_file() for f in files):
                return place, index
    wanted = " or ".join("+".join(files) for files, _ in spec.layouts)
    manual = f" {spec.manual}." if spec.manual else ""
    raise DatasetNotFoundError(
        f"{spec.title} not found under {root} (looked for {wanted} in {root} and "
        f"{root / spec.name}). Get it with `{fetch_hint(spec.name, data_dir)}`, or place the files "
        f"in {root / spec.name} by hand.{manual}"
    )


def load(name: str, data_dir: Path | str | None = None) -> LoggedDataset | TaobaoLog:
    """Load data set ``name`` from ``data_dir`` (see :func:`locate`)."""
    spec = spec_of(name)
    folder, index = locate(spec.name, data_dir)
    return spec.layouts[index][1](folder)


def _signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    return tuple(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
        if p.is_file()
    )


@functools.lru_cache(maxsize=8)
def _prepared_cached(
    name: str,
    folder: str,
    index: int,
    signature: tuple,
    min_interactions: int,
    rating_threshold: float | None,
    num_test_negatives: int,
    seed: int,
) -> PreparedData:
    from fedrec.envs.datasets.formats import LoggedDataset
    from fedrec.envs.datasets.preprocess import prepare

    dataset = DATASETS[name].layouts[index][1](Path(folder))
    assert isinstance(dataset, LoggedDataset)
    return prepare(
        dataset,
        min_interactions=min_interactions,
        rating_threshold=rating_threshold,
        num_test_negatives=num_test_negatives,
        seed=seed,
    )


def load_prepared(
    name: str,
    data_dir: Path | str | None = None,
    *,
    min_interactions: int = 5,
    rating_threshold: float | None = None,
    num_test_negatives: int = 100,
    seed: int = 0,
) -> PreparedData:
    """Load and preprocess an interaction data set (cached per process while the files are unchanged).

    The result is shared between callers (e.g. the copies of a ``SyncVectorEnv``): treat it as
    read-only.
    """
    spec = spec_of(name)
    if spec.name == "taobao-ads":
        raise ValueError("taobao-ads is an impression log; use load_taobao_prepared")
    folder, index = locate(spec.name, data_dir)
    return _prepared_cached(
        spec.name,
        str(folder.resolve()),
        index,
        _signature(folder),
        min_interactions,
        rating_threshold,
        num_test_negatives,
        seed,
    )
