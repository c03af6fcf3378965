"""fedrec.train: the training loops on one core (:mod:`fedrec.train.core`) and safe checkpoints.

:func:`train` trains a single-platform agent, :func:`train_multi_platform` a multi-platform one;
FedNCF's federated training is :func:`fedrec.train.fedncf.train_federated`, FEL's is in
:mod:`fedrec.train.fel`. :func:`load_trained_agent` rebuilds a finished run's agent with its
trained weights (safely: :mod:`fedrec.train.trained`).

What it may import: every layer below it (envs, federation, agents, eval) and ``fedrec.util``,
never ``fedrec.experiments`` or the command line (checked by tests/test_layers.py).

The names below are imported on first use (PEP 562), so that importing one submodule (e.g.
``fedrec.train.fedncf`` in a Flower node, which starts a fresh process per message) does not
pay for the loops' imports (SciPy's statistics among them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedrec.train.loop import TrainConfig, TrainResult, train
    from fedrec.train.multi_platform import (
        MultiPlatformResult,
        MultiPlatformTrainConfig,
        train_multi_platform,
    )
    from fedrec.train.trained import load_trained_agent

_WHERE = {
    "TrainConfig": "fedrec.train.loop",
    "TrainResult": "fedrec.train.loop",
    "train": "fedrec.train.loop",
    "MultiPlatformResult": "fedrec.train.multi_platform",
    "MultiPlatformTrainConfig": "fedrec.train.multi_platform",
    "train_multi_platform": "fedrec.train.multi_platform",
    "load_trained_agent": "fedrec.train.trained",
}

__all__ = [
    "MultiPlatformResult",
    "MultiPlatformTrainConfig",
    "TrainConfig",
    "TrainResult",
    "load_trained_agent",
    "train",
    "train_multi_platform",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'fedrec.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
