"""What a FedNCF run is: its configuration (:class:`FedNCFConfig`, centralised
:class:`CentralConfig`) and the names of its client simulations and client optimiser states.

``FedNCFConfig.simulation`` defaults to ``"auto"``: the compiled simulation where Numba imports
(:func:`fedrec.train.fedncf.simulate_compiled.numba_available`), the batched one otherwise. The
choice is made once, when the configuration is built, and the configuration keeps the resolved
name, so a run's ``config.json`` (and a bench's cache key, a Flower job) records the simulation
that actually trained it: a run stays reproducible and comparable on another machine, and
resuming it where the other simulation would be chosen is refused as a changed setup.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from fedrec.agents.ncf import NCFConfig
from fedrec.federation.registry import AGGREGATOR_NAMES, DEFAULT_AGGREGATOR
from fedrec.train.fedncf.simulate_compiled import numba_available

#: How the clients of a round are simulated (:attr:`FedNCFConfig.simulation`, once resolved).
SIMULATIONS: tuple[str, ...] = ("batched", "compiled", "reference")

#: How a client's Adam state lives between participations (:attr:`FedNCFConfig.client_optimizer`).
CLIENT_OPTIMIZERS: tuple[str, ...] = ("federated", "persistent", "fresh")


def resolve_simulation(simulation: str) -> str:
    """``simulation`` with ``"auto"`` replaced by what it means here: ``"compiled"`` where Numba
    imports, else ``"batched"`` (the stated fallback); any other name is returned as it is."""
    if simulation != "auto":
        return simulation
    return "compiled" if numba_available() else "batched"


@dataclass(frozen=True)
class FedNCFConfig:
    """One federated training run (defaults: FedNCF on ML-100K)."""

    model: NCFConfig = field(default_factory=NCFConfig)
    """the NCF architecture (GMF, MLP or NeuMF)."""
    aggregator: str = DEFAULT_AGGREGATOR
    """server rule: "simpleavg", "fedavg", "mf-fedavg" or "mf-secavg"."""
    global_rounds: int = 400
    """passes over all clients (FedNCF's "epochs"); ignored when aggregation_rounds is set."""
    aggregation_rounds: int | None = None
    """if set, train exactly this many aggregation rounds instead (the other unit)."""
    clients_per_round: int = 20
    """c: clients selected per aggregation round (FedNCF: 20 for ML-100K)."""
    local_epochs: int = 2
    """local epochs per participation."""
    batch_size: int = 64
    """local mini-batch size (FedNCF does not give one)."""
    lr: float = 1e-3
    """Adam learning rate."""
    num_negatives: int = 4
    """sampled negatives per training positive, redrawn every local epoch."""
    eval_every: int = 10
    """evaluate HR@10/NDCG@10 every this many global rounds (0: only at the end)."""
    validation: bool = False
    """hold each user's second-to-last positive out of training as a validation item, rank it at
    every evaluation, and report the test metrics of the round with the best validation HR@K
    (:attr:`TrainResult.selected`); the paper reports the last round's."""
    top_k: int = 10
    """K of HR@K and NDCG@K."""
    seed: int = 0
    """seeds initialisation, client selection and local sampling."""
    simulation: Literal["auto", "batched", "compiled", "reference"] = "auto"
    """client simulation: "compiled" (a Numba kernel, clients in parallel; about 2x faster than
    batched, needs ``fedrec[fast]``), "batched" (stacked NumPy arrays, every client in lockstep;
    float32 sums in another order, so its runs differ from compiled ones in the last bits and
    later in their trajectory), "reference" (the per-client ``torch.optim`` loop, slow) or "auto"
    (the default): "compiled" where Numba imports, else "batched". "auto" is resolved when the
    configuration is made, so the attribute, ``dataclasses.asdict`` and every ``config.json``
    hold the simulation that actually ran (:func:`resolve_simulation`)."""
    client_optimizer: Literal["federated", "persistent", "fresh"] = "federated"
    """federated: the Adam state of the item rows and network is federated like the weights (sent
    with them, continued by the clients, aggregated by the server's rule) and each user row's stays
    on its client (:class:`FederatedOptimizerState`; the best measured); persistent: each client
    keeps its own Adam state across its participations; fresh: a new Adam every participation
    (the paper's literal reading; docs/fedncf.md, "Client optimiser state")."""
    selection: Literal["permutation", "cohorts"] = "permutation"
    """client selection: "permutation" splits a fresh random permutation of the clients into the
    aggregation rounds of every global round; "cohorts" draws that split once, at the first
    global round, and afterwards only shuffles the order of the same groups (fixed cohorts: with
    MF-SecAvg each pair of neighbours agrees on a key once per run, docs/secure_aggregation.md)."""

    def __post_init__(self) -> None:
        if self.aggregator.lower() not in AGGREGATOR_NAMES:
            raise ValueError(
                f"aggregator must be one of {AGGREGATOR_NAMES}, got {self.aggregator!r}"
            )
        positive = {
            "clients_per_round": self.clients_per_round,
            "local_epochs": self.local_epochs,
            "batch_size": self.batch_size,
            "num_negatives": self.num_negatives,
            "top_k": self.top_k,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.aggregation_rounds is None and self.global_rounds < 1:
            raise ValueError(f"global_rounds must be >= 1, got {self.global_rounds}")
        if self.aggregation_rounds is not None and self.aggregation_rounds < 1:
            raise ValueError(f"aggregation_rounds must be >= 1, got {self.aggregation_rounds}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
        if self.simulation not in ("auto", *SIMULATIONS):
            raise ValueError(
                f"simulation must be 'auto' or one of {SIMULATIONS}, got {self.simulation!r}"
            )
        object.__setattr__(self, "simulation", resolve_simulation(self.simulation))
        if self.client_optimizer not in CLIENT_OPTIMIZERS:
            raise ValueError(
                f"client_optimizer must be one of {CLIENT_OPTIMIZERS}, got {self.client_optimizer!r}"
            )
        if self.selection not in ("permutation", "cohorts"):
            raise ValueError(
                f"selection must be 'permutation' or 'cohorts', got {self.selection!r}"
            )

    def rounds_per_global(self, num_users: int) -> int:
        """Aggregation rounds in one global round: ceil(U / clients_per_round)."""
        return math.ceil(num_users / min(self.clients_per_round, num_users))

    def total_aggregation_rounds(self, num_users: int) -> int:
        """The run's length in aggregation rounds."""
        if self.aggregation_rounds is not None:
            return self.aggregation_rounds
        return self.global_rounds * self.rounds_per_global(num_users)


@dataclass(frozen=True)
class CentralConfig:
    """One centralised training run on the pooled data (the upper bound)."""

    model: NCFConfig = field(default_factory=NCFConfig)
    """the NCF architecture (GMF, MLP or NeuMF)."""
    epochs: int = 20
    """passes over the pooled training data (fresh negatives each)."""
    batch_size: int = 256
    """mini-batch size (NCF's default)."""
    lr: float = 1e-3
    """Adam learning rate."""
    num_negatives: int = 4
    """sampled negatives per training positive, redrawn every epoch."""
    eval_every: int = 1
    """evaluate every this many epochs (0: only at the end)."""
    validation: bool = False
    """hold out a validation item per user and select the epoch on it (:class:`FedNCFConfig`)."""
    top_k: int = 10
    """K of HR@K and NDCG@K."""
    seed: int = 0
    """seeds initialisation and sampling."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "num_negatives", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
