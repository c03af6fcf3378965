"""fedrec.envs."""
