"""The joint return ``return/joint`` of multi-platform runs: training curve, final evaluation and
``fedrec eval`` table (docs/metrics.md, "Joint return")."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from run_dirs import write_run

from fedrec.cli import main
from fedrec.eval import stats
from fedrec.eval.etror import JOINT_SERIES, aggregate, load_run, run_metrics
from fedrec.eval.paper_numbers import paper_reference
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

PLATFORMS = ("return/platform_a", "return/platform_b")
#: Curve options short enough for an 8-episode run to have a learning curve.
CURVE = {"window": 4, "log_every": 2}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny real multi-platform run (top-x heuristic, 8 episodes, 6 held-out episodes)."""
    out = tmp_path_factory.mktemp("joint") / "top_x"
    config = MultiPlatformTrainConfig(
        method="top_x",
        episodes=8,
        num_users=4,
        seed=1,
        env_kwargs={"num_candidates": 10, "slate_size": 3},
        checkpoint_every=0,
        eval_episodes=6,
        planner=False,
        progress=False,
    )
    train_multi_platform(config, out_dir=out)
    return out


def _entry(returns: list[float]) -> dict:
    mean, half = stats.mean_ci(returns)
    return {"mean": mean, "half_width": half, "returns": returns}


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_joint_series_is_the_row_sum_of_the_platforms(trained: Path) -> None:
    run = load_run(trained)
    assert run.series == list(PLATFORMS)  # the logged columns are unchanged
    assert run.reported_series == [*PLATFORMS, JOINT_SERIES]
    table = run.episodes
    np.testing.assert_array_equal(
        run.returns(JOINT_SERIES), table[PLATFORMS[0]].to_numpy() + table[PLATFORMS[1]].to_numpy()
    )
    (group,) = aggregate([run], **CURVE)
    assert list(group.series) == [*PLATFORMS, JOINT_SERIES]
    joint, expected = group.series[JOINT_SERIES], run_metrics(run.returns(JOINT_SERIES), **CURVE)
    np.testing.assert_array_equal(joint.curve_mean, expected.values)
    assert joint.plateau.mean == expected.plateau and joint.etror.mean == expected.etror


def test_joint_final_eval_is_the_paired_sum_of_the_platforms(trained: Path) -> None:
    run = load_run(trained)
    policies = json.loads((trained / "final_eval.json").read_text())["policies"]
    final = run.final(JOINT_SERIES)
    assert sorted(final.references) == [
        "best_open_loop", "bottom_x", "random", "top_x"
    ]  # no *_alone entries  # fmt: skip
    assert final.alone_over_top_x is None
    for name in ("agent", "random", "top_x", "bottom_x"):
        entry = final.agent if name == "agent" else final.references[name]
        sums = np.add(*(policies[name][p]["returns"] for p in ("platform_a", "platform_b")))
        mean, half = stats.mean_ci(sums)
        assert entry.mean == pytest.approx(mean) and entry.half_width == pytest.approx(half)
        np.testing.assert_allclose(entry.returns, sums)
        assert entry.mean == pytest.approx(policies[name]["total"]["mean"])  # the env's total
    gain = np.asarray(final.agent.returns) - np.asarray(final.references["random"].returns)
    assert final.gain_over_random.mean == pytest.approx(gain.mean())
    assert final.gain_over_random.half_width == pytest.approx(stats.mean_ci(gain)[1])


def test_joint_half_width_comes_from_the_sums(tmp_path: Path) -> None:
    """Anti-correlated platforms: each has a wide CI, their per-episode sum is constant."""
    a, b = [900.0, 1000.0, 1100.0, 1200.0], [1300.0, 1200.0, 1100.0, 1000.0]
    final = {
        "episodes": 4,
        "seed": 1000000,
        "policies": {
            "agent": {"platform_a": _entry(a), "platform_b": _entry(b)},
            "random": {"platform_a": {"mean": 800.0}, "platform_b": {"mean": 700.0}},
            "top_x": {"platform_a": _entry(a)},  # a platform is missing: no joint entry
            "agent_alone": {"platform_a": _entry(a), "platform_b": _entry(b)},
        },
    }
    columns = {PLATFORMS[0]: np.arange(6.0), PLATFORMS[1]: 10 * np.arange(6.0)}
    run = load_run(write_run(tmp_path / "run", columns, final))
    joint = run.final(JOINT_SERIES)
    assert joint.agent.mean == 2200.0 and joint.agent.half_width == 0.0
    sum_of_half_widths = stats.mean_ci(a)[1] + stats.mean_ci(b)[1]
    assert sum_of_half_widths > 100
    assert joint.references["random"].mean == 1500.0  # no returns lists: the mean only
    assert np.isnan(joint.references["random"].half_width)
    assert "top_x" not in joint.references and "agent_alone" not in joint.references


def test_eval_table_and_csv_have_a_joint_row(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_csv = tmp_path / "table.csv"
    options = ["--window", "4", "--log-every", "2", "--no-plot", "--csv", str(out_csv)]
    assert main(["eval", str(trained), *options]) == 0
    printed = capsys.readouterr().out
    assert JOINT_SERIES in printed and "user's total engagement" in " ".join(printed.split())
    rows = _read_csv(out_csv)
    assert [row["series"] for row in rows] == [*PLATFORMS, JOINT_SERIES]
    joint = rows[-1]
    run = load_run(trained)
    agent = run.final(JOINT_SERIES).agent
    assert joint["final greedy eval"] == f"{agent.mean:.1f} ± {agent.half_width:.1f}"
    assert joint["plateau"] != "–" and joint["vs random"] != "–" and joint["vs top-x"] != "–"
    assert joint["alone"] == "–" and joint["alone vs top-x"] == "–"  # no joint meaning
    assert rows[0]["alone"] != "–"
    # --paper auto matches this 10x3 Choc-vs-Kale run: platform B has the paper's random mean
    assert rows[1]["paper random"] == "948.3"
    assert all(joint[column] == "–" for column in ("paper ETROR", "paper optimal", "paper random"))


def test_the_paper_has_no_joint_numbers() -> None:
    for algorithm in ("fedslate", "slateq", "random"):
        assert paper_reference(algorithm=algorithm, setting="10x3", series=PLATFORMS[1])
        assert paper_reference(algorithm=algorithm, setting="10x3", series=JOINT_SERIES) == {}


def test_single_platform_runs_have_no_joint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    final = {"episodes": 3, "seed": 1000000, "policies": {"agent": _entry([1.0, 2.0, 3.0])}}
    single = write_run(tmp_path / "single", {"return": 1000 + rng.standard_normal(8)}, final)
    one_platform = write_run(tmp_path / "one", {PLATFORMS[0]: 1000 + rng.standard_normal(8)}, None)
    for path in (single, one_platform):
        run = load_run(path)
        assert run.reported_series == run.series and JOINT_SERIES not in run.reported_series
        out_csv = tmp_path / f"{path.name}.csv"
        assert main(["eval", str(path), "--no-plot", "--paper", "none", "--csv", str(out_csv)]) == 0
        assert JOINT_SERIES not in capsys.readouterr().out
        assert JOINT_SERIES not in {row["series"] for row in _read_csv(out_csv)}


def test_joint_learning_curve_is_plotted(trained: Path, tmp_path: Path) -> None:
    out_png = tmp_path / "curves.png"
    options = ["--window", "4", "--log-every", "2", "--out", str(out_png)]
    assert main(["eval", str(trained), *options]) == 0
    assert out_png.read_bytes()[:4] == b"\x89PNG"
