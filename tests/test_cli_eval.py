"""`fedrec eval RUN_DIR...` end to end on generated run directories."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fedrec.cli import main
from fedrec.eval import stats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(path: Path, columns: dict[str, np.ndarray], config: dict, final: dict | None):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    names = list(columns)
    rows = ["episode,step," + ",".join(names) + ",length"]
    for i in range(len(columns[names[0]])):
        values = ",".join(f"{columns[n][i]:.3f}" for n in names)
        rows.append(f"{i + 1},{61 * (i + 1)},{values},61")
    (path / "episodes.csv").write_text("\n".join(rows) + "\n")
    if final is not None:
        (path / "final_eval.json").write_text(json.dumps(final))


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Two agents x two seeds on the 100/10 setting, with final evaluations."""
    rng = np.random.default_rng(0)
    common = rng.standard_normal(50)  # the held-out episodes: the same in every run
    common -= common.mean()
    env_kwargs = {"num_candidates": 100, "slate_size": 10}
    for agent, step in (("slateq", 400), ("fedslate", 200)):
        for seed in (0, 1):
            returns = np.r_[np.full(step, 950.0), np.full(1000 - step, 1100.0)]
            returns += rng.standard_normal(1000)

            def entry(mean: float) -> dict:
                values = (mean + 160 * common).tolist()
                return {"mean": float(np.mean(values)), "half_width": 44.0, "returns": values}

            final = {
                "episodes": 50,
                "seed": 1000000,
                "policies": {
                    "agent": entry(1100.0),
                    "random": entry(945.0),
                    "myopic": entry(1090.0),
                    "planner": entry(1120.0),
                },
            }
            config = {
                "agent": agent,
                "env_id": "fedrec/ChocKaleSlate-v0",
                "seed": seed,
                "episodes": 1000,
                "num_envs": 16,
                "env_kwargs": env_kwargs,
                "agent_config": {},
            }
            _write_run(tmp_path / "runs" / f"{agent}-{seed}", {"return": returns}, config, final)
    return tmp_path / "runs"


def test_eval_prints_the_table_and_writes_the_plot(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dirs = sorted(str(p) for p in runs.iterdir())
    table = runs.parent / "tables" / "eval.csv"
    assert main(["eval", *dirs, "--csv", str(table), "--wide"]) == 0
    out = capsys.readouterr().out
    png = runs / "learning_curves.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert str(png) in out.replace("\n", "")
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 5}
    fedslate, slateq = lines["fedslate ChocKaleSlate-v0"], lines["slateq ChocKaleSlate-v0"]
    # step at episode s -> ETROR s + 100 in both seeds (zero spread); paper columns beside ours
    assert "300 ± 0" in fedslate and "500 ± 0" in slateq
    assert "2340" in fedslate and "3400" in slateq and "1115.1" in slateq
    assert "1120.0 ± 0.0" in slateq  # the planner on the same held-out episodes in both seeds
    assert "20.0 ± 0.0" in slateq  # paired regret
    assert "945.0" in slateq
    # agent - random on the same held-out episodes: exactly 155 (the shared noise cancels)
    assert "+155.0 ± 0.0" in slateq and "+155.0 ± 0.0" in fedslate
    # --csv: the same cells, unwrapped, one row per group and series
    with table.open(encoding="utf-8") as handle:
        written = {row["group"]: row for row in csv.DictReader(handle)}
    assert written["slateq ChocKaleSlate-v0"]["ETROR"] == "500 ± 0"
    assert written["fedslate ChocKaleSlate-v0"]["vs random"] == "+155.0 ± 0.0"
    assert written["slateq ChocKaleSlate-v0"]["paper ETROR"] == "3400"


def test_eval_expands_a_folder_and_multi_platform(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(1)
    columns = {
        "return/platform_a": 1000 + 160 * rng.standard_normal(400),
        "return/platform_b": 900 + 160 * rng.standard_normal(400),
    }
    config = {"agent": "fedslate", "env_id": "fedrec/ChocKaleMultiPlatform-v0", "seed": 3}
    final = {
        "episodes": 3,
        "seed": 1000000,
        "policies": {"agent": {"platform_a": {"mean": 1001.5}, "platform_b": {"mean": 899.5}}},
    }
    _write_run(tmp_path / "mp" / "seed3", columns, config, final)
    out_png = tmp_path / "plots" / "curves.png"
    code = main(["eval", str(tmp_path / "mp"), "--out", str(out_png), "--paper", "none", "--wide"])
    assert code == 0
    out = capsys.readouterr().out
    assert out_png.read_bytes()[:8] == PNG_MAGIC
    assert "return/platform_a" in out and "return/platform_b" in out
    assert "1001.5" in out and "899.5" in out and "paper ETROR" not in out


def test_eval_errors_exit_2_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"agent": "slateq", "env_id": "e"}))
    (bad / "episodes.csv").write_text("episode,step,length\n1,61,61\n")
    assert main(["eval", str(bad), str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "fedrec eval: error:" in err and str(bad / "episodes.csv") in err
    assert "missing column(s) return or return/<platform>" in err
    assert main(["eval", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_eval_help_has_no_doubled_percent_signs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "%%" not in out
    assert "20%)" in out and "95% t-interval" in out


def test_rates_in_unit_interval_print_with_four_decimals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A leave-one-out evaluation env returns the hit (0/1): HR@10 needs 4 decimals, not 1."""
    rng = np.random.default_rng(2)
    config = {
        "agent": "popularity",
        "env_id": "fedrec/MovieLens100K-v0",
        "env_kwargs": {"mode": "evaluation"},
    }
    for seed, (agent, random) in enumerate(((0.3966, 0.0988), (0.4123, 0.1021))):
        hits = (rng.random(300) < agent).astype(float)
        final = {
            "episodes": 943,
            "seed": 1000000,
            "policies": {
                "agent": {"mean": agent, "half_width": 0.0312},
                "random": {"mean": random, "half_width": 0.0191},
            },
        }
        _write_run(
            tmp_path / "hr" / f"seed{seed}", {"return": hits}, {**config, "seed": seed}, final
        )
    assert main(["eval", str(tmp_path / "hr"), "--no-plot", "--paper", "none", "--wide"]) == 0
    out = capsys.readouterr().out
    for values in ((0.3966, 0.4123), (0.0988, 0.1021)):  # final greedy eval, random
        mean, half = stats.mean_ci(values)  # across the 2 seeds
        assert f"{mean:.4f} ± {half:.4f}" in out
    assert "+0.3040 ± 0.0788" in out  # vs random
    assert " 0.4 ± " not in out and " 0.1 ± " not in out


def test_returns_keep_one_decimal(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(runs / "slateq-0"), "--no-plot", "--paper", "none"]) == 0
    out = capsys.readouterr().out
    assert "1100.0 ± " in out and "1100.0000" not in out


def test_multi_platform_table_explains_negative_per_platform_regret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedrec.eval.report import PLATFORM_REGRET_NOTE

    rng = np.random.default_rng(3)
    columns = {f"return/platform_{p}": 1000 + 160 * rng.standard_normal(200) for p in "ab"}
    config = {"agent": "slateq", "env_id": "fedrec/ChocKaleMultiPlatform-v0", "seed": 0}
    policies = {
        "agent": {"platform_a": {"mean": 1015.8}, "platform_b": {"mean": 912.8}},
        "planner": {"platform_a": {"mean": 1010.0}, "platform_b": {"mean": 1027.6}},
    }
    final = {"episodes": 200, "seed": 1000000, "policies": policies}
    _write_run(tmp_path / "mp" / "seed0", columns, config, final)
    assert main(["eval", str(tmp_path / "mp"), "--no-plot", "--paper", "none"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "-5.8" in out  # platform A's regret is negative
    assert " ".join(PLATFORM_REGRET_NOTE.split()) in out


def test_single_platform_table_has_no_platform_regret_note(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(runs / "slateq-0"), "--no-plot", "--paper", "none"]) == 0
    assert "per-platform regret" not in capsys.readouterr().out


def _long_label_runs(tmp_path: Path) -> Path:
    """Multi-platform runs of two agents whose group labels are long (labels in config)."""
    rng = np.random.default_rng(4)
    for agent in ("LinUCBRelay", "fedslate"):
        for seed in (0, 1):
            columns = {f"return/platform_{p}": 1000 + 160 * rng.standard_normal(200) for p in "ab"}
            label = (
                f'{agent} ChocKaleMultiPlatform-v0 share="scores" shared_catalogue=true '
                "episodes=400"
            )
            config = {"agent": agent, "env_id": "fedrec/ChocKaleMultiPlatform-v0", "seed": seed}
            policies = {
                "agent": {"platform_a": {"mean": 1015.8}, "platform_b": {"mean": 912.8}},
                "planner": {"platform_a": {"mean": 1010.0}, "platform_b": {"mean": 1027.6}},
                "random": {"platform_a": {"mean": 950.0}, "platform_b": {"mean": 850.0}},
                "top_x": {"platform_a": {"mean": 1000.0}, "platform_b": {"mean": 1000.0}},
            }
            final = {"episodes": 200, "seed": 1000000, "policies": policies}
            _write_run(
                tmp_path / "mp" / f"{agent}-{seed}", columns, {**config, "label": label}, final
            )
    return tmp_path / "mp"


def test_the_default_view_fits_100_columns_with_a_legend(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for folder in (runs, _long_label_runs(tmp_path)):
        assert main(["eval", str(folder), "--no-plot"]) == 0
        out = capsys.readouterr().out
        assert max(len(line) for line in out.splitlines()) <= 100, out
        assert "legend:" in out and "final = final greedy eval" in " ".join(out.split())
        assert "│" not in out  # no box: plain aligned columns
    assert 'share="scores"' in out  # the words every group shares, named once in the legend
    table = [line for line in out.splitlines() if line.startswith(("LinUCBRelay ", "fedslate "))]
    assert len(table) == 6  # 2 groups x (2 platforms + joint)
    assert "more columns: --wide shows them" in out


def test_wide_has_every_column_and_csv_to_stdout_parses(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(runs), "--no-plot", "--wide"]) == 0
    wide = capsys.readouterr().out
    for column in ("ETROR→plateau", "optimal (paper-style)", "planner (oracle)", "paper random"):
        assert column in " ".join(wide.split())
    assert main(["eval", str(runs), "--no-plot", "--csv"]) == 0
    captured = capsys.readouterr()
    rows = list(csv.DictReader(captured.out.splitlines()))
    assert {row["group"] for row in rows} == {
        "fedslate ChocKaleSlate-v0",
        "slateq ChocKaleSlate-v0",
    }
    slateq = next(row for row in rows if row["group"].startswith("slateq"))
    assert slateq["ETROR"] == "500 ± 0" and slateq["vs random"] == "+155.0 ± 0.0"
    assert slateq["planner (oracle)"] == "1120.0 ± 0.0" and slateq["paper ETROR"] == "3400"
    assert "legend" not in captured.out  # CSV only on stdout
    assert main(["eval", str(runs), "--no-plot", "--csv", "-"]) == 0
    assert list(csv.DictReader(capsys.readouterr().out.splitlines())) == rows
