"""fedrec.agents."""
