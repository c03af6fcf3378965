"""One import path for the logged data files' loaders and format rules (it re-exports them).

The code lives in one module per job: the parser engine (:mod:`fedrec.envs.datasets.parsing`:
:class:`Field` rules, :func:`parse_delimited`, :class:`FormatError`), what every loader returns
(:mod:`fedrec.envs.datasets.logged_dataset`: :class:`LoggedDataset`) and one loader module per
data set family: :mod:`~fedrec.envs.datasets.movielens_files` (ML-100K, ML-1M, ML-20M/25M),
:mod:`~fedrec.envs.datasets.recbole_files` (RecBole atomic files),
:mod:`~fedrec.envs.datasets.lastfm_files`, :mod:`~fedrec.envs.datasets.foursquare_files` and
:mod:`~fedrec.envs.datasets.taobao_files`.

Every field of every line is validated against its :class:`Field` rule and keyed files must not
repeat a key; any violation raises :class:`FormatError` naming the file, the 1-based line number
and what was expected. docs/datasets.md ("What the loaders check") lists the rules and what no
loader can detect (a file cut exactly at a line end).
"""

from __future__ import annotations

from fedrec.envs.datasets.foursquare_files import (
    FOURSQUARE_FIELDS,
    FOURSQUARE_NAMES,
    FOURSQUARE_TIME_FORMAT,
    load_foursquare_nyc,
    parse_foursquare_time,
)
from fedrec.envs.datasets.lastfm_files import LASTFM_MILLISECONDS, load_lastfm2k
from fedrec.envs.datasets.logged_dataset import LoggedDataset
from fedrec.envs.datasets.movielens_files import (
    ML1M_GENRES,
    ML100K_GENRES,
    ML100K_OCCUPATIONS,
    load_ml1m,
    load_ml100k,
    load_ml_csv,
)
from fedrec.envs.datasets.parsing import (
    INT64_MAX,
    INT64_MIN,
    UNIX_SECONDS,
    Field,
    FormatError,
    Kind,
    Parsed,
    parse_delimited,
    read_delimited,
    require,
)
from fedrec.envs.datasets.recbole_files import (
    MOVIELENS_ATOMIC,
    load_atomic,
    parse_atomic,
    read_atomic,
)
from fedrec.envs.datasets.taobao_files import (
    TAOBAO_AD_FEATURE_HEADER,
    TAOBAO_PIDS,
    TAOBAO_RAW_SAMPLE_HEADER,
    TAOBAO_USER_PROFILE_HEADER,
    TaobaoLog,
    load_taobao,
)

__all__ = [
    "FOURSQUARE_FIELDS",
    "FOURSQUARE_NAMES",
    "FOURSQUARE_TIME_FORMAT",
    "INT64_MAX",
    "INT64_MIN",
    "LASTFM_MILLISECONDS",
    "ML1M_GENRES",
    "ML100K_GENRES",
    "ML100K_OCCUPATIONS",
    "MOVIELENS_ATOMIC",
    "TAOBAO_AD_FEATURE_HEADER",
    "TAOBAO_PIDS",
    "TAOBAO_RAW_SAMPLE_HEADER",
    "TAOBAO_USER_PROFILE_HEADER",
    "UNIX_SECONDS",
    "Field",
    "FormatError",
    "Kind",
    "LoggedDataset",
    "Parsed",
    "TaobaoLog",
    "load_atomic",
    "load_foursquare_nyc",
    "load_lastfm2k",
    "load_ml1m",
    "load_ml100k",
    "load_ml_csv",
    "load_taobao",
    "parse_atomic",
    "parse_delimited",
    "parse_foursquare_time",
    "read_atomic",
    "read_delimited",
    "require",
]
