"""Checkpoints and run files that are safe to load and atomic to write.

*Safe*: a checkpoint holds plain data only -- tensors, NumPy arrays, numbers, strings, lists,
tuples and dicts -- and is read with ``torch.load(weights_only=True)``, which refuses any other
pickled object. Loading a checkpoint (or a colleague's run directory) therefore never runs code
from it. Environments and agents contribute their state as data (``state_dict()``), never as a
pickle. NumPy arrays, which ``weights_only`` does not accept, travel as tensors tagged
``{"__ndarray__": tensor}`` and come back as arrays with the same dtype and shape.

*Atomic*: each write goes to a temporary file in the same directory, is flushed and fsynced, then
renamed over the target with :func:`os.replace`, so a crash at any moment leaves either the old
file or the new one, never half of one.

*Owned*: a checkpoint records the setup of the run that wrote it (:func:`setup_hash` of the run's
config without its length), and a training loop refuses a checkpoint of another setup.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

#: Bumped when the layout of a checkpoint changes incompatibly.
CHECKPOINT_FORMAT = 2
_ARRAY_TAG = "__ndarray__"


def atomic_write(path: Path | str, write: Callable[[IO[bytes]], None]) -> Path:
    """Write ``path`` atomically with ``write(file)``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def to_plain(value: Any, path: str = "state") -> Any:
    """``value`` as data ``torch.load(weights_only=True)`` accepts (NumPy arrays become tagged
    tensors, NumPy scalars Python numbers); anything else raises ``TypeError`` naming its path."""
    if isinstance(value, np.generic):  # first: np.float64 is also a float, but pickles as NumPy
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufc":
            raise TypeError(f"{path}: arrays of dtype {value.dtype} cannot be checkpointed")
        # ascontiguousarray returns at least 1-d: keep a 0-d array 0-d
        array = np.ascontiguousarray(value).reshape(value.shape)
        if not array.flags.writeable:  # torch.from_numpy needs a writeable array (else a copy)
            array = array.copy()
        # Shares memory with the caller's array: save_checkpoint serialises it at once.
        return {_ARRAY_TAG: torch.from_numpy(array)}
    if isinstance(value, Mapping):
        items = {}
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise TypeError(f"{path}: dict keys must be str or int, got {key!r}")
            items[key] = to_plain(item, f"{path}.{key}")
        return (
            collections.OrderedDict(items) if isinstance(value, collections.OrderedDict) else items
        )
    if isinstance(value, (list, tuple)):
        items = [to_plain(item, f"{path}[{i}]") for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    raise TypeError(
        f"{path}: a {type(value).__name__} cannot be checkpointed as data (state_dict() must "
        "return tensors, arrays, numbers, strings, lists, tuples and dicts)"
    )


def from_plain(value: Any) -> Any:
    """Inverse of :func:`to_plain`: tagged tensors become NumPy arrays again."""
    if isinstance(value, Mapping):
        if set(value) == {_ARRAY_TAG}:
            return value[_ARRAY_TAG].numpy()
        items = {key: from_plain(item) for key, item in value.items()}
        return (
            collections.OrderedDict(items) if isinstance(value, collections.OrderedDict) else items
        )
    if isinstance(value, list):
        return [from_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(from_plain(item) for item in value)
    return value


def save_checkpoint(path: Path | str, state: Mapping[str, Any]) -> Path:
    """Atomically save ``state`` (plain data, see :func:`to_plain`) as a checkpoint."""
    plain = to_plain({"format": CHECKPOINT_FORMAT, **state}, "checkpoint")
    return atomic_write(path, lambda file: torch.save(plain, file))


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` without running code from it.

    ``torch.load(weights_only=True)`` refuses every pickled object that is not plain data, so a
    crafted or foreign file raises ``ValueError`` (naming the file) and executes nothing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:  # corrupt, foreign or unsafe: say which file, load nothing
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"checkpoint {path} is unreadable or not plain data (refused, nothing was loaded): "
            f"{first}"
        ) from error
    if not isinstance(state, Mapping) or state.get("format") != CHECKPOINT_FORMAT:
        found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(
            f"checkpoint {path} has format {found!r}, expected {CHECKPOINT_FORMAT} (written by "
            "another fedrec version; start the run again without --resume)"
        )
    return from_plain(dict(state))


def canonical_json(data: Any) -> str:
    """The JSON text used for hashing: sorted keys, no whitespace, tuples as lists."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def setup_hash(setup: Mapping[str, Any]) -> str:
    """SHA-256 of a run's setup (what must not change between a run and its resumption)."""
    return hashlib.sha256(canonical_json(setup).encode()).hexdigest()


def setup_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Human-readable ``key: saved X, now Y`` lines for every top-level key that differs."""
    keys = sorted(set(saved) | set(current))
    saved_json = json.loads(canonical_json(saved))
    current_json = json.loads(canonical_json(current))
    return [
        f"{key}: saved {saved_json.get(key)!r}, now {current_json.get(key)!r}"
        for key in keys
        if saved_json.get(key) != current_json.get(key)
    ]


def write_json(path: Path | str, data: Any) -> Path:
    """Atomically write indented JSON."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return atomic_write(path, lambda file: file.write(text.encode()))


def write_text(path: Path | str, text: str) -> Path:
    """Atomically write a text file."""
    return atomic_write(path, lambda file: file.write(text.encode()))
