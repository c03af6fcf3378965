"""Train Stable-Baselines3 PPO on ``fedrec/ChocKaleSlate-v0`` with the batched adapter.

PPO sees B users per step through one native batched env (:func:`fedrec.agents.sb3_adapter.make_sb3_env`);
its action is a score per candidate, served as the top-n slate. The trained policy is then
evaluated on held-out users (a fixed evaluation seed) against a uniformly random slate and the
myopic "top feature" slate (the n candidates with the highest x, a strong hand-made baseline
here: sensitivity is small, so engagement now is nearly all that matters).

Run: ``.venv/bin/python examples/sb3_ppo_chockale.py [--timesteps 200000] [--num-envs 32]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecEnv, VecNormalize

from fedrec.agents.sb3_adapter import make_sb3_env

ENV_ID = "fedrec/ChocKaleSlate-v0"


class RandomSlates:
    """Uniformly random slates: i.i.d. random scores (SB3's ``predict`` interface)."""

    def __init__(self, num_candidates: int, *, seed: int) -> None:
        self.num_candidates = num_candidates
        self.rng = np.random.default_rng(seed)

    def predict(self, obs: np.ndarray, *args: object, **kwargs: object) -> tuple[np.ndarray, None]:
        scores = self.rng.uniform(-1, 1, (len(obs), self.num_candidates))
        return scores.astype(np.float32), None


class TopFeature:
    """The n candidates with the highest feature x (the flat observation starts with them)."""

    def __init__(self, num_candidates: int) -> None:
        self.num_candidates = num_candidates

    def predict(self, obs: np.ndarray, *args: object, **kwargs: object) -> tuple[np.ndarray, None]:
        return 2.0 * obs[:, : self.num_candidates] - 1.0, None


def evaluate(policy: object, venv: VecEnv, episodes: int) -> tuple[float, float]:
    """Mean and standard error of the episode return over ``episodes`` episodes."""
    returns, _ = evaluate_policy(
        policy, venv, n_eval_episodes=episodes, return_episode_rewards=True
    )
    returns = np.asarray(returns, dtype=np.float64)
    return float(returns.mean()), float(returns.std(ddof=1) / np.sqrt(len(returns)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=200_000)
    parser.add_argument("--num-envs", type=int, default=32)
    parser.add_argument("--num-candidates", type=int, default=6)
    parser.add_argument("--slate-size", type=int, default=2)
    parser.add_argument("--gamma", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-episodes", type=int, default=500)
    args = parser.parse_args()
    torch.set_num_threads(1)
    env_kwargs = {"num_candidates": args.num_candidates, "slate_size": args.slate_size}

    start = time.perf_counter()
    train_env = VecNormalize(
        make_sb3_env(ENV_ID, num_envs=args.num_envs, seed=args.seed, **env_kwargs),
        gamma=args.gamma,
    )
    model = PPO(
        "MlpPolicy",
        train_env,
        n_steps=64,
        batch_size=256,
        learning_rate=1e-3,
        gamma=args.gamma,
        seed=args.seed,
        device="cpu",
    )
    model.learn(args.timesteps)
    train_seconds = time.perf_counter() - start

    def eval_env(*, normalized: bool) -> VecEnv:
        venv = make_sb3_env(ENV_ID, num_envs=100, seed=10_000 + args.seed, **env_kwargs)
        if not normalized:
            return venv
        venv = VecNormalize(venv, training=False, norm_reward=False)
        venv.obs_rms = train_env.obs_rms  # the statistics the policy was trained with
        return venv

    n = args.eval_episodes
    results = {
        "random slates": evaluate(
            RandomSlates(args.num_candidates, seed=1), eval_env(normalized=False), n
        ),
        "PPO (trained)": evaluate(model, eval_env(normalized=True), n),
        "top-feature (myopic)": evaluate(
            TopFeature(args.num_candidates), eval_env(normalized=False), n
        ),
    }
    print(
        f"{ENV_ID} N={args.num_candidates} n={args.slate_size}: PPO {args.timesteps} steps, "
        f"{args.num_envs} users per step, gamma={args.gamma}, trained in {train_seconds:.1f} s"
    )
    print(f"mean episode return over {n} evaluation episodes (+- standard error):")
    base = results["random slates"][0]
    for name, (mean, sem) in results.items():
        print(
            f"  {name:22s} {mean:8.1f} +- {sem:5.1f}   ({100 * (mean / base - 1):+5.1f}% vs random)"
        )


if __name__ == "__main__":
    main()
