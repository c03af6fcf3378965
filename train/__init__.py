"""fedrec.train: the training loop (:func:`train`, :class:`TrainConfig`) and atomic checkpoints."""

from fedrec.train.loop import TrainConfig, TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "train"]
