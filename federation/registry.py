"""Every aggregation rule of the federated recommenders by name: the plain ones and MF-SecAvg.

One registry, above both :mod:`fedrec.federation.aggregators` (the plain rules) and
:mod:`fedrec.federation.secagg` (MF-SecAvg, which builds on the plain rules' types), so that
neither imports the other's dependants.
"""

from __future__ import annotations

from fedrec.federation.aggregators import Aggregator, FedAvg, MFFedAvg, SimpleAvg
from fedrec.federation.secagg import MFSecAvg

#: The plain (non-secure) rules by name. Commands, benchmarks and the Flower apps take their
#: names from this module.
AGGREGATORS: dict[str, type[Aggregator]] = {cls.name: cls for cls in (SimpleAvg, FedAvg, MFFedAvg)}
#: The plain rules' names, in table order.
PLAIN_AGGREGATOR_NAMES: tuple[str, ...] = tuple(AGGREGATORS)
#: Every name :func:`make_aggregator` accepts.
AGGREGATOR_NAMES: tuple[str, ...] = (*AGGREGATORS, "mf-secavg")
#: The default rule of FedNCF training (the paper's best).
DEFAULT_AGGREGATOR = MFFedAvg.name


def aggregator_label(name: str) -> str:
    """An aggregator's name in printed tables (``"mf-fedavg"`` -> ``"MF-FedAvg"``)."""
    key = name.lower()
    if key == "mf-secavg":
        return "MF-SecAvg"
    return AGGREGATORS[key].label if key in AGGREGATORS else name


def make_aggregator(name: str) -> Aggregator:
    """The aggregator called ``name`` (one of :data:`AGGREGATOR_NAMES`, case-insensitive)."""
    key = name.lower()
    if key == "mf-secavg":
        return MFSecAvg()
    if key not in AGGREGATORS:
        raise ValueError(f"unknown aggregator {name!r}; known: {', '.join(AGGREGATOR_NAMES)}")
    return AGGREGATORS[key]()
