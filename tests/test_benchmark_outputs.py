"""The standalone scripts of ``benchmarks/`` never write into the committed ``results/`` by
default and never replace a file an earlier run wrote unless told to (``--overwrite``): their
default output is ``runs/benchmarks/SCRIPT/``, and the check comes before any work."""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedrec.experiments.harness import (
    RUNS_ROOT,
    SCRIPTS_ROOT,
    BenchError,
    add_out_arguments,
    claim_outputs,
    run_script,
    script_out,
)

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
SHELL_SCRIPTS = sorted(BENCHMARKS.glob("*.sh"))
REFUSED = re.compile(
    r"^error: .+ exists \(written by an earlier run\): pass --overwrite to replace it, "
    r"or choose another --out$"
)

# ------------------------------------------------------------------------------ static checks


def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every docstring node (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _is_results(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in ("results", "./results")


def results_paths(source: str) -> list[str]:
    """Where a script's code (docstrings and comments aside) names a path under ``results/``:
    a string starting with ``results/``, ``X / "results"`` or ``Path("results", ...)``."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.replace("\\", "/").removeprefix("./")
            if id(node) not in docstrings and text.startswith("results/"):
                found.append(f"line {node.lineno}: {node.value!r}")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            if _is_results(node.left) or _is_results(node.right):
                found.append(f"line {node.lineno}: ... / 'results'")
        elif isinstance(node, ast.Call) and node.args and _is_results(node.args[0]):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in ("Path", "PurePath", "join"):
                found.append(f"line {node.lineno}: {name}('results', ...)")
    return found


SHELL_DEFAULT = re.compile(r"\$\{\w+:-\.?/?results\b|^\s*\w+=[\"']?\.?/?results\b", re.M)


def shell_results_defaults(source: str) -> list[str]:
    """Variables of a shell script that default to a path under ``results/``."""
    return [match.group(0).strip() for match in SHELL_DEFAULT.finditer(source)]


def test_the_static_checks_find_a_results_default() -> None:
    """The checks below catch the patterns the scripts used before (so they can fail)."""
    for source in (
        'parser.add_argument("--out", default="results/fedncf")',
        'parser.add_argument("--out", type=Path, default=Path("results/offline"))',
        'OUT = Path("results") / "rllib_criteria"',
        'DEFAULT = ROOT / "results" / "cascade"',
    ):
        assert results_paths(source), source
    assert not results_paths('"""Writes results/x/table.md."""\nrow = {"results": 1}\n')
    assert shell_results_defaults("OUT=${OUT:-results/slateq}\n")
    assert not shell_results_defaults("OUT=${OUT:-runs/benchmarks/slateq_proof}\n")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_script_defaults_to_results(script: Path) -> None:
    """No script names a path under results/ in its code: not as a default ``--out``, not as a
    constant; results/ is written only when ``--out`` names it."""
    found = results_paths(script.read_text(encoding="utf-8"))
    assert not found, f"{script.name} names a path under results/: {found}"


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_no_shell_script_defaults_to_results(script: Path) -> None:
    found = shell_results_defaults(script.read_text(encoding="utf-8"))
    assert not found, f"{script.name} defaults to a path under results/: {found}"


def _calls(tree: ast.AST) -> set[str]:
    return {
        getattr(node.func, "id", getattr(node.func, "attr", ""))
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_with_outputs_claims_them(script: Path) -> None:
    """A script with ``--out`` (or ``--json``) has ``--overwrite``, checks its files with
    :func:`claim_outputs` and runs under :func:`run_script` (one-line errors)."""
    source = script.read_text(encoding="utf-8")
    tree = ast.parse(source)
    calls = _calls(tree)
    options = {
        node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value
    }
    if not ({"--out", "--json"} & options or "add_out_arguments" in calls):
        return
    assert "--overwrite" in options or "add_out_arguments" in calls, script.name
    assert "claim_outputs" in calls, script.name
    assert "run_script" in calls, script.name


# ------------------------------------------------------------------------------ the helpers


def test_script_out_defaults_under_runs() -> None:
    assert SCRIPTS_ROOT == Path("runs") / "benchmarks"
    assert SCRIPTS_ROOT.parent == RUNS_ROOT.parent  # runs/, git-ignored
    assert script_out("fedncf_speed", None) == Path("runs/benchmarks/fedncf_speed")
    assert script_out("flower_scale", None, "scale.json") == Path(
        "runs/benchmarks/flower_scale/scale.json"
    )
    assert script_out("fedncf_speed", "results/fedncf") == Path("results/fedncf")
    assert script_out("flower_scale", Path("x.json"), "scale.json") == Path("x.json")
    gitignore = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "/runs/" in gitignore


def test_claim_outputs_refuses_an_existing_file(tmp_path: Path) -> None:
    old, new = tmp_path / "old" / "speed.md", tmp_path / "new" / "speed.json"
    claim_outputs([old, new], overwrite=False)  # nothing there yet: fine
    assert not old.parent.exists() and not new.parent.exists()  # and nothing made
    old.parent.mkdir()
    old.write_text("earlier run\n")
    with pytest.raises(BenchError) as error:
        claim_outputs([new, old], overwrite=False)
    message = str(error.value)
    assert REFUSED.match(f"error: {message}") and str(old) in message
    assert len(message.splitlines()) == 1
    assert old.read_text() == "earlier run\n"
    claim_outputs([new, old], overwrite=True)
    claim_outputs(iter([str(new)]), overwrite=False)  # any iterable, str paths too


def test_add_out_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_out_arguments(parser, "flower_scale", name="scale.json", what="the JSON")
    args = parser.parse_args([])
    assert args.out is None and args.overwrite is False
    args = parser.parse_args(["--out", "results/flower/scale.json", "--overwrite"])
    assert args.out == "results/flower/scale.json" and args.overwrite is True
    text = " ".join(parser.format_help().split())
    assert "runs/benchmarks/flower_scale/scale.json" in text and "--overwrite" in text


def test_run_script_turns_a_bench_error_into_one_line() -> None:
    assert run_script(lambda: 3) == 3

    def refused() -> None:
        raise BenchError("x.json exists")

    with pytest.raises(SystemExit) as stop:
        run_script(refused)
    assert stop.value.code == "error: x.json exists"

    def broken() -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):  # only the user's errors become one line
        run_script(broken)


# ------------------------------------------------------------------------------ real scripts


def _run(script: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    command = ["bash"] if script.endswith(".sh") else [sys.executable]
    return subprocess.run(
        [*command, str(BENCHMARKS / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", **env},
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_ope_script_default_out_refusal_and_overwrite(tmp_path: Path) -> None:
    """ope_cross_platform.py (tiny sizes) from an empty folder: the default writes under
    runs/benchmarks/ope_cross_platform/ and makes no results/; a second run is refused with one
    line and leaves the files byte for byte; with --overwrite it runs and replaces them."""
    tiny = ["--datasets", "1", "--users", "20", "--truth-users", "40"]
    first = _run("ope_cross_platform.py", *tiny, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out = tmp_path / "runs" / "benchmarks" / "ope_cross_platform"
    assert sorted(_snapshot(out)) == ["results.json", "table.md"]
    assert not (tmp_path / "results").exists()
    before = _snapshot(out)

    again = _run("ope_cross_platform.py", *tiny, cwd=tmp_path)
    assert again.returncode != 0
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and REFUSED.match(lines[0]), again.stderr
    assert "runs/benchmarks/ope_cross_platform/results.json" in lines[0]
    assert _snapshot(out) == before

    (out / "table.md").write_text("stale\n")
    replaced = _run("ope_cross_platform.py", *tiny, "--overwrite", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert (out / "table.md").read_text() != "stale\n"
    assert json.loads((out / "results.json").read_text())["rows"]


def test_cascade_replot_needs_overwrite(tmp_path: Path) -> None:
    """A re-plot rewrites regret.md and regret.png, so it too is refused without --overwrite."""
    out = tmp_path / "cascade"
    tiny = ["--steps", "8", "--seeds", "2", "--settings", "fixed", "--policies", "oracle", "random"]
    first = _run("cascade_regret.py", *tiny, "--out", str(out), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    before = _snapshot(out)
    assert set(before) == {"regret.json", "regret.md", "regret.png"}
    replot = _run("cascade_regret.py", "--replot", "--out", str(out), cwd=tmp_path)
    assert replot.returncode != 0
    assert REFUSED.match(replot.stderr.strip()), replot.stderr
    assert _snapshot(out) == before
    (out / "regret.md").write_text("stale\n")
    replot = _run("cascade_regret.py", "--replot", "--overwrite", "--out", str(out), cwd=tmp_path)
    assert replot.returncode == 0, replot.stderr
    assert (out / "regret.md").read_text() != "stale\n"
    assert (out / "regret.json").read_bytes() == before["regret.json"]  # read, not rewritten


def test_slateq_proof_refuses_before_training(tmp_path: Path) -> None:
    """slateq_proof.sh (``fedrec`` replaced by a recorder): the default OUT is under
    runs/benchmarks/; an existing run directory stops it before anything runs."""
    log = tmp_path / "calls.txt"
    recorder = tmp_path / "fedrec"
    recorder.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    recorder.chmod(0o755)
    done = _run("slateq_proof.sh", "0", cwd=tmp_path, FEDREC=str(recorder))
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert all("runs/benchmarks/slateq_proof/" in call for call in calls[:-1]), calls
    assert not any("--out results/" in call for call in calls)

    log.unlink()
    (tmp_path / "runs" / "benchmarks" / "slateq_proof" / "slate-100x10" / "slateq-seed0").mkdir(
        parents=True
    )
    refused = _run("slateq_proof.sh", "0", cwd=tmp_path, FEDREC=str(recorder))
    assert refused.returncode != 0 and not log.exists()
    message = refused.stderr.strip()
    assert message.startswith(
        "error: runs/benchmarks/slateq_proof/slate-100x10/slateq-seed0 exists"
    )
    assert "--overwrite" in message and len(message.splitlines()) == 1
    forced = _run("slateq_proof.sh", "--overwrite", "0", cwd=tmp_path, FEDREC=str(recorder))
    assert forced.returncode == 0 and log.exists()
