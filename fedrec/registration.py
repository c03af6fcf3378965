"""The registry of fedrec environments: one table, registered with Gymnasium and PettingZoo on import."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium
import pettingzoo

from fedrec.envs.choc_kale import FEDSLATE_KWARGS, LIBRARY_DEFAULTS

#: Parameters of ``fedrec/ChocKaleLongTerm-v0``: the FedSlate variant with a satisfaction that
#: reacts (tau = 0.2 instead of 0.01), so that a myopic policy erodes it and planning pays.
#: The measured gap between the optimal planner and the myopic policy is in the README.
LONG_TERM_KWARGS: dict[str, Any] = {**FEDSLATE_KWARGS, "sensitivity": 0.2}


@dataclass(frozen=True)
class EnvEntry:
    """One registered environment id."""

    id: str
    api: Literal["gymnasium", "pettingzoo"]
    entry_point: str
    description: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    vector_entry_point: str | None = None


_CHOC_KALE = "fedrec.envs.choc_kale:ChocKaleEnv"
_CHOC_KALE_VECTOR = "fedrec.envs.choc_kale_vector:ChocKaleVectorEnv"

ENVIRONMENTS: tuple[EnvEntry, ...] = (
    EnvEntry(
        id="fedrec/ChocKale-v0",
        api="gymnasium",
        entry_point=_CHOC_KALE,
        vector_entry_point=_CHOC_KALE_VECTOR,
        kwargs=LIBRARY_DEFAULTS,
        description="RecSim's library long-term-satisfaction env: slot 0 consumed, 60 steps.",
    ),
    EnvEntry(
        id="fedrec/ChocKaleSlate-v0",
        api="gymnasium",
        entry_point=_CHOC_KALE,
        vector_entry_point=_CHOC_KALE_VECTOR,
        kwargs=FEDSLATE_KWARGS,
        description="FedSlate's single-platform variant: MNL choice, noisy satisfaction, 5 responses.",
    ),
    EnvEntry(
        id="fedrec/ChocKaleLongTerm-v0",
        api="gymnasium",
        entry_point=_CHOC_KALE,
        vector_entry_point=_CHOC_KALE_VECTOR,
        kwargs=LONG_TERM_KWARGS,
        description="ChocKaleSlate with a reactive satisfaction (tau=0.2): planning beats myopia.",
    ),
    EnvEntry(
        id="fedrec/ChocKaleMultiPlatform-v0",
        api="pettingzoo",
        entry_point="fedrec.envs.multi_platform:ChocKaleMultiPlatformEnv",
        description="One user, K platforms (A with feedback, B without), shared state and budget.",
    ),
)


def register_all() -> None:
    """Register every id with its library (idempotent: re-import does not warn)."""
    for entry in ENVIRONMENTS:
        if entry.api == "gymnasium":
            if entry.id in gymnasium.registry:
                continue
            gymnasium.register(
                id=entry.id,
                entry_point=entry.entry_point,
                vector_entry_point=entry.vector_entry_point,
                kwargs=dict(entry.kwargs),
            )
        else:
            if entry.id in pettingzoo.parallel_registry:
                continue
            pettingzoo.register(
                "parallel", entry.id, entry_point=entry.entry_point, kwargs=dict(entry.kwargs)
            )


def environment_ids(api: str | None = None) -> list[str]:
    """Registered ids, optionally only those of one API ('gymnasium' or 'pettingzoo')."""
    return [entry.id for entry in ENVIRONMENTS if api is None or entry.api == api]
