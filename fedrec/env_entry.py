"""One row of the environment registry (kept apart so env modules can declare rows without cycles)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class EnvEntry:
    """One registered environment id."""

    id: str
    api: Literal["gymnasium", "pettingzoo"]
    entry_point: str
    description: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    vector_entry_point: str | None = None
