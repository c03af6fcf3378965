"""Experiment drivers: the ``fedrec bench`` benchmarks and the demo's FedSlate comparison.

They train models (``fedrec.train``) and print tables (``fedrec.eval``); ``fedrec.eval`` itself
imports neither the training code nor the command line.
"""
