"""``fedrec bench zoo``'s configuration: the environments, learners and reference policies it
ranks, and the options of the command (:class:`ZooConfig`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
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
