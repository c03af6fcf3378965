"""Choc-vs-Kale user, document and choice model: parameters and the batched equations.

Every Choc-vs-Kale environment (single, vector, multi-platform) draws its randomness and applies
its dynamics through this module, so there is exactly one implementation of the equations of
``docs/choc_kale.md``. All functions work on arrays with a leading batch axis of users.

Notation follows docs/choc_kale.md ("Three descriptions"). Each document has one feature ``x`` in [0, 1] (the library's
``clickbait_score``, the FedSlate code's ``kaleness``). Its *choc-ness* ``c`` drives engagement
and exposure: ``c = x`` under the code semantics (RecSim library and FedSlate code, the default),
``c = 1 - x`` under the prose semantics of the RecSim tutorial and the FedSlate paper, where ``x``
is kaleness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

ChoiceModelName = Literal["first_slot", "mnl"]
Semantics = Literal["code", "prose"]


@dataclass(frozen=True, kw_only=True)
class ChocKaleParams:
    """All parameters of a Choc-vs-Kale simulation (one source of truth for every env class)."""

    num_candidates: int = 10
    """N, candidate documents offered at every step (a fresh draw each step)."""
    slate_size: int = 3
    """n, distinct candidates the agent recommends per step."""
    choice_model: ChoiceModelName = "first_slot"
    """'first_slot': the RecSim library always consumes slot 0; 'mnl': multinomial logit."""
    choice_intercept: float = 1.0
    """MNL logit of a document is ``choice_intercept - x`` (the tutorial's ``1 - kaleness``)."""
    no_click_logit: float | None = None
    """MNL logit of the null item (no consumption); None means a click always happens."""
    semantics: Semantics = "code"
    """'code': c = x (library/FedSlate code); 'prose': c = 1 - x (tutorial prose, x = kaleness)."""
    memory_discount: float = 0.7
    """beta, how much of the net exposure survives a step."""
    sensitivity: float = 0.01
    """tau, slope of satisfaction = sigmoid(tau * exposure)."""
    user_sensitivities: tuple[float, ...] | None = None
    """Hidden user types: each user's tau is drawn uniformly from these values at the start of
    every episode (it then replaces ``sensitivity``); None: every user has ``sensitivity``."""
    innovation_stddev: float = 0.05
    """eta, standard deviation of the exposure noise."""
    choc_mean: float = 5.0
    """mu_c, log-engagement location of a pure choc document (times satisfaction)."""
    choc_stddev: float = 1.0
    """sigma_c, log-engagement scale of a pure choc document."""
    kale_mean: float = 4.0
    """mu_k, log-engagement location of a pure kale document (times satisfaction)."""
    kale_stddev: float = 1.0
    """sigma_k, log-engagement scale of a pure kale document."""
    time_budget: int = 60
    """Steps (consumptions) per episode, shared by all platforms of a multi-platform env."""
    satisfaction_noise_stddev: float | None = None
    """Std of the truncated-normal noise on the observed satisfaction; None: not observed."""
    history_length: int = 1
    """How many past responses (per slot clicks and engagements) the observation carries."""
    engagement_clip: float | None = 100.0
    """Upper clip of the *observed* engagement (the reward is never clipped); None: no clip."""

    def __post_init__(self) -> None:
        _check_int("num_candidates", self.num_candidates, minimum=1)
        _check_int("slate_size", self.slate_size, minimum=1)
        if self.slate_size > self.num_candidates:
            raise ValueError(
                f"slate_size={self.slate_size} exceeds num_candidates={self.num_candidates}: "
                "a slate lists distinct candidates"
            )
        if self.choice_model not in ("first_slot", "mnl"):
            raise ValueError(
                f"choice_model must be 'first_slot' or 'mnl', got {self.choice_model!r}"
            )
        if self.semantics not in ("code", "prose"):
            raise ValueError(f"semantics must be 'code' or 'prose', got {self.semantics!r}")
        if self.choice_model == "first_slot" and self.no_click_logit is not None:
            raise ValueError("no_click_logit needs choice_model='mnl' (first_slot always clicks)")
        if not 0.0 <= self.memory_discount < 1.0:
            raise ValueError(f"memory_discount must be in [0, 1), got {self.memory_discount}")
        for name in ("innovation_stddev", "choc_stddev", "kale_stddev"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.user_sensitivities is not None:
            values = self.user_sensitivities
            if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
                raise ValueError(f"user_sensitivities must be a sequence of floats, got {values!r}")
            try:
                values = tuple(float(v) for v in values)
            except (TypeError, ValueError) as error:
                raise ValueError(f"user_sensitivities must hold floats: {error}") from error
            if not values or not all(math.isfinite(v) for v in values):
                raise ValueError(
                    f"user_sensitivities must be a non-empty sequence of finite floats, got {values}"
                )
            # a tuple, so that parameters stay hashable (the planner caches its tables by them)
            object.__setattr__(self, "user_sensitivities", values)
        for name in ("sensitivity", "choc_mean", "kale_mean", "choice_intercept"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
        if self.no_click_logit is not None and not math.isfinite(self.no_click_logit):
            raise ValueError(f"no_click_logit must be finite or None, got {self.no_click_logit}")
        _check_int("time_budget", self.time_budget, minimum=1)
        _check_int("history_length", self.history_length, minimum=1)
        noise = self.satisfaction_noise_stddev
        if noise is not None and not noise >= 0.0:
            raise ValueError(f"satisfaction_noise_stddev must be >= 0 or None, got {noise}")
        clip = self.engagement_clip
        if clip is not None and not clip > 0.0:
            raise ValueError(f"engagement_clip must be > 0 or None, got {clip}")

    @property
    def observes_satisfaction(self) -> bool:
        """Whether observations carry the (noisy) user satisfaction."""
        return self.satisfaction_noise_stddev is not None

    @property
    def heterogeneous(self) -> bool:
        """Whether users differ in a hidden sensitivity (``user_sensitivities``)."""
        return self.user_sensitivities is not None

    @property
    def has_null_item(self) -> bool:
        """Whether the user may consume nothing."""
        return self.no_click_logit is not None


def make_params(kwargs: dict[str, Any]) -> ChocKaleParams:
    """Build validated parameters, turning an unknown keyword into a clear ValueError."""
    known = ChocKaleParams.__dataclass_fields__
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(f"unknown Choc-vs-Kale argument(s) {unknown}; valid: {sorted(known)}")
    return ChocKaleParams(**kwargs)


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


# Truncation of the observation noise, in standard deviations (FedSlate code: +-10 sigma).
NOISE_TRUNCATION = 10.0


class ChocKaleModel:
    """The batched equations of the model; stateless apart from its parameters."""

    def __init__(self, params: ChocKaleParams) -> None:
        self.params = params
        p = params
        # Engagement log-location = (c*mu_c + (1-c)*mu_k) * sat = (loc0 + loc1*c) * sat.
        self._loc0, self._loc1 = p.kale_mean, p.choc_mean - p.kale_mean
        self._scale0, self._scale1 = p.kale_stddev, p.choc_stddev - p.kale_stddev

    # -- features -----------------------------------------------------------------------------
    def chocness(self, x: np.ndarray) -> np.ndarray:
        """c(x): the choc-ness that drives engagement and exposure."""
        return x if self.params.semantics == "code" else 1.0 - x

    def choice_logits(self, x: np.ndarray) -> np.ndarray:
        """MNL logit of documents with feature x (``intercept - x``)."""
        return self.params.choice_intercept - x

    # -- user state ---------------------------------------------------------------------------
    def initial_exposure(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """NPE_0 = (u - 1/2) / (1 - beta), u ~ U(0, 1)."""
        return (rng.random(size) - 0.5) / (1.0 - self.params.memory_discount)

    def satisfaction(
        self, exposure: np.ndarray, sensitivity: np.ndarray | float | None = None
    ) -> np.ndarray:
        """sat = sigmoid(tau * exposure); ``sensitivity``: each user's tau (default: the params')."""
        tau = self.params.sensitivity if sensitivity is None else sensitivity
        return 1.0 / (1.0 + np.exp(-tau * exposure))

    def draw_sensitivities(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Each user's hidden tau, uniform over ``user_sensitivities`` (one uniform per user)."""
        values = np.asarray(self.params.user_sensitivities, dtype=np.float64)
        # floor(u * k) rather than rng.integers: the single env draws the same doubles one by one
        return values[
            np.minimum((rng.random(size) * len(values)).astype(np.int64), len(values) - 1)
        ]

    def next_exposure(
        self, exposure: np.ndarray, chocness: np.ndarray, innovation: np.ndarray
    ) -> np.ndarray:
        """NPE' = beta * NPE - 2 (c - 1/2) + eps (the library's minus sign)."""
        return self.params.memory_discount * exposure - 2.0 * (chocness - 0.5) + innovation

    # -- engagement ---------------------------------------------------------------------------
    def engagement_params(
        self, satisfaction: np.ndarray, chocness: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Location and scale of the log-engagement of a consumed document."""
        loc = (self._loc0 + self._loc1 * chocness) * satisfaction
        scale = self._scale0 + self._scale1 * chocness
        return loc, scale

    def expected_engagement(self, satisfaction: np.ndarray, chocness: np.ndarray) -> np.ndarray:
        """E[engagement] = exp(loc + scale^2 / 2) (log-normal mean)."""
        loc, scale = self.engagement_params(satisfaction, chocness)
        return np.exp(loc + 0.5 * scale * scale)

    # -- choice -------------------------------------------------------------------------------
    def choice_weights(self, slate_x: np.ndarray) -> tuple[np.ndarray, float]:
        """Unnormalised choice weights v_i of the slate's items and v_null (0 without a null item).

        For 'first_slot' the weights put all mass on slot 0.
        """
        p = self.params
        if p.choice_model == "first_slot":
            weights = np.zeros_like(slate_x, dtype=np.float64)
            weights[..., 0] = 1.0
            return weights, 0.0
        weights = np.exp(self.choice_logits(slate_x.astype(np.float64)))
        null = math.exp(p.no_click_logit) if p.no_click_logit is not None else 0.0
        return weights, null

    def sample_choice(self, rng: np.random.Generator, slate_x: np.ndarray) -> np.ndarray:
        """Clicked slot per user, -1 for the null item. Draws one uniform per user for 'mnl'."""
        batch = slate_x.shape[0]
        if self.params.choice_model == "first_slot":
            return np.zeros(batch, dtype=np.int64)
        weights, null = self.choice_weights(slate_x)
        cumulative = np.cumsum(weights, axis=1)
        total = cumulative[:, -1] + null
        threshold = rng.random(batch) * total
        slot = (cumulative <= threshold[:, None]).sum(axis=1)
        slot[slot >= slate_x.shape[1]] = -1  # past every item's mass: the null item
        return slot

    # -- documents and observation noise ------------------------------------------------------
    def sample_documents(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        """A fresh candidate set per user: features ~ U(0, 1), shape (batch, N), float32."""
        return rng.random((batch, self.params.num_candidates), dtype=np.float32)

    def observe_satisfaction(
        self, rng: np.random.Generator, satisfaction: np.ndarray
    ) -> np.ndarray:
        """sat + N(0, sigma^2) truncated at +-10 sigma (fresh draw per observation)."""
        sigma = self.params.satisfaction_noise_stddev or 0.0
        z = rng.standard_normal(satisfaction.shape)
        # Rejection keeps the exact truncated normal; at 10 sigma a redraw has probability 1e-23.
        outside = np.abs(z) > NOISE_TRUNCATION
        while outside.any():
            z[outside] = rng.standard_normal(int(outside.sum()))
            outside = np.abs(z) > NOISE_TRUNCATION
        return satisfaction + sigma * z
