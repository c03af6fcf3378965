"""Training throughput of fedrec's ``sac_topk`` against Stable-Baselines3's SAC on the same env.

Usage: ``python benchmarks/pg_agents_speed.py [--env fedrec/ChocKaleSlate-v0] [--num-envs 16]
[--steps 4000] [--runs 3]``. Both train for ``--steps`` transitions (user-steps) of ``--num-envs``
users with the same SAC settings (``fedrec.experiments.zoo_speed.SAC_SETTINGS``, shared with
``fedrec bench zoo``): one hidden layer of 256 units in the actor and each critic,
minibatch 20, replay 10,000, tau 0.002, gamma 0.8, automatic entropy tuning, 500 random
transitions first, then **one gradient step per transition** (SB3: ``train_freq=1``,
``gradient_steps=-1``, i.e. ``num_envs`` gradient steps per vector step). fedrec's agent runs in
fedrec's training loop (``fedrec.train.loop.train``, in memory, no checkpoint or evaluation); SB3's
SAC runs ``model.learn`` on fedrec's SB3 adapter (``fedrec.agents.sb3_adapter.make_sb3_env``:
scores per candidate, the top-K served). The runs alternate between the two; the table gives the
median env steps per second (transitions / wall-clock seconds, the random warm-up included) and
their ratio. What differs by design: SB3's action is a score per candidate (N dimensions), SAC+TopK's
a vector of the item feature size (D = 1 on Choc-vs-Kale), so SB3's networks have N - D more
action inputs and outputs.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

import fedrec  # noqa: F401  (registers the envs)
from fedrec.agents.sac_topk import SACTopKAgent, SACTopKConfig
from fedrec.experiments.zoo_speed import SAC_SETTINGS, sac_topk_overrides, sb3_sac
from fedrec.train.loop import TrainConfig, train

WARMUP = SAC_SETTINGS["warmup"]


def fedrec_run(env_id: str, num_envs: int, steps: int, seed: int) -> tuple[float, int]:
    """(env steps per second, gradient steps) of one fedrec run."""
    config = SACTopKConfig(**sac_topk_overrides(steps))
    agent = SACTopKAgent.from_env(gym.make_vec(env_id, num_envs=num_envs), config=config, seed=seed)
    run = TrainConfig(
        env_id=env_id, episodes=None, steps=steps, num_envs=num_envs, seed=seed,
        checkpoint_every=0, eval_episodes=0, progress=False,
    )  # fmt: skip
    start = time.perf_counter()
    result = train(agent, config=run)
    elapsed = time.perf_counter() - start
    return result.steps / elapsed, agent.gradient_steps


def sb3_run(env_id: str, num_envs: int, steps: int, seed: int) -> tuple[float, int]:
    """(env steps per second, gradient steps) of one SB3 run."""
    from fedrec.agents.sb3_adapter import make_sb3_env

    venv = make_sb3_env(env_id, num_envs=num_envs, seed=seed)
    model = sb3_sac(venv, steps, seed)
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    elapsed = time.perf_counter() - start
    return model.num_timesteps / elapsed, int(model._n_updates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="fedrec/ChocKaleSlate-v0")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runners = {"fedrec sac_topk": fedrec_run, "SB3 SAC (adapter)": sb3_run}
    rates: dict[str, list[float]] = {name: [] for name in runners}
    updates: dict[str, int] = {}
    for seed in range(args.runs):
        for name, runner in runners.items():
            rate, updates[name] = runner(args.env, args.num_envs, args.steps, seed)
            rates[name].append(rate)
        print(f"run {seed}: " + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in rates.items()))
    medians = {name: float(np.median(values)) for name, values in rates.items()}
    print(
        f"\n{args.env}, {args.num_envs} users, {args.steps} transitions, one gradient step per "
        f"transition after {WARMUP}; median of {args.runs} runs"
    )
    print("| agent | env steps/s (median) | runs | gradient steps per run |")
    print("|---|---|---|---|")
    for name, values in rates.items():
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {name} | {medians[name]:.0f} | {runs} | {updates[name]} |")
    ratio = medians["fedrec sac_topk"] / medians["SB3 SAC (adapter)"]
    print(f"\nratio fedrec / SB3: {ratio:.2f}")


if __name__ == "__main__":
    main()
