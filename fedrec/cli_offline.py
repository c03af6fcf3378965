"""``fedrec train NAME --dataset PATH``: train an offline agent from a logged dataset.

Called by :mod:`fedrec.cli_train` when ``--dataset`` is given or NAME is an offline agent (``bc``,
``cql_slateq``): the dataset is read and validated whole (:mod:`fedrec.train.offline`), the agent
takes ``--steps`` gradient steps (default 5000) with a checkpoint every ``--checkpoint-every``
steps, and the run directory gets ``config.json``, ``updates.csv``, ``checkpoint.pt`` and
``final_eval.json`` (the agent online beside the logging policy and the reference policies).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fedrec.agents.registry import OFFLINE_AGENTS, config_from_json, make_config

DEFAULT_STEPS = 5000


def train_offline_command(
    name: str, agent_cls: type, overrides: dict[str, Any], parsed: Any
) -> int:
    """Run the offline training that ``parsed`` (the ``fedrec train`` options) asks for."""
    from fedrec.train.offline import OfflineTrainConfig, load_offline_dataset, train_offline

    offline = ", ".join(OFFLINE_AGENTS)
    if not getattr(agent_cls, "offline", False):
        raise ValueError(
            f"--dataset: {name!r} learns online; the offline agents ({offline}) learn from a "
            f"dataset (train {name} with --env ID)"
        )
    if parsed.dataset is None:
        raise ValueError(
            f"{name!r} is an offline agent: give --dataset PATH (a dataset written by `fedrec data "
            "collect`; docs/offline.md)"
        )
    if parsed.episodes is not None:
        raise ValueError("--episodes: an offline run is measured in gradient steps (use --steps)")
    dataset = load_offline_dataset(
        parsed.dataset, env_id=parsed.env, env_kwargs=dict(parsed.env_kwarg) or None
    )
    env_tag = dataset.env_id.split("/")[-1]
    agent_tag = name.rpartition(":")[2]
    out = parsed.out or Path("runs") / f"{agent_tag}-{env_tag}-seed{parsed.seed}"
    agent_config = make_config(agent_cls, overrides)
    if parsed.resume and not overrides and (out / "config.json").is_file():
        try:
            saved = json.loads((out / "config.json").read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(
                f"--resume: {out / 'config.json'} is not valid JSON ({error})"
            ) from error
        saved = (saved.get("agent_config") or {}) if isinstance(saved, dict) else None
        if not isinstance(saved, dict):
            raise ValueError(f"--resume: {out / 'config.json'}: agent_config is not an object")
        agent_config = config_from_json(agent_cls, saved)
    config = OfflineTrainConfig(
        dataset=str(parsed.dataset),
        env_id=dataset.env_id,
        env_kwargs=dataset.env_kwargs,
        steps=parsed.steps if parsed.steps is not None else DEFAULT_STEPS,
        seed=parsed.seed,
        checkpoint_every=parsed.checkpoint_every,
        eval_episodes=parsed.eval_episodes,
        references=not parsed.no_references,
        progress=not parsed.no_progress,
    )

    def factory(env: Any) -> Any:
        return agent_cls.from_env(env, config=agent_config, seed=parsed.seed)

    result = train_offline(
        factory,
        config=config,
        out_dir=out,
        resume=parsed.resume,
        run_info={"agent": name},
        dataset=dataset,
    )
    print(
        f"{result.steps} gradient steps on {dataset.transitions} logged transitions "
        f"({dataset.episodes} episodes of {dataset.env_id}) in {result.wall_time:.1f} s; "
        f"final loss {result.losses[-1]:.4g}",
        file=sys.stdout,
    )
    if result.final_eval is not None:
        for policy, summary in result.final_eval["policies"].items():
            mean, half = summary["mean"], summary["half_width"]
            print(f"  online evaluation, {policy:14s} {mean:.1f} ± {half:.1f}")
    print(f"run written to {out}")
    return 0
