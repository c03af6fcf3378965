"""Reference policies a finished run's final evaluation lacks, evaluated on its held-out episodes.

A run's ``final_eval.json`` holds the reference policies that existed when it was trained. When a
reference is added later (the best open-loop rule, the belief planner), retraining every
committed run only to compare against it would waste hours: its held-out episodes are fixed by
the evaluation seed, so the new reference is evaluated on exactly those episodes and written to
``references.json`` beside ``final_eval.json`` (a new file: the run's own files are never
rewritten). :func:`fedrec.eval.etror.load_run` merges it, refusing any policy whose returns
differ from the run's own record, so every comparison stays paired.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.train.checkpoint import atomic_write, write_json

REFERENCES_FILE = "references.json"
#: The reference policies added after runs were committed without them.
ADDED_REFERENCES = ("best_open_loop", "belief_planner")
#: A deterministic reference recomputed to check that the episodes are the run's.
CHECK = "bottom_x"


def _reference_returns(
    config: dict[str, Any], seed: int, episodes: int, names: set[str]
) -> dict[str, Any]:
    """The reference policies ``names`` (those the run's env has) on its held-out episodes, in the
    final evaluation's format."""
    import gymnasium as gym

    from fedrec.agents.belief_planner import JointBeliefPlanner
    from fedrec.agents.multi_platform import HeuristicConfig, HeuristicMultiPolicy
    from fedrec.agents.open_loop import JointOpenLoopPolicy
    from fedrec.agents.reference import env_params, reference_policies
    from fedrec.eval.rollout import evaluate_joint_policy, evaluate_policy
    from fedrec.registration import batched_entry_point, entry_of, is_multi_platform

    env_id = config["env_id"]
    env_kwargs = dict(config.get("env_kwargs") or {})
    if is_multi_platform(env_id):  # the batched class takes the id's registered kwargs too
        env_kwargs = {**entry_of(env_id).kwargs, **env_kwargs}
    num_envs = min(episodes, 500)
    results: dict[str, Any] = {}
    if is_multi_platform(env_id):
        probe = batched_entry_point(env_id)(1, **env_kwargs)
        parties = {"platforms": probe.possible_agents, "feedback": probe.feedback}
        joint = {
            "best_open_loop": lambda: JointOpenLoopPolicy.for_env(probe),
            "belief_planner": lambda: JointBeliefPlanner.for_env(probe),
            "bottom_x": lambda: HeuristicMultiPolicy(
                **parties, params=probe.params, config=HeuristicConfig("bottom_x"), seed=seed
            ),
        }
        if not probe.params.heterogeneous:  # the belief planner is the planner there
            joint.pop("belief_planner")
        for name in sorted(names & set(joint)):
            summaries = evaluate_joint_policy(
                joint[name](),
                episodes=episodes,
                num_envs=num_envs,
                seed=seed,
                env_kwargs=env_kwargs,
            )
            results[name] = {agent: _entry(summary) for agent, summary in summaries.items()}
        return results
    probe = gym.make(env_id, **env_kwargs)
    try:
        params = env_params(probe)
    except ValueError:  # not a Choc-vs-Kale env: no reference policies
        return results
    finally:
        probe.close()
    for name, policy in reference_policies(params, seed=seed).items():
        if name in names:
            summary = evaluate_policy(
                env_id,
                policy,
                episodes=episodes,
                num_envs=num_envs,
                seed=seed,
                env_kwargs=env_kwargs,
            )
            results[name] = _entry(summary)
    return results


def _entry(summary: Any) -> dict[str, Any]:
    return {
        "mean": summary.mean,
        "half_width": summary.half_width,
        "returns": summary.returns.tolist(),
    }


def complete_references(run_dir: str | Path) -> Path | None:
    """Evaluate the added reference policies (:data:`ADDED_REFERENCES`) that ``run_dir``'s final
    evaluation lacks on its held-out episodes and write them to ``references.json``; returns that
    file, or None when there is nothing to add (no final evaluation, or not Choc-vs-Kale)."""
    from fedrec.eval.curves import gzip_bytes
    from fedrec.eval.etror import load_run, run_file
    from fedrec.eval.runs import read_run_json

    run = load_run(run_dir)  # validates the run, and any references.json already there
    if run.final_eval is None:
        return None
    seed, episodes = int(run.final_eval["seed"]), int(run.final_eval["episodes"])
    path = run_file(run_dir, REFERENCES_FILE)  # gzipped in a compacted run
    recorded = run.final_eval["policies"]  # with any references.json merged
    missing = set(ADDED_REFERENCES) - set(recorded)
    if not missing:
        return path if path.exists() else None
    computed = _reference_returns(dict(run.config), seed, episodes, missing | {CHECK})
    # bottom_x is deterministic: recomputed, it shows that these are the run's held-out episodes
    if CHECK in computed and CHECK in recorded and not _same(computed[CHECK], recorded[CHECK]):
        raise ValueError(
            f"{run_dir}: {CHECK} scores differently on the episodes of evaluation seed {seed} "
            "than the run recorded: not the same held-out episodes (or another env version)"
        )
    added = {name: computed[name] for name in sorted(missing) if name in computed}
    if not added:
        return path if path.exists() else None
    if path.exists():  # an earlier completion: keep what it added
        added = {**read_run_json(path)["policies"], **added}
    record = {"seed": seed, "episodes": episodes, "policies": added}
    if path.suffix == ".gz":  # keep a compacted run compact: the same file, gzipped
        text = json.dumps(record, indent=2, sort_keys=True) + "\n"  # as write_json writes it
        atomic_write(path, lambda f: f.write(gzip_bytes(text.encode())))
    else:
        write_json(path, record)
    load_run(run_dir)  # the merged evaluation parses and names no policy twice
    return path


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal per-episode returns (single-platform entries, or every platform of a joint one)."""
    if "returns" in a or "returns" in b:
        return "returns" in a and "returns" in b and np.allclose(a["returns"], b["returns"])
    return set(a) == set(b) and all(_same(a[key], b[key]) for key in a)
