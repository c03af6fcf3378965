"""Curve summaries (``curve.json.gz``): a compacted run reads exactly as the run with its log."""

from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image
from run_dirs import write_run

from fedrec.cli import main
from fedrec.eval.compact import compact, compact_run
from fedrec.eval.compact import main as curves_main
from fedrec.eval.curves import CURVE_FILE
from fedrec.eval.etror import JOINT_SERIES, aggregate, load_run
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

#: The default curve, a coarser one, and one whose window is not a multiple of log_every.
OPTIONS = (
    {},
    {"log_every": 40, "window": 200, "tail": 0.5, "tolerance": 3.0, "relative": False},
    {"log_every": 60, "window": 100, "target": 900.0},
)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real single-platform run of the training loop: 250 episodes (a curve with 8 points)."""
    out = tmp_path_factory.mktemp("single") / "run"
    assert main([
        "train", "random", "--env", "fedrec/ChocKaleSlate-v0", "--episodes", "250",
        "--num-envs", "16", "--out", str(out), "--eval-episodes", "4", "--no-progress",
        "--checkpoint-every", "0",
    ]) == 0  # fmt: skip
    return out


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real multi-platform run (top-x, 330 episodes): platform columns and the joint return."""
    out = tmp_path_factory.mktemp("multi") / "top_x"
    config = MultiPlatformTrainConfig(
        method="top_x",
        episodes=330,
        num_users=16,
        seed=3,
        env_kwargs={"num_candidates": 10, "slate_size": 3},
        checkpoint_every=0,
        eval_episodes=6,
        planner=False,
        progress=False,
    )
    train_multi_platform(config, out_dir=out)
    return out


def _compacted(run: Path, tmp_path: Path, **kwargs) -> Path:
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    compact_run(copy, **kwargs)
    return copy


def _same_float(a: float, b: float) -> bool:
    return (np.isnan(a) and np.isnan(b)) or a == b


def _assert_identical(a, b) -> None:
    """Two values of aggregate's result are equal bit for bit (arrays by bytes, NaN == NaN)."""
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b)
        for field in dataclasses.fields(a):
            if field.name not in ("runs", "path"):
                _assert_identical(getattr(a, field.name), getattr(b, field.name))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_identical(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_identical(x, y)
    elif isinstance(a, float):
        assert _same_float(a, b), (a, b)
    else:
        assert a == b


@pytest.mark.parametrize("fixture", ["single", "multi"])
def test_every_metric_of_a_compacted_run_is_the_logs_bit_for_bit(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    run = request.getfixturevalue(fixture)
    copy = _compacted(run, tmp_path)
    assert (copy / CURVE_FILE).is_file() and not (copy / "episodes.csv").exists()
    full, compacted = load_run(run), load_run(copy)
    assert compacted.episodes is None and compacted.series == full.series
    assert compacted.reported_series == full.reported_series
    if fixture == "multi":
        assert JOINT_SERIES in compacted.reported_series
    assert compacted.curves.rows == len(full.episodes)
    assert compacted.curves.last_step == int(full.episodes["step"].iloc[-1])
    for options in OPTIONS:
        _assert_identical(aggregate([full], **options), aggregate([compacted], **options))
    with pytest.raises(ValueError, match=r"compacted into curve\.json\.gz"):
        compacted.returns(full.series[0])


def test_fedrec_eval_prints_and_plots_the_same_from_a_summary(
    multi: Path, single: Path, tmp_path: Path
) -> None:
    copies = [_compacted(run, tmp_path / "compact", gzip_json=True) for run in (multi, single)]
    assert (copies[0] / "final_eval.json.gz").is_file()
    assert not (copies[0] / "final_eval.json").exists()
    outputs = {}
    for name, runs in (("full", [multi, single]), ("compact", copies)):
        args = [*map(str, runs), "--csv", str(tmp_path / f"{name}.csv")]
        assert main(["eval", *args, "--out", str(tmp_path / f"{name}.png")]) == 0
        outputs[name] = (tmp_path / f"{name}.csv").read_bytes()
    assert outputs["full"] == outputs["compact"]
    full, compacted = image.imread(tmp_path / "full.png"), image.imread(tmp_path / "compact.png")
    assert full.shape == compacted.shape and np.array_equal(full, compacted)


def test_a_summary_refuses_a_curve_it_cannot_give(multi: Path, tmp_path: Path) -> None:
    run = load_run(_compacted(multi, tmp_path))
    with pytest.raises(ValueError, match="multiples of 20; got 10 and 100"):
        run.curve_metrics("return/platform_a", log_every=10)
    with pytest.raises(ValueError, match="multiples of 20; got 20 and 50"):
        aggregate([run], window=50)
    with pytest.raises(ValueError, match="must be >= 1"):
        run.curve_metrics("return/platform_a", window=0)


def test_malformed_or_ambiguous_compacted_files_are_named(multi: Path, tmp_path: Path) -> None:
    copy = _compacted(multi, tmp_path, gzip_json=True)
    shutil.copy(multi / "final_eval.json", copy / "final_eval.json")
    with pytest.raises(ValueError, match=r"final_eval\.json\.gz both exist"):
        load_run(copy)
    (copy / "final_eval.json").unlink()
    summary = json.loads(gzip.decompress((copy / CURVE_FILE).read_bytes()))
    summary["series"]["return/platform_a"]["cumulative"].pop()
    (copy / CURVE_FILE).write_bytes(gzip.compress(json.dumps(summary).encode()))
    with pytest.raises(ValueError, match="'return/platform_a' has 16 cumulative sums, expected 17"):
        load_run(copy)
    (copy / CURVE_FILE).write_text("not gzip")
    with pytest.raises(ValueError, match=f"{CURVE_FILE}: not a gzipped JSON curve summary"):
        load_run(copy)
    (copy / CURVE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=r"episodes\.csv is missing"):
        load_run(copy)


def test_compact_command_skips_keeps_logs_and_leaves_unfinished_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    final = {"seed": 1, "episodes": 2, "policies": {"agent": {"mean": 1.0, "returns": [1, 1]}}}
    runs = {
        name: write_run(tmp_path / "res" / name, {"return": rng.normal(size=130)}, final)
        for name in ("a", "b", "c")
    }
    unfinished = write_run(tmp_path / "res" / "d", {"return": rng.normal(size=130)}, None)
    before = {name: load_run(path) for name, path in runs.items()}
    code = curves_main([
        "compact", str(tmp_path / "res"), "--skip", str(runs["b"]), "--keep-log", str(runs["c"]),
        "--gzip-json",
    ])  # fmt: skip
    assert code == 0
    assert sorted(p.name for p in runs["a"].iterdir()) == [
        "config.json", CURVE_FILE, "final_eval.json.gz"
    ]  # fmt: skip
    assert sorted(p.name for p in runs["b"].iterdir()) == [
        "config.json", "episodes.csv", "final_eval.json"
    ]  # fmt: skip
    assert sorted(p.name for p in runs["c"].iterdir()) == [
        "config.json", "episodes.csv.gz", "final_eval.json.gz"
    ]  # fmt: skip
    assert (unfinished / "episodes.csv").is_file()  # no final evaluation: still training
    assert load_run(runs["c"]).episodes.equals(before["c"].episodes)
    for name in runs:
        _assert_identical(aggregate([before[name]]), aggregate([load_run(runs[name])]))
    said: list[str] = []
    again = {"skip": [runs["b"]], "keep_log": [runs["c"]], "gzip_json": True, "log": said.append}
    assert len(compact([tmp_path / "res"], **again)) == 2
    assert len(said) == 2 and all(line.endswith("already compact") for line in said)
