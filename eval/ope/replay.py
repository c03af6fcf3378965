"""The replay evaluator (Li, Chu, Langford & Wang, WSDM 2011) for uniformly logged slates.

Li et al. evaluate a policy on a log of events whose actions were chosen **uniformly at random**:
walk the log, keep an event when the target policy chooses the logged action in the logged
context, discard it otherwise, and average the rewards of the kept events. With a uniform
logger the kept events are distributed as if the target had acted (contexts i.i.d., the logged
action independent of the context), so the estimate is unbiased given at least one kept event;
about 1 event in A is kept for A actions. For slates of K out of N candidates, two variants:

* ``variant="slate"`` (the default): keep an event when the target's **whole ordered slate**
  equals the logged one (1 in N!/(N−K)! events). Assumes nothing on the reward: the value is
  the mean slate reward ``Σ_k r_k`` of the kept events.
* ``variant="position"``: for each slot k, keep the events where the target's item at slot k
  equals the logged one (1 in N), and sum the per-slot means of ``r_k``. Assumes the reward of
  slot k depends only on the context and the item at slot k (additive, no interaction between
  slots); biased otherwise (a cascade, a choice among the slate's items).

The target's slates on the logged contexts are given as an array; a stochastic target is
replayed by drawing its slates with its own generator, independently of the log. The logs must
be uniform: every logged propensity must equal ``(N−K)!/N!`` (per slate) or ``1/N`` (per slot),
checked to a relative 1e-6; missing or non-uniform propensities raise ``ValueError`` (use the
importance-sampling estimators of :mod:`fedrec.eval.ope` for other loggers).

The interval is Student t on the kept events (``variant="slate"``; it is conditional on their
number) or the delta method for the sum of per-slot ratio means (``variant="position"``); both
treat the events as independent. Events of one user's episode are not (a sequential env's log):
pass ``groups`` (n,), e.g. the episode of each event, and the standard error is the delta
method's over groups (cluster-robust, Student t with G − 1 degrees of freedom).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from numpy.typing import ArrayLike

from fedrec.eval.ope.core import Estimate, _array, _check_confidence, _mean_estimate
from fedrec.eval.ope.slate import LoggedSlates
from fedrec.eval.stats import t_quantile

__all__ = ["ReplayEstimate", "replay"]

#: Relative tolerance of the uniformity check on the logged propensities.
UNIFORM_RTOL = 1e-6


@dataclasses.dataclass(frozen=True)
class ReplayEstimate(Estimate):
    """An :class:`Estimate` (``n`` = accepted events) with the replay's bookkeeping."""

    logged: int = 0
    """Number of logged events offered to the replay"""
    accepted_per_slot: tuple[int, ...] = ()
    """``variant="position"``: events kept at each slot (``()`` for the slate variant)"""
    variant: str = "slate"

    @property
    def accepted(self) -> int:
        """Events kept (slate variant: whole-slate matches; position: a match at any slot)."""
        return self.n

    def __str__(self) -> str:
        return f"{super().__str__()} ({self.accepted} of {self.logged} events accepted)"


def _check_uniform(name: str, values: np.ndarray | None, expected: float, hint: str) -> None:
    if values is None:
        raise ValueError(
            f"replay needs the logging propensities ({name}) to check that the log is uniform; "
            "the log has none (e.g. the Taobao impressions or any log without a known logger). "
            "Replay is only valid on uniformly logged events"
        )
    bad = ~np.isclose(values, expected, rtol=UNIFORM_RTOL, atol=0.0)
    if np.any(bad):
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"replay needs uniformly logged slates: {name}{list(index)} = {values[index]:.6g}, "
            f"but a uniform logger gives {expected:.6g} ({hint}). Use the importance-sampling "
            "estimators (fedrec.eval.ope.slate_ips, ...) for other loggers"
        )


def replay(
    data: LoggedSlates,
    target_slates: ArrayLike,
    *,
    num_candidates: int,
    variant: str = "slate",
    groups: ArrayLike | None = None,
    confidence: float = 0.95,
) -> ReplayEstimate:
    """Li et al.'s replay estimate of the target's expected slate reward per event.

    ``data.slates`` (n, K) are the logged slates (indices into each event's ``num_candidates``
    candidates), ``data.rewards`` (n, K) their per-slot rewards and ``data.behaviour_slate``
    (slate variant) or ``data.behaviour_slot`` (position variant) the logging propensities,
    which must be uniform. ``target_slates`` (n, K) is the target's slate at each logged
    context; ``groups`` (n,) optional ids of the independent units (episodes, users). Raises
    ``ValueError`` for non-uniform or missing propensities, slates outside
    ``[0, num_candidates)``, an unknown variant, or no accepted event.
    """
    _check_confidence(confidence)
    if isinstance(num_candidates, bool) or not isinstance(num_candidates, (int, np.integer)):
        raise ValueError(f"num_candidates must be an integer, got {num_candidates!r}")
    n, size = data.slates.shape
    if not 1 <= size <= num_candidates:
        raise ValueError(f"slates of {size} need 1 <= K <= num_candidates, got {num_candidates}")
    if data.slates.max() >= num_candidates:
        raise ValueError(f"logged slates must hold indices in [0, {num_candidates})")
    target = _array("target_slates", target_slates, (n, size), np.int64)
    if np.any((target < 0) | (target >= num_candidates)):
        raise ValueError(f"target_slates must hold indices in [0, {num_candidates})")
    if groups is not None:
        groups = _array("groups", groups, (n,), np.int64)
    if variant == "slate":
        count = math.perm(num_candidates, size)
        _check_uniform(
            "behaviour_slate", data.behaviour_slate, 1.0 / count,
            f"1 / {count:,} ordered slates of {size} out of {num_candidates}",
        )  # fmt: skip
        accepted = np.all(target == data.slates, axis=1)
        kept = int(accepted.sum())
        if kept == 0:
            raise ValueError(
                f"replay: none of the {n} logged slates matches the target's (expected about "
                f"{n / count:.2g}); log more events or use variant='position'"
            )
        if groups is None:
            base = _mean_estimate("replay", data.rewards[accepted].sum(axis=1), confidence)
            return ReplayEstimate(**dataclasses.asdict(base), logged=n, variant="slate")
        value = float(data.rewards[accepted].sum(axis=1).mean())
        influence = accepted * (data.rewards.sum(axis=1) - value) * (n / kept)
        se, half = _clustered(influence, groups, confidence)
        return ReplayEstimate(
            "replay", value, se, value - half, value + half, kept, confidence,
            logged=n, variant="slate",
        )  # fmt: skip
    if variant != "position":
        raise ValueError(f"variant must be 'slate' or 'position', got {variant!r}")
    _check_uniform(
        "behaviour_slot", data.behaviour_slot, 1.0 / num_candidates,
        f"1 / {num_candidates} candidates per slot",
    )  # fmt: skip
    match = (target == data.slates).astype(np.float64)  # (n, K)
    per_slot = match.sum(axis=0)
    if np.any(per_slot == 0):
        slot = int(np.argmax(per_slot == 0))
        raise ValueError(f"replay (position): no logged event matches the target at slot {slot}")
    means = (match * data.rewards).sum(axis=0) / per_slot
    value = float(means.sum())
    # Delta method: V = Σ_k S_k / M_k with S_k, M_k means over events; influence of event i.
    influence = np.sum(match * (data.rewards - means) / (per_slot / n), axis=1)
    if groups is not None:
        se, half = _clustered(influence, groups, confidence)
    elif n > 1:
        se = float(np.std(influence, ddof=1) / math.sqrt(n))
        half = t_quantile(confidence, n - 1) * se
    else:
        se = half = math.nan
    kept = int(np.any(match > 0, axis=1).sum())
    return ReplayEstimate(
        "replay (per position)", value, se, value - half, value + half, kept, confidence,
        logged=n, accepted_per_slot=tuple(int(c) for c in per_slot), variant="position",
    )  # fmt: skip


def _clustered(influence: np.ndarray, groups: np.ndarray, confidence: float) -> tuple[float, float]:
    """Standard error and t half-width of a mean of per-event influences summed within groups."""
    _, index = np.unique(groups, return_inverse=True)
    sums = np.bincount(index, weights=influence)
    count = len(sums)
    if count < 2:
        return math.nan, math.nan
    se = float(math.sqrt(count / (count - 1) * np.sum(sums**2)) / len(influence))
    return se, t_quantile(confidence, count - 1) * se
