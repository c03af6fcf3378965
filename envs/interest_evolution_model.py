"""RecSim's interest-evolution user, document and choice model: parameters and batched equations.

Every interest-evolution environment (single and vector) simulates its users through
:class:`InterestEvolutionSimulator`, so the equations of ``docs/interest_evolution.md`` have one
implementation. The defaults are those of RecSim's ``interest_evolution.create_environment`` (the
``IEvUserModel`` with ``UtilityModelUserSampler`` users, ``UtilityModelVideoSampler`` videos and
the ``MultinomialProportionalChoiceModel``), which RLlib's ``InterestEvolutionRecSimEnv`` and its
tuned SlateQ examples use with ``num_candidates=10, slate_size=2, resample_documents=True``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fedrec.envs.state import StateReader

ChoiceModel = Literal["proportional", "mnl"]

#: The user's hidden state and the candidates' hidden quality: the keys of
#: :meth:`InterestEvolutionSimulator.oracle_state`, declared hidden by every interest-evolution env.
HIDDEN_STATE_KEYS = frozenset({"budget_left", "candidate_quality"})


def _check_int(name: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class InterestEvolutionParams:
    """All parameters of an interest-evolution simulation (RecSim's names in the comments)."""

    num_candidates: int = 10
    """N, videos offered at every step (a fresh draw each step: ``resample_documents=True``)."""
    slate_size: int = 2
    """n, distinct candidates recommended per step."""
    num_topics: int = 20
    """K, topics (clusters); ``IEvVideo.NUM_FEATURES`` = ``IEvUserState.NUM_FEATURES``."""
    time_budget: float = 200.0
    """Minutes of the session (``time_budget``)."""
    video_length: float = 4.0
    """Length of every video in minutes (``UtilityModelVideoSampler.video_length``)."""
    min_utility: float = -3.0
    """Mean quality of topic 0, the trashiest (``min_utility``)."""
    max_utility: float = 3.0
    """Mean quality of topic K-1, the most nutritious (``max_utility``)."""
    quality_stddev: float = 0.1
    """Standard deviation of a video's quality around its topic mean (RecSim's ``quality_variance``,
    used as a standard deviation)."""
    choice_model: ChoiceModel = "proportional"
    """'proportional': ``MultinomialProportionalChoiceModel`` (RecSim's and RLlib's choice);
    'mnl': ``MultinomialLogitChoiceModel`` (softmax over the affinities and ``no_click_mass``)."""
    no_click_mass: float = 1.0
    """Score of the no-click option (``no_click_mass``)."""
    min_normalizer: float = -1.0
    """Offset subtracted from every score of the proportional model (``min_normalizer``)."""
    step_penalty: float = 0.5
    """Minutes lost by a step without a click (``step_penalty``)."""
    user_update_alpha: float = 0.9 / 3.4
    """Budget change per watched minute and unit of utility (``user_update_alpha``)."""
    user_quality_factor: float = 0.0
    """Weight of the choice model's score of the watched video in the utility."""
    document_quality_factor: float = 1.0
    """Weight of the watched video's quality in the utility."""
    alpha_x_intercept: float = 1.0
    """Interest step size alpha(x) = y0 - (y0 / x0) |x| (``alpha_x_intercept`` x0)."""
    alpha_y_intercept: float = 0.3
    """(``alpha_y_intercept`` y0)."""

    def __post_init__(self) -> None:
        _check_int("num_candidates", self.num_candidates, minimum=1)
        _check_int("slate_size", self.slate_size, minimum=1)
        _check_int("num_topics", self.num_topics, minimum=2)
        if self.slate_size > self.num_candidates:
            raise ValueError(
                f"slate_size={self.slate_size} exceeds num_candidates={self.num_candidates}: "
                "a slate lists distinct candidates"
            )
        if self.choice_model not in ("proportional", "mnl"):
            raise ValueError(
                f"choice_model must be 'proportional' or 'mnl', got {self.choice_model!r}"
            )
        for name in (
            "time_budget", "video_length", "min_utility", "max_utility", "quality_stddev",
            "no_click_mass", "min_normalizer", "step_penalty", "user_update_alpha",
            "user_quality_factor", "document_quality_factor", "alpha_x_intercept",
            "alpha_y_intercept",
        ):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float | np.number):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
        for name in ("time_budget", "video_length"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.quality_stddev < 0.0 or self.step_penalty < 0.0:
            raise ValueError("quality_stddev and step_penalty must be >= 0")
        if self.alpha_x_intercept == 0.0:
            raise ValueError("alpha_x_intercept must be nonzero")
        if self.choice_model == "proportional" and not (
            self.min_normalizer <= -1.0 and self.no_click_mass >= self.min_normalizer
        ):
            # affinities lie in [-1, 1]; RecSim asserts every normalized score is >= 0
            raise ValueError(
                "the proportional choice model needs min_normalizer <= -1 and "
                f"no_click_mass >= min_normalizer, got {self.min_normalizer}, {self.no_click_mass}"
            )

    def topic_quality_means(self) -> np.ndarray:
        """Mean quality of each topic: RecSim's ``cluster_means``, linear from ``min_utility`` to
        0 over the first ``int(0.7 K)`` topics (trashy) and from 0 to ``max_utility`` over the
        rest (nutritious). With K = 20: 14 and 6 topics (0 appears twice)."""
        trashy = int(self.num_topics * 0.7)
        return np.concatenate(
            (
                np.linspace(self.min_utility, 0.0, trashy),
                np.linspace(0.0, self.max_utility, self.num_topics - trashy),
            )
        )


def make_params(kwargs: dict[str, Any]) -> InterestEvolutionParams:
    """Validated parameters; an unknown keyword is a ValueError that lists the valid ones."""
    known = InterestEvolutionParams.__dataclass_fields__
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ValueError(
            f"unknown interest-evolution argument(s) {unknown}; valid: {sorted(known)}"
        )
    return InterestEvolutionParams(**kwargs)


@dataclass(frozen=True)
class StepOutcome:
    """What happened in one step (arrays of shape (B,))."""

    clicked_slot: np.ndarray
    """Slot of the watched video, -1 for no click or an inactive user."""
    watch_time: np.ndarray
    """Minutes watched (the reward); 0 without a click."""
    stepped: np.ndarray
    """Which users stepped (active and with budget left)."""


class InterestEvolutionSimulator:
    """B interest-evolution users, all updated with whole-array NumPy operations.

    Per user: interests (K,) in [-1, 1] (observed, as in RecSim), the remaining time budget
    (hidden), the N candidates' topics and qualities (the quality is hidden until the video is
    shown), and the response to the last slate.

    Random draws, in this order (the single env draws the same numbers for one user):

    - reset of m users: interests ``uniform(-1, 1, (m, K))``, then the candidates;
    - candidates of m users: topics ``integers(0, K, (m, N))``, then ``standard_normal((m, N))``
      for the quality;
    - step of m active users: ``random((m, 2))`` (column 0 picks the choice, column 1 the
      direction of the interest update), then their next candidates.
    """

    def __init__(self, params: InterestEvolutionParams, *, num_users: int) -> None:
        if num_users < 1:
            raise ValueError(f"num_users must be >= 1, got {num_users}")
        self.params = params
        self.num_users = num_users
        b, n, k, s = num_users, params.num_candidates, params.num_topics, params.slate_size
        self.topic_means = params.topic_quality_means()
        self.interests = np.zeros((b, k))
        self.budget = np.zeros(b)
        self.topics = np.zeros((b, n), dtype=np.int64)
        self.quality = np.zeros((b, n))
        self.response_click = np.zeros((b, s), dtype=np.float32)
        self.response_watch_time = np.zeros((b, s), dtype=np.float32)
        self.response_quality = np.zeros((b, s), dtype=np.float32)
        self._rows = np.arange(b)

    # ----------------------------------------------------------------------------------------
    # Sampling

    def _sample_documents(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, ...]:
        p = self.params
        topics = rng.integers(0, p.num_topics, (count, p.num_candidates))
        quality = self.topic_means[topics] + p.quality_stddev * rng.standard_normal(
            (count, p.num_candidates)
        )
        return topics, quality

    def reset(self, rng: np.random.Generator, mask: np.ndarray | None = None) -> None:
        """Start new sessions for the users in ``mask`` (all when None)."""
        users: Any = slice(None) if mask is None else mask
        count = self.num_users if mask is None else int(mask.sum())
        if count == 0:
            return
        p = self.params
        self.interests[users] = rng.uniform(-1.0, 1.0, (count, p.num_topics))
        self.budget[users] = p.time_budget
        self.topics[users], self.quality[users] = self._sample_documents(rng, count)
        for response in (self.response_click, self.response_watch_time, self.response_quality):
            response[users] = 0.0

    # ----------------------------------------------------------------------------------------
    # The user model

    def choice_weights(self, affinity: np.ndarray) -> np.ndarray:
        """Unnormalized choice weights (..., n + 1) of the slate's videos and, last, no click,
        from the user's affinities (..., n) with the slate's videos (RecSim's order)."""
        p = self.params
        null = np.full((*affinity.shape[:-1], 1), p.no_click_mass)
        scores = np.concatenate((affinity, null), axis=-1)
        if p.choice_model == "proportional":
            return scores - p.min_normalizer
        scores = scores - scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        return weights / weights.sum(axis=-1, keepdims=True)

    def expected_utility(self, affinity: np.ndarray) -> np.ndarray:
        """The choice model's score of a watched video alone (RecSim re-scores it, without the
        no-click option for the proportional model and with it for the logit model)."""
        p = self.params
        if p.choice_model == "proportional":
            return affinity - p.min_normalizer
        return 1.0 / (1.0 + np.exp(p.no_click_mass - affinity))

    def step(
        self, rng: np.random.Generator, slates: np.ndarray, active: np.ndarray | None = None
    ) -> StepOutcome:
        """Every active user with budget left responds to its slate (B, n) and moves on."""
        p, b, n = self.params, self.num_users, self.params.slate_size
        stepped = self.budget > 0.0
        if active is not None:
            stepped &= active
        if not stepped.any():
            return StepOutcome(np.full(b, -1), np.zeros(b), stepped)
        every = bool(stepped.all())
        # every user steps (the common case): work on views, no gathers or scatters of state
        rows: Any = slice(None) if every else np.flatnonzero(stepped)
        m = b if every else len(rows)
        slate = slates if every else slates[rows]
        interests = self.interests[rows]
        sub = self._rows[:m]
        topics = np.take_along_axis(self.topics[rows], slate, axis=1)  # (m, n)
        quality = np.take_along_axis(self.quality[rows], slate, axis=1)
        affinity = np.take_along_axis(interests, topics, axis=1)  # dot with a one-hot video
        uniforms = rng.random((m, 2))
        next_topics, next_quality = self._sample_documents(rng, m)

        # choice: the first cumulative weight above u * total (numpy.random.choice's rule)
        cumulative = np.cumsum(self.choice_weights(affinity), axis=1)
        threshold = uniforms[:, 0] * cumulative[:, -1]
        choice = np.minimum((cumulative <= threshold[:, None]).sum(axis=1), n)
        clicked = choice < n
        slot = np.where(clicked, choice, 0)
        budget = self.budget[rows]
        watch = np.where(clicked, np.minimum(budget, p.video_length), 0.0)

        # interest update of the watched video's topic (RecSim's IEvUserModel.update_state)
        topic = topics[sub, slot]
        x = affinity[sub, slot]
        alpha = (-p.alpha_y_intercept / p.alpha_x_intercept) * np.abs(x) + p.alpha_y_intercept
        update = alpha * (1.0 - x)
        towards = uniforms[:, 1] < (x + 1.0) / 2.0
        moved = np.clip(x + np.where(towards, update, -update), -1.0, 1.0)
        interests[sub[clicked], topic[clicked]] = moved[clicked]
        utility = p.user_quality_factor * self.expected_utility(x) + (
            p.document_quality_factor * quality[sub, slot]
        )
        budget = np.where(
            clicked,
            budget - watch + p.user_update_alpha * watch * utility,
            budget - p.step_penalty,
        )

        click_row = np.zeros((m, n), dtype=np.float32)
        watch_row = np.zeros((m, n), dtype=np.float32)
        click_row[sub[clicked], slot[clicked]] = 1.0
        watch_row[sub[clicked], slot[clicked]] = watch[clicked]
        if every:
            self.budget = budget
            self.topics, self.quality = next_topics, next_quality
            self.response_click, self.response_watch_time = click_row, watch_row
            self.response_quality = quality.astype(np.float32)
            return StepOutcome(np.where(clicked, slot, -1), watch, stepped)
        self.interests[rows] = interests
        self.budget[rows] = budget
        self.topics[rows], self.quality[rows] = next_topics, next_quality
        self.response_click[rows] = click_row
        self.response_watch_time[rows] = watch_row
        self.response_quality[rows] = quality
        clicked_slot = np.full(b, -1)
        clicked_slot[rows] = np.where(clicked, slot, -1)
        watch_time = np.zeros(b)
        watch_time[rows] = watch
        return StepOutcome(clicked_slot, watch_time, stepped)

    # ----------------------------------------------------------------------------------------
    # Views

    def observation(self) -> dict[str, np.ndarray]:
        """All users' observations (copies, leading batch axis; float32)."""
        return {
            "user": self.interests.astype(np.float32),
            "candidates": self._one_hot(self.topics),
            "response_click": self.response_click.copy(),
            "response_watch_time": self.response_watch_time.copy(),
            "response_quality": self.response_quality.copy(),
        }

    def _one_hot(self, topics: np.ndarray) -> np.ndarray:
        """(B, N, K) float32 one-hot topics (a scatter into zeros: faster than ``eye[topics]``)."""
        k = self.params.num_topics
        out = np.zeros((*topics.shape, k), dtype=np.float32)
        flat = out.reshape(-1, k)
        flat[np.arange(len(flat)), topics.reshape(-1)] = 1.0
        return out

    def oracle_state(self) -> dict[str, np.ndarray]:
        """Hidden ground truth (:data:`HIDDEN_STATE_KEYS`): each user's remaining minutes and each
        candidate's quality."""
        return {"budget_left": self.budget.copy(), "candidate_quality": self.quality.copy()}

    def state_dict(self) -> dict[str, Any]:
        """The users' state as plain data (copies)."""
        return {
            "interests": self.interests.copy(),
            "budget": self.budget.copy(),
            "topics": self.topics.copy(),
            "quality": self.quality.copy(),
            "response_click": self.response_click.copy(),
            "response_watch_time": self.response_watch_time.copy(),
            "response_quality": self.response_quality.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of a simulator with the same users and params (checked
        first: ``ValueError`` and nothing changes)."""
        read = StateReader(state, type(self).__name__)
        p, b = self.params, self.num_users
        n, k, s = p.num_candidates, p.num_topics, p.slate_size
        hint = f"num_users={b}, num_candidates={n}, num_topics={k}, slate_size={s}"
        interests = read.array("interests", (b, k), np.float64, hint=hint)
        budget = read.array("budget", (b,), np.float64, hint=hint)
        topics = read.array("topics", (b, n), np.int64, hint=hint)
        quality = read.array("quality", (b, n), np.float64, hint=hint)
        responses = {
            key: read.array(key, (b, s), np.float32, hint=hint)
            for key in ("response_click", "response_watch_time", "response_quality")
        }
        read.finish()
        if not (np.abs(interests) <= 1.0).all():
            raise read.fail("interests", "must lie in [-1, 1]")
        if topics.size and (topics.min() < 0 or topics.max() >= k):
            raise read.fail("topics", f"must lie in [0, num_topics={k})")
        if not (np.isfinite(budget).all() and budget.max() <= p.time_budget):
            raise read.fail("budget", f"must be finite and at most time_budget={p.time_budget}")
        self.interests, self.budget, self.topics, self.quality = interests, budget, topics, quality
        self.response_click = responses["response_click"]
        self.response_watch_time = responses["response_watch_time"]
        self.response_quality = responses["response_quality"]
