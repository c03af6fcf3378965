"""fedrec.experiments: the ``fedrec bench`` drivers and the demo's comparison.

What lives here: one driver per benchmark, which trains (``fedrec.train``), evaluates
(``fedrec.eval``) and writes the tables and plots that back the README's numbers. Standalone
speed, scale and cost measurements are scripts in ``benchmarks/`` instead (CONTRIBUTING.md).

What it may import: every layer below it (envs, federation, agents, eval, train) and
``fedrec.util``, never the command line (checked by tests/test_layers.py).
"""
