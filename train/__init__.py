"""fedrec.train: the training loops on one core (:mod:`fedrec.train.core`) and safe checkpoints.

:func:`train` trains a single-platform agent, :func:`train_multi_platform` a multi-platform one;
FedNCF's federated training is :func:`fedrec.train.fedncf.train_federated`.
"""

from fedrec.train.loop import TrainConfig, TrainResult, train
from fedrec.train.multi_platform import (
    MultiPlatformResult,
    MultiPlatformTrainConfig,
    train_multi_platform,
)

__all__ = [
    "MultiPlatformResult",
    "MultiPlatformTrainConfig",
    "TrainConfig",
    "TrainResult",
    "train",
    "train_multi_platform",
]
