"""FedNCF's default client simulation: the compiled one where Numba imports, else the batched one,
and a run records the simulation that actually ran (never "auto")."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from fedrec.train import fedncf
from fedrec.train.fedncf import config as fedncf_config


def test_auto_is_resolved_to_compiled_where_numba_imports() -> None:
    pytest.importorskip("numba")
    config = fedncf.FedNCFConfig()
    assert config.simulation == "compiled"
    assert dataclasses.asdict(config)["simulation"] == "compiled"  # what config.json records
    from fedrec.experiments.fedncf import BenchFedNCFConfig

    bench = BenchFedNCFConfig(aggregators=("mf-fedavg",))  # `fedrec bench fedncf`'s default
    assert bench.simulation == "compiled"


def test_auto_falls_back_to_batched_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # ``import numba`` now raises ImportError
    fedncf_config.numba_available.cache_clear()  # the answer is cached per process
    try:
        assert fedncf.resolve_simulation("auto") == "batched"
        assert fedncf.FedNCFConfig().simulation == "batched"
        assert fedncf.FedNCFConfig(simulation="reference").simulation == "reference"
        from fedrec.experiments.fedncf import BenchFedNCFConfig

        assert BenchFedNCFConfig(aggregators=("mf-fedavg",)).simulation == "batched"
    finally:
        fedncf_config.numba_available.cache_clear()


def test_an_unknown_simulation_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="simulation must be 'auto' or one of"):
        fedncf.FedNCFConfig(simulation="gpu")
