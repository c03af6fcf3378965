"""fedrec.agents: the slate-agent and multi-platform agent interfaces, SlateQ, FedSlate, reference
policies and baselines."""

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
