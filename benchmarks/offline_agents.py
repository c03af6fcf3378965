"""Offline agents vs the logging policy and online SlateQ on ``fedrec/ChocKaleSlate-v0``.

Usage: ``python benchmarks/offline_agents.py [--seeds 0 1 2] [--episodes 200] [--steps 3000]
[--out DIR] [--overwrite]``. Per seed:

1. collect ``--episodes`` episodes (60 steps each) with the logger (1 − ε) · bottom_x + ε ·
   uniformly random slates (``fedrec data collect --policy bottom_x --epsilon E``; bottom_x is the
   worst fixed rule on this env, so the logger is poor; ε = 0.5, the default, shows every item in
   30% of its slates, ε = 0.05 rarely shows any other item than bottom_x's);
2. train offline from that dataset, ``--steps`` gradient steps each: ``bc`` and ``cql_slateq``
   with α = 1 (default) and α = 0.1, and plain offline SlateQ (``cql_slateq`` with α = 0);
3. train online SlateQ on the env for as many transitions as the dataset holds (ε-greedy, its
   schedule scaled to the budget: learning starts at 1,000 transitions, ε decays over 6,000);
4. evaluate every policy greedily on the same 500 held-out episodes (the online runs' evaluation
   seed), with the logger, uniformly random slates and top_x (the best no-learning rule here:
   it equals the planner, docs/longterm.md).

Writes ``OUT/results.json`` (per seed: means, 95% CIs over episodes, wall times) and
``OUT/table.md`` (mean over seeds with a 95% t interval over the seed means, and per seed). OUT
defaults to ``runs/benchmarks/offline_agents/`` (the committed files are in ``results/offline``);
an earlier run's files are replaced only with ``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from fedrec.agents.offline_bc import BehaviourCloningAgent
from fedrec.agents.offline_cql import CQLSlateQAgent, CQLSlateQConfig
from fedrec.agents.slateq import SlateQAgent, SlateQConfig
from fedrec.eval.stats import mean_ci
from fedrec.experiments.harness import add_out_arguments, claim_outputs, run_script, script_out
from fedrec.train.collect import collect, save_minari
from fedrec.train.loop import TrainConfig, train
from fedrec.train.offline import (
    OfflineTrainConfig,
    load_offline_dataset,
    offline_evaluation,
    train_offline,
)

ENV = "fedrec/ChocKaleSlate-v0"
LOGGER = "bottom_x"
EVAL_EPISODES = 500
ONLINE = SlateQConfig(learning_starts=1000, epsilon_decay=6000)
OFFLINE = {
    "bc": (BehaviourCloningAgent, BehaviourCloningAgent.Config()),
    "cql_slateq (α=1)": (CQLSlateQAgent, CQLSlateQConfig(alpha=1.0)),
    "cql_slateq (α=0.1)": (CQLSlateQAgent, CQLSlateQConfig(alpha=0.1)),
    "offline SlateQ (α=0)": (CQLSlateQAgent, CQLSlateQConfig(alpha=0.0)),
}
ROWS = ("logger", "random", "top_x", *OFFLINE, "online SlateQ")


def run_seed(seed: int, episodes: int, steps: int, epsilon: float, root: Path) -> dict:
    started = time.perf_counter()
    data = collect(ENV, LOGGER, episodes=episodes, seed=seed, epsilon=epsilon, progress=False)
    path = save_minari(data, root / f"seed{seed}").parent
    dataset = load_offline_dataset(path)
    result: dict = {"dataset_transitions": dataset.transitions, "wall_s": {}, "policies": {}}
    config = OfflineTrainConfig(
        dataset=str(path), steps=steps, seed=seed, eval_episodes=0, progress=False
    )
    for name, (cls, agent_config) in OFFLINE.items():
        clock = time.perf_counter()
        agent = cls.from_env(_env(), config=agent_config, seed=seed)
        train_offline(agent, config=config, dataset=dataset)
        result["wall_s"][name] = time.perf_counter() - clock
        first = name == "bc"  # the logger and the references once per seed
        evaluation = offline_evaluation(
            agent, dataset, seed=seed, episodes=EVAL_EPISODES, references=first
        )
        for policy, summary in evaluation["policies"].items():
            key = name if policy == "agent" else policy
            if key in ROWS:
                result["policies"][key] = _summary(summary)
        print(f"seed {seed} {name}: {result['policies'][name]['mean']:.1f}", flush=True)
    clock = time.perf_counter()
    online = train(
        lambda env: SlateQAgent.from_env(env, config=ONLINE, seed=seed),
        config=TrainConfig(env_id=ENV, episodes=None, steps=dataset.transitions, seed=seed,
                           eval_episodes=EVAL_EPISODES, references=False, progress=False),
    )  # fmt: skip
    result["wall_s"]["online SlateQ"] = time.perf_counter() - clock
    assert online.final_eval is not None
    assert online.final_eval["seed"] == evaluation["seed"]  # the same held-out episodes
    result["policies"]["online SlateQ"] = _summary(online.final_eval["policies"]["agent"])
    print(f"seed {seed} online SlateQ: {result['policies']['online SlateQ']['mean']:.1f}")
    result["wall_s"]["total"] = time.perf_counter() - started
    return result


def _env():
    import gymnasium as gym

    return gym.make_vec(ENV, num_envs=1)


def _summary(summary: dict) -> dict:
    return {"mean": summary["mean"], "half_width": summary["half_width"]}


def table(results: dict) -> str:
    seeds = sorted(results["seeds"], key=int)
    lines = [
        f"| policy | mean over seeds {', '.join(seeds)} (95% CI over seeds) | minus the logger, "
        "paired by seed (95% CI) | "
        + " | ".join(f"seed {s} (95% CI over {EVAL_EPISODES} episodes)" for s in seeds)
        + " |",
        "|---|---|---|" + "---|" * len(seeds),
    ]
    for row in ROWS:
        cells = [results["seeds"][s]["policies"][row] for s in seeds]
        mean, half = mean_ci([c["mean"] for c in cells])
        logger = [results["seeds"][s]["policies"]["logger"]["mean"] for s in seeds]
        diff, diff_half = mean_ci([c["mean"] - b for c, b in zip(cells, logger, strict=True)])
        versus = "" if row == "logger" else f"{diff:+.1f} ± {diff_half:.1f}"
        per_seed = " | ".join(f"{c['mean']:.1f} ± {c['half_width']:.1f}" for c in cells)
        lines.append(f"| {row} | {mean:.1f} ± {half:.1f} | {versus} | {per_seed} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=200, help="logged episodes per seed")
    parser.add_argument("--steps", type=int, default=3000, help="offline gradient steps")
    parser.add_argument(
        "--epsilon", type=float, default=0.5, help="the logger's share of random slates (0.5)"
    )
    add_out_arguments(parser, "offline_agents", what="folder of results.json and table.md")
    parser.add_argument(
        "--table-only", action="store_true", help="rewrite OUT/table.md from OUT/results.json"
    )
    args = parser.parse_args()
    args.out = script_out("offline_agents", args.out)
    written = [] if args.table_only else [args.out / "results.json"]
    claim_outputs([*written, args.out / "table.md"], overwrite=args.overwrite)
    if args.table_only:
        text = table(json.loads((args.out / "results.json").read_text()))
        (args.out / "table.md").write_text(text)
        print(text)
        return
    torch.set_num_threads(1)
    results = {
        "env": ENV,
        "logger": f"(1 - {args.epsilon:g}) * {LOGGER} + {args.epsilon:g} * random",
        "logged_episodes": args.episodes,
        "offline_gradient_steps": args.steps,
        "online_slateq": {"learning_starts": 1000, "epsilon_decay": 6000, "budget": "dataset size"},
        "eval_episodes": EVAL_EPISODES,
        "machine": f"{platform.machine()}, 1 thread, torch {torch.__version__}",
        "seeds": {},
    }
    with tempfile.TemporaryDirectory() as root:
        for seed in args.seeds:
            results["seeds"][str(seed)] = run_seed(
                seed, args.episodes, args.steps, args.epsilon, Path(root)
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    text = table(results)
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    run_script(main)
