"""Agents by name, for the command line: built-in names or ``module:Class`` / ``file.py:Class``.

There are two kinds of agent, with one table of built-in names each: single-platform slate agents
(:class:`fedrec.agents.base.SlateAgent`, trained on Gymnasium envs) and multi-platform agents
(:class:`fedrec.agents.multi_platform.MultiPlatformAgent`, trained on the PettingZoo
multi-platform env). A built-in name may stand for a class with preset hyperparameters (the
labelled FedSlate variants). An agent class usable by name has a ``Config`` dataclass and a
``from_env(env, *, config, seed)`` class method; a class written in a researcher's own file is
found by its path exactly as a built-in is found by its name, without installing anything; the
file may import the modules beside it (its folder is on ``sys.path`` while it is imported).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fedrec.agents.base import SlateAgent
from fedrec.util import json_ready  # noqa: F401  (re-exported: run configs are written with it)

#: Built-in single-platform agent name -> ``module:Class``.
AGENTS: dict[str, str] = {
    "slateq": "fedrec.agents.slateq:SlateQAgent",
    "random": "fedrec.agents.reference:RandomPolicy",
    "myopic": "fedrec.agents.reference:MyopicPolicy",
    "planner": "fedrec.agents.reference:OptimalPlanner",
    "belief_planner": "fedrec.agents.belief_planner:BeliefPlanner",
    "rule_search": "fedrec.agents.slate_rule:RuleSearchAgent",
    "rule_search_adaptive": "fedrec.agents.slate_rule:AdaptiveRuleSearchAgent",
    "rule_search_sequential": "fedrec.agents.slate_rule_sequential:SequentialRuleSearchAgent",
    "rule_search_evidence": "fedrec.agents.slate_rule_evidence:EvidenceRuleSearchAgent",
    "rule_search_fitted": "fedrec.agents.slate_rule_fitted:FittedRuleSearchAgent",
    "top_x": "fedrec.agents.reference:HighestFeaturePolicy",
    "bottom_x": "fedrec.agents.reference:LowestFeaturePolicy",
    "best_open_loop": "fedrec.agents.open_loop:OpenLoopPolicy",
    "popularity": "fedrec.agents.logged_baselines:PopularityAgent",
    "ppo": "fedrec.agents.sb3_agents:PPOAgent",
    "recurrent_ppo": "fedrec.agents.sb3_agents:RecurrentPPOAgent",
    # Bandits (docs/agents.md, "Bandits").
    "cascade_ucb1": "fedrec.agents.cascade_bandits:CascadeUCB1Agent",
    "cascade_linucb": "fedrec.agents.cascade_bandits:CascadeLinUCBAgent",
    "linucb_slate": "fedrec.agents.linucb_slate:LinUCBSlateAgent",
    # Policy gradient and actor-critic (docs/agents.md, "Policy gradient and actor-critic").
    "reinforce_topk": "fedrec.agents.reinforce_topk:ReinforceTopKAgent",
    "sac_topk": "fedrec.agents.sac_topk:SACTopKAgent",
}

#: Built-in offline agents (trained from a logged dataset: ``fedrec train NAME --dataset PATH``,
#: :mod:`fedrec.train.offline`; docs/offline.md) -> ``module:Class``.
OFFLINE_AGENTS: dict[str, str] = {
    "bc": "fedrec.agents.offline_bc:BehaviourCloningAgent",
    "cql_slateq": "fedrec.agents.offline_cql:CQLSlateQAgent",
}

_FEDSLATE = "fedrec.agents.fedslate:FedSlateAgent"
#: The official code's settings (its widths narrowed from 4096/2048 to 256 to fit a CPU).
_OFFICIAL = {
    "head": "tanh",
    "reward_scale": 1.0,
    "choice_model": "paper",
    "learning_rate": 0.01,
    "normalize_inputs": False,
    "local_hidden": (256,) * 5,
    "global_hidden": (256,) * 4,
}
_PER_PLATFORM = "fedrec.agents.per_platform:PerPlatformAgent"
_ITEMWISE_RELU = {"local_network": "itemwise", "local_hidden": (64, 32), "local_activation": "relu"}


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    """A built-in multi-platform method: its class and the hyperparameters it presets."""

    target: str
    """``module:Class``"""
    presets: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Config fields the name fixes (a user's overrides of other fields still apply)"""
    description: str = ""


#: Built-in multi-platform method name -> class and presets.
MULTI_PLATFORM_AGENTS: dict[str, AgentSpec] = {
    "fedslate": AgentSpec(_FEDSLATE, {"method": "fedslate"}, "FedSlate (basic version)"),
    "fedslate_exp": AgentSpec(
        _FEDSLATE, {"method": "fedslate_exp"}, "FedSlate(exp): every platform has feedback"
    ),
    "fedq": AgentSpec(_FEDSLATE, {"method": "fedq"}, "FedQ: federated DQN without slates"),
    "slateq": AgentSpec(
        _FEDSLATE, {"method": "slateq"}, "per-platform SlateQ, no federation (SlateQ-local)"
    ),
    "random": AgentSpec("fedrec.agents.multi_platform:RandomMultiPolicy"),
    "top_x": AgentSpec(
        "fedrec.agents.multi_platform:HeuristicMultiPolicy",
        {"rule": "top_x"},
        "fixed heuristic: the n largest-feature candidates",
    ),
    "bottom_x": AgentSpec(
        "fedrec.agents.multi_platform:HeuristicMultiPolicy",
        {"rule": "bottom_x"},
        "fixed heuristic: the n smallest-feature candidates",
    ),
    "fedslate_linear": AgentSpec(
        _FEDSLATE,
        {"method": "fedslate", "global_network": "linear"},
        "the paper's ablation: F is one linear layer",
    ),
    "fedslate_official": AgentSpec(
        _FEDSLATE,
        {"method": "fedslate", **_OFFICIAL},
        "the official code's settings (labelled): tanh heads, raw rewards, its softmax choice "
        "model, Adam 0.01, raw inputs; its depths, narrowed from 4096/2048 to 256 units",
    ),
    "fedslate_exp_official": AgentSpec(
        _FEDSLATE,
        {"method": "fedslate_exp", **_OFFICIAL},
        "the official (100, 10) script's settings (labelled): fedslate_official's, on "
        "FedSlate(exp), where every platform has feedback",
    ),
    "fedcem": AgentSpec(
        "fedrec.agents.fedcem:FedCEMAgent",
        {},
        "FedCEM: feedback platforms search a shared slate-scoring rule over (feature, time) by "
        "the cross-entropy method; FedAvg gives it to every platform (weights cross the "
        "channel, no per-user values)",
    ),
    "fedcem_notime": AgentSpec(
        "fedrec.agents.fedcem:FedCEMAgent",
        {"time_bins": 1},
        "FedCEM whose rule ignores the time in the episode (ablation: no clock)",
    ),
    "fedcem_dp": AgentSpec(
        "fedrec.agents.fedcem:FedCEMAgent",
        {"protection": "dp", "population": 1024},
        "FedCEM whose feedback platforms send clipped, Gaussian-noised elite statistics of "
        "1,024 user-episodes per update: the rule the others see is differentially private in "
        "each user's return (docs/fedcem.md)",
    ),
    "fedcem_adaptive": AgentSpec(
        "fedrec.agents.fedcem:FedCEMAgent",
        {
            "satisfaction_edges": (0.45, 0.55),
            "satisfaction_window": 15,
            "episodes_per_rule": 8,
            "population": 1024,
        },
        "closed-loop FedCEM for hidden user types: the shared rule also reads the user's "
        "satisfaction level, which every platform (B included) takes from its own noisy "
        "readings; each drawn rule is played on 8 user-episodes",
    ),
    "per_platform_adaptive": AgentSpec(
        _PER_PLATFORM,
        {"agent": "rule_search_adaptive", "silent": "bottom_x"},
        "local baseline for hidden user types: rule_search_adaptive on every feedback platform "
        "(its rule reads the platform's own satisfaction readings); no-feedback platforms serve "
        "bottom_x, the best fixed slate",
    ),
    "per_platform": AgentSpec(
        _PER_PLATFORM,
        {},
        "any single-platform agent (--agent NAME) on every feedback platform, trained on that "
        "platform alone; platforms without feedback serve --silent (random)",
    ),
    **{
        name: AgentSpec(
            _PER_PLATFORM,
            {"agent": name},
            f"single-platform {name} on every feedback platform, trained locally (no "
            "federation); platforms without feedback serve random",
        )
        for name in ("rule_search", "rule_search_adaptive", "ppo", "recurrent_ppo")
    },
    # Labelled deviations from the paper (docs/fedslate.md, "Diagnosis").
    "slateq_itemwise": AgentSpec(
        _FEDSLATE, {"method": "slateq", "local_network": "itemwise"}, "deviation: item-wise Q"
    ),
    "fedslate_itemwise": AgentSpec(
        _FEDSLATE, {"method": "fedslate", "local_network": "itemwise"}, "deviation: item-wise Q"
    ),
    "fedslate_residual": AgentSpec(
        _FEDSLATE, {"method": "fedslate", "global_network": "residual"}, "deviation: residual F"
    ),
    "slateq_itemwise_relu": AgentSpec(
        _FEDSLATE, {"method": "slateq", **_ITEMWISE_RELU}, "deviation: small ReLU item-wise Q"
    ),
    "fedslate_itemwise_residual": AgentSpec(
        _FEDSLATE,
        {"method": "fedslate", **_ITEMWISE_RELU, "global_network": "residual"},
        "deviation: item-wise Q and residual F",
    ),
}


def _load_module(target: str) -> Any:
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"agent file {path} does not exist")
        name = f"fedrec_user_agent_{path.stem}"
        loaded = sys.modules.get(name)
        if loaded is not None and Path(loaded.__file__ or "").resolve() == path.resolve():
            return loaded  # the same file, already imported: keep its classes identical
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import agent file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            with _sibling_imports(path):
                spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)  # a failed import leaves no half-built module behind
            raise
        return module
    return importlib.import_module(target)


@contextlib.contextmanager
def _sibling_imports(path: Path) -> Iterator[None]:
    """While an agent file is executed, its folder is first on ``sys.path``, so the file may
    import the modules beside it (``from my_helpers import Net``), as ``python my_agent.py``
    would; the folder is removed afterwards (the modules imported stay in ``sys.modules``)."""
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        try:
            sys.path.remove(folder)  # the first occurrence: the one inserted above
        except ValueError:  # the file removed it itself
            pass


def _load_class(target: str) -> type:
    module_name, _, class_name = target.rpartition(":")
    module = _load_module(module_name)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{target}: {module_name} has no class {class_name!r}")
    return cls


def _multi_platform_base() -> type:
    from fedrec.agents.multi_platform import MultiPlatformAgent

    return MultiPlatformAgent


def resolve_agent(name: str) -> type[SlateAgent]:
    """The single-platform agent class for a built-in name, ``package.module:Class`` or
    ``path/file.py:Class``."""
    target = AGENTS.get(name) or OFFLINE_AGENTS.get(name, name)
    if ":" not in target:
        known = ", ".join(sorted({**AGENTS, **OFFLINE_AGENTS}))
        raise ValueError(
            f"unknown agent {name!r}: use one of {known}, or module:Class / path/to/file.py:Class"
        )
    cls = _load_class(target)
    if issubclass(cls, _multi_platform_base()):
        raise ValueError(
            f"{target} is a multi-platform agent: train it on a multi-platform env "
            "(--env fedrec/ChocKaleMultiPlatform-v0)"
        )
    if not issubclass(cls, SlateAgent):
        raise ValueError(f"{target} is not a fedrec SlateAgent subclass")
    return cls


def resolve_multi_platform_agent(name: str) -> tuple[type, dict[str, Any]]:
    """The multi-platform agent class and its preset hyperparameters, for a built-in method name
    (:data:`MULTI_PLATFORM_AGENTS`), ``package.module:Class`` or ``path/file.py:Class``."""
    spec = MULTI_PLATFORM_AGENTS.get(name)
    target = spec.target if spec is not None else name
    if ":" not in target:
        known = ", ".join(MULTI_PLATFORM_AGENTS)
        raise ValueError(
            f"unknown multi-platform agent {name!r}: use one of {known}, or module:Class / "
            "path/to/file.py:Class"
        )
    cls = _load_class(target)
    if not issubclass(cls, _multi_platform_base()):
        kind = "a single-platform SlateAgent" if issubclass(cls, SlateAgent) else "not an agent"
        raise ValueError(
            f"{target} is {kind}; a multi-platform env needs a subclass of "
            "fedrec.agents.multi_platform.MultiPlatformAgent"
        )
    return cls, dict(spec.presets) if spec is not None else {}


def build_multi_platform_agent(name: str, env: Any, *, seed: int = 0, **overrides: Any) -> Any:
    """The multi-platform agent ``name`` (built-in, ``module:Class`` or ``file.py:Class``) for the
    batched multi-platform ``env``, with its presets and ``overrides`` of its Config."""
    cls, presets = resolve_multi_platform_agent(name)
    return cls.from_env(env, config=make_config(cls, {**presets, **overrides}), seed=seed)


def is_multi_platform_agent(name: str) -> bool:
    """True for a multi-platform built-in name or class (a name in both tables: False)."""
    if name in AGENTS or name in OFFLINE_AGENTS:
        return False
    if name in MULTI_PLATFORM_AGENTS:
        return True
    target = name
    return ":" in target and issubclass(_load_class(target), _multi_platform_base())


def make_config(cls: type, overrides: Mapping[str, Any] | None = None) -> Any:
    """The agent's ``Config`` with ``overrides`` applied (unknown names are an error)."""
    overrides = dict(overrides or {})
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"{cls.__name__} has no hyperparameter(s) {unknown}; known: {sorted(fields)}"
        )
    return cls.Config(**overrides)


def config_from_json(cls: type, data: Mapping[str, Any]) -> Any:
    """The Config saved in a run's ``config.json`` (JSON lists become tuples again)."""
    values = {}
    for field in dataclasses.fields(cls.Config):
        if field.name in data:
            value = data[field.name]
            values[field.name] = tuple(value) if isinstance(value, list) else value
    return make_config(cls, values)
