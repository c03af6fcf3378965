"""fedrec's agents on SARDINE's TopK environments: random, SARDINE's greedy oracle, SlateQ,
REINFORCE-TopK and SAC+TopK, several seeds, mean ± 95% CI across seeds (docs/sardine.md).

    python benchmarks/sardine_table.py --episodes 20 --seeds 5 --eval-episodes 100   # docs/sardine.md
    python benchmarks/sardine_table.py --envs sardine/SlateTopK-Bored-fedrec-v0 --out /tmp/bored
    python benchmarks/sardine_table.py --merge /tmp/bored /tmp/boredinf /tmp/uncertain

Every cell (env, policy, seed) is seeded on its own, so runs over disjoint envs or seeds
(``--envs``, ``--first-seed``) give the cells of one run over all of them; ``--merge`` writes
their table. ``table.md`` and ``table.json`` go to ``--out`` (default
``runs/benchmarks/sardine_table/``; docs/sardine.md's table is the first command with
``--out results/sardine --overwrite``); an earlier run's files are replaced only with
``--overwrite``.

Needs the ``sardine`` extra (``pip install "fedrec[sardine]"``). Each learner trains for
``--episodes`` user-episodes (100 steps each) on ``--num-envs`` users in parallel with the
training loop of ``fedrec train`` (:func:`fedrec.train.loop.train`), then its greedy policy is
evaluated on ``--eval-episodes`` held-out episodes (the same episodes for every policy of a
seed). SARDINE's papers train far longer; this budget is much
smaller, so the learners' numbers are early-training numbers, labelled as such in the output.

The greedy oracle (:class:`SardineGreedyOracle`) is SARDINE's short-term oracle
(``step([-1] * n)``): it reads the user's hidden embedding (info ``oracle_slate``), so it is an
**oracle**, not a recommender, and is marked so in the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.agents.base import Info, Observation, SlateAgent, slate_size_of
from fedrec.agents.reference import RandomPolicy
from fedrec.agents.reinforce_topk import ReinforceTopKAgent, ReinforceTopKConfig
from fedrec.agents.sac_topk import SACTopKAgent, SACTopKConfig
from fedrec.agents.slateq import SlateQAgent, SlateQConfig
from fedrec.eval.rollout import EVAL_SEED_OFFSET, evaluate_policy
from fedrec.eval.stats import mean_ci
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.train.loop import TrainConfig, train

ENVS = (
    "sardine/SlateTopK-Bored-fedrec-v0",
    "sardine/SlateTopK-BoredInf-fedrec-v0",
    "sardine/SlateTopK-Uncertain-fedrec-v0",
)
POLICIES = ("random", "greedy_oracle", "slateq", "reinforce_topk", "sac_topk")
LABELS = {
    "random": "random",
    "greedy_oracle": "greedy oracle (SARDINE's; reads the hidden user, an oracle)",
    "slateq": "SlateQ",
    "reinforce_topk": "REINFORCE-TopK",
    "sac_topk": "SAC+TopK",
}


class SardineGreedyOracle(SlateAgent):
    """SARDINE's short-term greedy oracle: the n items most relevant to the user's *hidden*
    current embedding (the adapter's info ``oracle_slate``, computed by SARDINE's own
    ``get_st_oracle_slate``). An oracle: fedrec's loops give it the hidden info."""

    oracle = True

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        if infos is None or "oracle_slate" not in infos:
            raise ValueError("the greedy oracle reads info['oracle_slate'] of a SARDINE env")
        return np.asarray(infos["oracle_slate"], dtype=np.int64).reshape(-1, self.slate_size)

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        del config
        return cls(slate_size=slate_size_of(env), seed=seed)


def learner_configs(transitions: int) -> dict[str, Any]:
    """The learners' hyperparameters for a budget of ``transitions`` user-steps.

    Defaults of fedrec's agents except what SARDINE's catalogue forces or the short budget needs:
    SlateQ learns its choice model (the true one is Choc-vs-Kale's); replay buffers hold 2,000
    transitions (each observation carries the 1,000 x 10 catalogue: 80 KB per transition);
    warm-up 500 transitions (a quarter of the budget if less); SlateQ's epsilon decays over the
    first half of the budget; SAC+TopK uses SARDINE's action box (the embeddings' range,
    ``action_box="features"``) and one gradient step per 4 transitions (its state holds the
    10,000 catalogue features, so a step costs ~0.1 s on one core).
    """
    warmup = min(500, transitions // 4)
    return {
        "slateq": SlateQConfig(
            choice_model="learned",
            buffer_size=2_000,
            learning_starts=warmup,
            epsilon_decay=max(1, transitions // 2),
        ),
        "reinforce_topk": ReinforceTopKConfig(),
        "sac_topk": SACTopKConfig(
            action_box="features", buffer_size=2_000, learning_starts=warmup, train_frequency=4
        ),
    }


AGENT_CLASSES = {
    "slateq": SlateQAgent,
    "reinforce_topk": ReinforceTopKAgent,
    "sac_topk": SACTopKAgent,
}


def run_cell(
    env_id: str, policy: str, seed: int, *, episodes: int, num_envs: int, eval_episodes: int
) -> dict[str, Any]:
    """Train (learners) and evaluate one policy on one env with one seed."""
    start = time.perf_counter()
    eval_seed = EVAL_SEED_OFFSET + seed
    if policy in AGENT_CLASSES:
        config = TrainConfig(
            env_id=env_id,
            episodes=episodes,
            num_envs=num_envs,
            seed=seed,
            checkpoint_every=0,
            eval_episodes=0,
            references=False,
            progress=False,
        )
        agent_config = learner_configs(episodes * 100)[policy]
        cls = AGENT_CLASSES[policy]
        try:
            result = train(
                _keeping(lambda env: cls.from_env(env, config=agent_config, seed=seed)),
                config=config,
            )
        except RuntimeError as error:  # recorded, not hidden: the table counts the seeds that ran
            _LAST_AGENT.clear()
            return {
                "env": env_id,
                "policy": policy,
                "seed": seed,
                "eval_mean": None,
                "error": f"{type(error).__name__}: {error}",
                "seconds": time.perf_counter() - start,
            }
        agent = _LAST_AGENT.pop()
        train_returns = result.returns
    else:
        cls = RandomPolicy if policy == "random" else SardineGreedyOracle
        agent, train_returns = cls(slate_size=10, seed=seed), np.zeros(0)
    summary = evaluate_policy(
        env_id, agent, episodes=eval_episodes, num_envs=min(eval_episodes, 50), seed=eval_seed
    )
    return {
        "env": env_id,
        "policy": policy,
        "seed": seed,
        "eval_mean": summary.mean,
        "train_last_mean": float(np.mean(train_returns[-num_envs:]))
        if train_returns.size
        else None,
        "seconds": time.perf_counter() - start,
    }


#: train() returns no agent; the factory below keeps the one it built.
_LAST_AGENT: list[SlateAgent] = []


def _keeping(factory: Any) -> Any:
    def build(env: Any) -> SlateAgent:
        agent = factory(env)
        _LAST_AGENT.append(agent)
        return agent

    return build


def table_markdown(cells: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """Mean ± 95% CI (t, across seeds) of each policy on each env."""
    envs = list(dict.fromkeys(c["env"] for c in cells))
    policies = list(dict.fromkeys(c["policy"] for c in cells))
    short = [e.split("/")[1].replace("-fedrec-v0", "") for e in envs]
    lines = [
        f"| policy | {' | '.join(short)} |",
        "|---|" + "---:|" * len(envs),
    ]
    for policy in policies:
        row = []
        for env in envs:
            mine = [c for c in cells if c["env"] == env and c["policy"] == policy]
            values = [c["eval_mean"] for c in mine if c["eval_mean"] is not None]
            if not values:
                row.append("crashed")
                continue
            mean, half = mean_ci(np.asarray(values), 0.95)
            text = f"{mean:.1f} ± {half:.1f}" if np.isfinite(half) else f"{mean:.1f}"
            if len(values) < len(mine):
                text += f" ({len(values)}/{len(mine)} seeds; the rest crashed)"
            row.append(text)
        lines.append(f"| {LABELS[policy]} | {' | '.join(row)} |")
    note = (
        f"\nClicks per 100-step episode (SARDINE's return), greedy policies on "
        f"{meta['eval_episodes']} held-out episodes per seed; mean ± 95% CI (t) across "
        f"{meta['seeds']} seeds. Learners trained {meta['episodes']} episodes "
        f"({meta['episodes'] * 100:,} transitions, {meta['num_envs']} users in parallel): an "
        "early-training budget, far below what SARDINE's papers train.\n"
    )
    return "\n".join(lines) + "\n" + note


def merge(folders: list[Path], out: Path, *, overwrite: bool = False) -> int:
    """Merge the ``table.json`` of runs over disjoint seeds (or envs) with the same budget into
    ``out``: the table is the one a single run over all their seeds would write."""
    runs = [json.loads((folder / "table.json").read_text()) for folder in folders]
    budget = ("episodes", "num_envs", "eval_episodes", "configs")
    first = runs[0]["meta"]
    for run in runs[1:]:
        if any(run["meta"][key] != first[key] for key in budget):
            raise SystemExit(f"cannot merge runs with different budgets: {budget}")
    cells = sorted(
        (cell for run in runs for cell in run["cells"]),
        key=lambda c: (ENVS.index(c["env"]) if c["env"] in ENVS else len(ENVS), c["seed"]),
    )
    keys = {(c["env"], c["policy"], c["seed"]) for c in cells}
    if len(keys) != len(cells):
        raise SystemExit("the runs overlap: a cell (env, policy, seed) appears twice")
    seeds = sorted({c["seed"] for c in cells})
    meta = {
        **{key: first[key] for key in budget},
        "seeds": len(seeds),
        "first_seed": seeds[0],
        "merged_from": [run["meta"]["command"] for run in runs],
        "command": "python benchmarks/sardine_table.py --merge "
        + " ".join(str(folder) for folder in folders),
    }
    claim_outputs([out / "table.md", out / "table.json"], overwrite=overwrite)
    out.mkdir(parents=True, exist_ok=True)
    markdown = table_markdown(cells, meta)
    (out / "table.md").write_text(markdown)
    (out / "table.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))
    print(markdown)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(ENVS))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="run seeds first-seed .. first-seed + seeds - 1 (each cell is seeded on its own, so "
        "runs over disjoint seeds can be merged with --merge)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=None,
        help="instead of running, merge the table.json files of these folders into --out",
    )
    parser.add_argument("--episodes", type=int, default=20, help="training episodes per learner")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--eval-episodes", type=int, default=100)
    add_out_arguments(parser, "sardine_table", what="folder of table.md and table.json")
    args = parser.parse_args(argv)
    args.out = script_out("sardine_table", args.out)
    if args.merge:
        return merge(args.merge, args.out, overwrite=args.overwrite)
    claim_outputs([args.out / "table.md", args.out / "table.json"], overwrite=args.overwrite)
    torch.set_num_threads(1)
    meta = {
        "seeds": args.seeds,
        "first_seed": args.first_seed,
        "episodes": args.episodes,
        "num_envs": args.num_envs,
        "eval_episodes": args.eval_episodes,
        "configs": {k: str(v) for k, v in learner_configs(args.episodes * 100).items()},
        "command": "python benchmarks/sardine_table.py " + " ".join(argv or sys.argv[1:]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    cells: list[dict[str, Any]] = []
    markdown = ""
    for env_id in args.envs:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for policy in args.policies:
                cell = run_cell(
                    env_id,
                    policy,
                    seed,
                    episodes=args.episodes,
                    num_envs=args.num_envs,
                    eval_episodes=args.eval_episodes,
                )
                cells.append(cell)
                score = cell.get("error") or f"{cell['eval_mean']:.1f}"
                print(
                    f"{env_id} seed {seed} {policy}: {score} ({cell['seconds']:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        # Written after every env, so an interrupted run keeps the envs it finished.
        markdown = table_markdown(cells, meta)
        (args.out / "table.md").write_text(markdown)
        (args.out / "table.json").write_text(json.dumps({"meta": meta, "cells": cells}, indent=1))
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_script(main))
