"""Hidden info keys: what an env's info reveals that a deployed recommender could not know.

Every fedrec env declares, in ``metadata["hidden_info_keys"]`` (a frozenset; the class attribute
is the one place), the info keys that hold such state: the user's true state on Choc-vs-Kale, the
held-out answer or what the log holds next on the logged-data envs. Reference oracles and analysis
may read them; a learner may not. :func:`hidden_info_keys` reads the declaration of any env --
single, vector, under Gymnasium wrappers, Gymnasium's ``SyncVectorEnv`` or a PettingZoo env --
and :func:`strip_hidden` removes those keys from an info dict at every depth.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

#: The ``metadata`` entry in which an env declares its hidden info keys.
HIDDEN_INFO_KEYS = "hidden_info_keys"


def hidden_info_keys(env: Any) -> frozenset[str]:
    """The info keys ``env`` declares hidden (empty for an env that declares none).

    Gymnasium wrappers and vector wrappers forward ``metadata``, and ``SyncVectorEnv`` copies its
    sub-envs', so the declaration is read through them; ``env.unwrapped`` is read as well, for a
    wrapper that replaced its ``metadata``.
    """
    keys: set[str] = set()
    for candidate in (env, getattr(env, "unwrapped", None)):
        metadata = getattr(candidate, "metadata", None)
        if isinstance(metadata, Mapping):
            keys.update(metadata.get(HIDDEN_INFO_KEYS, ()))
    return frozenset(keys)


def strip_hidden(info: Mapping[str, Any], hidden: Collection[str]) -> dict[str, Any]:
    """``info`` without the keys in ``hidden`` or their ``_key`` masks, at every depth.

    Nested mappings -- a vector env's ``final_info`` (whose ``_final_info`` mask stays valid: it
    says which users ended, not what their info holds), per-platform infos -- are filtered the
    same way, into new dicts; ``info`` itself is left unchanged and other values are not copied.
    """
    visible = {}
    for key, value in info.items():
        if isinstance(key, str) and key.removeprefix("_") in hidden:
            continue
        visible[key] = strip_hidden(value, hidden) if isinstance(value, Mapping) else value
    return visible
