"""The FedNCF protocol: filters that report, the leave-one-out tie rule, fixed negatives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedrec.envs.datasets.formats import LoggedDataset
from fedrec.envs.datasets.preprocess import (
    Statistics,
    prepare,
    sample_training_negatives,
)
from fedrec.envs.datasets.synthetic import synthetic_log


def _dataset(rows: list[tuple[int, int, float, int]], name: str = "toy") -> LoggedDataset:
    frame = pd.DataFrame(rows, columns=["user", "item", "rating", "timestamp"])
    return LoggedDataset(name=name, interactions=frame, files=())


def _synthetic(seed: int = 0, **kwargs: int) -> LoggedDataset:
    log = synthetic_log(seed=seed, **kwargs)
    return _dataset(list(zip(log.users, log.items, log.ratings, log.timestamps, strict=True)))


# user 7: five items, the last two share the latest timestamp -> the later file row (item 15) is test
# user 8: item 21 logged twice; the later duplicate (time 50) is kept, so 21 is its test item
# user 9: only 3 items -> removed by the minimum-activity filter
ROWS = [
    (7, 11, 4.0, 10),
    (8, 21, 5.0, 5),
    (7, 12, 3.0, 20),
    (9, 31, 1.0, 1),
    (7, 13, 2.0, 30),
    (8, 22, 1.0, 6),
    (7, 14, 5.0, 40),
    (8, 23, 2.0, 7),
    (7, 15, 1.0, 40),
    (8, 24, 2.0, 8),
    (9, 32, 1.0, 2),
    (8, 25, 3.0, 9),
    (8, 21, 4.0, 50),
    (9, 33, 1.0, 3),
]


def test_leave_one_out_tie_rule_and_deduplication() -> None:
    data = prepare(_dataset(ROWS), num_test_negatives=3)
    raw_items = data.item_ids
    assert list(data.user_ids) == [7, 8]
    test = raw_items[data.test_items]
    assert list(test) == [15, 21]  # tie -> later file row; duplicate -> latest occurrence
    assert list(raw_items[data.positives(0)]) == [11, 12, 13, 14, 15]
    assert list(raw_items[data.positives(1)]) == [22, 23, 24, 25, 21]
    assert int(data.train_mask.sum()) == 8


def test_filters_report_what_they_removed() -> None:
    data = prepare(_dataset(ROWS), num_test_negatives=3)
    implicit, dedup, minimum = data.report
    assert implicit.rows_removed == 0
    assert (dedup.rows_before, dedup.rows_after) == (14, 13)
    assert (minimum.rows_removed, minimum.users_before, minimum.users_after) == (3, 3, 2)
    assert "removed 3 of 13 rows, 1 of 3 users" in str(minimum)
    thresholded = prepare(
        _dataset(ROWS), rating_threshold=2.0, min_interactions=3, num_test_negatives=3
    )
    assert thresholded.report[0].rows_removed == sum(r[2] < 2.0 for r in ROWS)
    assert "ratings >= 2.0" in str(thresholded.report[0])


def test_test_negatives_fixed_by_seed_distinct_and_disjoint_from_positives() -> None:
    dataset = _synthetic(num_items=400)
    a, b, c = prepare(dataset, seed=5), prepare(dataset, seed=5), prepare(dataset, seed=6)
    np.testing.assert_array_equal(a.test_negatives, b.test_negatives)
    np.testing.assert_array_equal(a.eval_candidates, b.eval_candidates)
    assert not np.array_equal(a.test_negatives, c.test_negatives)
    assert a.test_negatives.shape == (a.num_users, 100)
    for user in range(a.num_users):
        negatives = a.test_negatives[user]
        assert len(np.unique(negatives)) == 100
        assert not np.isin(negatives, a.positives(user)).any()
    # candidates: the held-out item at eval_target, then exactly the negatives
    rows = np.arange(a.num_users)
    np.testing.assert_array_equal(a.eval_candidates[rows, a.eval_target], a.test_items)
    assert np.bincount(a.eval_target, minlength=101).max() < a.num_users  # shuffled positions


def test_too_few_items_for_negatives_is_an_error() -> None:
    with pytest.raises(ValueError, match="fewer than the 100 test negatives"):
        prepare(_dataset(ROWS))
    with pytest.raises(ValueError, match="min_interactions must be >= 2"):
        prepare(_dataset(ROWS), min_interactions=1)


def test_training_negatives_four_per_positive_resampled_each_epoch() -> None:
    data = prepare(_synthetic(num_items=400))
    rng = np.random.default_rng(0)
    first = sample_training_negatives(data, rng)
    second = sample_training_negatives(data, rng)
    train_users, _ = data.train()
    assert len(first.labels) == 5 * len(train_users)
    assert first.labels.sum() == len(train_users)
    negatives = first.labels == 0
    assert not data.is_positive(first.users[negatives], first.items[negatives]).any()
    assert data.is_positive(first.users[~negatives], first.items[~negatives]).all()
    assert not np.array_equal(np.sort(first.items), np.sort(second.items))


def test_statistics_match_a_hand_count() -> None:
    stats = Statistics.of(np.array([1, 1, 1, 2]), np.array([5, 6, 7, 5]))
    assert (stats.users, stats.items, stats.interactions) == (2, 3, 4)
    assert stats.sparsity == pytest.approx(1 - 4 / 6)
    assert (stats.per_user_min, stats.per_user_max, stats.per_user_mean) == (1, 3, 2.0)
    assert stats.per_user_std == pytest.approx(np.std([3, 1]))


def test_duplicated_feature_rows_are_a_clear_error() -> None:
    """A hand-built data set with two rows for one user failed in pandas' reindex before."""
    dataset = _dataset(ROWS)
    dataset.user_features = pd.DataFrame({"age": [1.0, 2.0, 3.0]}, index=[7, 8, 7])
    with pytest.raises(ValueError, match=r"toy: the user features have more than one row .*\[7\]"):
        prepare(dataset, num_test_negatives=3)
