"""FedSlate's hyperparameters (:class:`FedSlateConfig`) and method names."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

import numpy as np

Method = Literal["fedslate", "fedslate_exp", "fedq", "slateq"]
METHODS: tuple[str, ...] = ("fedslate", "fedslate_exp", "fedq", "slateq")
FEDERATED_METHODS = ("fedslate", "fedslate_exp", "fedq")
Observations = Mapping[str, Mapping[str, np.ndarray]]


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class FedSlateConfig:
    """FedSlate hyperparameters; the official code's value is given where ours differs.

    Counts are in transitions of one platform (user-steps), the code's "steps", so a batched env
    of U users follows the same schedule per unit of experience.
    """

    method: str = dataclasses.field(
        default="fedslate",
        metadata=_help("fedslate | fedslate_exp | fedq | slateq (local only, no federation)"),
    )
    global_network: Literal["mlp", "linear", "residual"] = dataclasses.field(
        default="mlp",
        metadata=_help(
            "F: mlp (the paper's), linear (the paper's ablation), or residual: own Q + MLP "
            "(a labelled deviation, see docs/fedslate.md)"
        ),
    )
    gamma: float = dataclasses.field(default=0.9, metadata=_help("discount (code: 0.9)"))
    local_network: Literal["position", "itemwise"] = dataclasses.field(
        default="position",
        metadata=_help(
            "position: the paper's state -> N outputs; itemwise: one MLP shared across candidates "
            "(a labelled deviation, see docs/fedslate.md)"
        ),
    )
    local_hidden: tuple[int, ...] = dataclasses.field(
        default=(128, 128), metadata=_help("local Q net hidden layers, Mish (code: 5 x 4096)")
    )
    global_hidden: tuple[int, ...] = dataclasses.field(
        default=(128, 128), metadata=_help("federated net F hidden layers, Mish (code: 4 x 2048)")
    )
    local_activation: Literal["mish", "relu"] = dataclasses.field(
        default="mish",
        metadata=_help("local net activation (code: Mish; relu is SlateQ's and ~4x cheaper)"),
    )
    head: Literal["linear", "tanh"] = dataclasses.field(
        default="linear",
        metadata=_help("output heads (code: tanh, which saturates on rewards of 10-20)"),
    )
    learning_rate: float = dataclasses.field(
        default=1e-3, metadata=_help("Adam step size, one optimiser per network (code: 0.01)")
    )
    batch_size: int = dataclasses.field(default=32, metadata=_help("replay batch (code: 32)"))
    buffer_size: int = dataclasses.field(
        default=2_000, metadata=_help("replay capacity per platform (code: 2,000)")
    )
    learning_starts: int = dataclasses.field(
        default=5_000, metadata=_help("burn-in transitions before learning (code: 5,000)")
    )
    train_frequency: int = dataclasses.field(
        default=3, metadata=_help("transitions per learning round (code: 3)")
    )
    target_update_interval: int = dataclasses.field(
        default=500, metadata=_help("transitions between target syncs, all nets (code: 500)")
    )
    epsilon_decay: float = dataclasses.field(
        default=0.99995, metadata=_help("epsilon = decay ** transitions (code: 0.99995)")
    )
    epsilon_floor: float = dataclasses.field(
        default=0.1, metadata=_help("below this epsilon drops to epsilon_end (code: 0.1)")
    )
    epsilon_end: float = dataclasses.field(
        default=0.0, metadata=_help("exploration after the floor is crossed (code: 0)")
    )
    reward_scale: float = dataclasses.field(
        default=0.0, metadata=_help("reward multiplier in labels; 0 = 1 / mean |r| of burn-in")
    )
    choice_model: Literal["true", "paper"] = dataclasses.field(
        default="true",
        metadata=_help("env's true MNL, or the code's softmax([u x_i, 1]) (misspecified)"),
    )
    normalize_inputs: bool = dataclasses.field(
        default=True, metadata=_help("standardise states with mean/std frozen after burn-in")
    )

    def __post_init__(self) -> None:
        checks = {
            "method": self.method in METHODS,
            "global_network": self.global_network in ("mlp", "linear", "residual"),
            "gamma": 0.0 <= self.gamma <= 1.0,
            "local_network": self.local_network in ("position", "itemwise"),
            "local_hidden": len(self.local_hidden) >= 1 and min(self.local_hidden) >= 1,
            "local_activation": self.local_activation in ("mish", "relu"),
            "global_hidden": len(self.global_hidden) >= 1 and min(self.global_hidden) >= 1,
            "head": self.head in ("linear", "tanh"),
            "learning_rate": self.learning_rate > 0,
            "batch_size": self.batch_size >= 1,
            "buffer_size": self.buffer_size >= self.batch_size,
            "learning_starts": self.learning_starts >= 0,
            "train_frequency": self.train_frequency >= 1,
            "target_update_interval": self.target_update_interval >= 1,
            "epsilon_decay": 0.0 < self.epsilon_decay <= 1.0,
            "epsilon_floor": 0.0 <= self.epsilon_floor <= 1.0,
            "epsilon_end": 0.0 <= self.epsilon_end <= 1.0,
            "reward_scale": self.reward_scale >= 0,
            "choice_model": self.choice_model in ("true", "paper"),
        }
        bad = [name for name, ok in checks.items() if not ok]
        if self.global_network == "residual" and self.head != "linear":
            bad.append("head")  # the residual F adds a correction to Q_own: no squashing head
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise ValueError(f"invalid FedSlate config: {values}")

    @property
    def federated(self) -> bool:
        return self.method in FEDERATED_METHODS
