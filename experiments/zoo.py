"""``fedrec bench zoo``: one leaderboard of the single-platform slate agents on every simulated env.

Every learning agent (:data:`LEARNERS`) is trained on every environment (:data:`ENVS`) for the
env's budget of env steps (user-steps, the same for every agent of an env) and ``--seeds`` seeds
with fedrec's training loop (:func:`fedrec.train.loop.train`, in memory, no checkpoints), then
its greedy policy is evaluated on ``--eval-episodes`` held-out episodes; the reference policies
(:data:`REFERENCES`: random, the fixed heuristics top-x and bottom-x, the best open-loop rule,
and the oracles myopic, planner, belief planner and the cascade optimum, which read the hidden
user) are evaluated on the same held-out episodes of each seed. An agent that refuses an env
(its ``from_env`` raises, e.g. SlateQ without Choc-vs-Kale's choice model) and a reference an
env does not define are rows with the reason instead of a number. The table gives the mean
return over seeds with its 95% t-interval, the gain over the best no-learning policy (random,
top-x, bottom-x, best open-loop; paired per seed on the same episodes), the training wall time per run
and the training throughput in env steps per second. In the same run the training throughput of
``sac_topk`` and ``reinforce_topk`` is measured against Stable-Baselines3's SAC and PPO (the
nearest outside implementations, on fedrec's SB3 adapter; median of ``--speed-runs``
alternating runs) and reported as a ratio. The default run's records took 93 min of run time on this project's
2-core machine under heavy load (an estimated 15-20 min on a free core); ``--quick`` takes seconds.

Each run's record is ``OUT/runs/ENV/AGENT/seedS.json`` (the references'
``OUT/runs/ENV/references/seedS.json``); a record whose setup matches is read, not rerun, so an
interrupted leaderboard completes when the command is run again, and ``OUT/config.json`` refuses
a folder of another configuration. Writes ``leaderboard.md``, ``leaderboard.csv``,
``leaderboard.json``, ``headline.md`` and ``speed.json``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedrec.experiments import harness
from fedrec.experiments.harness import option

BENCH = "zoo"
#: Users simulated in parallel while training (the training loop's default).
NUM_ENVS = 16


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """An environment of the zoo: its registered id, training budget and agent overrides."""

    env_id: str
    steps: int
    """training env steps (user-steps) of every learning agent"""
    title: str
    overrides: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """agent -> hyperparameters that this env forces (its catalogue or its cost)"""
    sardine: bool = False
    """needs the optional ``sardine`` package (``fedrec[sardine]``)"""
    max_eval_episodes: int | None = None
    """at most this many held-out episodes per seed (an env whose evaluation is expensive)"""


#: SARDINE's catalogue holds 1,000 items of 10 features in every observation (80 KB per
#: transition) and a SAC gradient step costs ~0.1 s there: the replay buffers are small and SAC
#: learns every 4 transitions (benchmarks/sardine_table.py's settings); SlateQ learns its choice
#: model (the true one is Choc-vs-Kale's).
_SARDINE_OVERRIDES: dict[str, dict[str, Any]] = {
    "slateq": {"choice_model": "learned", "buffer_size": 2_000, "learning_starts": 200},
    "sac_topk": {
        "action_box": "features",
        "buffer_size": 2_000,
        "learning_starts": 200,
        "train_frequency": 4,
    },
}

ENVS: dict[str, EnvSpec] = {
    "slate": EnvSpec("fedrec/ChocKaleSlate-v0", 10_000, "ChocKaleSlate-v0 (FedSlate's env)"),
    "longterm": EnvSpec(
        "fedrec/ChocKaleLongTerm-v0", 10_000, "ChocKaleLongTerm-v0 (reactive satisfaction)"
    ),
    "user-types": EnvSpec(
        "fedrec/ChocKaleUserTypes-v0", 10_000, "ChocKaleUserTypes-v0 (hidden user types)"
    ),
    "interest-evolution": EnvSpec(
        "fedrec/InterestEvolution-v0", 10_000, "InterestEvolution-v0 (RecSim, RLlib's SlateQ env)"
    ),
    "cascade": EnvSpec("fedrec/ChocKaleCascade-v0", 10_000, "ChocKaleCascade-v0 (cascade clicks)"),
    "sardine-bored": EnvSpec(
        "sardine/SlateTopK-Bored-fedrec-v0",
        800,
        "SARDINE SlateTopK-Bored-v0 (through fedrec's adapter)",
        overrides=_SARDINE_OVERRIDES,
        sardine=True,
        max_eval_episodes=32,
    ),
}

#: The learning agents (registered names, :data:`fedrec.agents.registry.AGENTS`) and a word each.
LEARNERS: dict[str, str] = {
    "slateq": "SlateQ (Ie et al. 2019)",
    "reinforce_topk": "REINFORCE with the top-K correction (Chen et al. 2019)",
    "sac_topk": "SAC+TopK (SARDINE's baseline)",
    "ppo": "Stable-Baselines3 PPO, scores per candidate",
    "rule_search": "cross-entropy search over a (feature, time) slate rule",
    "rule_search_adaptive": "rule_search whose rule also reads the observed satisfaction",
    "cascade_ucb1": "CascadeUCB1 (Kveton et al. 2015)",
    "cascade_linucb": "CascadeLinUCB (Zong et al. 2016)",
    "linucb_slate": "LinUCB over the slate's items",
}

#: Reference policies: name -> (oracle: reads the hidden user or knows its model, description).
REFERENCES: dict[str, tuple[bool, str]] = {
    "planner": (True, "optimal planner (DP over the true state; knows each user's tau)"),
    "belief_planner": (True, "knows the model, not the user: QMDP on the exact posterior"),
    "myopic": (True, "best expected engagement now, from the hidden state"),
    "cascade_oracle": (True, "the cascade model's optimum: most attractive items first"),
    "best_open_loop": (False, "best schedule of fixed rules by step, searched with the model"),
    "top_x": (False, "fixed heuristic: the n largest-feature candidates"),
    "bottom_x": (False, "fixed heuristic: the n smallest-feature candidates"),
    "random": (False, "uniformly random slates"),
}
#: The no-learning policies (no feedback, no hidden state, nothing learned): "beats" means beats
#: the best of them. Random is one: where fixed slates bore the user it beats them.
NO_LEARNING = ("random", "top_x", "bottom_x", "best_open_loop")


def _env_names() -> tuple[str, ...]:
    return tuple(ENVS)


def _learner_names() -> tuple[str, ...]:
    return tuple(LEARNERS)


def sardine_installed() -> bool:
    """Whether the optional ``sardine`` package is there (its envs are registered then)."""
    from fedrec.envs.sardine import sardine_available

    return sardine_available()


def default_envs() -> tuple[str, ...]:
    """Every env of :data:`ENVS`, the SARDINE ones only when the extra is installed."""
    return tuple(name for name, spec in ENVS.items() if not spec.sardine or sardine_installed())


@dataclasses.dataclass(frozen=True)
class ZooConfig:
    """What ``fedrec bench zoo`` runs (its fields are the command's options)."""

    envs: tuple[str, ...] | None = option(
        None,
        choices=_env_names,
        cli_choices=_env_names,
        metavar="ENV",
        help="environments (default: " + ", ".join(ENVS) + "; the SARDINE ones only when the "
        "sardine extra is installed)",
    )
    agents: tuple[str, ...] = option(
        tuple(LEARNERS), choices=_learner_names, cli_choices=_learner_names, metavar="AGENT"
    )
    """learning agents"""
    seeds: int = option(3, min=1)
    """seeds per agent and env (0, 1, ...)"""
    steps: int | None = option(None, min=1)
    """training env steps of every run (default: each env's own budget)"""
    eval_episodes: int = option(100, min=1)
    """held-out episodes per seed (the same for every policy of a seed)"""
    speed_steps: int = option(2_000, min=1)
    """transitions per throughput run against Stable-Baselines3"""
    speed_runs: int = option(3, min=0)
    """throughput runs per implementation (median reported; 0 skips the comparison)"""
    out: str | None = option(None, metavar="DIR")
    """output folder (default runs/bench/zoo/HASH of the configuration; results/zoo holds the
    committed leaderboard)"""

    def __post_init__(self) -> None:
        harness.check_fields(self)

    @property
    def env_list(self) -> tuple[str, ...]:
        return self.envs if self.envs is not None else default_envs()

    def budget(self, env: str) -> int:
        return self.steps if self.steps is not None else ENVS[env].steps

    def eval_budget(self, env: str) -> int:
        """Held-out episodes per seed on ``env``: ``eval_episodes``, at most the env's cap."""
        cap = ENVS[env].max_eval_episodes
        return self.eval_episodes if cap is None else min(cap, self.eval_episodes)

    def key(self) -> dict[str, Any]:
        """What the results depend on (``config.json``; the default folder's hash)."""
        return {
            "envs": list(self.env_list),
            "agents": list(self.agents),
            "seeds": self.seeds,
            "steps": {env: self.budget(env) for env in self.env_list},
            "eval_episodes": {env: self.eval_budget(env) for env in self.env_list},
            "num_envs": NUM_ENVS,
            "speed_steps": self.speed_steps,
            "speed_runs": self.speed_runs,
        }

    def out_path(self) -> Path:
        if self.out is not None:
            return Path(self.out)
        return harness.default_out(BENCH, self.key())


#: ``--quick``: the defaults it shortens (options given on the command line win).
QUICK: dict[str, Any] = {
    "envs": ("slate", "cascade"),
    "agents": ("reinforce_topk", "rule_search", "cascade_ucb1", "slateq"),
    "seeds": 2,
    "steps": 320,
    "eval_episodes": 8,
    "speed_steps": 64,
    "speed_runs": 1,
}


# ------------------------------------------------------------------------------------ runs


def _agent_key(env: str, agent: str, seed: int, config: ZooConfig) -> dict[str, Any]:
    """The setup of one learner's run (checked against its cached record)."""
    from fedrec.agents.registry import json_ready, make_config, resolve_agent

    spec = ENVS[env]
    overrides = dict(spec.overrides.get(agent, {}))
    agent_config = make_config(resolve_agent(agent), overrides)
    return {
        "env_id": spec.env_id,
        "agent": agent,
        "agent_config": json_ready(dataclasses.asdict(agent_config)),
        "steps": config.budget(env),
        "num_envs": NUM_ENVS,
        "seed": seed,
        "eval_episodes": config.eval_budget(env),
    }


def _eval_seed(seed: int) -> int:
    from fedrec.eval.rollout import EVAL_SEED_OFFSET

    return EVAL_SEED_OFFSET + seed


def _evaluate(env_id: str, policy: Any, episodes: int, seed: int) -> dict[str, float]:
    from fedrec.eval.rollout import evaluate_policy

    start = time.perf_counter()
    summary = evaluate_policy(
        env_id, policy, episodes=episodes, num_envs=min(episodes, 200), seed=_eval_seed(seed)
    )
    return {
        "mean": float(summary.mean),
        "episode_half_width": float(summary.half_width),
        "eval_seconds": time.perf_counter() - start,
    }


def train_one(key: Mapping[str, Any]) -> dict[str, Any]:
    """Train one learner (``key`` from :func:`_agent_key`) and evaluate its greedy policy; a
    learner that refuses the env is a record with the reason."""
    import torch

    from fedrec.agents.registry import config_from_json, resolve_agent
    from fedrec.train.loop import TrainConfig, train

    torch.set_num_threads(1)
    cls = resolve_agent(key["agent"])
    agent_config = config_from_json(cls, key["agent_config"])
    built: list[Any] = []

    def factory(env: Any) -> Any:
        built.append(cls.from_env(env, config=agent_config, seed=key["seed"]))
        return built[-1]

    run = TrainConfig(
        env_id=key["env_id"],
        episodes=None,
        steps=key["steps"],
        num_envs=key["num_envs"],
        seed=key["seed"],
        checkpoint_every=0,
        eval_episodes=0,
        references=False,
        progress=False,
    )
    start = time.perf_counter()
    try:
        result = train(factory, config=run)
    except ValueError as error:
        if built:  # the agent accepted the env and then failed: a bug, not a skip
            raise
        return {"key": dict(key), "skipped": " ".join(str(error).split())}
    seconds = time.perf_counter() - start
    evaluation = _evaluate(key["env_id"], built[0], key["eval_episodes"], key["seed"])
    return {
        "key": dict(key),
        **evaluation,
        "train_seconds": seconds,
        "env_steps": int(result.steps),
        "steps_per_second": result.steps / seconds,
    }


def _reference_key(env: str, seed: int, config: ZooConfig) -> dict[str, Any]:
    return {
        "env_id": ENVS[env].env_id,
        "seed": seed,
        "eval_episodes": config.eval_budget(env),
        "references": list(REFERENCES),
    }


def _slate_size(env_id: str) -> int:
    import gymnasium as gym

    from fedrec.agents.base import slate_size_of

    probe = gym.make(env_id)
    try:
        return slate_size_of(probe)
    finally:
        probe.close()


def evaluate_references(key: Mapping[str, Any]) -> dict[str, Any]:
    """Every reference policy the env defines, on the held-out episodes of ``key["seed"]``;
    the others with the reason they do not apply."""
    import gymnasium as gym
    import torch

    from fedrec.agents.cascade_oracle import CascadeOraclePolicy
    from fedrec.agents.reference import (
        HighestFeaturePolicy,
        LowestFeaturePolicy,
        RandomPolicy,
        env_params,
        reference_policies,
    )

    torch.set_num_threads(1)
    env_id, seed = key["env_id"], key["seed"]
    eval_seed = _eval_seed(seed)
    probe = gym.make(env_id)
    try:
        params = env_params(probe)
    except ValueError:
        params = None
    finally:
        probe.close()
    size = _slate_size(env_id)
    policies: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    if params is not None:
        policies = dict(reference_policies(params, seed=eval_seed))
        if "belief_planner" not in policies:
            skipped["belief_planner"] = "no hidden user types (it is the planner here)"
    else:
        policies = {
            "random": RandomPolicy(slate_size=size, seed=eval_seed),
            "top_x": HighestFeaturePolicy(slate_size=size, seed=eval_seed),
            "bottom_x": LowestFeaturePolicy(slate_size=size, seed=eval_seed),
        }
        for name in ("best_open_loop", "myopic", "planner", "belief_planner"):
            skipped[name] = "needs the Choc-vs-Kale model (the env has none)"
    policies["cascade_oracle"] = CascadeOraclePolicy(slate_size=size, seed=eval_seed)
    results: dict[str, Any] = {}
    for name in REFERENCES:
        if name in skipped:
            results[name] = {"skipped": skipped[name]}
            continue
        try:
            results[name] = _evaluate(env_id, policies[name], key["eval_episodes"], seed)
        except ValueError:  # the env lacks what the policy reads
            if name != "cascade_oracle":
                raise
            results[name] = {"skipped": "no cascade attraction probabilities in the env's info"}
    return {"key": dict(key), "policies": results}


_RESULT = harness.record(
    {"mean": harness.finite, "eval_seconds": harness.non_negative},
    {"train_seconds": harness.non_negative, "steps_per_second": harness.non_negative},
)
_SKIP = harness.record({"skipped": harness.string})


def _either(value: Any) -> str | None:
    if isinstance(value, dict) and "skipped" in value:
        return _SKIP(value)
    return _RESULT(value)


def AGENT_RECORD(value: Any) -> str | None:
    """A learner's record: its key and a result or a skip reason."""
    problem = harness.record({"key": harness.record({})})(value)
    return problem or _either({k: v for k, v in value.items() if k != "key"})


REFERENCE_RECORD = harness.record(
    {"key": harness.record({}), "policies": harness.mapping_of(_either, min_length=1)}
)


def _cached(path: Path, key: Mapping[str, Any], check: harness.Check, what: str) -> Any:
    """The record at ``path`` when there is one (refused when of another setup), else None."""
    if not path.exists():
        return None
    saved = harness.read_cached(path, check, what)
    harness.check_same(path, saved["key"], key, what=what)
    return saved


def run_path(out: Path, env: str, name: str, seed: int) -> Path:
    return out / "runs" / env / name / f"seed{seed}.json"


# ------------------------------------------------------------------------------------ speed


def _sac_settings() -> dict[str, Any]:
    """benchmarks/pg_agents_speed.py's matched SAC settings (one gradient step per
    transition after 500 random ones)."""
    return {"hidden": 256, "batch": 20, "buffer": 10_000, "tau": 0.002, "gamma": 0.8}


def fedrec_speed(agent: str, env_id: str, steps: int, seed: int) -> float:
    """Env steps per second of fedrec's ``agent`` (sac_topk with the matched SAC settings,
    reinforce_topk with its defaults) in the training loop, in memory."""
    import torch

    from fedrec.agents.registry import make_config, resolve_agent
    from fedrec.train.loop import TrainConfig, train

    torch.set_num_threads(1)
    cls = resolve_agent(agent)
    overrides: dict[str, Any] = {}
    if agent == "sac_topk":
        s = _sac_settings()
        overrides = {
            "hidden_sizes": (s["hidden"],), "batch_size": s["batch"], "buffer_size": s["buffer"],
            "tau": s["tau"], "gamma": s["gamma"], "learning_starts": min(500, steps // 2),
            "train_frequency": 1,
        }  # fmt: skip
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
    from stable_baselines3 import PPO, SAC

    from fedrec.agents.sb3_adapter import make_sb3_env

    torch.set_num_threads(1)
    venv = make_sb3_env(env_id, num_envs=NUM_ENVS, seed=seed)
    if algorithm == "SAC":
        s = _sac_settings()
        model: Any = SAC(
            "MlpPolicy", venv, learning_rate=1e-3, buffer_size=s["buffer"],
            learning_starts=min(500, steps // 2), batch_size=s["batch"], tau=s["tau"],
            gamma=s["gamma"], train_freq=1, gradient_steps=-1, ent_coef="auto",
            policy_kwargs={"net_arch": [s["hidden"]]}, seed=seed, device="cpu",
        )  # fmt: skip
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


def _speed_key(config: ZooConfig) -> dict[str, Any]:
    from importlib.metadata import version

    return {
        "env_id": SPEED_ENV,
        "steps": config.speed_steps,
        "runs": config.speed_runs,
        "num_envs": NUM_ENVS,
        "pairs": dict(SPEED_PAIRS),
        "stable_baselines3": version("stable-baselines3"),
    }


# ------------------------------------------------------------------------------------ table


@dataclasses.dataclass(frozen=True)
class Row:
    """One policy on one env, over seeds."""

    env: str
    policy: str
    kind: str
    """``learner``, ``reference`` or ``oracle``"""
    seeds: int
    mean: float
    half_width: float
    over_best: tuple[float, float] | None
    """(mean, half-width) of this - the best no-learning policy, paired per seed"""
    best: str | None
    """the best no-learning policy of the env"""
    train_seconds: float | None
    steps_per_second: float | None
    eval_seconds: float
    skipped: str | None = None

    @property
    def verdict(self) -> str:
        """Whether a learner beats the best no-learning policy (95% interval of the paired
        difference above 0), ties it or loses."""
        if self.over_best is None or self.kind != "learner":
            return ""
        mean, half = self.over_best
        if not math.isfinite(half):
            return "beats" if mean > 0 else "below"
        if mean - half > 0:
            return "beats"
        if mean + half < 0:
            return "below"
        return "tie"


def _t(values: Sequence[float]) -> tuple[float, float]:
    return harness.mean_ci(values)


def build_rows(config: ZooConfig, records: Mapping[str, Any]) -> list[Row]:
    """The leaderboard rows, env by env: learners and references, best mean first, skipped rows
    last. ``records``: env -> {"agents": {agent: [record per seed]}, "references": [record per
    seed]}."""
    rows: list[Row] = []
    for env in config.env_list:
        refs = records[env]["references"]
        per_seed: dict[str, list[dict[str, Any]]] = {}
        for name in REFERENCES:
            per_seed[name] = [r["policies"][name] for r in refs]
        for agent in config.agents:
            per_seed[agent] = records[env]["agents"][agent]
        means = {
            name: [r["mean"] for r in entries]
            for name, entries in per_seed.items()
            if not any("skipped" in r for r in entries)
        }
        heuristics = [h for h in NO_LEARNING if h in means]
        best = max(heuristics, key=lambda h: statistics.fmean(means[h]), default=None)
        env_rows = []
        for name, entries in per_seed.items():
            kind = "learner" if name in config.agents else "reference"
            if kind == "reference" and REFERENCES[name][0]:
                kind = "oracle"
            if name not in means:
                reason = next(r["skipped"] for r in entries if "skipped" in r)
                env_rows.append(
                    Row(env, name, kind, 0, math.nan, math.nan, None, best, None, None, 0.0,
                        reason)
                )  # fmt: skip
                continue
            mean, half = _t(means[name])
            over = None
            if best is not None and name != best:
                over = _t([a - b for a, b in zip(means[name], means[best], strict=True)])
            train = [r["train_seconds"] for r in entries if "train_seconds" in r]
            rate = [r["steps_per_second"] for r in entries if "steps_per_second" in r]
            env_rows.append(
                Row(
                    env, name, kind, len(entries), mean, half, over, best,
                    statistics.fmean(train) if train else None,
                    statistics.median(rate) if rate else None,
                    statistics.fmean(r["eval_seconds"] for r in entries),
                )
            )  # fmt: skip
        env_rows.sort(key=lambda r: (r.skipped is not None, -r.mean if r.skipped is None else 0))
        rows += env_rows
    return rows


COLUMNS = [
    "env", "rank", "policy", "kind", "seeds", "mean return", "vs best no-learning", "verdict",
    "train s/run", "env steps/s", "eval s/run", "note",
]  # fmt: skip


def _pm(mean: float, half: float, *, sign: bool = False) -> str:
    text = f"{mean:+.1f}" if sign else f"{mean:.1f}"
    return text if not math.isfinite(half) else f"{text} ± {half:.1f}"


def row_cells(rank: int | None, row: Row) -> list[str]:
    note = f"skipped: {row.skipped}" if row.skipped else ""
    if row.kind == "oracle" and not row.skipped:
        note = "oracle reference (reads the hidden user)"
    if row.policy == row.best:
        note = "best no-learning policy"
    return [
        row.env,
        "" if rank is None else str(rank),
        row.policy,
        row.kind,
        str(row.seeds),
        "" if row.skipped else _pm(row.mean, row.half_width),
        "" if row.over_best is None else _pm(*row.over_best, sign=True),
        row.verdict,
        "" if row.train_seconds is None else f"{row.train_seconds:.1f}",
        "" if row.steps_per_second is None else f"{row.steps_per_second:,.0f}",
        "" if row.skipped else f"{row.eval_seconds:.2f}",
        note,
    ]


def render(config: ZooConfig, rows: Sequence[Row], speed: Mapping[str, Any] | None) -> str:
    """The whole leaderboard as Markdown: one table per env, then the throughput ratios."""
    lines = [
        "# fedrec bench zoo",
        "",
        "Mean greedy return on the env's held-out episodes (the same for every policy of a "
        f"seed), mean ± 95% t-interval over {config.seeds} seeds; 'vs best no-learning' is paired per seed on the "
        "same episodes; 'beats' when its interval is above 0. Learners trained with "
        f"{NUM_ENVS} users in parallel for the env's budget of env steps.",
    ]
    for env in config.env_list:
        spec = ENVS[env]
        lines += [
            "",
            f"## {env}: {spec.title}",
            "",
            f"`{spec.env_id}`, {config.budget(env):,} training env steps per run, "
            f"{config.eval_budget(env)} held-out episodes per seed.",
            "",
            "| " + " | ".join(COLUMNS[1:]) + " |",
            "|" + "---|" * (len(COLUMNS) - 1),
        ]
        rank = 0
        for row in (r for r in rows if r.env == env):
            rank += row.skipped is None
            cells = row_cells(None if row.skipped else rank, row)[1:]
            lines.append("| " + " | ".join(cells) + " |")
    if speed:
        lines += [
            "",
            "## Training throughput against Stable-Baselines3",
            "",
            f"`{SPEED_ENV}`, {config.speed_steps:,} transitions of {NUM_ENVS} users per run, "
            f"median of {config.speed_runs} alternating runs.",
            "",
            "| fedrec agent | env steps/s | outside | env steps/s | ratio |",
            "|---|---|---|---|---|",
        ]
        for agent, pair in speed.items():
            ours = statistics.median(pair["fedrec_steps_per_second"])
            theirs = statistics.median(pair["outside_steps_per_second"])
            lines.append(
                f"| {agent} | {ours:,.0f} | {pair['outside']} | {theirs:,.0f} | "
                f"{pair['ratio']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def headline(config: ZooConfig, rows: Sequence[Row]) -> str:
    """The short table: learners and the main references (rows) by env (columns), mean ± CI;
    a learner's cell is bold where it beats the best no-learning policy."""
    envs = list(config.env_list)
    names = [*config.agents, "random", "best no-learning", "planner (oracle)"]
    table = {(r.env, r.policy): r for r in rows}
    lines = ["| policy | " + " | ".join(envs) + " |", "|---|" + "---|" * len(envs)]
    for name in names:
        cells = []
        for env in envs:
            if name == "best no-learning":
                best = next((r.best for r in rows if r.env == env), None)
                row = table.get((env, best)) if best else None
            else:
                row = table.get((env, name.split(" ")[0]))
            if row is None or row.skipped:
                cells.append("n/a")
                continue
            text = _pm(row.mean, row.half_width)
            if name == "best no-learning":
                text += f" ({row.policy})"
            if row.verdict == "beats":
                text = f"**{text}**"
            cells.append(text)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(
    out: Path, config: ZooConfig, rows: Sequence[Row], speed: Mapping[str, Any] | None
) -> str:
    """Write the tables (Markdown, CSV, JSON); returns the Markdown."""
    markdown = render(config, rows, speed)
    (out / "leaderboard.md").write_text(markdown, encoding="utf-8")
    (out / "headline.md").write_text(headline(config, rows), encoding="utf-8")
    with (out / "leaderboard.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for env in config.env_list:
            rank = 0
            for row in (r for r in rows if r.env == env):
                rank += row.skipped is None
                writer.writerow(row_cells(None if row.skipped else rank, row))
    harness.write_json(
        out / "leaderboard.json",
        {"config": config.key(), "rows": [dataclasses.asdict(r) for r in rows], "speed": speed},
    )
    return markdown


# ------------------------------------------------------------------------------------ driver


def _specs(config: ZooConfig) -> list[tuple[str, str, int, dict[str, Any]]]:
    """Every (env, name, seed, key) of the leaderboard: references first, then learners."""
    specs = []
    for env in config.env_list:
        for seed in range(config.seeds):
            specs.append((env, "references", seed, _reference_key(env, seed, config)))
            for agent in config.agents:
                specs.append((env, agent, seed, _agent_key(env, agent, seed, config)))
    return specs


def collect(config: ZooConfig, out: Path, *, run: bool = True, log: Any = None) -> dict:
    """Every run's record: read when cached, else (with ``run``) run and written; a progress bar
    with the ETA on a terminal (one line per finished run either way)."""
    from tqdm.auto import tqdm

    log = log or harness.log
    records: dict[str, Any] = {
        env: {"agents": {a: [] for a in config.agents}, "references": []} for env in config.env_list
    }
    specs = list(_specs(config))
    bar = tqdm(specs, desc="zoo runs", unit="run", disable=None, leave=False)  # None: a TTY only
    for env, name, seed, key in bar:
        path = run_path(out, env, name, seed)
        is_ref = name == "references"
        check = REFERENCE_RECORD if is_ref else AGENT_RECORD
        what = "fedrec bench zoo run record"
        record = _cached(path, key, check, what)
        if record is None:
            if not run:
                raise harness.BenchError(f"{path} is missing: run the command to make it")
            start = time.perf_counter()
            record = evaluate_references(key) if is_ref else train_one(key)
            harness.write_json(path, record)
            took = time.perf_counter() - start
            shown = "evaluated" if is_ref else record.get("skipped") or f"{record['mean']:.1f}"
            log(f"{env} {name} seed {seed}: {shown} ({took:.1f} s)")
        if is_ref:
            records[env]["references"].append(record)
        else:
            records[env]["agents"][name].append(record)
    return records


def read_speed(config: ZooConfig, out: Path, *, run: bool = True) -> dict[str, Any] | None:
    """The throughput comparison: ``speed.json`` when it matches, else measured (with ``run``)."""
    if config.speed_runs == 0:
        return None
    path, key = out / "speed.json", _speed_key(config)
    if path.exists():
        saved = harness.read_cached(
            path, harness.record({"key": harness.record({}), "pairs": harness.record({})}),
            "fedrec bench zoo speed record",
        )  # fmt: skip
        harness.check_same(path, saved["key"], key, what="a throughput comparison")
        return saved["pairs"]
    if not run:
        raise harness.BenchError(f"{path} is missing: run the command to make it")
    pairs = measure_speed(config)
    harness.write_json(path, {"key": key, "pairs": pairs})
    return pairs


def check_config(config: ZooConfig, out: Path) -> None:
    """Refuse ``out`` when it holds another configuration's leaderboard (before anything runs)."""
    path = out / "config.json"
    if path.exists():
        saved = harness.read_cached(path, harness.record({}), "fedrec bench zoo configuration")
        harness.check_same(path, saved, config.key(), what="a leaderboard")
    elif out.exists() and any(out.iterdir()):
        raise harness.BenchError(
            f"{out} is not empty and holds no zoo leaderboard: choose another --out"
        )


def config_from_args(args: argparse.Namespace) -> ZooConfig:
    return harness.config_from_args(
        ZooConfig, args, **(QUICK if getattr(args, "quick", False) else {})
    )


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:
    """Register ``zoo`` under ``fedrec bench``."""
    harness.add_bench_parser(
        bench_subparsers,
        BENCH,
        ZooConfig,
        help="leaderboard of every single-platform agent on every env, with references and speed",
        description=__doc__.split("\n\n")[1] if __doc__ else "",
        handler=run,
        quick="a few seconds: slate and cascade, four agents, 2 seeds, 320 steps",
    )


def run(args: argparse.Namespace) -> int:
    """``fedrec bench zoo``: run (or read) every run, write and print the leaderboard."""
    config = config_from_args(args)
    missing = [env for env in config.env_list if ENVS[env].sardine and not sardine_installed()]
    if missing:
        raise harness.BenchError(
            f"{', '.join(missing)} need(s) the sardine extra: pip install 'fedrec[sardine]'"
        )
    out = config.out_path()
    check_config(config, out)
    out.mkdir(parents=True, exist_ok=True)
    harness.write_json(out / "config.json", config.key())
    start = time.perf_counter()
    records = collect(config, out)
    speed = read_speed(config, out)
    rows = build_rows(config, records)
    markdown = write_outputs(out, config, rows, speed)
    harness.show_markdown(markdown)  # compact by default; --wide prints the Markdown, --csv CSV
    harness.log(f"written to {out} ({time.perf_counter() - start:.0f} s)")
    return 0


def rebuild(out: Path) -> str:
    """The leaderboard Markdown of a finished ``out`` from its records alone (nothing runs):
    what ``leaderboard.md`` there must hold."""
    saved = harness.read_cached(
        out / "config.json", harness.record({}), "fedrec bench zoo configuration"
    )
    steps = saved["steps"]
    uniform = len(set(steps.values())) == 1 and all(
        steps[env] == steps[next(iter(steps))] for env in steps
    )
    config = ZooConfig(
        envs=tuple(saved["envs"]),
        agents=tuple(saved["agents"]),
        seeds=saved["seeds"],
        steps=None if all(steps[e] == ENVS[e].steps for e in steps) or not uniform
        else next(iter(steps.values())),
        eval_episodes=max(saved["eval_episodes"].values()),
        speed_steps=saved["speed_steps"],
        speed_runs=saved["speed_runs"],
        out=str(out),
    )  # fmt: skip
    harness.check_same(out / "config.json", saved, config.key(), what="a leaderboard")
    records = collect(config, out, run=False)
    speed = read_speed(config, out, run=False)
    return render(config, build_rows(config, records), speed)
