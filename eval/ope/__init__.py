"""Off-policy evaluation: estimate a target policy's value from data logged by another policy.

Three input formats (frozen dataclasses, validated on construction), one per kind of problem:

* :class:`LoggedBandit` -- single-step, one action per context, with the full action
  distributions of the logger (behaviour) and the target: :func:`ips`, :func:`snips`,
  :func:`direct_method`, :func:`doubly_robust`, :func:`self_normalized_doubly_robust`,
  :func:`switch_doubly_robust`.
* :class:`LoggedSlates` -- single-step slates of ``K`` slots with per-slot rewards and the
  propensities of the logged slate (whole slate, per slot, per prefix):
  :func:`slate_ips` (standard), :func:`independent_ips`, :func:`reward_interaction_ips`,
  :func:`pseudoinverse` and :func:`cascade_doubly_robust`.
* :class:`LoggedEpisodes` -- trajectories of ``T`` steps with per-step propensities of the logged
  action: :func:`per_decision_is`, :func:`weighted_doubly_robust` and
  :func:`marginalized_is` (with a known state-distribution ratio).

Every estimator returns an :class:`Estimate`: the value, its standard error and a two-sided
confidence interval (Student t with ``n - 1`` degrees of freedom, :func:`fedrec.eval.stats.mean_ci`
for the estimators that are a plain mean of per-sample terms; the delta method for the
self-normalised ones).

**Validation.** Wrong shapes, non-finite values, propensities outside ``[0, 1]``, a logged action
whose behaviour propensity is 0 (the logger could not have produced it), and a target policy that
puts probability where the logger puts none (when the full distributions are given) raise a
:class:`ValueError` that names the field and the first bad row. No estimator returns NaN silently:
an estimator that cannot be computed (e.g. every self-normalisation weight is 0) raises too.

* :func:`replay` -- Li et al.'s replay evaluator (WSDM 2011) on uniformly logged slates
  (:class:`LoggedSlates` with uniform propensities), whole-slate or per-position matching.

What each estimator assumes and where it fails is in ``docs/ope.md`` (replay and cross-platform
estimation: ``docs/ope_platforms.md``). Modules: ``core`` (:class:`Estimate`, input checks),
``bandit``, ``slate``, ``sequential``, ``replay``; every name is importable from
``fedrec.eval.ope``. ``fedrec.eval.ope.cross_platform`` (imported on its own: it runs the
two-platform env) estimates a policy's value on a platform without feedback.
"""

from __future__ import annotations

from fedrec.eval.ope.bandit import (
    LoggedBandit,
    direct_method,
    doubly_robust,
    ips,
    self_normalized_doubly_robust,
    snips,
    switch_doubly_robust,
)
from fedrec.eval.ope.core import MAX_ENUMERATED_SLATES, Estimate
from fedrec.eval.ope.replay import ReplayEstimate, replay
from fedrec.eval.ope.sequential import (
    LoggedEpisodes,
    marginalized_is,
    per_decision_is,
    weighted_doubly_robust,
)
from fedrec.eval.ope.slate import (
    LoggedSlates,
    cascade_doubly_robust,
    enumerate_slates,
    independent_ips,
    plackett_luce_slate_probabilities,
    pseudoinverse,
    reward_interaction_ips,
    slate_ips,
    slot_marginals,
)

__all__ = [
    "MAX_ENUMERATED_SLATES",
    "Estimate",
    "LoggedBandit",
    "LoggedEpisodes",
    "LoggedSlates",
    "ReplayEstimate",
    "cascade_doubly_robust",
    "direct_method",
    "doubly_robust",
    "enumerate_slates",
    "independent_ips",
    "ips",
    "marginalized_is",
    "per_decision_is",
    "plackett_luce_slate_probabilities",
    "pseudoinverse",
    "replay",
    "reward_interaction_ips",
    "self_normalized_doubly_robust",
    "slate_ips",
    "slot_marginals",
    "snips",
    "switch_doubly_robust",
    "weighted_doubly_robust",
]
