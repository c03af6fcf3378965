"""``fedrec bench zoo``'s throughput comparison: fedrec's ``sac_topk`` and ``reinforce_topk``
against Stable-Baselines3's SAC and PPO on the same env, in the same run (env steps per second,
median of alternating runs, and their ratio). ``benchmarks/pg_agents_speed.py`` uses the same
matched SAC settings (:data:`SAC_SETTINGS`)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from fedrec.experiments.zoo_config import NUM_ENVS, ZooConfig

#: The matched SAC settings of both sides: one hidden layer of 256 units in the actor and each
#: critic, minibatch 20, replay 10,000, tau 0.002, gamma 0.8, learning rate 1e-3, automatic
#: entropy tuning, 500 random transitions first, then one gradient step per transition.
SAC_SETTINGS: dict[str, Any] = {
    "hidden": 256, "batch": 20, "buffer": 10_000, "tau": 0.002, "gamma": 0.8, "warmup": 500,
}  # fmt: skip


def sac_topk_overrides(steps: int) -> dict[str, Any]:
    """``sac_topk``'s hyperparameters under :data:`SAC_SETTINGS` for a run of ``steps``
    transitions (the warm-up at most half of them)."""
    s = SAC_SETTINGS
    return {
        "hidden_sizes": (s["hidden"],), "batch_size": s["batch"], "buffer_size": s["buffer"],
        "tau": s["tau"], "gamma": s["gamma"], "learning_starts": min(s["warmup"], steps // 2),
        "train_frequency": 1,
    }  # fmt: skip


def sb3_sac(venv: Any, steps: int, seed: int) -> Any:
    """Stable-Baselines3's SAC under :data:`SAC_SETTINGS` on ``venv`` (``train_freq=1``,
    ``gradient_steps=-1``: one gradient step per transition of every user)."""
    from stable_baselines3 import SAC

    s = SAC_SETTINGS
    return SAC(
        "MlpPolicy", venv, learning_rate=1e-3, buffer_size=s["buffer"],
        learning_starts=min(s["warmup"], steps // 2), batch_size=s["batch"], tau=s["tau"],
        gamma=s["gamma"], train_freq=1, gradient_steps=-1, ent_coef="auto",
        policy_kwargs={"net_arch": [s["hidden"]]}, seed=seed, device="cpu",
    )  # fmt: skip


def fedrec_speed(agent: str, env_id: str, steps: int, seed: int) -> float:
    """Env steps per second of fedrec's ``agent`` (sac_topk with the matched SAC settings,
    reinforce_topk with its defaults) in the training loop, in memory."""
    import torch

    from fedrec.agents.registry import make_config, resolve_agent
    from fedrec.train.loop import TrainConfig, train

    torch.set_num_threads(1)
    cls = resolve_agent(agent)
    overrides = sac_topk_overrides(steps) if agent == "sac_topk" else {}
    agent_config = make_config(cls, overrides)
    run = TrainConfig(
        env_id=env_id, episodes=None, steps=steps, num_envs=NUM_ENVS, seed=seed,
        checkpoint_every=0, eval_episodes=0, references=False, progress=False,
    )  # fmt: skip
    start = time.perf_counter()
    result = train(lambda env: cls.from_env(env, config=agent_config, seed=seed), config=run)
    return result.steps / (time.perf_counter() - start)


def sb3_speed(algorithm: str, env_id: str, steps: int, seed: int) -> float:
    """Env steps per second of Stable-Baselines3's ``algorithm`` (SAC with the matched
    settings; PPO with its defaults, 64-unit layers, a rollout of 2,048 transitions split over
    the users) on fedrec's SB3 adapter (scores per candidate, the top-K served)."""
    import torch
    from stable_baselines3 import PPO

    from fedrec.agents.sb3_adapter import make_sb3_env

    torch.set_num_threads(1)
    venv = make_sb3_env(env_id, num_envs=NUM_ENVS, seed=seed)
    if algorithm == "SAC":
        model: Any = sb3_sac(venv, steps, seed)
    else:
        model = PPO(
            "MlpPolicy", venv, n_steps=max(1, 2048 // NUM_ENVS), batch_size=64, seed=seed,
            device="cpu",
        )  # fmt: skip
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    return model.num_timesteps / (time.perf_counter() - start)


#: fedrec agent -> its nearest outside implementation in Stable-Baselines3.
SPEED_PAIRS: dict[str, str] = {"sac_topk": "SAC", "reinforce_topk": "PPO"}
SPEED_ENV = "fedrec/ChocKaleSlate-v0"


def measure_speed(config: ZooConfig) -> dict[str, Any]:
    """Training throughput of each pair (:data:`SPEED_PAIRS`), the two alternating run by run;
    the medians and their ratio."""
    pairs: dict[str, Any] = {}
    for agent, algorithm in SPEED_PAIRS.items():
        ours: list[float] = []
        theirs: list[float] = []
        for seed in range(config.speed_runs):
            ours.append(fedrec_speed(agent, SPEED_ENV, config.speed_steps, seed))
            theirs.append(sb3_speed(algorithm, SPEED_ENV, config.speed_steps, seed))
        pairs[agent] = {
            "outside": f"Stable-Baselines3 {algorithm}",
            "fedrec_steps_per_second": ours,
            "outside_steps_per_second": theirs,
            "ratio": statistics.median(ours) / statistics.median(theirs),
        }
    return pairs


def speed_key(config: ZooConfig) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "env_id": SPEED_ENV,
        "steps": config.speed_steps,
        "runs": config.speed_runs,
        "num_envs": NUM_ENVS,
        "pairs": dict(SPEED_PAIRS),
        "stable_baselines3": version("stable-baselines3"),
    }
