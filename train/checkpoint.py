"""Atomic files: a crash at any moment leaves either the old file or the new one, never half.

Each write goes to a temporary file in the same directory, is flushed and fsynced, then renamed
over the target with :func:`os.replace` (atomic on POSIX and Windows).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch


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


def save_checkpoint(path: Path | str, state: dict[str, Any]) -> Path:
    """Atomically save a checkpoint (any picklable state, tensors included)."""
    return atomic_write(path, lambda file: torch.save(state, file))


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (trusted: it unpickles the env)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        return torch.load(path, weights_only=False)
    except Exception as error:  # a corrupt file must say which file
        raise ValueError(f"checkpoint {path} is unreadable: {error}") from error


def write_json(path: Path | str, data: Any) -> Path:
    """Atomically write indented JSON."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    return atomic_write(path, lambda file: file.write(text.encode()))


def write_text(path: Path | str, text: str) -> Path:
    """Atomically write a text file."""
    return atomic_write(path, lambda file: file.write(text.encode()))
