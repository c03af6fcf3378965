"""Packaging: dependency ranges vs the exact pins, optional extras, the licence."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_library_dependencies_are_ranges_that_admit_the_pins() -> None:
    pins = _pins()
    for text in PROJECT["dependencies"]:
        requirement = Requirement(text)
        assert not any(s.operator == "==" for s in requirement.specifier), text
        assert any(s.operator == ">=" for s in requirement.specifier), f"{text}: no lower bound"
        pinned = pins[canonicalize_name(requirement.name)]
        # torch's pin is the CPU build (2.13.0+cpu); a range admits its public version.
        assert requirement.specifier.contains(Version(pinned.public.split("+")[0])), text


def test_optional_extras() -> None:
    extras = PROJECT["optional-dependencies"]
    names = {e: {canonicalize_name(Requirement(r).name) for r in extras[e]} for e in extras}
    assert "stable-baselines3" in names["sb3"]
    assert "tensorboard" in names["tensorboard"]
    assert {"pytest", "ruff", "recsim-no-tf", "six"} <= names["test"]
    assert "fedrec[sb3]" in extras["test"]  # the tests exercise the SB3 adapter
    pins = _pins()
    for extra in ("sb3", "tensorboard"):
        for text in extras[extra]:
            requirement = Requirement(text)
            assert requirement.specifier.contains(pins[canonicalize_name(requirement.name)])


def test_sb3_adapter_without_stable_baselines3_names_the_extra() -> None:
    """Simulate a missing package: ``sys.modules[name] = None`` makes its import fail."""
    code = (
        "import sys\n"
        "sys.modules['stable_baselines3'] = None\n"
        "try:\n"
        "    import fedrec.agents.sb3_adapter\n"
        "except ImportError as error:\n"
        "    print(error)\n"
        "else:\n"
        "    raise SystemExit('imported without stable_baselines3')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'fedrec[sb3]'" in result.stdout


def test_core_imports_without_stable_baselines3() -> None:
    code = (
        "import sys\n"
        "sys.modules['stable_baselines3'] = None\n"
        "import fedrec, fedrec.train, fedrec.eval.etror, fedrec.cli\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "text",
    [
        "Apache License\n                           Version 2.0, January 2004",
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "END OF TERMS AND CONDITIONS",
        "Copyright 2026 the fedrec authors",
        'Licensed under the Apache License, Version 2.0 (the "License");',
    ],
)
def test_license_is_the_apache_2_0_text(text: str) -> None:
    assert "Apache-2.0" in str(PROJECT["license"])
    assert text in (ROOT / "LICENSE").read_text()
