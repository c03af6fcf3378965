"""``fedrec bench longterm``: trains the contenders, reads finished runs instead of retraining them,
refuses a directory of another run, and ranks everything with oracle rows marked and paired
regrets computed on the same held-out episodes."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from fedrec.cli import main
from fedrec.experiments.longterm import leaderboard

ARGS = ["--settings", "10x3", "--agents", "rule_search", "slateq_myopic", "--seeds", "2"]
SHORT = ["--episodes", "32", "--eval-episodes", "16", "--no-progress"]


def test_the_leaderboard_ranks_contenders_and_references_and_marks_oracles(tmp_path, capsys):
    assert main(["bench", "longterm", *ARGS, *SHORT, "--out", str(tmp_path)]) == 0
    board = tmp_path / "10x3"
    assert (board / "learning_curves.png").stat().st_size > 0
    with (board / "leaderboard.csv").open() as handle:
        rows = {row["policy"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {
        "rule_search", "slateq_myopic", "planner", "myopic", "top_x", "bottom_x",
        "best_open_loop", "random",
    }  # fmt: skip
    assert {p for p, r in rows.items() if r["oracle"] == "oracle"} == {"planner", "myopic"}
    finals = [
        float(r["final greedy return"].split(" ± ")[0].replace(",", "")) for r in rows.values()
    ]
    ranks = [int(r["rank"]) for r in rows.values()]
    assert [f for _, f in sorted(zip(ranks, finals, strict=True))] == sorted(finals, reverse=True)
    assert rows["planner"]["regret to planner"] == ""
    assert rows["rule_search"]["episodes"] == "32"

    # the regret is paired per seed on the same held-out episodes, then averaged over seeds
    runs = {"rule_search": [board / "rule_search" / f"seed{s}" for s in (0, 1)]}
    (row,) = [r for r in leaderboard(runs) if r.policy == "rule_search"]
    per_seed = []
    for path in runs["rule_search"]:
        policies = json.loads((path / "final_eval.json").read_text())["policies"]
        per_seed.append(
            np.mean(np.subtract(policies["planner"]["returns"], policies["agent"]["returns"]))
        )
    assert row.regret.mean == pytest.approx(np.mean(per_seed))
    assert row.seeds == 2 and not row.oracle

    # run again: the finished runs are read, not retrained
    before = (board / "rule_search" / "seed0" / "episodes.csv").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["bench", "longterm", *ARGS, *SHORT, "--out", str(tmp_path), "--no-plot"]) == 0
    assert "finished run" in capsys.readouterr().out
    assert (board / "rule_search" / "seed0" / "episodes.csv").stat().st_mtime_ns == before

    # another budget in the same directory is another run: refused, nothing overwritten
    longer = ["--episodes", "48", *SHORT[2:]]
    assert main(["bench", "longterm", *ARGS, *longer, "--out", str(tmp_path)]) != 0
    assert "holds another run (episodes differ" in capsys.readouterr().err
    assert (board / "rule_search" / "seed0" / "episodes.csv").stat().st_mtime_ns == before


def test_an_archived_log_reads_like_the_plain_one(tmp_path):
    """Committed long runs keep their episode log gzipped (``episodes.csv.gz``)."""
    import gzip
    import shutil

    from fedrec.eval.etror import load_run

    assert main(["bench", "longterm", *ARGS[:3], "rule_search", "--seeds", "1", *SHORT,
                 "--out", str(tmp_path), "--no-plot"]) == 0  # fmt: skip
    run = tmp_path / "10x3" / "rule_search" / "seed0"
    plain = load_run(run)
    with (run / "episodes.csv").open("rb") as src, gzip.open(run / "episodes.csv.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (run / "episodes.csv").unlink()
    archived = load_run(run)
    assert archived.episodes.equals(plain.episodes)
    assert [r.policy for r in leaderboard({"rule_search": [run]})]  # the leaderboard reads it


def test_references_missing_from_a_run_are_evaluated_on_its_held_out_episodes(tmp_path):
    """A run trained before a reference policy existed: the leaderboard evaluates that policy
    on the run's own held-out episodes (checked against the references the run recorded)."""
    from fedrec.experiments.longterm import reference_returns

    assert main(["bench", "longterm", *ARGS[:3], "rule_search", "--seeds", "1", *SHORT,
                 "--out", str(tmp_path), "--no-plot"]) == 0  # fmt: skip
    run = tmp_path / "10x3" / "rule_search" / "seed0"
    final = json.loads((run / "final_eval.json").read_text())
    del final["policies"]["best_open_loop"]  # as in a run made before it existed
    (run / "final_eval.json").write_text(json.dumps(final))
    references = {0: reference_returns("10x3", 0, out=tmp_path, episodes=16, log=lambda *_: None)}
    rows = {r.policy: r for r in leaderboard({"rule_search": [run]}, references)}
    assert "best_open_loop" in rows and not rows["best_open_loop"].oracle
    np.testing.assert_array_equal(
        references[0]["bottom_x"], final["policies"]["bottom_x"]["returns"]
    )
    # references of other episodes are refused, not mixed in
    shifted = {0: {**references[0], "bottom_x": references[0]["bottom_x"] + 1.0}}
    with pytest.raises(ValueError, match="same held-out episodes"):
        leaderboard({"rule_search": [run]}, shifted)
    # a references file of another setting is refused with its name
    with pytest.raises(ValueError, match="another setting"):
        reference_returns("10x3", 0, out=tmp_path, episodes=32, log=lambda *_: None)
