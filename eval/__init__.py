"""fedrec.eval."""
