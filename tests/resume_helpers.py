"""Kill a training run right after a checkpoint, and read what a resumed run must reproduce:
shared by the exact-resume tests (``test_training_core.py``, ``test_resume_every_agent.py``); and
play a multi-platform agent's training episodes by hand, then resume it from plain data (the
FedCEM tests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def play_episodes(agent: Any, env: Any, episodes: int, *, seed: int | None = 0) -> None:
    """Train a multi-platform ``agent`` for ``episodes`` synchronised episodes of ``env`` (the
    first reset with ``seed``), handing it the feedback platforms' rewards only."""
    for episode in range(episodes):
        observations, _ = env.reset(seed=seed if episode == 0 else None)
        running = True
        while running:
            slates = agent.explore(observations)
            next_observations, rewards, terminated, _, _ = env.step(slates)
            feedback = {p: rewards[p] for p in env.possible_agents if env.feedback[p]}
            first = env.possible_agents[0]
            agent.observe(observations, slates, feedback, next_observations, terminated[first])
            observations = next_observations
            running = not terminated[first].all()
        agent.end_episode(env.num_users)


def resumed_copy(fresh: Callable[[], tuple[Any, Any]], before: int, after: int) -> tuple[Any, Any]:
    """Play ``before`` episodes, save the agent and env as plain data, restore both into a fresh
    pair, and play ``after`` more on each: returns (the original agent, the restored one)."""
    from fedrec.train.checkpoint import from_plain, to_plain

    env, agent = fresh()
    play_episodes(agent, env, before)
    state = from_plain(to_plain(agent.state_dict()))
    env_state = env.state_dict()
    env2, agent2 = fresh()
    agent2.load_state_dict(state)
    env2.load_state_dict(env_state)
    for e, ag in ((env, agent), (env2, agent2)):
        play_episodes(ag, e, after, seed=None)
    return agent, agent2
