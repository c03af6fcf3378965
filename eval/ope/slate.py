"""Slate off-policy estimators on :class:`LoggedSlates`: standard, independent and
reward-interaction IPS, Cascade-DR and PseudoInverse (with the exact slate enumeration it needs).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
from numpy.typing import ArrayLike

from fedrec.eval.ope.core import (
    MAX_ENUMERATED_SLATES,
    Estimate,
    _array,
    _check_confidence,
    _mean_estimate,
    _probabilities,
    _support,
)

# --------------------------------------------------------------------------------------------
# Slates
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoggedSlates:
    """n logged slates of K slots over A items with per-slot rewards.

    Per row i (context ``x_i``) and slot k:

    * ``slates[i, k]`` -- the item at slot k (distinct within a slate), drawn by the logger μ;
    * ``rewards[i, k]`` -- the reward earned at slot k (e.g. a click); the slate's reward is the
      sum over slots;
    * ``behaviour_slate[i]`` / ``target_slate[i]`` -- ``μ(s_i|x_i)`` / ``π(s_i|x_i)`` of the whole
      logged slate (standard slate IPS);
    * ``behaviour_slot[i, k]`` / ``target_slot[i, k]`` -- the slot marginals
      ``μ(a_k = s_ik | x_i)`` / ``π(a_k = s_ik | x_i)`` (independent IPS);
    * ``behaviour_prefix[i, k]`` / ``target_prefix[i, k]`` -- the probability of the logged
      top-(k+1) prefix, ``μ(a_{1:k+1} = s_{i,1:k+1} | x_i)`` (reward-interaction IPS, cascade DR;
      the last column equals the whole slate's);
    * ``behaviour_marginals`` / ``target_marginals`` (n, K, A) -- the full slot-item marginals,
      optional: when both are given the target's slot-level support is checked against the
      logger's. ``target_marginals`` is also what the pseudoinverse estimator needs.

    Fields an estimator does not need may be None; the estimator that needs one says so.
    """

    slates: np.ndarray
    rewards: np.ndarray
    behaviour_slate: np.ndarray | None = None
    target_slate: np.ndarray | None = None
    behaviour_slot: np.ndarray | None = None
    target_slot: np.ndarray | None = None
    behaviour_prefix: np.ndarray | None = None
    target_prefix: np.ndarray | None = None
    behaviour_marginals: np.ndarray | None = None
    target_marginals: np.ndarray | None = None
    num_items: int | None = None
    contexts: np.ndarray | None = None

    def __post_init__(self) -> None:
        slates = _array("slates", self.slates, (None, None), np.int64)
        n, k = slates.shape
        if n == 0 or k == 0:
            raise ValueError(f"slates must be a non-empty (n, K) array, got {slates.shape}")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("slates", slates)
        set_("rewards", _array("rewards", self.rewards, (n, k)))
        num_items = self.num_items
        for name in ("behaviour_marginals", "target_marginals"):
            value = getattr(self, name)
            if value is not None:
                array = _array(name, value, (n, k, num_items))
                num_items = array.shape[2]
                _probabilities(name, array, logged=False)
                sums = array.sum(axis=2)
                if not np.allclose(sums, 1.0, atol=1e-6):
                    raise ValueError(f"{name}: every slot's marginals must sum to 1")
                set_(name, array)
        if num_items is None:
            num_items = int(slates.max()) + 1
        if np.any(slates < 0) or np.any(slates >= num_items):
            raise ValueError(f"slates must hold item indices in [0, {num_items})")
        ordered = np.sort(slates, axis=1)
        if k > 1 and np.any(ordered[:, 1:] == ordered[:, :-1]):
            row = int(np.argwhere(np.any(ordered[:, 1:] == ordered[:, :-1], axis=1))[0, 0])
            raise ValueError(f"slates must hold distinct items; row {row} repeats one")
        set_("num_items", int(num_items))
        shapes = {"_slate": (n,), "_slot": (n, k), "_prefix": (n, k)}
        for suffix, shape in shapes.items():
            for role in ("behaviour", "target"):
                name = role + suffix
                value = getattr(self, name)
                if value is None:
                    continue
                array = _array(name, value, shape)
                _probabilities(name, array, logged=role == "behaviour")
                set_(name, array)
        for role in ("behaviour", "target"):
            prefix = getattr(self, role + "_prefix")
            if prefix is not None and np.any(np.diff(prefix, axis=1) > 1e-12):
                raise ValueError(f"{role}_prefix must not increase along the slate")
        if self.behaviour_marginals is not None and self.target_marginals is not None:
            _support(
                "behaviour_marginals", self.behaviour_marginals,
                "target_marginals", self.target_marginals,
            )  # fmt: skip
        if self.contexts is not None and len(self.contexts) != n:
            raise ValueError(f"contexts must have {n} rows, got {len(self.contexts)}")

    @property
    def n(self) -> int:
        return self.slates.shape[0]

    @property
    def slate_size(self) -> int:
        return self.slates.shape[1]

    def _need(self, estimator: str, *fields: str) -> list[np.ndarray]:
        missing = [f for f in fields if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{estimator} needs {', '.join(missing)} (missing from the data)")
        return [getattr(self, f) for f in fields]


def slate_ips(data: LoggedSlates, *, confidence: float = 0.95) -> Estimate:
    """Standard slate IPS: ``V̂ = 1/n Σ_i π(s_i|x_i)/μ(s_i|x_i) · Σ_k r_ik``.

    Unbiased for any reward structure when ``μ(s|x) > 0`` wherever ``π(s|x) > 0``; its variance
    grows with the number of slates (exponential in K).
    """
    _check_confidence(confidence)
    mu, pi = data._need("slate IPS", "behaviour_slate", "target_slate")
    return _mean_estimate("slate IPS", pi / mu * data.rewards.sum(axis=1), confidence)


def independent_ips(data: LoggedSlates, *, confidence: float = 0.95) -> Estimate:
    """Independent IPS (IIPS): ``V̂ = 1/n Σ_i Σ_k π(a_k=s_ik|x_i)/μ(a_k=s_ik|x_i) · r_ik``.

    Assumes the reward is a sum of per-slot terms, each depending only on that slot's item
    (``E[r_k | x, s] = q_k(x, s_k)``). Biased when slots interact (e.g. a cascade, where a click
    above suppresses the ones below).
    """
    _check_confidence(confidence)
    mu, pi = data._need("independent IPS", "behaviour_slot", "target_slot")
    return _mean_estimate("IIPS", np.sum(pi / mu * data.rewards, axis=1), confidence)


def reward_interaction_ips(data: LoggedSlates, *, confidence: float = 0.95) -> Estimate:
    """Reward-interaction IPS (RIPS, Kiyohara et al. 2022):
    ``V̂ = 1/n Σ_i Σ_k π(s_{i,1:k}|x_i)/μ(s_{i,1:k}|x_i) · r_ik``.

    Assumes the cascade: the reward at slot k depends only on the items at slots 1..k
    (``E[r_k | x, s] = q_k(x, s_{1:k})``). Unbiased then; between IIPS and slate IPS in variance.
    """
    _check_confidence(confidence)
    mu, pi = data._need("RIPS", "behaviour_prefix", "target_prefix")
    return _mean_estimate("RIPS", np.sum(pi / mu * data.rewards, axis=1), confidence)


def cascade_doubly_robust(
    data: LoggedSlates,
    q_hat: ArrayLike,
    q_hat_target: ArrayLike,
    *,
    confidence: float = 0.95,
) -> Estimate:
    """Cascade-DR (Kiyohara et al., WSDM 2022):
    ``V̂ = 1/n Σ_i Σ_k [w_{i,1:k} (r_ik − Q̂_k(x_i, s_{i,1:k})) + w_{i,1:k−1} V̂_k(x_i, s_{i,1:k−1})]``.

    ``w_{i,1:k}`` is the prefix weight ``π(s_{1:k}|x)/μ(s_{1:k}|x)`` (``w_{1:0} = 1``);
    ``q_hat[i, k] = Q̂_k(x_i, s_{i,1:k})`` estimates the reward from slot k down,
    ``E[Σ_{l≥k} r_l | x, s_{1:k}]``, and ``q_hat_target[i, k] = V̂_k =
    E_{a ~ π(·|x_i, s_{i,1:k−1})} Q̂_k(x_i, s_{i,1:k−1}, a)`` is its expectation under the
    target's choice at slot k given the logged items above. Under the cascade assumption it is
    unbiased for any ``Q̂`` (and the variance shrinks as ``Q̂`` improves); with a perfect ``Q̂``
    only the first slot's term is random.
    """
    _check_confidence(confidence)
    mu, pi = data._need("Cascade-DR", "behaviour_prefix", "target_prefix")
    n, k = data.slates.shape
    q = _array("q_hat", q_hat, (n, k))
    v = _array("q_hat_target", q_hat_target, (n, k))
    weights = pi / mu
    previous = np.concatenate([np.ones((n, 1)), weights[:, :-1]], axis=1)
    terms = np.sum(weights * (data.rewards - q) + previous * v, axis=1)
    return _mean_estimate("Cascade-DR", terms, confidence)


def enumerate_slates(num_items: int, slate_size: int) -> np.ndarray:
    """All ordered slates of ``slate_size`` distinct items out of ``num_items``: (S, K) int64."""
    if not 1 <= slate_size <= num_items:
        raise ValueError(f"need 1 <= slate_size <= num_items, got {slate_size}, {num_items}")
    count = math.perm(num_items, slate_size)
    if count > MAX_ENUMERATED_SLATES:
        raise ValueError(
            f"{count:,} ordered slates of {slate_size} out of {num_items} items: more than "
            f"{MAX_ENUMERATED_SLATES:,}, too many to enumerate exactly"
        )
    return np.array(list(itertools.permutations(range(num_items), slate_size)), dtype=np.int64)


def plackett_luce_slate_probabilities(weights: ArrayLike, slates: ArrayLike) -> np.ndarray:
    """``P(s | weights)`` of slates drawn by sampling without replacement proportionally to
    ``weights`` (Plackett–Luce): slot 1 ∝ w, slot 2 ∝ w over the items left, and so on.

    ``weights`` (n, A) non-negative with a positive sum per row; ``slates`` (S, K). Returns
    (n, S). Prefix probabilities are the same with ``slates[:, :k]``.
    """
    w = _array("weights", weights, (None, None))
    if np.any(w < 0):
        raise ValueError("weights must be non-negative")
    s = _array("slates", slates, (None, None), np.int64)
    total = w.sum(axis=1, keepdims=True)
    if np.any(total <= 0):
        raise ValueError("every row of weights needs a positive sum")
    probability = np.ones((w.shape[0], s.shape[0]))
    left = np.broadcast_to(total, probability.shape).copy()
    for slot in range(s.shape[1]):
        chosen = w[:, s[:, slot]]
        with np.errstate(divide="ignore", invalid="ignore"):
            probability *= np.where(left > 0, chosen / np.where(left > 0, left, 1), 0.0)
        left = left - chosen
    return probability


def slot_marginals(slates: np.ndarray, probabilities: np.ndarray, num_items: int) -> np.ndarray:
    """Slot-item marginals ``P(a_k = j)`` (n, K, A) of slate distributions (n, S) over
    ``slates`` (S, K)."""
    n = probabilities.shape[0]
    size = slates.shape[1]
    marginals = np.zeros((n, size, num_items))
    for slot in range(size):
        for item in range(num_items):
            marginals[:, slot, item] = probabilities[:, slates[:, slot] == item].sum(axis=1)
    return marginals


def _indicator(slates: np.ndarray, num_items: int) -> np.ndarray:
    """One-hot slot-item indicators 1_s ∈ {0,1}^{K·A} of (S, K) slates: (S, K·A)."""
    count, size = slates.shape
    indicator = np.zeros((count, size * num_items))
    indicator[np.arange(count)[:, None], np.arange(size) * num_items + slates] = 1.0
    return indicator


def _uniform_gamma(num_items: int, size: int) -> np.ndarray:
    """Closed form of ``Γ = E[1_s 1_s^T]`` for uniformly random slates without replacement.

    ``P(a_k=j) = 1/A``; ``P(a_k=j, a_l=j') = 1/(A(A−1))`` for k ≠ l, j ≠ j'; 0 for k ≠ l, j = j'
    and for k = l, j ≠ j'.
    """
    a = num_items
    slot_same = np.eye(size)
    item_same = np.eye(a)
    pair = 1.0 / (a * (a - 1)) if a > 1 else 0.0
    gamma = np.kron(1 - slot_same, (1 - item_same) * pair) + np.kron(slot_same, item_same / a)
    return gamma


def pseudoinverse(
    data: LoggedSlates,
    *,
    logger: str = "uniform",
    logger_weights: ArrayLike | None = None,
    confidence: float = 0.95,
) -> Estimate:
    """PseudoInverse estimator (Swaminathan et al., NeurIPS 2017):
    ``V̂ = 1/n Σ_i (Σ_k r_ik) · q_π(x_i)^T Γ_μ(x_i)^† 1_{s_i}``.

    ``1_s`` ∈ {0,1}^{K·A} marks the (slot, item) pairs of slate s, ``q_π(x) = E_π[1_s | x]`` the
    target's slot-item marginals (``data.target_marginals``) and ``Γ_μ(x) = E_μ[1_s 1_s^T | x]``
    the logger's pairwise marginals; ``†`` is the Moore–Penrose pseudoinverse.

    Assumes an additive slate reward, ``E[Σ_k r_k | x, s] = Σ_k φ_x(k, s_k)``, and that ``q_π``
    lies in the span of the logger's indicators; then it is unbiased. Biased when the slots
    interact. Supported loggers:

    * ``logger="uniform"`` -- uniformly random slates without replacement (closed-form ``Γ``);
    * ``logger="plackett_luce"`` -- sampling without replacement with per-context item weights
      ``logger_weights`` (n, A): ``Γ`` computed exactly by enumerating the ordered slates (up to
      :data:`MAX_ENUMERATED_SLATES`), once per distinct weight row.
    """
    _check_confidence(confidence)
    (q_pi,) = data._need("pseudoinverse", "target_marginals")
    n, size = data.slates.shape
    a = data.num_items
    indicator = _indicator(data.slates, a)  # (n, K·A)
    q = q_pi.reshape(n, size * a)
    if logger == "uniform":
        if logger_weights is not None:
            raise ValueError("logger_weights is only for logger='plackett_luce'")
        behaviour = np.full((n, size, a), 1.0 / a)
        _support("uniform logger marginals", behaviour, "target_marginals", q_pi)
        projected = q @ np.linalg.pinv(_uniform_gamma(a, size))  # (n, K·A)
    elif logger == "plackett_luce":
        w = _array("logger_weights", logger_weights, (n, a))
        if np.any(w < 0) or np.any(w.sum(axis=1) <= 0):
            raise ValueError("logger_weights must be non-negative with a positive sum per row")
        all_slates = enumerate_slates(a, size)
        onehots = _indicator(all_slates, a)
        unique, inverse = np.unique(w, axis=0, return_inverse=True)
        probability = plackett_luce_slate_probabilities(unique, all_slates)  # (U, S)
        marginals = slot_marginals(all_slates, probability, a)[inverse.reshape(-1)]
        _support("logger marginals", marginals, "target_marginals", q_pi)
        pinvs = np.stack(
            [np.linalg.pinv(onehots.T @ (onehots * row[:, None])) for row in probability]
        )
        projected = np.einsum("nd,nde->ne", q, pinvs[inverse.reshape(-1)])
    else:
        raise ValueError(f"logger must be 'uniform' or 'plackett_luce', got {logger!r}")
    weights = np.sum(projected * indicator, axis=1)
    return _mean_estimate("PseudoInverse", weights * data.rewards.sum(axis=1), confidence)
