"""Throughput of the batched interaction-mode env: the per-user Python loop vs the numpy core.

Usage: ``python benchmarks/logged_env_speed.py [--repeats 5] [--sizes 1 64 1024]``. Writes a
synthetic data set of ML-100K's size (943 users, 1,682 items, ~100K ratings) in the ML-100K file
format to a temporary folder, then times ``LoggedInteractionVectorEnv.step`` with random slates
(NEXT_STEP autoreset, default arguments: 20 candidates, slates of 5, ``max_steps=50``) and
prints a Markdown table of user-steps per second (median of ``--repeats`` runs).

"loop" is the implementation before the step was vectorised (one ``draw_candidates`` /
``respond`` call per user); it is kept here, and only here, as the baseline. "numpy" is the
current :class:`fedrec.envs.datasets.environments.LoggedInteractionVectorEnv`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from fedrec.envs.datasets.environments import LoggedInteractionVectorEnv
from fedrec.envs.datasets.preprocess import PreparedData
from fedrec.envs.datasets.synthetic import synthetic_log, write_ml100k
from fedrec.envs.slates import validate_slates
from fedrec.envs.vector_utils import reset_mask, with_masks

# ---------------------------------------------------------------------------------------------
# The pre-vectorisation implementation (baseline only)


class _LoopCore:
    """Per-slot state, one Python call per user (the implementation before vectorisation)."""

    def __init__(
        self,
        data: PreparedData,
        *,
        num_envs: int,
        num_candidates: int,
        slate_size: int,
        positives_per_step: int | None,
        split: str,
    ) -> None:
        self.data = data
        self.num_envs = num_envs
        self.num_candidates = num_candidates
        self.slate_size = slate_size
        self.positives_per_step = positives_per_step
        self.split = split
        n_items = data.num_items
        self.users = np.zeros(num_envs, dtype=np.int64)
        self.chrono = np.full((num_envs, n_items), -1, dtype=np.int64)
        self.recommended = np.zeros((num_envs, n_items), dtype=bool)
        self.consumed = np.zeros((num_envs, n_items), dtype=bool)
        self.candidates = np.zeros((num_envs, num_candidates), dtype=np.int64)
        self.last_slate = np.full((num_envs, slate_size), -1, dtype=np.int64)
        self.last_click = np.zeros((num_envs, slate_size), dtype=np.float32)
        self.steps = np.zeros(num_envs, dtype=np.int64)

    def positives_of(self, user: int) -> np.ndarray:
        items = self.data.positives(user)
        return items[:-1] if self.split == "train" else items

    def reset_slot(self, rng: np.random.Generator, slot: int, user: int | None) -> None:
        if user is None:
            user = int(rng.integers(self.data.num_users))
        self.users[slot] = user
        self.chrono[slot] = -1
        positives = self.positives_of(user)
        self.chrono[slot, positives] = np.arange(len(positives))
        self.recommended[slot] = False
        self.consumed[slot] = False
        self.last_slate[slot] = -1
        self.last_click[slot] = 0.0
        self.steps[slot] = 0
        self.draw_candidates(rng, slot)

    def draw_candidates(self, rng: np.random.Generator, slot: int) -> None:
        available = ~self.recommended[slot]
        is_pos = self.chrono[slot] >= 0
        pos = np.flatnonzero(available & is_pos)
        neg = np.flatnonzero(available & ~is_pos)
        c = self.num_candidates
        if self.positives_per_step is None:
            chosen = rng.choice(np.flatnonzero(available), c, replace=False)
        else:
            k = min(self.positives_per_step, len(pos), c)
            k = max(k, c - len(neg))
            chosen = np.concatenate(
                [rng.choice(pos, k, replace=False), rng.choice(neg, c - k, replace=False)]
            )
            chosen = chosen[rng.permutation(c)]
        self.candidates[slot] = chosen

    def exhausted(self, slot: int) -> bool:
        available = ~self.recommended[slot]
        positives_left = bool((available & (self.chrono[slot] >= 0)).any())
        return not positives_left or int(available.sum()) < self.num_candidates

    def respond(self, slot: int, slate: np.ndarray) -> tuple[int, int]:
        items = self.candidates[slot, slate]
        ranks = self.chrono[slot, items]
        eligible = (ranks >= 0) & ~self.consumed[slot, items]
        self.recommended[slot, items] = True
        self.last_slate[slot] = items
        self.last_click[slot] = 0.0
        if not eligible.any():
            return -1, -1
        choice = int(np.argmin(np.where(eligible, ranks, np.iinfo(np.int64).max)))
        self.consumed[slot, items[choice]] = True
        self.last_click[slot, choice] = 1.0
        return choice, int(items[choice])

    def observation(self) -> dict[str, np.ndarray]:
        d = self.data
        obs = {
            "user_id": self.users[:, None].copy(),
            "candidate_ids": self.candidates.copy(),
            "last_slate": self.last_slate.copy(),
            "last_click": self.last_click.copy(),
        }
        if d.user_features is not None:
            obs["user_features"] = d.user_features[self.users]
        if d.item_features is not None:
            obs["candidate_features"] = d.item_features[self.candidates]
        return obs

    def logged(self, slot: int, item: int) -> tuple[float, int]:
        if item < 0:
            return 0.0, -1
        row = self.data.indptr[int(self.users[slot])] + int(self.chrono[slot, item])
        return float(self.data.ratings[row]), int(self.data.timestamps[row])


class LoopInteractionVectorEnv(LoggedInteractionVectorEnv):
    """The interaction vector env as it was before vectorisation (same spaces and semantics)."""

    def __init__(self, num_envs: int, dataset: str, **kwargs: Any) -> None:
        super().__init__(num_envs, dataset, **kwargs)
        new = self.core
        self.core = _LoopCore(  # type: ignore[assignment]
            self.data,
            num_envs=num_envs,
            num_candidates=new.num_candidates,
            slate_size=new.slate_size,
            positives_per_step=new.positives_per_step,
            split=new.split,
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        VectorEnv.reset(self, seed=seed)
        mask = reset_mask(options, self.num_envs, started=self._started)
        for i in np.flatnonzero(mask):
            self.core.reset_slot(self.np_random, i, None)
        self._autoreset[mask] = False
        self._started = True
        return self.core.observation(), {}

    def _loop_step_slots(self, rng: np.random.Generator, slates: np.ndarray, active: np.ndarray):
        core = self.core
        b = core.num_envs
        rewards = np.zeros(b)
        terminated = np.zeros(b, dtype=bool)
        truncated = np.zeros(b, dtype=bool)
        slot_of = np.full(b, -1, dtype=np.int64)
        item_of = np.full(b, -1, dtype=np.int64)
        rating = np.zeros(b)
        stamp = np.full(b, -1, dtype=np.int64)
        left = np.zeros(b, dtype=np.int64)
        for i in np.flatnonzero(active):
            slot, item = core.respond(i, slates[i])
            slot_of[i], item_of[i] = slot, item
            rewards[i] = 1.0 if slot >= 0 else 0.0
            rating[i], stamp[i] = core.logged(i, item)
            core.steps[i] += 1
            terminated[i] = core.exhausted(i)
            if not terminated[i]:
                if self.max_steps is not None and core.steps[i] >= self.max_steps:
                    truncated[i] = True
                core.draw_candidates(rng, i)
            available = ~core.recommended[i]
            left[i] = int((available & (core.chrono[i] >= 0)).sum())
        info = {
            "consumed_slot": slot_of,
            "consumed_item": item_of,
            "logged_timestamp": stamp,
            "positives_left": left,
        }
        if not np.isnan(core.data.ratings).all():
            info["logged_rating"] = rating
        return rewards, terminated, truncated, info

    def step(self, actions: np.ndarray):  # type: ignore[override]
        mode = self.metadata["autoreset_mode"]
        slates = np.array(actions, copy=True)
        resetting = self._autoreset.copy() if mode == AutoresetMode.NEXT_STEP else None
        if resetting is not None and resetting.any():
            slates[resetting] = np.arange(self.core.slate_size)
        slates = validate_slates(
            slates,
            num_candidates=self.core.num_candidates,
            slate_size=self.core.slate_size,
            batch_size=self.num_envs,
            who="slates",
        )
        active = np.ones(self.num_envs, bool) if resetting is None else ~resetting
        if resetting is not None:
            for i in np.flatnonzero(resetting):
                self.core.reset_slot(self.np_random, i, None)
        rewards, terminated, truncated, info = self._loop_step_slots(self.np_random, slates, active)
        info = with_masks(info, self.num_envs)
        if mode == AutoresetMode.NEXT_STEP:
            self._autoreset = terminated | truncated
        return self.core.observation(), rewards, terminated, truncated, info


# ---------------------------------------------------------------------------------------------
# Timing


def write_data(root: Path, seed: int = 0) -> Path:
    """An ML-100K-sized synthetic log (943 users, 1,682 items, ~100K rows) in ML-100K's format."""
    log = synthetic_log(num_users=943, num_items=1682, min_per_user=20, max_per_user=190, seed=seed)
    return write_ml100k(root / "ml-100k", log, seed=seed)


def user_steps_per_second(
    env_class: type, num_envs: int, data_dir: Path, *, user_steps: int, seed: int = 0
) -> float:
    """User-steps per second of ``env_class`` over about ``user_steps`` (random slates)."""
    env = env_class(num_envs, "ml-100k", data_dir=data_dir)
    steps = max(user_steps // num_envs, 10)
    rng = np.random.default_rng(seed)
    n, c = env.core.slate_size, env.core.num_candidates
    slates = np.argsort(rng.random((steps, num_envs, c)), axis=2)[:, :, :n]
    env.reset(seed=seed)
    start = time.perf_counter()
    for t in range(steps):
        env.step(slates[t])
    elapsed = time.perf_counter() - start
    env.close()
    return steps * num_envs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--user-steps", type=int, default=20_000, help="per run and size")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = write_data(Path(tmp))
        probe = LoggedInteractionVectorEnv(1, "ml-100k", data_dir=data_dir)
        d = probe.data
        print(
            f"synthetic ML-100K-sized log: {d.num_users} users, {d.num_items} items, "
            f"{len(d.items):,} positives; median of {args.repeats} runs\n"
        )
        print("| B | loop (user-steps/s) | numpy (user-steps/s) | speed-up |")
        print("|---|---|---|---|")
        classes = (LoopInteractionVectorEnv, LoggedInteractionVectorEnv)
        for b in args.sizes:
            runs: list[list[float]] = [[], []]
            for r in range(args.repeats):  # interleaved, so that load drifts hit both alike
                for runs_of, env_class in zip(runs, classes, strict=True):
                    runs_of.append(
                        user_steps_per_second(
                            env_class, b, data_dir, user_steps=args.user_steps, seed=r
                        )
                    )
            loop, vectorised = (statistics.median(x) for x in runs)
            print(f"| {b} | {loop:,.0f} | {vectorised:,.0f} | {vectorised / loop:.1f}x |")


if __name__ == "__main__":
    main()
