"""fedrec.train.estimate and `fedrec data estimate`: a target's value estimated from one collected
dataset, checked against the Monte Carlo truth, and the refusals (unknown policy, a target outside
the logger's support, a dataset without propensities, an estimator that does not apply)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedrec.cli import main
from fedrec.cli_data import ESTIMATE_ESTIMATORS
from fedrec.train.collect import collect, save_minari
from fedrec.train.estimate import ESTIMATORS, estimate_dataset, parse_target

pytest.importorskip("minari")

ENV = "fedrec/ChocKaleCascade-v0"
#: One-step episodes of 2 slots out of 4 candidates: 12 slates, so slate IPS's weight is 12.
ONE_STEP = {"time_budget": 1, "num_candidates": 4, "slate_size": 2}


def _dataset(root, policy: str, episodes: int, *, drop=(), **env_kwargs) -> str:
    data = collect(
        ENV, policy, episodes=episodes, seed=0, env_kwargs=env_kwargs or ONE_STEP, progress=False
    )
    for episode in data.episodes:
        for key in drop:
            del episode[key]
    return str(save_minari(data, root).parent)


@pytest.fixture(scope="module")
def uniform(tmp_path_factory) -> str:
    return _dataset(tmp_path_factory.mktemp("uniform"), "random", 400)


def test_slate_ips_covers_the_truth(uniform) -> None:
    report = estimate_dataset(uniform, "top_x", truth_episodes=5000, seed=0)
    rows = {row["estimator"]: row for row in report.estimates}
    assert list(rows) == [label for label, _ in ESTIMATORS.values()]
    assert all(row["error"] is None and row["n"] == 400 for row in rows.values())
    truth = report.truth
    assert truth is not None and truth["episodes"] == 5000 and truth["ci_half_width"] > 0
    slate = rows["slate IPS"]
    assert slate["ci_low"] <= truth["value"] <= slate["ci_high"]
    # Under the cascade click model RIPS is unbiased too; top_x beats the uniform logger.
    assert rows["RIPS"]["ci_low"] <= truth["value"] <= rows["RIPS"]["ci_high"]
    assert truth["value"] > report.logged["value"]
    # Seeded: the same call gives the same numbers.
    again = estimate_dataset(uniform, "top_x", estimators=["slate-ips"], seed=0)
    assert again.estimates[0]["value"] == slate["value"]


def test_mixture_target_and_its_propensities(uniform) -> None:
    assert parse_target("top_x@0.25") == ("top_x", 0.25)
    pure = estimate_dataset(uniform, "top_x", estimators=["slate-ips"])
    mixed = estimate_dataset(uniform, "top_x@0.25", estimators=["slate-ips"])
    flat = estimate_dataset(uniform, "random", estimators=["slate-ips"])
    # Slate IPS is linear in the target's propensities: the mixture's estimate is the mixture.
    expected = 0.75 * pure.estimates[0]["value"] + 0.25 * flat.estimates[0]["value"]
    assert mixed.estimates[0]["value"] == pytest.approx(expected)
    # The uniform target on a uniform log: every weight is 1, the logged value itself.
    assert flat.estimates[0]["value"] == pytest.approx(flat.logged["value"])


def test_cli_prints_the_table_and_writes_json(uniform, tmp_path, capsys) -> None:
    out = tmp_path / "report.json"
    argv = ["data", "estimate", uniform, "--target", "top_x", "--truth-episodes", "500"]
    assert main([*argv, "--estimators", "slate-ips", "rips", "pdis", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    for text in ("logged value", "slate IPS", "RIPS", "PDIS", "95% CI", "truth (MC)"):
        assert text in printed
    assert "IIPS" not in printed
    report = json.loads(out.read_text())
    assert report["target"] == "top_x" and report["episodes"] == 400
    assert [row["estimator"] for row in report["estimates"]] == ["slate IPS", "RIPS", "PDIS"]
    assert report["truth"]["episodes"] == 500
    assert set(report["estimates"][0]) >= {"value", "ci_low", "ci_high", "n", "assumption"}


def _error(capsys, *argv: str) -> str:
    assert main(["data", "estimate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("fedrec data estimate: error:")
    return err


def test_refusals(uniform, tmp_path, capsys) -> None:
    assert "unknown agent 'nope'" in _error(capsys, uniform, "--target", "nope")
    assert "epsilon must be in [0, 1]" in _error(capsys, uniform, "--target", "top_x@2")
    assert "does not exist" in _error(capsys, str(tmp_path / "none"), "--target", "top_x")
    greedy = _dataset(tmp_path / "greedy", "top_x", 20)
    err = _error(capsys, greedy, "--target", "bottom_x")
    assert "support outside the logger's" in err and "is not the logged" in err
    assert "support outside" in _error(capsys, greedy, "--target", "top_x@0.1")
    assert main(["data", "estimate", greedy, "--target", "top_x"]) == 0  # the logger itself
    capsys.readouterr()
    bare = _dataset(tmp_path / "bare", "random", 20, drop=("propensity_slate",))
    assert "no logging propensities" in _error(capsys, bare, "--target", "top_x")
    longer = _dataset(tmp_path / "long", "random", 20, time_budget=3)
    err = _error(capsys, longer, "--target", "top_x", "--estimators", "slate-ips")
    assert "needs one-step episodes" in err


def test_long_episodes_get_the_sequential_estimators(tmp_path) -> None:
    path = _dataset(tmp_path, "random", 60, time_budget=3, num_candidates=4, slate_size=2)
    report = estimate_dataset(path, "top_x@0.5")
    assert [row["estimator"] for row in report.estimates] == ["PDIS", "WDR", "MIS (ratio 1)"]
    assert all(np.isfinite(row["value"]) for row in report.estimates)


def test_cli_lists_the_estimators_of_the_module() -> None:
    assert tuple(ESTIMATORS) == ESTIMATE_ESTIMATORS
