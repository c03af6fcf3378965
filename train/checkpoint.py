"""Checkpoints and run files that are safe to load and atomic to write.

*Safe*: a checkpoint holds plain data only -- tensors, NumPy arrays, numbers, strings, lists,
tuples and dicts -- and is read with ``torch.load(weights_only=True)``, which refuses any other
pickled object. Loading a checkpoint (or a colleague's run directory) therefore never runs code
from it. Environments and agents contribute their state as data (``state_dict()``), never as a
pickle. NumPy arrays, which ``weights_only`` does not accept, travel as tensors tagged
``{"__ndarray__": tensor}`` and come back as arrays with the same dtype and shape.

*Atomic*: each write goes to a temporary file ``.<name>.XXXXXXXX.tmp`` in the same directory, is
flushed and fsynced, then renamed over the target with :func:`os.replace`, so a crash at any moment
leaves either the old file or the new one, never half of one. A process killed during a write
leaves its temporary file behind; the next write of the same target removes it
(:func:`clean_orphans`), never a file another live process is still writing.

*Checked*: a checkpoint is a plain ``torch.save`` zip archive whose zip comment holds the SHA-256
of every byte before it (``fedrec-sha256:<64 hex digits>``; ``zipfile`` and ``torch.load`` read it
as usual). :func:`load_checkpoint` verifies it before unpickling anything, so a flipped bit anywhere
in the file is refused (torch's zip reader checks no CRC), and refuses floating-point tensors that
hold NaN or inf (a diverged run is not resumed silently), except arrays under the keys of
:data:`NAN_MARKER_KEYS`, which use NaN as "no value yet".

*Owned*: a checkpoint records the setup of the run that wrote it (:func:`setup_hash` of the run's
config without its length), and a training loop refuses a checkpoint of another setup.
"""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import re
import struct
import tempfile
import time
import warnings
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

try:  # POSIX: a live writer holds a lock on its temporary file (see clean_orphans)
    import fcntl
except ImportError:  # pragma: no cover - Windows: orphans are recognised by age alone
    fcntl = None  # type: ignore[assignment]

#: Bumped when the layout of a checkpoint changes incompatibly.
CHECKPOINT_FORMAT = 2
_ARRAY_TAG = "__ndarray__"
#: The zip comment of a checkpoint: this marker and the SHA-256 (hex) of all bytes before it.
_CHECKSUM_MARKER = b"fedrec-sha256:"
_CHECKSUM_LENGTH = len(_CHECKSUM_MARKER) + 64
_EOCD_SIGNATURE = b"PK\x05\x06"  # a zip's end-of-central-directory record (22 bytes + comment)
_EOCD_SIZE = 22
#: Keys whose arrays use NaN as "no value yet" (a user's satisfaction readings before the first
#: one): :func:`load_checkpoint` does not refuse NaN or inf anywhere under them.
NAN_MARKER_KEYS: frozenset[str] = frozenset({"readings"})
#: The random part of a temporary file's name (what :func:`tempfile.mkstemp` draws).
_TMP_RANDOM = r"[a-z0-9_]{8}"
#: An empty temporary file younger than this may belong to a writer that has not locked it yet.
_ORPHAN_GRACE_S = 60.0


def clean_orphans(directory: Path | str, name: str | None = None) -> list[Path]:
    """Remove the temporary files that :func:`atomic_write` left in ``directory`` when its
    process was killed (``.<name>.XXXXXXXX.tmp``, for target ``name`` or, when None, for every
    target); return the paths removed.

    Only files of exactly that pattern are candidates, and only orphans are removed: a live writer
    holds an exclusive lock on its file while writing, so a file that can be locked and is
    non-empty (or empty and older than a minute) has lost its writer. Without ``fcntl`` (Windows)
    a candidate is removed once it is older than a minute."""
    directory = Path(directory)
    target = re.escape(name) if name is not None else r".+"
    pattern = re.compile(rf"\.{target}\.{_TMP_RANDOM}\.tmp")
    removed = []
    try:
        candidates = [p for p in directory.iterdir() if pattern.fullmatch(p.name)]
    except OSError:  # no directory yet, or not readable: nothing to clean
        return removed
    for candidate in candidates:
        if _is_orphan(candidate):
            try:
                candidate.unlink()
            except OSError:  # removed meanwhile, or not ours to remove: leave it
                continue
            removed.append(candidate)
    return removed


def _is_orphan(path: Path) -> bool:
    """Whether the temporary file ``path`` was left by a writer that is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:  # vanished, a link, or unreadable: not ours to judge
        return False
    try:
        info = os.fstat(fd)
        young = time.time() - info.st_mtime < _ORPHAN_GRACE_S
        if fcntl is None:
            return not young
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live writer holds it
            return False
        # Locked by nobody: a writer locks before its first byte, so a non-empty file is an
        # orphan; an empty one may be a writer between mkstemp and its lock, unless it is old.
        return info.st_size > 0 or not young
    finally:
        os.close(fd)  # also releases our lock


def atomic_write(path: Path | str, write: Callable[[IO[bytes]], None]) -> Path:
    """Write ``path`` atomically with ``write(file)``; orphaned temporary files of earlier
    writes of ``path`` (a killed process's) are removed first (:func:`clean_orphans`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_orphans(path.parent, path.name)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if fcntl is not None:  # held until renamed: clean_orphans leaves the file alone
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # no locks here (some network file systems): write unlocked
                pass
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
            if fcntl is not None:  # POSIX renames an open file: rename while still locked
                os.replace(tmp, path)
        if fcntl is None:
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
    """Atomically save ``state`` (plain data, see :func:`to_plain`) as a checkpoint, with the
    SHA-256 of its bytes in the zip comment (see the module doc)."""
    plain = to_plain({"format": CHECKPOINT_FORMAT, **state}, "checkpoint")
    buffer = io.BytesIO()
    torch.save(plain, buffer)
    data = buffer.getbuffer()
    eocd = len(data) - _EOCD_SIZE
    if bytes(data[eocd : eocd + 4]) != _EOCD_SIGNATURE or bytes(data[-2:]) != b"\0\0":
        raise RuntimeError("torch.save wrote no zip archive without comment: cannot checksum it")
    data[-2:] = struct.pack("<H", _CHECKSUM_LENGTH)  # the comment's length, then the comment
    trailer = _CHECKSUM_MARKER + hashlib.sha256(data).hexdigest().encode("ascii")

    def write(file: IO[bytes]) -> None:
        file.write(data)
        file.write(trailer)

    try:
        return atomic_write(path, write)
    finally:
        data.release()


def _verified_payload(path: Path, data: bytes) -> None:
    """Refuse ``data`` (the bytes of checkpoint ``path``) unless its checksum matches; a file
    from before checksums (a zip without comment) is accepted with a warning."""
    if len(data) >= _EOCD_SIZE + _CHECKSUM_LENGTH:
        trailer = data[-_CHECKSUM_LENGTH:]
        eocd = data[-_CHECKSUM_LENGTH - _EOCD_SIZE : -_CHECKSUM_LENGTH]
        if (
            trailer.startswith(_CHECKSUM_MARKER)
            and eocd.startswith(_EOCD_SIGNATURE)
            and eocd[-2:] == struct.pack("<H", _CHECKSUM_LENGTH)
        ):
            expected = trailer[len(_CHECKSUM_MARKER) :]
            actual = hashlib.sha256(memoryview(data)[:-_CHECKSUM_LENGTH]).hexdigest()
            if actual.encode("ascii") != expected:
                raise ValueError(
                    f"checkpoint {path} is corrupt: its SHA-256 does not match the one recorded "
                    "when it was written (refused, nothing was loaded; start the run again "
                    "without --resume, or restore the file)"
                )
            return
    if data[-_EOCD_SIZE : -_EOCD_SIZE + 4] == _EOCD_SIGNATURE and data[-2:] == b"\0\0":
        # Old checkpoints stay resumable (the state's layout is unchanged and weights_only still
        # guards against code); their integrity cannot be verified, so say so. The next
        # checkpoint the resumed run writes has a checksum.
        warnings.warn(
            f"checkpoint {path} has no checksum (written by an older fedrec): loaded without an "
            "integrity check",
            UserWarning,
            stacklevel=3,
        )
        return
    raise ValueError(
        f"checkpoint {path} is corrupt or not a fedrec checkpoint: no valid checksum record at "
        "its end (refused, nothing was loaded)"
    )


def _first_non_finite(value: Any, where: str, exempt: Collection[str]) -> str | None:
    """The path of the first floating-point tensor in ``value`` holding NaN or inf, or None."""
    if isinstance(value, torch.Tensor):
        if (value.is_floating_point() or value.is_complex()) and not bool(
            torch.isfinite(value).all()
        ):
            return where
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key in exempt:
                continue
            inner = where if key == _ARRAY_TAG else f"{where}.{key}"
            found = _first_non_finite(item, inner, exempt)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _first_non_finite(item, f"{where}[{i}]", exempt)
            if found is not None:
                return found
    return None


def load_checkpoint(
    path: Path | str, *, nan_markers: Collection[str] = NAN_MARKER_KEYS
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` without running code from it.

    The file's SHA-256 is verified first: a corrupt file (one flipped bit anywhere) raises
    ``ValueError`` naming it, and nothing is unpickled. A checkpoint written before fedrec
    recorded checksums (a zip without comment) is loaded with a ``UserWarning``: it has the same
    layout, ``weights_only`` still guards it, and refusing it would make every run in flight at
    the upgrade unresumable; the resumed run's next checkpoint has a checksum. Then
    ``torch.load(weights_only=True)`` refuses every pickled object that is not plain data, so a
    crafted or foreign file raises ``ValueError`` and executes nothing. Finally a floating-point
    tensor or array with NaN or inf is refused (naming where it is), except under the keys
    ``nan_markers`` (arrays that use NaN for "no value yet").
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    data = path.read_bytes()
    _verified_payload(path, data)
    try:
        state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
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
    where = _first_non_finite(state, "checkpoint", frozenset(nan_markers))
    if where is not None:
        raise ValueError(
            f"checkpoint {path}: {where} holds NaN or inf (refused, nothing was loaded; the run "
            "that wrote it had diverged, or the file was altered)"
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
