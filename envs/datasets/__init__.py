"""fedrec.envs.datasets: logged recommendation data sets and the bandit environments built on them.

What lives here: fetching and parsing the data files (MovieLens, Lastfm, Foursquare, Taobao ad
clicks), preprocessing and leave-one-out splits, per-client data for the federated
recommenders, and the evaluation- and interaction-mode environments. Part of the ``envs`` layer:
it imports only ``fedrec.envs`` and ``fedrec.util``.
"""
