"""``fedrec bench ope``: a tiny run end to end through the command line, the statistics it rests
on (IPS unbiased within 3 standard errors, independent IPS biased under cascade clicks), exact
reproduction, and a folder of another configuration refused."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from fedrec.cli import main
from fedrec.eval import ope
from fedrec.eval.ope import validation as v
from fedrec.experiments import ope as bench

TINY = ["--datasets", "8", "--sizes", "20", "40", "--truth-episodes", "2000", "--no-progress"]


def _rows(folder) -> list[dict[str, str]]:
    with (folder / "ope.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_quick_run_end_to_end_reruns_identically_and_refuses_another_config(tmp_path, capsys):
    args = ["bench", "ope", "--quick", *TINY, "--settings", "first-slot", "longterm"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert "PseudoInverse vs standard slate IPS" in printed
    rows = _rows(tmp_path / "a")
    found = {(r["setting"], r["n"], r["estimator"]) for r in rows}
    expected = {
        ("first-slot", n, e)
        for n in ("20", "40")
        for e in (*v.SLATE_ESTIMATORS, *v.BANDIT_ESTIMATORS)
    } | {("longterm", n, e) for n in ("20", "40") for e in v.SEQUENTIAL_ESTIMATORS}
    assert found == expected
    record = json.loads((tmp_path / "a" / "longterm.json").read_text())
    assert record["truth"]["episodes"] == 2000 and record["config"]["datasets"] == 8

    # another folder, same configuration: the same numbers (the timings aside)
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    assert _rows(tmp_path / "b") == rows
    for name in ("first-slot", "longterm"):
        first, second = (json.loads((tmp_path / d / f"{name}.json").read_text()) for d in "ab")
        assert first["rows"] == second["rows"] and first["truth"] == second["truth"]

    # the same folder again: the finished settings are read, not recomputed
    before = (tmp_path / "a" / "longterm.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert "read the finished setting" in capsys.readouterr().out
    assert (tmp_path / "a" / "longterm.json").stat().st_mtime_ns == before

    # another configuration in the same folder: refused, nothing overwritten
    other = [a if a != "8" else "9" for a in args]
    assert main([*other, "--out", str(tmp_path / "a")]) != 0
    assert "another configuration (datasets differ" in capsys.readouterr().err
    assert (tmp_path / "a" / "longterm.json").stat().st_mtime_ns == before
    assert json.loads((tmp_path / "a" / "config.json").read_text())["datasets"] == 8

    # a folder of files this command did not write: refused
    stranger = tmp_path / "c"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    assert main([*args, "--out", str(stranger)]) != 0
    assert "did not write" in capsys.readouterr().err


def test_ips_is_unbiased_and_independent_ips_is_biased_under_cascade_clicks():
    """120 logged data sets of 150 cascade slates (uniform logger, K = 3 of N = 10): slate IPS
    and RIPS within 3 SE of the Monte Carlo truth, IIPS (whose additive assumption fails under
    the cascade) off by more than 3 SE; on the first-slot env, where the reward is additive, IPS
    and IIPS are within 3 SE."""
    cascade = v.SETTINGS["cascade"]
    truth = v.true_value(cascade, 2.0, 200_000, seed=1)
    data = v.log_data(cascade, logger_beta=0.0, target_beta=2.0, episodes=120 * 150, seed=2)
    table = v.estimate_all(
        cascade, data, datasets=120, sizes=(150,), logger_beta=0.0, target_beta=2.0
    )[150]
    z = {name: v.summarise(cells, truth)["bias_z"] for name, cells in table.items()}
    assert abs(z["slate IPS"]) < 3 and abs(z["RIPS"]) < 3 and abs(z["Cascade-DR"]) < 3
    assert z["IIPS"] > 3  # a click above hides the slots below: IIPS over-counts them
    assert v.assumption(cascade, "IIPS")[0] == "biased"

    first = v.SETTINGS["first-slot"]
    truth = v.true_value(first, 2.0, 100_000, seed=3)
    data = v.log_data(first, logger_beta=0.0, target_beta=2.0, episodes=60 * 150, seed=4)
    table = v.estimate_all(
        first, data, datasets=60, sizes=(150,), logger_beta=0.0, target_beta=2.0
    )[150]
    for name in ("IPS", "IIPS", "slate IPS", "DR"):
        assert abs(v.summarise(table[name], truth)["bias_z"]) < 3, name


def test_propensities_are_exact_plackett_luce():
    """The slot marginals and prefix probabilities agree with frequencies of sampled slates, and
    the marginals of beta = 0 are uniform."""
    rng = np.random.default_rng(0)
    scores = np.tile(rng.random(5), (200_000, 1))
    slates = v.sample_slates(rng, scores, 2.0, 3)
    marginals = v.slot_marginals(scores[:1], 2.0, 3)[0]
    for k in range(3):
        frequency = np.bincount(slates[:, k], minlength=5) / len(slates)
        assert frequency == pytest.approx(marginals[k], abs=4e-3)
    prefix = v.prefix_probabilities(scores[:1], slates[:1], 2.0)[0]
    same = np.all(slates == slates[0], axis=1).mean()
    assert same == pytest.approx(prefix[-1], abs=3e-3)
    assert v.slot_marginals(scores[:1], 0.0, 3) == pytest.approx(np.full((1, 3, 5), 0.2))
    assert v.top_probabilities(scores[:1], 2.0)[0] == pytest.approx(marginals[0])
    # the dynamic programme over the sets above (slates of 5 of 7) is the enumeration's sum
    many = rng.random((50, 7))
    weights = np.exp(2.0 * (many - many.max(axis=1, keepdims=True)))
    every = ope.enumerate_slates(7, 5)
    enumerated = ope.slot_marginals(every, ope.plackett_luce_slate_probabilities(weights, every), 7)
    assert v.slot_marginals(many, 2.0, 5) == pytest.approx(enumerated, abs=1e-12)


def test_bench_settings_and_assumptions_are_consistent():
    assert set(bench._setting_names()) == set(v.SETTINGS)
    for setting in v.SETTINGS.values():
        for estimator in v.estimators_of(setting):
            expect, why = v.assumption(setting, estimator)
            assert expect in ("unbiased", "biased", "consistent", "model") and why
    with pytest.raises(ValueError, match="--datasets"):
        bench.BenchOpeConfig(datasets=1)
