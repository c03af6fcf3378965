"""fedrec.envs: the environments, the lowest layer.

What lives here: the Choc-vs-Kale user model (:mod:`~fedrec.envs.choc_kale_model`), its
Gymnasium envs, single (:mod:`~fedrec.envs.choc_kale`) and natively batched
(:mod:`~fedrec.envs.choc_kale_vector`), the PettingZoo multi-platform env
(:mod:`~fedrec.envs.multi_platform`), the slate space (:mod:`~fedrec.envs.slates`), which info
keys are hidden state (:mod:`~fedrec.envs.hidden`), and the logged-data environments
(:mod:`fedrec.envs.datasets`). The ids are registered by :mod:`fedrec.registration`.

What it may import: only ``fedrec.util`` / ``fedrec.env_entry`` and itself (the layer order
envs < federation < agents < eval < train < experiments < cli is checked by tests/test_layers.py).
"""
