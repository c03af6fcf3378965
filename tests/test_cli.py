"""The `fedrec` command line: help, environment listing and the demo."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import fedrec
from fedrec.cli import main


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("envs", "demo", "bench"):
        assert command in out


def test_envs_lists_every_registered_id(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["envs", "--plain"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == fedrec.environment_ids()
    assert all(len(line.split("\t")) == 3 and line.split("\t")[2] for line in lines)


def test_demo_prints_the_reference_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--episodes", "40", "--num-envs", "40"]) == 0
    out = capsys.readouterr().out
    for name in ("random", "myopic", "planner", "fedrec/ChocKaleLongTerm-v0"):
        assert name in out


def test_demo_with_the_fedslate_comparison(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """`make demo` = `fedrec demo --fedslate`: the reference table, then the short comparison."""
    argv = ["demo", "--episodes", "20", "--num-envs", "20", "--fedslate"]
    assert main([*argv, "--fedslate-episodes", "48", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "planner" in out and "FedSlate comparison" in out
    assert all(
        (tmp_path / m / "seed0" / "final_eval.json").is_file() for m in ("slateq", "fedslate")
    )
    assert (tmp_path / "learning_curves.png").is_file()
    with pytest.raises(SystemExit, match="fedslate-episodes"):
        main([*argv, "--fedslate-episodes", "0"])


def test_console_script_reports_errors_cleanly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fedrec.cli", "demo", "--episodes", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "episodes and num_envs must be >= 1" in result.stderr


def test_the_demo_writes_only_git_ignored_files() -> None:
    """`make demo` must leave `git status` clean: its default output folder is ignored by git."""
    from fedrec.cli import build_parser

    root = Path(__file__).resolve().parents[1]
    out = build_parser().parse_args(["demo"]).out
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    probe = Path(out) / "some-run" / "episodes.csv"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(probe)], cwd=root, check=False
    ).returncode
    assert ignored == 0, f"{out} is not git-ignored: make demo would dirty the repository"


#: A fenced block of a Markdown page: its language tag and its text.
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)


def _printed_commands() -> list[tuple[str, str]]:
    """(page, command) for every `fedrec ...` line of a bash block in the README and docs/."""
    root = Path(__file__).resolve().parents[1]
    found = []
    for page in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for block in FENCE.finditer(page.read_text()):
            if block["lang"] not in ("bash", "sh"):
                continue
            for line in block["body"].replace("\\\n", " ").splitlines():
                line = line.strip()
                if line.startswith("fedrec "):
                    # the command itself, without a trailing comment, pipe or redirection
                    command = re.split(r"\s(?:#|&&|\||>)", line)[0]
                    found.append((page.name, command))
    return found


def test_every_printed_fedrec_command_parses() -> None:
    """A command the README or docs print is accepted by the CLI as printed (flags, choices,
    subcommands); the long runs themselves are not repeated here."""
    from fedrec.cli import build_parser

    commands = _printed_commands()
    assert len(commands) > 20
    wrong = []
    for page, command in commands:
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit:
            wrong.append(f"{page}: {command}")
    assert not wrong, "commands the CLI refuses:\n" + "\n".join(wrong)


@pytest.mark.parametrize("argv", [["--help"], ["envs"], ["data", "list"]], ids=" ".join)
def test_start_up_commands_load_no_heavy_library(argv: list[str]) -> None:
    """`fedrec --help`, `fedrec envs` and `fedrec data list` run without PyTorch, SciPy, pandas,
    Ray or Flower (`--help` used to import them all and took seconds before printing anything;
    benchmarks/cli_startup.py times them)."""
    code = (
        "import contextlib, io, sys\n"
        "from fedrec.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        f"        main({argv!r})\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('torch', 'scipy', 'pandas', 'ray', 'flwr', 'sklearn', 'matplotlib')\n"
        "print(','.join(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip() == ""
