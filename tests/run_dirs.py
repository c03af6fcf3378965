"""Run directories written by hand, for the tests of ``fedrec eval`` (no training needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_run(
    path: Path,
    columns: dict[str, np.ndarray],
    final: dict | None,
    *,
    label: str | None = None,
    seed: int = 0,
) -> Path:
    """``config.json``, ``episodes.csv`` with the return ``columns`` (61-step episodes) and,
    unless ``final`` is None, ``final_eval.json``; a ``return`` column makes it single-platform."""
    path.mkdir(parents=True)
    env_id = "fedrec/ChocKaleMultiPlatform-v0" if "return" not in columns else "fedrec/ChocKale-v0"
    config = {"agent": "fedslate", "env_id": env_id, "seed": seed}
    if label is not None:
        config["label"] = label
    (path / "config.json").write_text(json.dumps(config))
    names = list(columns)
    rows = ["episode,step,length," + ",".join(names)]
    for i in range(len(columns[names[0]])):
        rows.append(f"{i + 1},{61 * (i + 1)},61," + ",".join(f"{columns[n][i]}" for n in names))
    (path / "episodes.csv").write_text("\n".join(rows) + "\n")
    if final is not None:
        (path / "final_eval.json").write_text(json.dumps(final))
    return path
