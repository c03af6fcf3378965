"""The configuration of ``fedrec bench fedncf`` (:mod:`fedrec.experiments.fedncf`): what it runs,
as command-line options (:func:`fedrec.experiments.harness.add_options`). Every name here is also
importable from :mod:`fedrec.experiments.fedncf`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedrec.experiments import harness
from fedrec.experiments.harness import option

MODELS = ("gmf", "mlp", "neumf")
CLIENT_OPTIMIZERS = ("federated", "persistent", "fresh")


#: The fields of :class:`BenchFedNCFConfig` that are :class:`~fedrec.train.fedncf.FedNCFConfig`'s
#: (besides the aggregator): validated there.
FED_FIELDS = (
    "global_rounds",
    "aggregation_rounds",
    "clients_per_round",
    "batch_size",
    "eval_every",
    "client_optimizer",
    "selection",
    "simulation",
    "validation",
)


def _plain_aggregators() -> tuple[str, ...]:
    """The plain rules of the aggregator registry (imported when needed: it loads torch)."""
    from fedrec.federation.registry import PLAIN_AGGREGATOR_NAMES

    return PLAIN_AGGREGATOR_NAMES


@dataclass(frozen=True)
class BenchFedNCFConfig:
    """What ``fedrec bench fedncf`` runs."""

    dataset: str = "ml-100k"
    """logged data set (fetched with ``fedrec data fetch``)."""
    data_dir: str | None = None
    """data directory (default: the fedrec cache)."""
    models: tuple[str, ...] = option(
        ("gmf",), flag="--model", choices=MODELS, cli_choices=(*MODELS, "all")
    )
    """NCF model(s) to train (all: every one)."""
    aggregators: tuple[str, ...] | None = option(None, choices=_plain_aggregators)
    """aggregation rules compared in table 5 (default: every plain rule of the registry)."""
    global_rounds: int = 400
    """passes over all clients (FedNCF's "epochs"); ignored when aggregation_rounds is set."""
    aggregation_rounds: int | None = None
    """train this many aggregation rounds instead."""
    clients_per_round: int = 20
    """clients per aggregation round (FedNCF: 20 for ML-100K)."""
    seeds: int = option(3, min=1)
    """seeds per configuration."""
    first_seed: int = option(0, min=0)
    """the seeds are first_seed, first_seed + 1, ..."""
    eval_every: int = 10
    """evaluate every this many global rounds."""
    batch_size: int = 64
    """local mini-batch size."""
    client_optimizer: str = option("federated", choices=CLIENT_OPTIMIZERS)
    """federated: the Adam state of items and network is aggregated like the weights (default);
    persistent: clients keep their own Adam state; fresh: a new Adam every participation."""
    simulation: str = option("auto", choices=("auto", "batched", "compiled"))
    """client simulation of the federated runs: "compiled" (Numba kernel, about 2-3x faster; the
    committed results), "batched" (NumPy; its runs differ from compiled ones in float32 rounding)
    or "auto": compiled where Numba imports, else batched (recorded resolved)."""
    selection: str = option("permutation", choices=("permutation", "cohorts"))
    """client selection of the federated runs (``FedNCFConfig.selection``): "permutation" or
    "cohorts" (fixed groups in a new order every global round)."""
    central_epochs: int = option(20, min=1)
    """epochs of the centralised upper bound."""
    validation: bool = False
    """hold out a validation item per user in every run (federated and centralised) and report
    the test metrics at each run's best validation point next to the last point's."""
    secagg_rounds: int = option(3, min=0)
    """aggregation rounds timed with MF-SecAvg per model (0: skip table 8)."""
    jobs: int = option(1, min=1)
    """training runs in parallel (one process each)."""
    out: str | None = None
    """folder for the run cache, plots and results.json (default runs/bench/fedncf/HASH)."""

    def __post_init__(self) -> None:
        if self.aggregators is None:
            object.__setattr__(self, "aggregators", _plain_aggregators())
        harness.check_fields(self)
        from fedrec.agents.ncf import NCFConfig
        from fedrec.train.fedncf import FedNCFConfig, resolve_simulation

        # "auto" is resolved here, so results.json and the run cache keys name the simulation run
        object.__setattr__(self, "simulation", resolve_simulation(self.simulation))

        for aggregator in self.aggregators:  # the training settings: FedNCFConfig's own checks
            FedNCFConfig(model=NCFConfig(model=self.models[0]), **self._fed_fields(aggregator))

    def _fed_fields(self, aggregator: str) -> dict[str, Any]:
        """The fields shared with :class:`fedrec.train.fedncf.FedNCFConfig`."""
        return {
            "aggregator": aggregator,
            **{name: getattr(self, name) for name in FED_FIELDS},
        }

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))
