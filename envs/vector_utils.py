"""Checks and helpers shared by fedrec's native batched (``gymnasium.vector.VectorEnv``) envs."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode


def parse_autoreset_mode(value: AutoresetMode | str) -> AutoresetMode:
    """The Gymnasium autoreset mode named by ``value``, or a ValueError listing the valid ones."""
    try:
        return AutoresetMode(value)
    except ValueError as error:
        valid = [mode.value for mode in AutoresetMode]
        raise ValueError(f"autoreset_mode must be one of {valid}, got {value!r}") from error


def check_vector_args(
    num_envs: object, render_mode: str | None, max_episode_steps: int | None, *, who: str
) -> None:
    """Validate the constructor arguments every batched env takes."""
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive integer, got {num_envs!r}")
    if render_mode is not None:
        raise ValueError(f"{who} does not render; use the single env with render_mode='ansi'")
    if max_episode_steps is not None and max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps}")


def reset_mask(options: dict[str, Any] | None, num_envs: int, *, started: bool) -> np.ndarray:
    """Which envs a ``reset(options=...)`` resets: ``options["reset_mask"]`` or all of them."""
    mask = None if options is None else options.get("reset_mask")
    if mask is None:
        return np.ones(num_envs, dtype=bool)
    mask = np.asarray(mask)
    if mask.dtype != np.bool_ or mask.shape != (num_envs,):
        raise ValueError(f"reset_mask must be a bool array of shape ({num_envs},)")
    if not started and not mask.all():
        raise ValueError("the first reset must reset every env (omit reset_mask)")
    return mask


def with_masks(
    info: dict[str, Any], num_envs: int, present: np.ndarray | None = None
) -> dict[str, Any]:
    """Add Gymnasium's ``_key`` masks: every entry present for the envs in ``present`` (all)."""
    mask = np.ones(num_envs, dtype=bool) if present is None else present
    return {**info, **{f"_{key}": mask.copy() for key in info}}
