"""Click-prediction data (FEL's input): per-sample sparse codes, dense features, labels, clients.

Data preparation only (the ``envs`` layer): the FEL model (:mod:`fedrec.agents.fel_model`), its
trainer (:mod:`fedrec.train.fel`) and its Flower apps read it.

:class:`ClickData` holds one row per impression (or rating), sorted by client, with CSR offsets per
client, the clients' **public** features (the only input of clustering) and a train/test flag.
Two builders:

- :func:`click_data_from_taobao`: Taobao Ali_Display_Ad_Click impressions (real files or
  :func:`fedrec.envs.datasets.taobao_synthetic.write_taobao_groups`). Label = ``clk``. Train = days
  1-7, test = 2017-05-13 (Asia/Shanghai), the standard split. Sparse fields: the 8 profile fields,
  adgroup / cate / campaign / customer / brand (ids hashed into ``hash_buckets``), pid and day of
  week; dense: standardised log(1 + price). Public features: the 8 profile fields (0 = empty or no
  profile row). The user id is not a feature.
- :func:`click_data_from_ml100k`: MovieLens-100K as a click task. Every rating is an impression;
  label = 1 if the rating is >= ``positive_threshold`` (4 stars) else 0, so no negatives are
  sampled. Split per user by time: each user's latest ``test_fraction`` of ratings (at least one,
  ties in file order) are the test rows. Sparse fields: gender, age band, occupation, item id;
  dense: the 19 genre flags. Public features: gender, age band (<18, 18-24, 25-34, 35-44, 45-49,
  50-55, 56+, as ML-1M), occupation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: ML-1M's age bands, used for ML-100K's ages in years: [lower bounds of bands 1..6].
ML_AGE_BOUNDS = (18, 25, 35, 45, 50, 56)


@dataclass(frozen=True)
class ClickData:
    """Samples sorted by client (CSR ``indptr``), with the clients' public features."""

    sparse: np.ndarray  # (M, F) int64 codes, each field's codes in [0, field_sizes[f])
    dense: np.ndarray  # (M, D) float32
    label: np.ndarray  # (M,) float32, 0 or 1
    client: np.ndarray  # (M,) int64 client of each sample (sorted)
    is_test: np.ndarray  # (M,) bool
    indptr: np.ndarray  # (U + 1,) int64 CSR offsets of each client's samples
    field_sizes: tuple[int, ...]
    field_names: tuple[str, ...]
    dense_names: tuple[str, ...]
    public: np.ndarray  # (U, P) int64 public (clustering) features of each client
    public_names: tuple[str, ...]

    @property
    def num_clients(self) -> int:
        return len(self.indptr) - 1

    @property
    def offsets(self) -> np.ndarray:
        """Start of each field in the concatenated vocabulary (one shared embedding table)."""
        return np.concatenate([[0], np.cumsum(self.field_sizes)[:-1]]).astype(np.int64)

    @property
    def vocab_size(self) -> int:
        return int(sum(self.field_sizes))

    def public_column(self, name: str) -> np.ndarray:
        if name not in self.public_names:
            raise ValueError(f"no public feature {name!r}; known: {', '.join(self.public_names)}")
        return self.public[:, self.public_names.index(name)]


def _build(
    client: np.ndarray,
    order_key: np.ndarray,
    sparse: np.ndarray,
    dense: np.ndarray,
    label: np.ndarray,
    is_test: np.ndarray,
    num_clients: int,
    **meta: object,
) -> ClickData:
    order = np.lexsort((np.arange(len(client)), order_key, client))
    counts = np.bincount(client, minlength=num_clients)
    sizes = tuple(int(s) for s in sparse.max(axis=0) + 1) if len(sparse) else ()
    return ClickData(
        sparse=sparse[order].astype(np.int64),
        dense=dense[order].astype(np.float32),
        label=label[order].astype(np.float32),
        client=client[order].astype(np.int64),
        is_test=is_test[order],
        indptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        field_sizes=sizes,
        **meta,  # type: ignore[arg-type]
    )


def click_data_from_taobao(
    data_dir: str | Path | None = None, *, hash_buckets: int = 1000
) -> ClickData:
    """Taobao impressions as :class:`ClickData` (see the module docstring for the definitions)."""
    from fedrec.envs.datasets.taobao import (
        AD_FIELDS,
        TEST_DAY_START,
        USER_FIELDS,
        load_taobao_prepared,
    )

    data = load_taobao_prepared(data_dir, "all")
    ads = data.ad_features.copy()
    ads = np.where(ads > 0, (ads - 1) % (hash_buckets - 1) + 1, 0)  # keep 0 = missing
    sparse = np.column_stack([data.user_features, ads, data.context])
    price = data.ad_price.astype(np.float64)
    dense = ((price - price.mean()) / (price.std() + 1e-8))[:, None]
    first = data.indptr[:-1]
    return _build(
        data.user,
        data.timestamps,
        sparse,
        dense,
        data.clicks,
        data.timestamps >= TEST_DAY_START,
        data.num_users,
        field_names=(*USER_FIELDS, *AD_FIELDS, "pid", "day_of_week"),
        dense_names=("log_price",),
        public=data.user_features[first],
        public_names=tuple(USER_FIELDS),
    )


def _genre_flags(item_features, genres: Sequence[str]) -> np.ndarray:
    """(items, G) 0/1 genre flags: ``u.item``'s genre columns, or RecBole's multi-hot ``class``
    tokens (``class=Action``, ...) of its atomic ``.item`` file, where a genre no item has is
    absent (all zeros)."""
    if all(genre in item_features.columns for genre in genres):
        return item_features[list(genres)].fillna(0).to_numpy(np.float32)
    if any(str(column).startswith("class=") for column in item_features.columns):
        flags = np.zeros((len(item_features), len(genres)), np.float32)
        for j, genre in enumerate(genres):
            if f"class={genre}" in item_features.columns:
                flags[:, j] = item_features[f"class={genre}"].fillna(0).to_numpy(np.float32)
        return flags
    raise ValueError(
        f"ML-100K item features have no genre flags (columns: {list(item_features.columns)})"
    )


def click_data_from_ml100k(
    data_dir: str | Path | None = None,
    *,
    positive_threshold: float = 4.0,
    test_fraction: float = 0.2,
) -> ClickData:
    """MovieLens-100K ratings as :class:`ClickData` (see the module docstring for the definitions)."""
    from fedrec.envs.datasets.catalog import load
    from fedrec.envs.datasets.formats import ML100K_GENRES

    dataset = load("ml-100k", data_dir)
    if dataset.user_features is None or dataset.item_features is None:
        raise ValueError("ML-100K needs u.user and u.item for FEL's features")
    log = dataset.interactions
    users, client = np.unique(log["user"].to_numpy(), return_inverse=True)
    items, item = np.unique(log["item"].to_numpy(), return_inverse=True)
    feats = dataset.user_features.reindex(users)
    gender = feats["gender"].fillna(0).to_numpy(np.int64) + 1  # 1 = M, 2 = F
    age = np.digitize(feats["age"].fillna(0).to_numpy(), ML_AGE_BOUNDS) + 1  # 1..7
    occupation = feats["occupation"].fillna(-1).to_numpy(np.int64) + 1  # 0 = unknown
    public = np.column_stack([gender, age, occupation]).astype(np.int64)
    genres = _genre_flags(dataset.item_features.reindex(items), ML100K_GENRES)
    stamps = log["timestamp"].to_numpy()
    # rank of each rating within its user by (time, file order); the latest ones are the test
    order = np.lexsort((np.arange(len(log)), stamps, client))
    counts = np.bincount(client, minlength=len(users))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(log), np.int64)
    rank[order] = np.arange(len(log)) - np.repeat(starts, counts)
    num_test = np.maximum(1, np.round(test_fraction * counts)).astype(np.int64)
    is_test = rank >= (counts - num_test)[client]
    sparse = np.column_stack([public[client], item + 1])
    return _build(
        client,
        stamps,
        sparse,
        genres[item],
        (log["rating"].to_numpy() >= positive_threshold).astype(np.float32),
        is_test,
        len(users),
        field_names=("gender", "age_band", "occupation", "item"),
        dense_names=tuple(ML100K_GENRES),
        public=public,
        public_names=("gender", "age_band", "occupation"),
    )
