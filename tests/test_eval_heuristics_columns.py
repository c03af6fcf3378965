"""``fedrec eval``'s bottom-x columns (the mirror heuristic beside top-x) and its greedy-slate
diagnostics table (docs/metrics.md, "Top-x, bottom-x"; docs/fedslate.md)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from run_dirs import write_run

from fedrec.cli import main
from fedrec.eval import stats
from fedrec.eval.etror import JOINT_SERIES, aggregate, load_run
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

#: Curve options short enough for an 8-episode run to have a learning curve.
OPTIONS = ["--window", "4", "--log-every", "2", "--no-plot", "--paper", "none"]
PLATFORMS = ("platform_a", "platform_b")
TITLE = "Greedy-slate diagnostics (final evaluation)"


def _entry(returns: np.ndarray | list[float]) -> dict:
    values = [float(v) for v in returns]
    mean, half = stats.mean_ci(values)
    return {"mean": mean, "half_width": half, "returns": values}


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _eval(paths: list[Path], out_csv: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["eval", *map(str, paths), *OPTIONS, "--csv", str(out_csv)]) == 0
    return " ".join(capsys.readouterr().out.split())  # rich wraps long notes


def _signed(mean: float, half: float) -> str:
    return ("+" if mean > 0 else "") + f"{mean:.1f} ± {half:.1f}"


#: Held-out episodes shared by every policy of a run: the user noise that pairing cancels.
NOISE = 160 * np.random.default_rng(0).standard_normal(30)
#: Per-episode agent - bottom_x differences that are not constant (a non-zero paired CI).
OFFSET = 40 + 5 * np.random.default_rng(1).standard_normal(30)


def _single_platform_final(*, bottom_x: bool = True, top_x: bool = True) -> dict:
    agent = 1100 + NOISE
    policies = {"agent": _entry(agent), "random": _entry(950 + NOISE)}
    if top_x:
        policies["top_x"] = _entry(1000 + NOISE)
    if bottom_x:
        policies["bottom_x"] = _entry(agent - OFFSET)
    return {"episodes": len(NOISE), "seed": 1000000, "policies": policies}


def test_vs_bottom_x_is_paired_on_the_held_out_episodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    final = _single_platform_final()
    run_dir = write_run(tmp_path / "run", {"return": 1000 + np.arange(8.0)}, final, label="a")
    run = load_run(run_dir)
    gain = run.final("return").gain_over_bottom_x
    mean, half = stats.mean_ci(OFFSET)  # the mean of the per-episode differences, its t-interval
    assert gain.mean == pytest.approx(mean) and gain.half_width == pytest.approx(half)
    welch = stats.welch_ci(1100 + NOISE, 1100 + NOISE - OFFSET)[1]
    assert half < welch / 10  # the shared user noise cancels: far narrower than unpaired
    (group,) = aggregate([run], window=4, log_every=2)
    summary = group.series["return"]
    assert summary.gain_over_bottom_x.mean == pytest.approx(mean)
    assert summary.bottom_x.mean == pytest.approx(final["policies"]["bottom_x"]["mean"])
    out = _eval([run_dir], tmp_path / "table.csv", capsys)
    (row,) = _read_csv(tmp_path / "table.csv")
    bottom = final["policies"]["bottom_x"]
    assert row["bottom-x"] == f"{bottom['mean']:.1f} ± {bottom['half_width']:.1f}"
    assert row["vs bottom-x"] == _signed(mean, half)
    assert row["vs top-x"] == "+100.0 ± 0.0"  # the same code path: exact with shared noise
    assert "bottom-x = the mirror heuristic" in out and "better of the two heuristics" in out


def test_vs_bottom_x_across_seeds_is_the_t_interval_of_the_per_seed_gains(tmp_path: Path) -> None:
    runs = []
    for seed, shift in ((0, 0.0), (1, 30.0)):
        final = _single_platform_final()
        final["policies"]["bottom_x"] = _entry(1100 + NOISE - OFFSET - shift)
        columns = {"return": 1000 + np.arange(8.0)}
        runs.append(
            load_run(write_run(tmp_path / f"s{seed}", columns, final, label="a", seed=seed))
        )
    (group,) = aggregate(runs, window=4, log_every=2)
    expected = stats.mean_ci([OFFSET.mean(), OFFSET.mean() + 30.0])
    gain = group.series["return"].gain_over_bottom_x
    assert gain.n == 2 and gain.mean == pytest.approx(expected[0])
    assert gain.half_width == pytest.approx(expected[1])


@pytest.mark.parametrize(
    ("top_x", "bottom_x"), [(True, False), (True, True), (False, True), (False, False)]
)
def test_heuristic_columns_appear_only_with_their_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], top_x: bool, bottom_x: bool
) -> None:
    final = _single_platform_final(top_x=top_x, bottom_x=bottom_x)
    run_dir = write_run(tmp_path / "run", {"return": 1000 + np.arange(8.0)}, final, label="a")
    out = _eval([run_dir], tmp_path / "table.csv", capsys)
    with (tmp_path / "table.csv").open(encoding="utf-8") as handle:
        header = next(csv.reader(handle))
    assert ("top-x" in header and "vs top-x" in header) == top_x
    assert ("bottom-x" in header and "vs bottom-x" in header) == bottom_x
    assert ("bottom-x = the mirror heuristic" in out) == bottom_x
    assert ("top-x = the fixed heuristic" in out) == top_x
    assert "always" not in out  # no note claims a heuristic is always the best


def test_an_old_run_without_bottom_x_beside_a_new_one_shows_a_blank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    columns = {"return": 1000 + np.arange(8.0)}
    old = write_run(tmp_path / "old", columns, _single_platform_final(bottom_x=False), label="old")
    new = write_run(tmp_path / "new", columns, _single_platform_final(), label="new")
    _eval([old, new], tmp_path / "table.csv", capsys)
    rows = {row["group"]: row for row in _read_csv(tmp_path / "table.csv")}
    assert rows["old"]["bottom-x"] == "–" and rows["old"]["vs bottom-x"] == "–"
    assert rows["new"]["vs bottom-x"] != "–"


def _multi_platform_final(diagnostics: dict | None = None) -> dict:
    rng = np.random.default_rng(2)
    noise = {p: 150 * rng.standard_normal(20) for p in PLATFORMS}

    def policy(level: float, spread: float = 0.0) -> dict:
        extra = spread * np.random.default_rng(int(level)).standard_normal(20)
        return {p: _entry(level + noise[p] + extra) for p in PLATFORMS}

    final = {
        "episodes": 20,
        "seed": 1000000,
        "policies": {
            "agent": policy(1100.0, 10.0),
            "random": policy(950.0),
            "top_x": policy(800.0, 5.0),
            "bottom_x": policy(1080.0, 5.0),
            "agent_alone": policy(1000.0),
            "top_x_alone": policy(990.0),
        },
    }
    if diagnostics is not None:
        final["diagnostics"] = diagnostics
    return final


def _multi_platform_columns() -> dict[str, np.ndarray]:
    return {f"return/{p}": 1000 + np.arange(8.0) for p in PLATFORMS}


def test_the_joint_row_has_the_bottom_x_columns_paired_on_the_sums(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    final = _multi_platform_final()
    run_dir = write_run(tmp_path / "mp", _multi_platform_columns(), final, label="mp")
    _eval([run_dir], tmp_path / "table.csv", capsys)
    rows = {row["series"]: row for row in _read_csv(tmp_path / "table.csv")}
    assert list(rows) == [*(f"return/{p}" for p in PLATFORMS), JOINT_SERIES]

    def sums(name: str) -> np.ndarray:
        return np.add(*(np.asarray(final["policies"][name][p]["returns"]) for p in PLATFORMS))

    mean, half = stats.mean_ci(sums("bottom_x"))
    assert rows[JOINT_SERIES]["bottom-x"] == f"{mean:.1f} ± {half:.1f}"
    difference = sums("agent") - sums("bottom_x")
    assert rows[JOINT_SERIES]["vs bottom-x"] == _signed(*stats.mean_ci(difference))
    # per platform: the same paired difference of that platform's returns
    a = final["policies"]
    per_platform = np.subtract(
        a["agent"]["platform_a"]["returns"], a["bottom_x"]["platform_a"]["returns"]
    )
    assert rows["return/platform_a"]["vs bottom-x"] == _signed(*stats.mean_ci(per_platform))
    assert rows[JOINT_SERIES]["alone"] == "–"  # unchanged: no joint meaning


def _diagnostics(saturated: tuple[float, float], top_x: tuple[float, float]) -> dict:
    return {
        p: {"saturated": s, "top_x_slates": t}
        for p, s, t in zip(PLATFORMS, saturated, top_x, strict=True)
    }


def test_diagnostics_table_and_csv_have_means_and_ranges_over_seeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seeds = {
        0: _diagnostics(saturated=(0.25, 1.0), top_x=(0.5, 1.0)),
        1: _diagnostics(saturated=(0.75, 1.0), top_x=(0.0, 0.8)),
    }
    paths = [
        write_run(
            tmp_path / "runs" / f"fedslate{seed}",
            _multi_platform_columns(),
            _multi_platform_final(entry),
            label="fedslate",
            seed=seed,
        )
        for seed, entry in seeds.items()
    ]
    # an old run without diagnostics still loads, and has no diagnostics row
    paths.append(
        write_run(
            tmp_path / "runs" / "old",
            _multi_platform_columns(),
            _multi_platform_final(),
            label="old",
        )
    )
    assert load_run(paths[-1]).diagnostics == {}
    groups = aggregate([load_run(p) for p in paths], window=4, log_every=2)
    assert [bool(g.diagnostics) for g in groups] == [True, False]
    a = groups[0].diagnostics["platform_a"]
    assert (a.seeds, a.saturated.mean, a.saturated.low, a.saturated.high) == (2, 0.5, 0.25, 0.75)
    assert (a.top_x_slates.mean, a.top_x_slates.low, a.top_x_slates.high) == (0.25, 0.0, 0.5)

    out = _eval(paths, tmp_path / "out" / "table.csv", capsys)
    assert TITLE in out and "|value| >= 0.99" in out
    assert out.index("bottom-x = the mirror heuristic") < out.index(TITLE)  # after the notes
    assert "0.500 (0.250–0.750)" in out
    rows = _read_csv(tmp_path / "out" / "table_diagnostics.csv")
    assert rows == [
        {
            "group": "fedslate",
            "platform": "platform_a",
            "seeds": "2",
            "saturated": "0.500 (0.250–0.750)",
            "top-x slates": "0.250 (0.000–0.500)",
        },
        {
            "group": "fedslate",
            "platform": "platform_b",
            "seeds": "2",
            "saturated": "1.000 (1.000–1.000)",
            "top-x slates": "0.900 (0.800–1.000)",
        },
    ]


def test_no_diagnostics_no_table_and_no_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = write_run(
        tmp_path / "mp", _multi_platform_columns(), _multi_platform_final(), label="mp"
    )
    out = _eval([run_dir], tmp_path / "table.csv", capsys)
    assert TITLE not in out
    assert (tmp_path / "table.csv").exists() and not (tmp_path / "table_diagnostics.csv").exists()


def test_one_seed_prints_the_value_without_a_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    final = _multi_platform_final(_diagnostics(saturated=(0.125, 1.0), top_x=(0.0, 1.0)))
    run_dir = write_run(tmp_path / "mp", _multi_platform_columns(), final, label="mp")
    _eval([run_dir], tmp_path / "table.csv", capsys)
    first = _read_csv(tmp_path / "table_diagnostics.csv")[0]
    assert first["seeds"] == "1" and first["saturated"] == "0.125"


@pytest.mark.parametrize(
    ("diagnostics", "match"),
    [
        ([0.5], "expected an object of per-platform objects"),
        ({"platform_a": 0.5}, "entry 'platform_a' must be an object"),
        ({"platform_a": {"mean": 0.5}}, "entry 'platform_a' has none of"),
        (
            {"platform_a": {"saturated": 1.5, "top_x_slates": 0.5}},
            r"'saturated' must be a fraction in \[0, 1\], got 1.5",
        ),
        (
            {"platform_a": {"saturated": 0.5, "top_x_slates": -0.1}},
            r"'top_x_slates' must be a fraction",
        ),
        ({"platform_a": {"saturated": "0.5", "top_x_slates": 0.5}}, "got '0.5'"),
        ({"platform_a": {"saturated": True, "top_x_slates": 0.5}}, "got True"),
        ({"platform_a": {"saturated": math.nan, "top_x_slates": 0.5}}, "got nan"),
    ],
)
def test_malformed_diagnostics_are_refused_naming_the_file(
    tmp_path: Path, diagnostics: object, match: str
) -> None:
    final = _multi_platform_final()
    final["diagnostics"] = diagnostics
    run_dir = write_run(tmp_path / "mp", _multi_platform_columns(), final, label="mp")
    with pytest.raises(ValueError, match=match) as info:
        load_run(run_dir)
    assert str(run_dir / "final_eval.json") in str(info.value)
    assert "diagnostics" in str(info.value)


def test_fedrec_eval_refuses_malformed_diagnostics_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    final = _multi_platform_final({"platform_a": {"saturated": 2, "top_x_slates": 0.5}})
    run_dir = write_run(tmp_path / "mp", _multi_platform_columns(), final, label="mp")
    assert main(["eval", str(run_dir), *OPTIONS]) == 2
    err = capsys.readouterr().err
    assert str(run_dir / "final_eval.json") in err and "must be a fraction in [0, 1]" in err


def test_a_real_fedslate_run_has_bottom_x_and_diagnostics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A very short FedSlate run: its final evaluation feeds both new parts of the table."""
    config = MultiPlatformTrainConfig(
        method="fedslate",
        episodes=4,
        num_users=4,
        seed=3,
        env_kwargs={"num_candidates": 10, "slate_size": 3},
        agent_kwargs={
            "learning_starts": 120,
            "batch_size": 8,
            "buffer_size": 200,
            "local_hidden": (16,),
            "global_hidden": (16,),
        },
        checkpoint_every=0,
        eval_episodes=4,
        planner=False,
        progress=False,
    )
    train_multi_platform(config, out_dir=tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert set(run.diagnostics) == set(PLATFORMS)
    out = _eval([tmp_path / "run"], tmp_path / "table.csv", capsys)
    assert TITLE in out
    rows = _read_csv(tmp_path / "table.csv")
    assert rows[-1]["series"] == JOINT_SERIES and rows[-1]["vs bottom-x"] != "–"
    diagnostics = _read_csv(tmp_path / "table_diagnostics.csv")
    assert [row["platform"] for row in diagnostics] == list(PLATFORMS)
    for row in diagnostics:
        entry = run.diagnostics[row["platform"]]
        # fedrec's FedSlate has linear heads: no tanh bound, so no saturated fraction
        assert "saturated" not in entry and row["saturated"] == "–"
        assert row["top-x slates"] == f"{entry['top_x_slates']:.3f}"
