"""``fedrec bench zoo``: a tiny leaderboard end to end through the CLI (reference rows, skip
reasons, oracles marked, the SB3 throughput ratio), a rerun that reads the records and one that
reproduces a deleted record, a folder of another configuration refused, and the committed
``results/zoo`` leaderboard rebuilt from its records alone."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fedrec.cli import main
from fedrec.experiments import zoo

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "zoo"


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zoo") / "board"
    assert main(["bench", "zoo", "--quick", "--out", str(out)]) == 0
    return out


def _rows(out: Path) -> dict[tuple[str, str], dict[str, str]]:
    with (out / "leaderboard.csv").open(encoding="utf-8") as handle:
        return {(row["env"], row["policy"]): row for row in csv.DictReader(handle)}


def test_the_quick_leaderboard_has_references_oracles_and_skip_reasons(quick: Path) -> None:
    rows = _rows(quick)
    slate = {policy: row for (env, policy), row in rows.items() if env == "slate"}
    for reference in ("random", "top_x", "bottom_x", "best_open_loop", "planner"):
        assert slate[reference]["mean return"], reference
    assert slate["planner"]["kind"] == "oracle" and slate["top_x"]["kind"] == "reference"
    assert slate["reinforce_topk"]["kind"] == "learner"
    assert "no hidden user types" in slate["belief_planner"]["note"]
    cascade = {policy: row for (env, policy), row in rows.items() if env == "cascade"}
    assert cascade["cascade_oracle"]["kind"] == "oracle" and cascade["cascade_oracle"]["rank"]
    # agents that need Choc-vs-Kale's model are skipped on the cascade env, with the reason
    for skipped in ("rule_search", "slateq"):
        assert cascade[skipped]["note"].startswith("skipped: "), skipped
        assert "Choc-vs-Kale" in cascade[skipped]["note"]
        assert cascade[skipped]["mean return"] == ""
    assert cascade["planner"]["note"].startswith("skipped: needs the Choc-vs-Kale model")
    # learners carry their training time and throughput, and a verdict against the best rule
    learner = slate["reinforce_topk"]
    assert float(learner["train s/run"]) >= 0 and float(learner["env steps/s"].replace(",", "")) > 0
    assert learner["verdict"] in ("beats", "tie", "below")
    assert sum(row["note"] == "best no-learning policy" for row in slate.values()) == 1
    markdown = (quick / "leaderboard.md").read_text(encoding="utf-8")
    assert "Stable-Baselines3 SAC" in markdown and "Stable-Baselines3 PPO" in markdown
    speed = json.loads((quick / "speed.json").read_text())["pairs"]
    assert set(speed) == {"sac_topk", "reinforce_topk"}
    assert all(pair["ratio"] > 0 for pair in speed.values())
    assert "| planner (oracle) |" in (quick / "headline.md").read_text(encoding="utf-8")


def test_a_rerun_reads_the_records_and_a_deleted_one_is_reproduced(
    quick: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (quick / "leaderboard.md").read_text(encoding="utf-8")
    record = quick / "runs" / "cascade" / "reinforce_topk" / "seed1.json"
    stamp = record.stat().st_mtime_ns
    capsys.readouterr()
    assert main(["bench", "zoo", "--quick", "--out", str(quick)]) == 0
    assert record.stat().st_mtime_ns == stamp  # read, not rerun
    assert (quick / "leaderboard.md").read_text(encoding="utf-8") == before
    assert zoo.rebuild(quick) == before

    saved = json.loads(record.read_text())
    record.unlink()
    assert main(["bench", "zoo", "--quick", "--out", str(quick)]) == 0
    again = json.loads(record.read_text())
    assert again["mean"] == saved["mean"]  # seeded: the same greedy return, bit for bit
    assert again["env_steps"] == saved["env_steps"]
    assert _rows(quick)[("cascade", "reinforce_topk")]["mean return"] == _rows_from(before)


def _rows_from(markdown: str) -> str:
    """The cascade reinforce_topk mean-return cell of a leaderboard's Markdown."""
    section = markdown.split("## cascade")[1].split("## ")[0]
    (line,) = [line for line in section.splitlines() if "| reinforce_topk |" in line]
    return line.split(" | ")[4]


def test_another_configuration_in_the_same_folder_is_refused(
    quick: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.stat().st_mtime_ns for p in quick.rglob("*.json"))
    capsys.readouterr()
    code = main(["bench", "zoo", "--quick", "--seeds", "3", "--out", str(quick)])
    assert code != 0
    assert "holds a leaderboard of another configuration (seeds differ)" in capsys.readouterr().err
    assert sorted(p.stat().st_mtime_ns for p in quick.rglob("*.json")) == before


def test_a_record_of_another_setup_is_refused(tmp_path: Path) -> None:
    config = zoo.ZooConfig(**{**zoo.QUICK, "out": str(tmp_path)})
    env, name, seed, key = zoo._specs(config)[1]
    path = zoo.run_path(tmp_path, env, name, seed)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": {**key, "steps": 1}, "skipped": "x"}))
    with pytest.raises(zoo.harness.BenchError, match=r"another configuration \(steps differ\)"):
        zoo._cached(path, key, zoo.AGENT_RECORD, "zoo run record")
    path.write_text(json.dumps({"key": key, "mean": float("nan"), "eval_seconds": 1.0}))
    with pytest.raises(zoo.harness.BenchError, match="mean: nan is not finite"):
        zoo._cached(path, key, zoo.AGENT_RECORD, "zoo run record")


@pytest.mark.skipif(not COMMITTED.exists(), reason="no committed results/zoo")
def test_the_committed_leaderboard_is_what_its_records_give() -> None:
    """results/zoo/leaderboard.md is rebuilt from its config.json and run records (nothing is
    trained), and its configuration is the command's default, so ``fedrec bench zoo --out
    results/zoo`` reproduces it."""
    config = json.loads((COMMITTED / "config.json").read_text())
    if any(zoo.ENVS[env].sardine for env in config["envs"]) and not zoo.sardine_installed():
        pytest.skip("the committed leaderboard includes SARDINE, which is not installed")
    assert zoo.rebuild(COMMITTED) == (COMMITTED / "leaderboard.md").read_text(encoding="utf-8")
    assert config == zoo.harness.json_ready(zoo.ZooConfig().key())
