"""The docs site (``make docs``) builds offline with warnings as errors and documents every name.

One Sphinx build (furo theme, MyST guides, autodoc API pages) into a temporary folder, then: the
key pages hold what they should (SlateQ's agent, the Choc-vs-Kale env card, the IPS estimator),
and every public class and function of fedrec.envs, fedrec.agents, fedrec.federation,
fedrec.train and fedrec.eval, and every name their packages export, is on its package's page.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

for _package in ("sphinx", "furo", "myst_parser"):
    pytest.importorskip(
        _package, reason="the docs build needs the extra: pip install 'fedrec[docs]'"
    )

# Flower's command line (imported with fedrec.federation's Flower modules) uses a deprecated click API.
pytestmark = pytest.mark.filterwarnings("ignore:'click.utils:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = ("envs", "agents", "federation", "train", "eval")
#: Seconds: the build takes about 45 s of CPU (3-4 min on two cores shared by 15 processes).
TIMEOUT = 900


def _build(out: Path) -> Path:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    env["PYTHONWARNINGS"] = "ignore::UserWarning"  # recsim's gym import warns on stderr
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q"]
    done = subprocess.run(
        [*command, "-d", str(out / "doctrees"), str(DOCS), str(out / "html")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, f"sphinx-build -W failed:\n{done.stderr[-6000:]}"
    return out / "html"


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'id="([^"]+)"', page.read_text(encoding="utf-8")))


def _undocumented(html: Path, short: str) -> list[str]:
    """The public names of ``fedrec.<short>`` missing from its page."""
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        from fedrec_sphinx import submodules
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    package = importlib.import_module(f"fedrec.{short}")
    page = html / "api" / f"{short}.html"
    ids, text = _ids(page), page.read_text(encoding="utf-8")
    missing = [name for name in getattr(package, "__all__", ()) if name not in text]
    for module in [package, *(importlib.import_module(i.name) for i in submodules(package))]:
        if f"module-{module.__name__}" not in ids:
            missing.append(module.__name__)
        exported = getattr(module, "__all__", None)
        for name, value in vars(module).items():
            if name.startswith("_") or not (inspect.isclass(value) or inspect.isfunction(value)):
                continue
            if value.__module__ != module.__name__ or (
                exported is not None and name not in exported
            ):
                continue
            if f"{module.__name__}.{name}" not in ids:
                missing.append(f"{module.__name__}.{name}")
    return missing


def test_docs_build_with_warnings_as_errors(tmp_path: Path) -> None:
    """One test, so that ``pytest -n 2`` builds the site once."""
    guides = sorted(DOCS.glob("*.md"))  # pages added while it builds are not checked
    html = _build(tmp_path)
    assert (html / "index.html").is_file()
    for guide in guides:
        assert (html / f"{guide.stem}.html").is_file(), f"docs/{guide.name} was not built"
    assert "fedrec.agents.slateq.SlateQAgent" in _ids(html / "api" / "agents.html")
    assert "fedrec.eval.ope.bandit.ips" in _ids(html / "api" / "eval.html")
    cards = (html / "api" / "env_cards.html").read_text(encoding="utf-8")
    assert re.search(r"<h2>ChocKaleEnv", cards), "no Choc-vs-Kale card"
    assert "<h3>Observation Space" in cards and "fedrec/ChocKale-v0" in cards
    # A card's Markdown table is a table on the cards page and in the class's API entry.
    assert "response_engagement" in cards and "<table" in cards
    entry = (html / "api" / "envs.html").read_text(encoding="utf-8")
    assert 'class="rubric">Observation Space' in entry and "<table" in entry
    missing = {short: _undocumented(html, short) for short in PACKAGES}
    assert not any(missing.values()), f"public names missing from the API pages: {missing}"
