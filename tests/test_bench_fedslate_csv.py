"""``fedrec bench fedslate --csv``: stdout carries the table as CSV and nothing else (the runs'
wall times and the plot's path go to stderr)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from fedrec.cli import main


def test_bare_csv_output_is_pure_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    command = ["bench", "fedslate", "--setting", "10x3", "--methods", "random", "--seeds", "1"]
    command += ["--episodes", "2", "--eval-episodes", "2", "--num-users", "2", "--no-planner"]
    assert main([*command, "--no-progress", "--out", str(out), "--csv"]) == 0
    captured = capsys.readouterr()
    blocks = captured.out.strip("\n").split("\n\n")
    rows = list(csv.reader(io.StringIO(blocks[0])))
    assert rows[0][:3] == ["group", "series", "seeds"]
    assert len(rows) > 1 and all(len(row) == len(rows[0]) for row in rows)
    for block in blocks[1:]:  # a further table (diagnostics) is CSV too
        block_rows = list(csv.reader(io.StringIO(block)))
        assert all(len(row) == len(block_rows[0]) for row in block_rows)
    assert "episodes in" in captured.err and "learning curves:" in captured.err
    assert "episodes in" not in captured.out
