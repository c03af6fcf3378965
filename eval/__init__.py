"""fedrec.eval: metrics, statistics and plots of finished runs.

What lives here: ETROR and the run-directory reader (:mod:`~fedrec.eval.etror`, with the metrics
of one run in :mod:`~fedrec.eval.metrics`, the reader in :mod:`~fedrec.eval.runs` and the printed
report of ``fedrec eval`` in :mod:`~fedrec.eval.report`), rollouts of a
policy on held-out episodes (:mod:`~fedrec.eval.rollout`), confidence intervals
(:mod:`~fedrec.eval.stats`), ranking metrics (HR@k, NDCG@k, AUC), the papers' numbers, plots, and
the elite-inference check of FedCEM's privacy.

What it may import: ``fedrec.envs``, ``fedrec.federation``, ``fedrec.agents`` and
``fedrec.util``, never the training code or the command line (checked by tests/test_layers.py).
"""
