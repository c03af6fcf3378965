"""benchmarks/cascade_regret.py: the regret it reports is the exact planner's click probability
minus the played slate's, zero for the planner and linear for random play."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import gymnasium as gym
import numpy as np
import pytest

from fedrec.agents.reference import RandomPolicy
from fedrec.envs.cascade_model import attraction_probabilities, click_probability

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cascade_regret.py"


@pytest.fixture(scope="module")
def regret() -> ModuleType:
    """The benchmark script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("cascade_regret", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("setting", ["fixed", "contextual"])
def test_the_exact_planner_has_zero_regret(regret: ModuleType, setting: str) -> None:
    curve = regret.regret_curve("oracle", setting, seed=3, steps=60)
    assert curve.shape == (60,)
    assert np.all(curve == 0.0)


@pytest.mark.parametrize("setting", ["fixed", "contextual"])
def test_random_regret_is_the_click_probability_gap_and_grows_linearly(
    regret: ModuleType, setting: str
) -> None:
    steps, seed = 400, 5
    curve = regret.regret_curve("random", setting, seed=seed, steps=steps)
    # The same run recomputed from the candidates alone: top-3 attraction vs the slate's.
    env = gym.make_vec(regret.ENV_ID, num_envs=1, time_budget=steps, **regret.SETTINGS[setting])
    agent = RandomPolicy(slate_size=3, seed=seed)
    observation, _ = env.reset(seed=seed)
    expected = []
    for _ in range(steps):
        attraction = attraction_probabilities(observation["candidates"][0, :, 0])
        slate = agent.explore_batch(observation)
        best = click_probability(np.sort(attraction)[-3:])
        expected.append(best - click_probability(attraction[slate[0]]))
        observation, *_ = env.step(slate)
    np.testing.assert_allclose(curve, expected, rtol=0, atol=1e-12)
    assert np.all(curve >= -1e-12) and curve.mean() > 0.05
    # no learning: the cumulative regret grows linearly (log-log slope ~1)
    assert 0.85 < regret.late_slope(np.cumsum(curve)) < 1.15


def test_late_slope_and_summary(regret: ModuleType) -> None:
    t = np.arange(1, 1001, dtype=np.float64)
    assert regret.late_slope(2.0 * t) == pytest.approx(1.0)
    assert regret.late_slope(np.sqrt(t)) == pytest.approx(0.5, abs=1e-3)
    assert np.isnan(regret.late_slope(np.zeros(10)))
    curves = np.stack([np.full(100, 0.1), np.full(100, 0.3)])  # per-round regret of 2 seeds
    summary = regret.summarise(curves)
    assert summary["rounds"][0] == 1 and summary["rounds"][-1] == 100
    assert summary["mean"][-1] == pytest.approx(20.0)
    assert summary["final_per_seed"] == pytest.approx([10.0, 30.0])
    assert summary["late_slope_mean"] == pytest.approx(1.0)


def test_a_quick_run_writes_its_results(regret: ModuleType, tmp_path: Path) -> None:
    argv = ["--steps", "30", "--seeds", "2", "--policies", "oracle", "random", "cascade_ucb1"]
    assert regret.main([*argv, "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "regret.json").read_text())
    assert set(results["curves"]) == {"fixed", "contextual"}
    assert results["curves"]["fixed"]["oracle"]["final_per_seed"] == [0.0, 0.0]
    assert (tmp_path / "regret.png").stat().st_size > 0
    assert "| fixed | random |" in (tmp_path / "regret.md").read_text()


def test_one_seed_writes_a_table_without_intervals(regret: ModuleType, tmp_path: Path) -> None:
    argv = ["--steps", "30", "--seeds", "1", "--settings", "fixed", "--policies", "random"]
    assert regret.main([*argv, "--out", str(tmp_path)]) == 0
    table = (tmp_path / "regret.md").read_text()
    assert "(one seed)" in table and "±" not in table.split("\n\n")[0]
