"""The registry of fedrec environments: one table, registered with Gymnasium and PettingZoo on import."""

from __future__ import annotations

from typing import Any

import gymnasium
import pettingzoo

from fedrec.env_entry import EnvEntry
from fedrec.envs.choc_kale import FEDSLATE_KWARGS, LIBRARY_DEFAULTS
from fedrec.envs.datasets.registry import LOGGED_DATA_ENVIRONMENTS
from fedrec.envs.sardine import SARDINE_IDS, fedrec_id, sardine_available

#: Parameters of ``fedrec/ChocKaleLongTerm-v0``: the FedSlate variant with a satisfaction that
#: reacts (tau = 0.05 instead of 0.01; nothing else changes). Exposure then spans sigmoid(+-0.5),
#: so a myopic policy that serves chocolate erodes satisfaction and the optimal planner beats it
#: by about 35% (the sweep and the measured gap are in docs/reference_policies.md).
LONG_TERM_KWARGS: dict[str, Any] = {**FEDSLATE_KWARGS, "sensitivity": 0.05}
#: Parameters of ``fedrec/ChocKaleUserTypes-v0``: the long-term env with two hidden user types,
#: drawn with equal probability per episode: indifferent users (tau = 0, for whom the myopic
#: highest-feature slate is optimal) and sensitive ones (tau = 0.1, for whom it is the worst). No
#: fixed slate rule fits both; the planner is told each user's tau. The sweep behind the choice is
#: in docs/longterm.md (``python benchmarks/user_types_sweep.py``).
USER_TYPES_KWARGS: dict[str, Any] = {**LONG_TERM_KWARGS, "user_sensitivities": (0.0, 0.1)}


#: Parameters of ``fedrec/ChocKaleMultiPlatformUserTypes-v0``: the two-platform env (A with
#: feedback, B without) with ``fedrec/ChocKaleUserTypes-v0``'s hidden user types. A schedule of
#: fixed rules decided in advance (the best open-loop rule) cannot serve both types their plan;
#: every platform observes its own noisy satisfaction reading of the shared user, so a platform
#: without feedback can still tell the types apart, if it knows what to do with the reading.
MULTI_PLATFORM_USER_TYPES_KWARGS: dict[str, Any] = {
    "sensitivity": USER_TYPES_KWARGS["user_sensitivities"][1],
    "user_sensitivities": USER_TYPES_KWARGS["user_sensitivities"],
}


_CHOC_KALE = "fedrec.envs.choc_kale:ChocKaleEnv"
_CHOC_KALE_VECTOR = "fedrec.envs.choc_kale_vector:ChocKaleVectorEnv"

CHOC_KALE_ENVIRONMENTS: tuple[EnvEntry, ...] = (
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
        description="ChocKaleSlate with a reactive satisfaction (tau=0.05): planning beats myopia.",
    ),
    EnvEntry(
        id="fedrec/ChocKaleUserTypes-v0",
        api="gymnasium",
        entry_point=_CHOC_KALE,
        vector_entry_point=_CHOC_KALE_VECTOR,
        kwargs=USER_TYPES_KWARGS,
        description="ChocKaleLongTerm with two hidden user types (tau 0 or 0.1): infer, then plan.",
    ),
    EnvEntry(
        id="fedrec/ChocKaleMultiPlatform-v0",
        api="pettingzoo",
        entry_point="fedrec.envs.multi_platform:ChocKaleMultiPlatformEnv",
        vector_entry_point="fedrec.envs.multi_platform:ChocKaleMultiPlatformBatchEnv",
        description="One user, K platforms (A with feedback, B without), shared state and budget.",
    ),
    EnvEntry(
        id="fedrec/ChocKaleMultiPlatformUserTypes-v0",
        api="pettingzoo",
        entry_point="fedrec.envs.multi_platform:ChocKaleMultiPlatformEnv",
        vector_entry_point="fedrec.envs.multi_platform:ChocKaleMultiPlatformBatchEnv",
        kwargs=MULTI_PLATFORM_USER_TYPES_KWARGS,
        description="The two-platform env with hidden user types (tau 0 or 0.1): no open-loop "
        "plan fits both.",
    ),
)


#: Other simulated users: RecSim's interest evolution and a cascade click model over Choc-vs-Kale
#: items (docs/interest_evolution.md). Their hidden info keys differ from Choc-vs-Kale's.
USER_MODEL_ENVIRONMENTS: tuple[EnvEntry, ...] = (
    EnvEntry(
        id="fedrec/InterestEvolution-v0",
        api="gymnasium",
        entry_point="fedrec.envs.interest_evolution:InterestEvolutionEnv",
        vector_entry_point="fedrec.envs.interest_evolution_vector:InterestEvolutionVectorEnv",
        description="RecSim's interest evolution (RLlib's SlateQ env): 10 videos, slates of 2, "
        "reward = watch time.",
    ),
    EnvEntry(
        id="fedrec/ChocKaleCascade-v0",
        api="gymnasium",
        entry_point="fedrec.envs.cascade:ChocKaleCascadeEnv",
        vector_entry_point="fedrec.envs.cascade_vector:ChocKaleCascadeVectorEnv",
        description="Cascade clicks (Kveton et al. 2015) on Choc-vs-Kale items; exact optimal "
        "slate for regret.",
    ),
)


#: SARDINE's slate environments through fedrec's adapter (docs/sardine.md), registered only when
#: the optional ``sardine`` package is installed (``fedrec[sardine]``; found without importing
#: it). Each SARDINE id ``sardine/<Name>-v0`` becomes ``sardine/<Name>-fedrec-v0``: SARDINE
#: registers its own ids, with its own observations, when it is imported. They are part of
#: :data:`ENVIRONMENTS` (and `fedrec envs`) when registered, so the suites over every entry
#: (fuzzing, exact resume, hidden keys and the oracle gate) cover them; tests/test_sardine.py
#: adds parity with SARDINE's own envs.
SARDINE_ENVIRONMENTS: tuple[EnvEntry, ...] = (
    tuple(
        EnvEntry(
            id=fedrec_id(sardine_id),
            api="gymnasium",
            entry_point="fedrec.envs.sardine:SardineEnv",
            vector_entry_point="fedrec.envs.sardine:SardineVectorEnv",
            kwargs={"sardine_id": sardine_id},
            description=f"SARDINE's {sardine_id} with fedrec's observations and slate actions.",
        )
        for sardine_id in SARDINE_IDS
    )
    if sardine_available()
    else ()
)


#: Every registered environment, in the order `fedrec envs` lists them.
ENVIRONMENTS: tuple[EnvEntry, ...] = (
    CHOC_KALE_ENVIRONMENTS
    + USER_MODEL_ENVIRONMENTS
    + SARDINE_ENVIRONMENTS
    + LOGGED_DATA_ENVIRONMENTS
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


def entry_of(env_id: str) -> EnvEntry:
    """The registry row of ``env_id`` (a clear error naming the known ids otherwise)."""
    for entry in ENVIRONMENTS:
        if entry.id == env_id:
            return entry
    known = ", ".join(environment_ids())
    raise ValueError(f"unknown environment {env_id!r}; fedrec registers {known}")


def is_multi_platform(env_id: str) -> bool:
    """True for the PettingZoo (multi-platform) ids, False for Gymnasium and unknown ids."""
    return any(entry.id == env_id and entry.api == "pettingzoo" for entry in ENVIRONMENTS)


def batched_entry_point(env_id: str) -> Any:
    """The batched class of a multi-platform id (``cls(num_users, **kwargs)``)."""
    import importlib

    entry = entry_of(env_id)
    if entry.api != "pettingzoo" or entry.vector_entry_point is None:
        raise ValueError(f"{env_id} is not a multi-platform environment with a batched version")
    module, _, name = entry.vector_entry_point.partition(":")
    return getattr(importlib.import_module(module), name)
