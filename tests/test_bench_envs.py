"""`fedrec bench envs` in quick mode: the result structure, the table and the JSON (no timing checks)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
from rich.console import Console

from fedrec.experiments import envs as bench_envs

HAS_RECSIM = importlib.util.find_spec("recsim") is not None


def quick_args(**overrides: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_envs.add_parser(parser.add_subparsers(dest="benchmark"))
    args = parser.parse_args(["envs", "--quick"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_quick_run_structure() -> None:
    config = bench_envs.config_from_args(quick_args(steps=30))
    calls: list[str] = []
    result = bench_envs.run_benchmark(config, progress=calls.append)

    kinds = ["single", "unwrapped"] + (["recsim"] if HAS_RECSIM else [])
    expected = {(kind, 1) for kind in kinds} | {("batched", b) for b in bench_envs.QUICK_USERS}
    assert {(c.implementation, c.num_users) for c in result.cells} == expected
    assert len(calls) == bench_envs.count_measurements(config, HAS_RECSIM)
    for cell in result.cells:
        assert (cell.num_candidates, cell.slate_size) == bench_envs.QUICK_SETTINGS[0]
        assert cell.steps == (30,) * bench_envs.QUICK_REPEATS
        assert all(rate > 0 for rate in cell.rates)
        assert cell.minimum <= cell.median <= cell.maximum
    assert ("recsim-no-tf" in result.recsim) == HAS_RECSIM

    checks = result.targets()
    assert [c.setting for c in checks] == [(100, 10), (10, 3)]
    assert checks[0].met is None  # (100, 10) not measured in quick mode
    assert checks[1].met is (None if not HAS_RECSIM else checks[1].measured >= 3.0)

    console = Console(record=True, width=120)
    bench_envs.render(result, console)
    text = console.export_text()
    assert "fedrec make_vec" in text and "Targets" in text and "one thread" in text


def test_run_command_writes_json(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    assert bench_envs.run(quick_args(json=str(path), include_recsim=False, steps=10)) == 0
    data = json.loads(path.read_text())
    assert data["recsim"] == "not requested"
    assert {cell["implementation"] for cell in data["cells"]} == {"single", "unwrapped", "batched"}
    assert all(cell["median"] > 0 for cell in data["cells"])
    assert all(cell["vs_recsim"] is None for cell in data["cells"])


def test_bad_settings_rejected() -> None:
    with pytest.raises(ValueError, match="slate_size"):
        bench_envs.BenchConfig(settings=((3, 5),))
    parser = argparse.ArgumentParser()
    bench_envs.add_parser(parser.add_subparsers(dest="benchmark"))
    assert parser.parse_args(["envs", "--settings", "100,10", "500x10"]).settings == [
        (100, 10),
        (500, 10),
    ]
    for bad in (["--settings", "ten"], ["--seconds", "1", "--steps", "5"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["envs", *bad])
