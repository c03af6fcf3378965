"""fedrec.agents: the slate-agent interface, SlateQ, reference policies and baselines."""

from fedrec.agents.base import SlateAgent, Transitions, random_slates, slate_size_of

__all__ = ["SlateAgent", "Transitions", "random_slates", "slate_size_of"]
