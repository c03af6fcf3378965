"""fedrec.agents: the agents and the policies they are measured against.

What lives here: the single-platform (:class:`SlateAgent`) and multi-platform
(:class:`MultiPlatformAgent`) interfaces and their registry, SlateQ, FedSlate
(:mod:`fedrec.agents.fedslate`), FedCEM, rule search, the supervised federated recommenders as
one-step agents (FedNCF, FEL), the Stable-Baselines3 adapter and agents, and the reference
policies (random, fixed rules, the best open-loop rule, and the oracles: myopic, planner,
belief planner).

What it may import: ``fedrec.envs``, ``fedrec.federation`` and ``fedrec.util`` (checked by
tests/test_layers.py); the training loops and the command line build on it.
"""

from fedrec.agents.base import SlateAgent, Transitions, random_slates, slate_size_of
from fedrec.agents.multi_platform import MultiPlatformAgent, RandomMultiPolicy

__all__ = [
    "MultiPlatformAgent",
    "RandomMultiPolicy",
    "SlateAgent",
    "Transitions",
    "random_slates",
    "slate_size_of",
]
