"""fedrec.federation."""
