"""Validation of recommended slates: every env checks actions here, with errors that name the fault."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces


class FinishedEpisodeError(ValueError, RuntimeError):
    """A step for sub-envs whose episode has ended, in a vector env with autoreset ``DISABLED``.

    Gymnasium's ``DISABLED`` mode requires ``reset(options={"reset_mask": ...})`` first. It is a
    ``ValueError`` (the action is refused, nothing changes) and, for code written against the
    earlier error, a ``RuntimeError``.
    """


def reject_finished(finished: np.ndarray) -> None:
    """Raise :class:`FinishedEpisodeError` naming the sub-envs in ``finished`` (if any)."""
    if finished.any():
        raise FinishedEpisodeError(
            f"sub-envs {np.flatnonzero(finished).tolist()} have finished; with autoreset "
            "DISABLED reset them first (reset(options={'reset_mask': mask}))"
        )


def _as_array(action: object, who: str) -> np.ndarray:
    """``np.asarray(action)``, with NumPy's errors (ragged lists, odd objects) named."""
    try:
        return np.asarray(action)
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"{who} is not an array of numbers ({action!r:.80}): {error}") from error


def validate_slates(
    action: object,
    *,
    num_candidates: int,
    slate_size: int,
    batch_size: int | None = None,
    who: str = "slate",
    ignore: np.ndarray | None = None,
) -> np.ndarray:
    """Check and return slates as an int64 array; nothing is changed and nothing is drawn.

    :param action: one slate of shape (slate_size,) when ``batch_size`` is None, else a batch of
        shape (batch_size, slate_size). Entries are indices into the current candidate list.
    :param who: how the error message names the action (e.g. ``"slate of platform_b"``).
    :param ignore: (batch_size,) bool mask of rows the env ignores (sub-envs being autoreset in
        Gymnasium's ``NEXT_STEP`` mode): their dtype and shape are checked with the rest, their
        values are not, and the returned copy holds the slate ``0, 1, ..., slate_size - 1`` there.
    :raises ValueError: not an integer array, wrong shape, index out of range or a repeated item.
    """
    array = _as_array(action, who)
    if array.dtype.kind not in "iu" and array.size:
        raise ValueError(
            f"{who} must hold integer candidate indices, got dtype {array.dtype} ({action!r:.80})"
        )
    expected = (slate_size,) if batch_size is None else (batch_size, slate_size)
    if array.shape != expected:
        what = "length" if batch_size is None and array.ndim == 1 else "shape"
        got = array.shape[0] if what == "length" else array.shape
        raise ValueError(
            f"{who} has {what} {got}, expected shape {expected} (slate_size={slate_size})"
        )
    if ignore is not None and ignore.any():
        array = array.astype(np.int64)  # a copy: the caller's array is left alone
        array[ignore] = np.arange(slate_size)
    batch = array.reshape(-1, slate_size)
    low, high = batch.min(), batch.max()
    if low < 0 or high >= num_candidates:
        bad = int(low if low < 0 else high)
        raise ValueError(
            f"{who} contains candidate index {bad}, outside [0, {num_candidates}) "
            f"(num_candidates={num_candidates})"
        )
    if slate_size > 1:
        ordered = np.sort(batch, axis=1)
        repeats = ordered[:, 1:] == ordered[:, :-1]
        if repeats.any():
            row, col = np.argwhere(repeats)[0]
            where = "" if batch_size is None else f" (row {row})"
            raise ValueError(
                f"{who} repeats candidate {int(ordered[row, col])}{where}: "
                "a slate must list distinct candidates"
            )
    return batch.astype(np.int64, copy=False).reshape(expected)


def checked_slate(action: object, *, num_candidates: int, slate_size: int) -> list[int]:
    """One slate as a list of ints, for a single env's scalar step.

    A valid integer array or list of ints takes a fast path (NumPy's per-call overhead dominates
    a one-user step); anything else, and every fault, goes through :func:`validate_slates`.
    """
    if isinstance(action, np.ndarray) and action.dtype.kind in "iu" and action.ndim == 1:
        slate = action.tolist()
    elif isinstance(action, list | tuple) and all(type(a) is int for a in action):
        slate = list(action)
    else:
        slate = []
    if (
        len(slate) != slate_size
        or min(slate) < 0
        or max(slate) >= num_candidates
        or len(set(slate)) != slate_size
    ):
        slate = validate_slates(
            action, num_candidates=num_candidates, slate_size=slate_size
        ).tolist()
    return slate


def validate_scores(
    action: object,
    shape: tuple[int, ...],
    *,
    low: float = 0.0,
    high: float = 1.0,
    who: str = "action",
    ignore: np.ndarray | None = None,
) -> np.ndarray:
    """Check scores in ``[low, high]`` (a ``Box`` action) and return them as float64, flat.

    ``action`` is a real (integer or float, not bool) array of ``shape``, or of the same size
    and fewer dimensions (a scalar for shape (1,), shape (B,) for (B, 1)). ``ignore`` is a
    (shape[0],) mask of rows being autoreset: their values are not checked (they may be NaN).

    :raises ValueError: non-numeric, wrong shape, NaN or infinite, or outside ``[low, high]``.
    """
    array = _as_array(action, who)
    if array.dtype.kind not in "iuf":
        raise ValueError(
            f"{who} must be real scores in [{low}, {high}], got dtype {array.dtype} "
            f"({action!r:.80})"
        )
    size = int(np.prod(shape))
    if array.shape != shape and array.size == size and array.ndim <= len(shape):
        array = array.reshape(shape)
    if array.shape != shape:
        raise ValueError(f"{who} must be scores of shape {shape}, got shape {array.shape}")
    score = array.astype(np.float64, copy=False)
    checked = score if ignore is None or not ignore.any() else score[~ignore]
    if not np.isfinite(checked).all():
        raise ValueError(f"{who} must be finite scores of shape {shape}, got {action!r:.80}")
    if checked.size and (checked.min() < low or checked.max() > high):
        raise ValueError(
            f"{who} holds a score outside [{low}, {high}] (the action space), got {action!r:.80}"
        )
    return score.reshape(-1)


class SlateSpace(spaces.MultiDiscrete):
    """``MultiDiscrete([N] * n)`` whose members are slates of *distinct* candidates.

    It is a true ``MultiDiscrete`` (start 0), so RL libraries treat it as one, but ``sample()``
    draws without replacement and ``contains()`` rejects repeated items, matching what the
    environments accept. (Plain ``MultiDiscrete.sample`` returns duplicates, and its ``mask``
    cannot express "distinct".)
    """

    def __init__(self, num_candidates: int, slate_size: int, seed: int | None = None) -> None:
        if slate_size > num_candidates:
            raise ValueError(f"slate_size={slate_size} exceeds num_candidates={num_candidates}")
        super().__init__([num_candidates] * slate_size, dtype=np.int64, seed=seed)
        self.num_candidates = num_candidates
        self.slate_size = slate_size

    def sample(self, mask: object = None, probability: object = None) -> np.ndarray:
        if mask is not None or probability is not None:
            raise ValueError("SlateSpace.sample does not support mask or probability")
        return self.np_random.choice(self.num_candidates, self.slate_size, replace=False)

    def contains(self, x: object) -> bool:
        if not super().contains(x):
            return False
        slate = np.asarray(x)
        return len(np.unique(slate)) == slate.size

    def __repr__(self) -> str:
        return f"SlateSpace(num_candidates={self.num_candidates}, slate_size={self.slate_size})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SlateSpace) and super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # mutable numpy fields, like MultiDiscrete


class SlateBatchSpace(spaces.Box):
    """A batch of slates, shape (B, n): ``Box(0, N-1, int64)`` whose rows list distinct candidates."""

    def __init__(
        self, num_candidates: int, slate_size: int, batch_size: int, seed: int | None = None
    ) -> None:
        super().__init__(0, num_candidates - 1, (batch_size, slate_size), np.int64, seed=seed)
        self.num_candidates = num_candidates
        self.slate_size = slate_size
        self.batch_size = batch_size

    def sample(self, mask: object = None, probability: object = None) -> np.ndarray:
        if mask is not None or probability is not None:
            raise ValueError("SlateBatchSpace.sample does not support mask or probability")
        keys = self.np_random.random((self.batch_size, self.num_candidates))
        return np.argsort(keys, axis=1)[:, : self.slate_size].astype(np.int64)

    def contains(self, x: object) -> bool:
        if not super().contains(x):
            return False
        ordered = np.sort(np.asarray(x), axis=1)
        return not (ordered[:, 1:] == ordered[:, :-1]).any()
