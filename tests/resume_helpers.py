"""Kill a training run right after a checkpoint, and read what a resumed run must reproduce:
shared by the exact-resume tests (``test_training_core.py``, ``test_resume_every_agent.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import fedrec.train.core as core


def die_after_checkpoint(
    monkeypatch: pytest.MonkeyPatch, run: Callable[[], object], *, checkpoints: int = 2
) -> None:
    """Call ``run()`` as a process that is killed (``KeyboardInterrupt``) right after it wrote its
    ``checkpoints``-th checkpoint; fails unless it died there. ``Trainer.checkpoint`` is restored
    afterwards, so the caller can resume."""
    written = {"n": 0}
    original = core.Trainer.checkpoint

    def dying_checkpoint(self: core.Trainer) -> None:
        original(self)
        written["n"] += 1
        if written["n"] == checkpoints:
            raise KeyboardInterrupt

    monkeypatch.setattr(core.Trainer, "checkpoint", dying_checkpoint)
    try:
        with pytest.raises(KeyboardInterrupt):
            run()
    finally:
        monkeypatch.setattr(core.Trainer, "checkpoint", original)


def final_eval_without_clock(run_dir: Path) -> dict:
    """The run's ``final_eval.json`` without its wall-clock fields."""
    data = json.loads((run_dir / "final_eval.json").read_text())
    for key in ("train_wall_time_s", "aggregation_seconds"):
        data.pop(key, None)
    for point in data.get("history", []):
        point.pop("seconds")
    return data
