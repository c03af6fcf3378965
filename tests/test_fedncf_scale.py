"""benchmarks/fedncf_scale.py: the quick run reports every point, the synthetic data is valid."""

from __future__ import annotations

import csv
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from fedrec.train.fedncf import round_rng, sample_round

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fedncf_scale.py"


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    """The benchmark script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("fedncf_scale", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_quick_run_reports_every_point(scale: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "scale.md"
    argv = ["--quick", "--in-process", "--models", "gmf", "neumf", "--out", str(out)]
    points = scale.main(argv)
    args = scale.parse_args(argv)
    expected = {(m, u, c) for m in args.models for u in args.users for c in args.clients_per_round}
    assert len(expected) == 8
    assert {(p.model, p.users, p.clients_per_round) for p in points} == expected

    with open(out.with_suffix(".csv"), newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert {(r["model"], int(r["users"]), int(r["clients_per_round"])) for r in rows} == expected
    for row in rows:
        for name in (
            "s_per_round_median",
            "s_per_round_min",
            "s_per_round_max",
            "s_per_global_round",
            "s_per_global_round_by_work",
            "s_per_1k_examples",
            "examples_per_round",
            "data_mib",
            "peak_rss_mib",
            "round_traced_mib",
        ):
            value = float(row[name])
            assert math.isfinite(value) and value > 0, (name, row)
        assert float(row["s_per_round_min"]) <= float(row["s_per_round_median"])
        assert float(row["s_per_round_median"]) <= float(row["s_per_round_max"])
        assert int(row["rounds_per_global"]) == math.ceil(
            int(row["users"]) / min(int(row["clients_per_round"]), int(row["users"]))
        )

    text = out.read_text(encoding="utf-8")
    table = [
        line for line in text.splitlines() if line.startswith("| GMF") or line.startswith("| NEUMF")
    ]
    assert len(table) == len(expected)
    for model in ("GMF", "NEUMF"):
        assert f"**{model}: " in text and "linear in the work" in text

    # the default mode: one point in its own process, results passed back as JSON
    spec = scale.PointSpec("gmf", 30, 6, rounds=1, warmup=0, repeats=1, shape=scale.QUICK_SHAPE)
    point = scale.measure_in_subprocess(spec)
    assert point.isolated and point.users == 30 and point.clients_actual == 6
    assert point.median > 0 and point.peak_rss_mib > 0 and point.round_traced_mib > 0


def test_synthetic_clients_shape_and_indices(scale: ModuleType) -> None:
    users = 400
    data = scale.synthetic_clients(users, seed=3)
    items = scale.ML100K_ITEMS
    assert data.num_items == items
    assert data.positives_indptr.shape == data.train_indptr.shape == (users + 1,)
    counts = np.diff(data.positives_indptr)
    assert np.array_equal(np.diff(data.train_indptr), counts - 1)  # one held-out item each
    assert counts.min() >= scale.ML100K_MIN and counts.max() <= scale.ML100K_MAX
    assert 70 < counts.mean() < 150  # about ML-100K's 106
    assert len(data.positives_sorted) == data.positives_indptr[-1]
    assert len(data.train_items) == data.train_indptr[-1]
    for array in (data.positives_sorted, data.train_items):
        assert array.dtype == np.int64 and array.min() >= 0 and array.max() < items
    for u in range(users):
        known = data.positives_sorted[data.positives_indptr[u] : data.positives_indptr[u + 1]]
        assert np.all(np.diff(known) > 0)  # sorted and distinct
        assert np.isin(data.train_of(u), known).all()
    popularity = np.bincount(data.positives_sorted, minlength=items)
    assert popularity.max() > 10 * np.median(popularity)  # long-tailed

    again = scale.synthetic_clients(users, seed=3)
    assert np.array_equal(again.train_items, data.train_items)  # seeded

    clients = np.arange(0, users, 37)
    samples = sample_round(data, clients, round_rng(0, 0), num_negatives=4, local_epochs=2)
    negatives = samples.labels == 0
    owners = clients[samples.client[negatives]]
    keys = owners * items + samples.items[negatives]
    owner_of_row = np.repeat(np.arange(users), counts)
    assert not np.isin(keys, owner_of_row * items + data.positives_sorted).any()
