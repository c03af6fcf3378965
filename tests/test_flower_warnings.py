"""Flower's deprecation notices stay out of fedrec's output: building fedrec's Flower apps uses
no deprecated Flower API (no ``DeprecationWarning`` from Flower, no ``DEPRECATED FEATURE`` log
record), and the one notice a simulation gets (``run_simulation`` is deprecated in favour of
``flwr run``, which ``fedrec flower deploy`` uses) is filtered, exactly that one. No Ray start."""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedrec.federation import flower_common

APPS = ("fedrec.train.fedncf.flower", "fedrec.train.fel.flower")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def deprecations(self) -> list[str]:
        return [r.getMessage() for r in self.records if "DEPRECATED" in r.getMessage()]


@pytest.fixture
def flower_log() -> Iterator[_Records]:
    """The records Flower's logger passes on (after its filters), without fedrec's filter."""
    logger = logging.getLogger("flwr")
    saved = list(logger.filters)
    for item in saved:
        logger.removeFilter(item)
    handler = _Records()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        for item in logger.filters:
            logger.removeFilter(item)
        for item in saved:
            logger.addFilter(item)


def _from_flower(caught: list[warnings.WarningMessage]) -> list[str]:
    flower = Path(importlib.import_module("flwr").__file__).parent
    return [
        f"{w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning))
        and Path(w.filename).is_relative_to(flower)
    ]


def test_building_the_apps_uses_no_deprecated_flower_api(flower_log: _Records) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in (*APPS, "fedrec.federation.flower_secagg", "fedrec.federation.flower_deploy"):
            importlib.import_module(name)
        for name in APPS:
            module = importlib.import_module(name)
            module.make_server_app()
            module.make_client_app()
    assert _from_flower(caught) == []
    assert flower_log.deprecations() == []


def test_the_run_simulation_notice_alone_is_filtered(
    flower_log: _Records, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = importlib.import_module("flwr.simulation.run_simulation")
    for name in ("_run_simulation", "_check_ray_support", "event"):  # no Ray, no telemetry
        monkeypatch.setattr(engine, name, lambda *args, **kwargs: None)

    def run() -> list[str]:
        flower_log.records.clear()
        engine.run_simulation(server_app=None, client_app=None, num_supernodes=1)
        return flower_log.deprecations()

    (notice,) = run()  # Flower still emits it, with the text the filter matches
    assert flower_common.RUN_SIMULATION_NOTICE in notice
    flower_common.hide_run_simulation_notice()
    flower_common.hide_run_simulation_notice()  # idempotent
    assert run() == []
    logging.getLogger("flwr").warning("DEPRECATED FEATURE: %s", "something else")
    assert flower_log.deprecations() == ["DEPRECATED FEATURE: something else"]
