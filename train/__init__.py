"""fedrec.train."""
