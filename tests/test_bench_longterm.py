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


def test_references_missing_from_a_run_are_evaluated_on_its_held_out_episodes(tmp_path, capsys):
    """A run trained before a reference policy existed: the leaderboard evaluates that policy
    on the run's own held-out episodes into references.json (the run's files stay as they are)."""
    from fedrec.train.references import complete_references

    args = [*ARGS[:3], "rule_search", "--seeds", "1", *SHORT, "--out", str(tmp_path), "--no-plot"]
    assert main(["bench", "longterm", *args]) == 0
    run = tmp_path / "10x3" / "rule_search" / "seed0"
    final = json.loads((run / "final_eval.json").read_text())
    recorded = final["policies"].pop("best_open_loop")
    (run / "final_eval.json").write_text(json.dumps(final))  # as in a run made before it existed
    assert main(["bench", "longterm", *args]) == 0
    added = json.loads((run / "references.json").read_text())
    assert added["seed"] == final["seed"] and set(added["policies"]) == {"best_open_loop"}
    assert added["policies"]["best_open_loop"]["returns"] == recorded["returns"]
    assert "best_open_loop" not in json.loads((run / "final_eval.json").read_text())["policies"]
    with (tmp_path / "10x3" / "leaderboard.csv").open() as handle:
        assert "best_open_loop" in {row["policy"] for row in csv.DictReader(handle)}
    assert complete_references(run) == run / "references.json"  # nothing more to add

    # other episodes are refused: bottom_x, recomputed, would not match the run's record
    final["policies"]["bottom_x"]["returns"][0] += 1.0
    (run / "final_eval.json").write_text(json.dumps(final))
    (run / "references.json").unlink()
    with pytest.raises(ValueError, match="not the same held-out episodes"):
        complete_references(run)
    # a references file of other episodes, or naming a recorded policy, is refused on load
    (run / "references.json").write_text(json.dumps({**added, "seed": 1}))
    with pytest.raises(ValueError, match="not evaluated on the run's episodes"):
        leaderboard({"rule_search": [run]})
    clash = {**added, "policies": {"bottom_x": added["policies"]["best_open_loop"]}}
    (run / "references.json").write_text(json.dumps(clash))
    with pytest.raises(ValueError, match=r"already in final_eval\.json"):
        leaderboard({"rule_search": [run]})
