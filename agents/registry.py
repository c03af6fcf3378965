"""Agents by name, for the command line: built-in names or ``module:Class`` / ``file.py:Class``.

An agent class usable by name has a ``Config`` dataclass and a ``from_env(env, *, config, seed)``
class method (see :class:`fedrec.agents.base.SlateAgent`); a class written in a researcher's own
file is loaded from its path without installing anything.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedrec.agents.base import SlateAgent

#: Built-in agent name -> ``module:Class``.
AGENTS: dict[str, str] = {
    "slateq": "fedrec.agents.slateq:SlateQAgent",
    "random": "fedrec.agents.reference:RandomPolicy",
    "myopic": "fedrec.agents.reference:MyopicPolicy",
    "planner": "fedrec.agents.reference:OptimalPlanner",
}


def _load_module(target: str) -> Any:
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"agent file {path} does not exist")
        name = f"fedrec_user_agent_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"cannot import agent file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(target)


def resolve_agent(name: str) -> type[SlateAgent]:
    """The agent class for a built-in name, ``package.module:Class`` or ``path/file.py:Class``."""
    target = AGENTS.get(name, name)
    if ":" not in target:
        known = ", ".join(sorted(AGENTS))
        raise ValueError(
            f"unknown agent {name!r}: use one of {known}, or module:Class / path/to/file.py:Class"
        )
    module_name, _, class_name = target.rpartition(":")
    module = _load_module(module_name)
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, SlateAgent)):
        raise ValueError(f"{target} is not a fedrec SlateAgent subclass")
    return cls


def make_config(cls: type[SlateAgent], overrides: Mapping[str, Any] | None = None) -> Any:
    """The agent's ``Config`` with ``overrides`` applied (unknown names are an error)."""
    overrides = dict(overrides or {})
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(
            f"{cls.__name__} has no hyperparameter(s) {unknown}; known: {sorted(fields)}"
        )
    return cls.Config(**overrides)


def config_from_json(cls: type[SlateAgent], data: Mapping[str, Any]) -> Any:
    """The Config saved in a run's ``config.json`` (JSON lists become tuples again)."""
    values = {}
    for field in dataclasses.fields(cls.Config):
        if field.name in data:
            value = data[field.name]
            values[field.name] = tuple(value) if isinstance(value, list) else value
    return make_config(cls, values)


def json_ready(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value
