"""Spy agents for the hidden-state tests: they record every info key they are handed, at any depth.

A spy serves random actions of its env's action space (slates or scores), so it runs on every
registered env, and counts each value of a hidden key it finds in ``infos``: top-level, inside a
vector env's ``final_info`` or a per-platform dict, or as a ``_key`` mask. The hidden keys are
the union of every env's declaration, pinned here (``tests/test_oracle_gate.py`` checks the envs
declare exactly these).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from fedrec.agents.base import SlateAgent, random_slates, slate_size_of

#: Choc-vs-Kale's hidden user state (every Choc-vs-Kale id, single- and multi-platform).
CHOC_KALE_HIDDEN = frozenset(
    {"user_exposure", "user_satisfaction", "budget_left", "user_sensitivity"}
)
#: The logged-data envs: the held-out answer (evaluation mode), what the log holds next
#: (interaction mode). The Taobao env declares none.
LOGGED_EVALUATION_HIDDEN = frozenset({"target_index", "test_item"})
LOGGED_INTERACTION_HIDDEN = frozenset({"positives_left"})
#: The other simulated users: interest evolution (the time budget, the candidates' quality) and
#: the cascade env (the attraction probabilities and the click probabilities behind regret).
INTEREST_EVOLUTION_HIDDEN = frozenset({"budget_left", "candidate_quality"})
CASCADE_HIDDEN = frozenset(
    {"candidate_attraction", "slate_click_probability", "optimal_click_probability"}
)
#: SARDINE's envs (the ``sardine`` extra): its user state, boredom, the slate's true relevances
#: and scores, and its greedy oracle's next slate.
SARDINE_HIDDEN = frozenset({"user_state", "bored", "relevances", "scores", "oracle_slate"})
ALL_HIDDEN = (
    CHOC_KALE_HIDDEN
    | LOGGED_EVALUATION_HIDDEN
    | LOGGED_INTERACTION_HIDDEN
    | INTEREST_EVOLUTION_HIDDEN
    | CASCADE_HIDDEN
    | SARDINE_HIDDEN
)


def hidden_values(infos: Any, hidden: frozenset[str] = ALL_HIDDEN, path: str = "infos") -> dict:
    """``{path of a hidden entry: number of values}`` for every hidden key or ``_key`` mask in
    ``infos``, at any depth (mappings and sequences of mappings are walked)."""
    found: dict[str, int] = {}
    if isinstance(infos, list | tuple):
        for index, item in enumerate(infos):
            found.update(hidden_values(item, hidden, f"{path}[{index}]"))
        return found
    if not isinstance(infos, Mapping):
        return found
    for key, value in infos.items():
        where = f"{path}[{key!r}]"
        if str(key).removeprefix("_") in hidden:
            mask = infos.get(f"_{key}")
            present = np.size(value) if mask is None else np.count_nonzero(mask)
            found[where] = 0 if str(key).startswith("_") else int(present)
        elif isinstance(value, Mapping | list | tuple):
            found.update(hidden_values(value, hidden, where))
    return found


@dataclasses.dataclass
class Record:
    """What the spies of one class were handed."""

    calls: int = 0
    infos: int = 0  # calls with an info dict
    keys: set[str] = dataclasses.field(default_factory=set)  # every key path, hidden or not
    hidden: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add(self, infos: Any) -> None:
        self.calls += 1
        if infos is None:
            return
        self.infos += 1
        self.keys |= _key_paths(infos)
        self.hidden.update(hidden_values(infos))

    def report(self) -> str:
        """The hidden entries seen, for an assertion message."""
        total = sum(self.hidden.values())
        return f"{total} hidden values in {len(self.hidden)} entries: {dict(self.hidden)}"


def _key_paths(infos: Mapping[str, Any], prefix: str = "") -> set[str]:
    paths = set()
    for key, value in infos.items():
        paths.add(prefix + str(key))
        if isinstance(value, Mapping):
            paths |= _key_paths(value, f"{prefix}{key}/")
    return paths


#: Records per spy class name (a plug-in loaded from a file subclasses these, so it shares them).
RECORDS: dict[str, Record] = collections.defaultdict(Record)


def reset_records() -> None:
    RECORDS.clear()


class InfoSpy(SlateAgent):
    """Random actions of the env's action space; records every ``infos`` it is handed."""

    record_as: ClassVar[str] = "learner"

    def __init__(self, *, slate_size: int, space: Any, seed: int | None = None) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        self.space = space

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> InfoSpy:
        del config
        space = getattr(env, "single_action_space", None) or env.action_space
        return cls(slate_size=slate_size_of(env), space=space, seed=seed)

    def act_batch(self, observations, *, infos=None) -> np.ndarray:
        RECORDS[self.record_as].add(infos)
        users = len(next(iter(observations.values())))
        if hasattr(self.space, "num_candidates"):  # a slate space
            return random_slates(self.rng, users, self.space.num_candidates, self.slate_size)
        low, high = self.space.low, self.space.high  # a Box of scores (Taobao)
        return self.rng.uniform(low, high, (users, *self.space.shape)).astype(self.space.dtype)


class OracleSpy(InfoSpy):
    """The same spy, declared an oracle: it must receive everything."""

    oracle = True
    record_as = "oracle"
