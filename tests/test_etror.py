"""ETROR / optimal-reward metrics: curve definition, known answers, bias, aggregation, loading."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedrec.eval.etror import (
    PolicyEval,
    aggregate,
    episodes_to_reach,
    learning_curve,
    load_run,
    plateau,
    regret,
    run_metrics,
    t_interval,
)
from fedrec.eval.paper_numbers import paper_reference, platform_of_series, setting_of


def write_run(
    path: Path,
    returns: dict[str, np.ndarray],
    *,
    seed: int = 0,
    config: dict | None = None,
    final: dict | None = None,
) -> Path:
    """A run directory in the training loop's format."""
    path.mkdir(parents=True)
    base = {"agent": "slateq", "env_id": "fedrec/ChocKaleSlate-v0", "seed": seed, "episodes": 0}
    (path / "config.json").write_text(json.dumps({**base, **(config or {})}))
    length = len(next(iter(returns.values())))
    lines = [",".join(["episode", "step", *returns, "length"])]
    for i in range(length):
        values = [f"{returns[name][i]:.6f}" for name in returns]
        lines.append(",".join([str(i + 1), str(61 * (i + 1)), *values, "61"]))
    (path / "episodes.csv").write_text("\n".join(lines) + "\n")
    if final is not None:
        (path / "final_eval.json").write_text(json.dumps(final))
    return path


def test_learning_curve_is_the_papers_logged_moving_average() -> None:
    returns = np.arange(1.0, 251.0)  # return of episode e is e
    episodes, values = learning_curve(returns, log_every=20, window=100)
    assert episodes.tolist() == [100, 120, 140, 160, 180, 200, 220, 240]
    # mean of episodes e-99..e is e - 49.5
    np.testing.assert_allclose(values, episodes - 49.5)
    assert learning_curve(returns[:99])[0].size == 0  # nothing before `window` episodes
    assert learning_curve(returns, log_every=30, window=100)[0][0] == 120


def test_step_change_gives_the_known_etror() -> None:
    # 1000 at episodes <= 500, 1100 after: the curve reaches 1100 - 1% = 1089 once at least
    # 89 of the last 100 episodes are past the step, i.e. at episode 589 -> logged at 600.
    returns = np.r_[np.full(500, 1000.0), np.full(500, 1100.0)]
    metrics = run_metrics(returns)
    assert metrics.optimal_reward == pytest.approx(1100.0)
    assert metrics.plateau == pytest.approx(1100.0)
    assert metrics.etror == 600
    assert metrics.etror_plateau == 600
    # absolute tolerance of 50: reached once >= 50 of the last 100 are past the step -> 560
    assert run_metrics(returns, tolerance=50, relative=False).etror == 560
    assert run_metrics(returns, tolerance=0.0).etror == 600
    assert math.isnan(run_metrics(returns, target=1200.0).etror_target)  # never: NaN
    assert run_metrics(returns, target=1050.0, tolerance=0.0).etror_target == 560


def test_short_run_has_no_curve_and_nan_metrics() -> None:
    metrics = run_metrics(np.ones(50))
    assert metrics.values.size == 0 and metrics.total_episodes == 50
    assert math.isnan(metrics.optimal_reward) and math.isnan(metrics.etror)
    assert math.isnan(episodes_to_reach([], [], 1.0))


def test_plateau_uses_the_final_fifth() -> None:
    episodes = np.arange(20, 1001, 20)
    values = np.where(episodes > 800, 2.0, 1.0)
    assert plateau(episodes, values, tail=0.2) == pytest.approx(2.0)
    assert plateau(episodes, values, tail=0.4) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="tail"):
        plateau(episodes, values, tail=0.0)


def test_paper_optimal_reward_is_biased_upwards_on_pure_noise() -> None:
    # A flat true plateau of 1000 with the paper's single-episode std of 160: the curve's s.e. is
    # 16 and its maximum over ~245 correlated points lands well above 1000, the plateau does not.
    rng = np.random.default_rng(0)
    optimal, level = [], []
    for _ in range(20):
        metrics = run_metrics(1000.0 + 160.0 * rng.standard_normal(5000))
        optimal.append(metrics.optimal_reward)
        level.append(metrics.plateau)
    assert min(optimal) > 1000.0
    assert np.mean(optimal) - 1000.0 > 30.0  # about 2.6 curve s.e. above the truth
    assert abs(np.mean(level) - 1000.0) < 10.0


def test_t_interval_matches_scipy() -> None:
    values = np.array([2340.0, 2100.0, 2600.0, 1980.0])
    low, high = stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))
    estimate = t_interval(values)
    assert estimate.mean == pytest.approx(values.mean())
    assert estimate.half_width == pytest.approx((high - low) / 2)
    one = t_interval([5.0])
    assert one.n == 1 and math.isnan(one.half_width)
    missing = t_interval([1.0, math.nan, 3.0])
    assert (missing.n, missing.missing, missing.mean) == (2, 1, 2.0)
    assert missing.format(unit="reached").endswith("(2/3 reached)")
    assert t_interval([math.nan]).format(unit="reached") == "never (0/1 reached)"


def test_regret_ci_is_paired_on_the_same_episodes() -> None:
    rng = np.random.default_rng(1)
    base = 1000 + 160 * rng.standard_normal(500)  # per-episode difficulty, shared
    planner = PolicyEval(float(np.mean(base + 50)), 14.0, base + 50 + rng.standard_normal(500))
    agent = PolicyEval(float(np.mean(base)), 14.0, base)
    estimate, method = regret(planner, agent)
    assert method == "paired"
    diff = planner.returns - agent.returns
    low, high = stats.t.interval(0.95, 499, loc=diff.mean(), scale=stats.sem(diff))
    assert estimate.half_width == pytest.approx((high - low) / 2)
    assert estimate.half_width < 1.0  # pairing removes the shared noise
    unpaired, method = regret(PolicyEval(1050.0, 3.0), PolicyEval(1000.0, 4.0))
    assert method == "quadrature" and unpaired.half_width == pytest.approx(5.0)
    assert unpaired.mean == pytest.approx(50.0)


def _final(agent: float, planner: float, n: int = 10) -> dict:
    def entry(mean: float) -> dict:
        return {"mean": mean, "half_width": 1.0, "returns": [mean] * n}

    return {
        "episodes": n,
        "seed": 1000000,
        "policies": {"agent": entry(agent), "random": entry(900.0), "planner": entry(planner)},
    }


def test_aggregate_groups_seeds_and_matches_scipy(tmp_path: Path) -> None:
    runs = []
    steps = [300, 500, 700]
    for seed, step in enumerate(steps):
        returns = np.r_[np.full(step, 1000.0), np.full(1000 - step, 1100.0)]
        final = _final(1090.0 + seed, 1150.0)
        runs.append(
            load_run(write_run(tmp_path / f"a{seed}", {"return": returns}, seed=seed, final=final))
        )
    other = {"agent": "fedslate"}
    runs.append(load_run(write_run(tmp_path / "b0", {"return": np.full(200, 5.0)}, config=other)))
    groups = aggregate(runs)
    assert [g.seeds for g in groups] == [[0, 1, 2], [0]]
    assert [g.label for g in groups] == ["slateq ChocKaleSlate-v0", "fedslate ChocKaleSlate-v0"]
    summary = groups[0].series["return"]
    etrors = [s + 100 for s in steps]  # step change at s -> reached at s + 89, logged at s + 100
    assert [c.etror for c in summary.per_run] == etrors
    low, high = stats.t.interval(0.95, 2, loc=np.mean(etrors), scale=stats.sem(etrors))
    assert summary.etror.mean == pytest.approx(np.mean(etrors))
    assert summary.etror.half_width == pytest.approx((high - low) / 2)
    assert summary.seeds == 3 and summary.final.mean == pytest.approx(1091.0)
    assert summary.regret.mean == pytest.approx(59.0)
    assert summary.random.mean == pytest.approx(900.0) and summary.planner.mean == 1150.0
    assert summary.band == "95% CI"
    single = groups[1].series["return"]
    assert single.seeds == 1 and math.isnan(single.etror.half_width) and single.final is None


def test_label_overrides_grouping(tmp_path: Path) -> None:
    ones = {"return": np.ones(120)}
    runs = [
        load_run(write_run(tmp_path / "x", ones, config={"label": "mine", "num_envs": 1})),
        load_run(write_run(tmp_path / "y", ones, seed=1, config={"label": "mine", "num_envs": 2})),
        load_run(write_run(tmp_path / "z", ones, config={"num_envs": 2})),
        load_run(
            write_run(tmp_path / "w", ones, config={"num_envs": 4, "agent_config": {"seed": 1}})
        ),
        load_run(write_run(tmp_path / "v", ones, seed=5, config={"num_envs": 4, "when": "today"})),
    ]
    groups = aggregate(runs)
    assert [g.label for g in groups] == [
        "mine",
        "slateq ChocKaleSlate-v0 num_envs=2",
        "slateq ChocKaleSlate-v0 num_envs=4",
    ]
    assert groups[0].series["return"].band == "min–max"
    assert groups[2].seeds == [0, 5]  # seeds and bookkeeping keys do not split a group


def test_multi_platform_series_and_nested_final_eval(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    returns = {
        "return/platform_a": 1000 + 10 * rng.standard_normal(300),
        "return/platform_b": 900 + 10 * rng.standard_normal(300),
    }
    final = {
        "episodes": 4,
        "seed": 1000000,
        "policies": {
            "agent": {
                "platform_a": {
                    "mean": 1000.0,
                    "half_width": 2.0,
                    "returns": [999, 1001, 1000, 1000],
                },
                "platform_b": {"mean": 900.0, "half_width": 2.0},
            },
            "random": {"platform_a": {"mean": 800.0}, "platform_b": {"mean": 700.0}},
        },
    }
    run = load_run(write_run(tmp_path / "mp", returns, config={"agent": "fedslate"}, final=final))
    assert run.series == ["return/platform_a", "return/platform_b"]
    (group,) = aggregate([run])
    a, b = group.series["return/platform_a"], group.series["return/platform_b"]
    assert a.optimal_reward.mean > 990 and b.optimal_reward.mean < 930
    assert a.final.mean == 1000.0 and b.final.mean == 900.0 and b.random.mean == 700.0
    assert a.regret is None and a.planner is None  # no planner on this env: no regret


@pytest.mark.parametrize(
    ("setup", "error", "match"),
    [
        (lambda p: None, FileNotFoundError, "does not exist"),
        (lambda p: p.mkdir(), FileNotFoundError, "config.json is missing"),
        (lambda p: p.write_text("x"), ValueError, "not a run directory"),
    ],
)
def test_missing_run_paths_are_named(tmp_path: Path, setup, error, match) -> None:
    path = tmp_path / "run"
    setup(path)
    with pytest.raises(error, match=match):
        load_run(path)


@pytest.mark.parametrize(
    ("csv", "match"),
    [
        (None, r"episodes\.csv is missing"),
        ("", "empty file"),
        ("episode,step,length\n1,61,61\n", "missing column.*return or return/<platform>"),
        ("episode,return,length\n1,3.0,61\n", "missing column.*step"),
        ("episode,step,return,length\n1,61,abc,61\n", "column 'return'.*data row 1"),
        ("episode,step,return,length\n2,61,1,61\n1,122,1,61\n", "strictly increasing"),
    ],
)
def test_malformed_episodes_csv_errors(tmp_path: Path, csv: str | None, match: str) -> None:
    path = tmp_path / "run"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"agent": "slateq", "env_id": "e", "seed": 0}))
    if csv is not None:
        (path / "episodes.csv").write_text(csv)
    with pytest.raises((ValueError, FileNotFoundError), match=match) as info:
        load_run(path)
    assert "episodes.csv" in str(info.value)


def test_malformed_config_and_final_eval_errors(tmp_path: Path) -> None:
    path = write_run(tmp_path / "run", {"return": np.ones(5)})
    (path / "final_eval.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"final_eval\.json: not valid JSON"):
        load_run(path)
    (path / "final_eval.json").write_text(json.dumps({"policies": {"agent": {"half_width": 1}}}))
    with pytest.raises(ValueError, match=r"final_eval\.json"):
        load_run(path)
    (path / "final_eval.json").unlink()
    (path / "config.json").write_text(json.dumps({"agent": "slateq"}))
    with pytest.raises(ValueError, match=r"config\.json: missing env_id"):
        load_run(path)
    header_only = write_run(tmp_path / "new", {"return": np.zeros(0)})
    assert load_run(header_only).episodes.empty  # a run that just started is valid


def test_paper_numbers_match_settings_and_platforms() -> None:
    assert setting_of("fedrec/ChocKaleSlate-v0", {"num_candidates": 100, "slate_size": 10}) == (
        "100x10"
    )
    assert setting_of("fedrec/ChocKaleSlate-v0", {}) == "10x3"
    assert setting_of("fedrec/MovieLens-v0", {}) is None
    assert platform_of_series("return/platform_b") == "beta" and platform_of_series("return") == (
        "alpha"
    )
    slateq = paper_reference(algorithm="SlateQAgent", setting="100x10")
    assert slateq["etror"].value == 3400 and slateq["optimal_reward"].value == 1115.07
    assert "random_mean" not in slateq  # the random means are the beta platform's
    beta = paper_reference(algorithm="fedslate", setting="500x10", series="return/platform_b")
    assert (beta["etror"].value, beta["optimal_reward"].value) == (1700, 1129.96)
    assert beta["random_mean"].value == 939.979
    assert str(paper_reference(algorithm="fedslate", setting="10x3")["etror"]) == "not conv."
    # The parity configurations compare with the paper's FedSlate numbers.
    for parity in ("fedslate_official", "fedslate_exp_official"):
        official = paper_reference(algorithm=parity, setting="100x10", series="return/platform_b")
        assert official["optimal_reward"].value == 1102.269
    assert "optimal_reward" not in paper_reference(
        algorithm="fedslate_exp", setting="100x10", series="return/platform_b"
    )
