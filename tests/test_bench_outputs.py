"""The ``fedrec bench`` drivers never touch the committed ``results/`` by default, never replace
the results of another configuration, and refuse malformed seed / cache files with one line."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import pytest

from fedrec.cli import main
from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups
from fedrec.experiments import fel

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--methods", "random", "--clusters", "2", "--target-epsilon", "--rounds", "2"]


def _tree_hash(folder: Path) -> str:
    digest = hashlib.sha1()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def taobao_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_taobao_groups(
        tmp_path_factory.mktemp("bench_out") / "data", num_users=200, num_ads=50, ctr=0.1
    )


def _fel(taobao_dir: Path, *extra: str) -> list[str]:
    return ["bench", "fel", "--quick", "--data-dir", str(taobao_dir), *QUICK, "--no-progress",
            *extra]  # fmt: skip


def test_bench_fel_default_out_leaves_results_alone(
    taobao_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run from a copy of the repository's results/ (cwd = the copy's root) with the default
    --out writes under runs/bench/fel/, and results/ is byte for byte what it was."""
    import shutil

    shutil.copytree(ROOT / "results" / "fel", tmp_path / "results" / "fel")
    before = _tree_hash(tmp_path / "results")
    monkeypatch.chdir(tmp_path)
    assert main(_fel(taobao_dir)) == 0
    assert _tree_hash(tmp_path / "results") == before
    (run,) = (tmp_path / "runs" / "bench" / "fel").iterdir()
    assert (run / "taobao-synthetic" / "table.md").is_file()
    assert main(_fel(taobao_dir, "--rounds", "3")) == 0  # another configuration: its own folder
    assert len(list((tmp_path / "runs" / "bench" / "fel").iterdir())) == 2


@pytest.fixture(scope="module")
def fel_out(taobao_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fel_out")
    assert main(_fel(taobao_dir, "--out", str(out))) == 0
    return out


def test_another_configuration_in_the_same_out_is_refused(
    taobao_dir: Path, fel_out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = fel_out / "taobao-synthetic" / "seeds" / "seed0.json"
    before = seed.read_bytes()
    capsys.readouterr()
    assert main(_fel(taobao_dir, "--out", str(fel_out), "--rounds", "3")) == 2
    err = capsys.readouterr().err.strip()
    assert "another configuration (rounds differ)" in err and "--out" in err
    assert len(err.splitlines()) == 1
    assert seed.read_bytes() == before
    # fewer seeds than the folder holds: the table would drop one
    assert main(_fel(taobao_dir, "--out", str(fel_out), "--first-seed", "1")) == 2
    assert "seed files this call does not include (seed0)" in capsys.readouterr().err
    assert seed.read_bytes() == before
    # the same configuration reads its finished seed
    assert main(_fel(taobao_dir, "--out", str(fel_out))) == 0


def _broken(records: list[dict]) -> dict[str, list[dict]]:
    first = dict(records[0])
    nan_auc = [dict(r) for r in records]
    nan_auc[0] = {**first, "auc": {"baseline": math.nan}}
    missing = [dict(r) for r in records]
    missing[-1] = {k: v for k, v in records[-1].items() if k != "auc"}
    wrong = [dict(r) for r in records]
    wrong[0] = {**first, "client_updates": "12"}
    return {
        "cut to one record": records[:1],
        "NaN AUC": nan_auc,
        "missing key": missing,
        "wrong type": wrong,
    }


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("cut to one record", "1 records, expected"),
        ("NaN AUC", "auc: baseline: nan is not finite"),
        ("missing key", "missing key(s) auc"),
        ("wrong type", "client_updates: '12' is not an integer"),
        ("torn write", "is not a valid fedrec bench fel seed file ("),
    ],
)
def test_malformed_seed_files_are_refused_in_one_line(
    taobao_dir: Path,
    fel_out: Path,
    tmp_path: Path,
    case: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(fel_out, out)
    seed = out / "taobao-synthetic" / "seeds" / "seed0.json"
    saved = json.loads(seed.read_text())
    if case == "torn write":
        seed.write_text(seed.read_text()[:100])
    else:
        saved["records"] = _broken(saved["records"])[case]
        seed.write_text(json.dumps(saved))
    table = (out / "taobao-synthetic" / "table.md").read_bytes()
    capsys.readouterr()
    assert main(_fel(taobao_dir, "--out", str(out))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(seed) in err and message in err
    assert (out / "taobao-synthetic" / "table.md").read_bytes() == table  # nothing rewritten


def test_committed_fel_tables_rebuild_from_their_seed_files() -> None:
    """The committed seed files pass the checks and give the committed tables unchanged."""
    for data in ("taobao-synthetic", "ml-100k"):
        folder = ROOT / "results" / "fel" / data
        saved = json.loads((folder / "seeds" / "seed0.json").read_text())
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["config"].items()}
        config = fel.BenchFELConfig(**fields, seeds=3, out=str(folder.parent), progress=False)
        finished = fel.check_out(folder, config)
        records = [r for seed in config.seed_list for r in finished[seed]]
        rows = fel.summarise(records, config)
        assert fel.render_markdown(rows, config) == (folder / "table.md").read_text()


def test_every_driver_defaults_outside_results() -> None:
    """No `fedrec bench` driver's default output folder lies under results/."""
    import argparse

    from fedrec import cli_bench

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="bench")
    import importlib

    for module in cli_bench.BENCHMARKS.values():
        importlib.import_module(module).add_parser(sub)
    for name, sub_parser in sub.choices.items():
        for action in sub_parser._actions:
            if action.dest in ("out", "json"):
                assert action.default is None or not str(action.default).startswith("results"), name
    assert fel.BenchFELConfig().out is None
    from fedrec.experiments.fedncf import BenchFedNCFConfig, out_of

    assert str(out_of(BenchFedNCFConfig(aggregators=("fedavg",)))).startswith(
        os.path.join("runs", "bench", "fedncf")
    )


def test_fedncf_cache_files_are_checked_whole(tmp_path: Path) -> None:
    from fedrec.experiments import harness
    from fedrec.experiments.fedncf import record_check

    spec = {"kind": "central", "model": "gmf", "seed": 0, "epochs": 1, "progress": True}
    good = {"spec": spec, "history": [{"global_round": 1.0, "hit_rate": 0.5, "ndcg": 0.2}],
            "hit_rate": 0.5, "ndcg": 0.2, "selected": None, "train_seconds": 1.0,
            "best_hit_rate": 0.5}  # fmt: skip
    path = tmp_path / "run.json"
    for bad, message in (
        ({**good, "hit_rate": math.nan}, "hit_rate: nan is not finite"),
        ({k: v for k, v in good.items() if k != "ndcg"}, "missing key(s) ndcg"),
        ({**good, "spec": {**spec, "epochs": 2}}, "another run's (epochs differ)"),
    ):
        path.write_text(json.dumps(bad))
        with pytest.raises(
            harness.BenchError, match=message.replace("(", r"\(").replace(")", r"\)")
        ):
            harness.read_cached(path, record_check(spec), "fedncf run cache file")
    path.write_text(json.dumps(good))
    assert harness.read_cached(path, record_check(spec), "x") == good


def test_plus_minus_can_read_a_zero_half_width_as_no_interval() -> None:
    from fedrec.experiments.harness import plus_minus

    assert plus_minus(0.5, 0.0, 4) == "0.5000 ± 0.0000"
    assert plus_minus(0.5, 0.0, 4, zero_is_none=True) == "0.5000"
