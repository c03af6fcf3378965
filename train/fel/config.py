"""FEL's federated settings: the leaves' (DP-)FedAvg (:class:`FedConfig`, :class:`DPConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fedrec.agents.fel_model import LeafConfig
from fedrec.federation.privacy import validate_dp_arguments


@dataclass(frozen=True)
class DPConfig:
    """DP-FedAvg inside each cluster; give ``noise_multiplier`` or ``target_epsilon``."""

    clip_norm: float = 1.0
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float = 1e-5

    def __post_init__(self) -> None:
        # A NaN or negative noise multiplier would otherwise hang or fail only in the
        # accounting at the end of the run.
        validate_dp_arguments(
            clip_norm=self.clip_norm,
            noise_multiplier=self.noise_multiplier,
            target_epsilon=self.target_epsilon,
            delta=self.delta,
        )


@dataclass(frozen=True)
class FedConfig:
    """Federated training of the leaves (the same settings drive the baseline)."""

    leaf: LeafConfig = field(default_factory=LeafConfig)
    rounds: int = 50
    sample_rate: float = 0.1
    """q: each round, each client of a cluster takes part with this probability (Poisson
    sampling), at least one client per cluster without DP."""
    local_epochs: int = 1
    batch_size: int = 16
    client_lr: float = 0.5
    server_lr: float = 1.0
    dp: DPConfig | None = None
    seed: int = 0
    fill_empty_clusters: bool = True
    """without DP, give a cluster that drew no client in a round one client at random; ``False``
    keeps pure Poisson sampling, so that runs with any clustering and the same seed sample exactly
    the same clients every round (the benchmark's FEL and plain FL then do the same client
    updates)."""
