"""Cross-platform off-policy evaluation: a target policy's value on a platform without feedback.

In the two-platform Choc-vs-Kale env (:mod:`fedrec.envs.multi_platform`) platform A observes
its users' responses and platform B does not: B knows its own candidates, its noisy reading of
the user's satisfaction and the slates it showed, never a click or an engagement. Nothing B logs
can tell it what a new slate policy π would earn there. This module estimates

    V_B(π) = E[engagement of one visit to B when B shows π's slate]

over the visit contexts B meets while the logging policies run (the contextual-bandit value of
``docs/ope.md``'s slate estimators: the effect of π on the user's later satisfaction is not
counted), from

* **A's logs** (contexts, slates, exact logging propensities, engagement), assuming B's users
  respond like A's (*transfer assumption*: the same choice and engagement given the same
  candidates and satisfaction, and contexts distributed alike): :func:`transfer_ips`,
  :func:`transfer_snips`, :func:`transfer_dr`;
* **only what the federation may carry**: a reward model A fits on its own logs travels as a
  ``MODEL_PARAMETERS`` message (a float32 vector, the parameter-sharing contract of
  :mod:`fedrec.federation.messages`; FedSlate's own contract refuses it) and B applies it to its
  own logged contexts: :func:`federated_dm` (assumes the transfer *and* the model's form);
  With bootstrap refits of A's model carried too (:func:`bootstrap_reward_models`), its
  interval also counts the model's estimation error;
* the **naive** baseline :func:`naive`: A's mean logged engagement, the value of A's *logger*,
  whatever π is. It is what B learns from FedSlate's TD labels with γ = 0 (the label is A's
  reward at the same step, independent of B's slate).

:func:`simulate` logs both platforms of the env with exact propensities (A: engagement and
click; B: neither) and, given a target, also draws the engagement π's slate would have earned at
each visit (the env is saved, stepped with π's slate and restored, so the logged run is
unchanged): :func:`true_value` is that Monte Carlo mean. ``benchmarks/ope_cross_platform.py``
measures bias, RMSE and interval coverage over logged datasets; ``docs/ope_platforms.md`` has the
table and where the transfer assumption fails.

Every estimate's interval treats **users** as the independent units (each user's visits are
averaged first; every user has the same number of visits, so the value is the per-visit mean).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fedrec.agents.base import random_slates
from fedrec.envs.multi_platform import ChocKaleMultiPlatformBatchEnv
from fedrec.eval.ope.core import Estimate, _array, _check_confidence, _mean_estimate
from fedrec.eval.stats import t_quantile
from fedrec.federation.channel import Channel
from fedrec.federation.messages import PARAMETER_SHARING_KINDS, SERVER, MessageKind

__all__ = [
    "RULES",
    "EpsilonLogger",
    "PlatformLog",
    "RewardModel",
    "SimulatedRun",
    "bootstrap_reward_models",
    "carry_reward_model",
    "federated_dm",
    "fit_reward_model",
    "naive",
    "simulate",
    "transfer_dr",
    "transfer_ips",
    "transfer_snips",
    "true_value",
]

#: A slate policy on one platform: ``(candidates (n, N), reading (n,)) -> slates (n, K)``.
SlatePolicy = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _top_x(candidates: np.ndarray, size: int) -> np.ndarray:
    return np.argsort(-candidates, axis=1, kind="stable")[:, :size].astype(np.int64)


def _bottom_x(candidates: np.ndarray, size: int) -> np.ndarray:
    return np.argsort(candidates, axis=1, kind="stable")[:, :size].astype(np.int64)


#: Deterministic rules by name (as :mod:`fedrec.agents.reference`'s heuristics): ``top_x`` the
#: K candidates with the largest feature x, largest first; ``bottom_x`` its mirror.
RULES: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {
    "top_x": _top_x,
    "bottom_x": _bottom_x,
}


def _target_slates(
    target: str | SlatePolicy, candidates: np.ndarray, reading: np.ndarray, size: int
) -> np.ndarray:
    """The deterministic target's slates on logged contexts, checked."""
    if isinstance(target, str):
        if target not in RULES:
            raise ValueError(f"unknown target rule {target!r}; known: {sorted(RULES)}")
        return RULES[target](candidates, size)
    if not callable(target):
        raise ValueError(
            f"target must be a rule name {sorted(RULES)} or a callable, got {target!r}"
        )
    slates = _array("target slates", target(candidates, reading), (len(candidates), size), np.int64)
    if np.any((slates < 0) | (slates >= candidates.shape[1])):
        raise ValueError(f"target slates must hold candidate indices in [0, {candidates.shape[1]})")
    ordered = np.sort(slates, axis=1)
    if size > 1 and np.any(ordered[:, 1:] == ordered[:, :-1]):
        raise ValueError("target slates must hold distinct candidates")
    return slates


@dataclasses.dataclass(frozen=True)
class EpsilonLogger:
    """The logger ``(1 − ε) · rule + ε · uniformly random slates``, with exact propensities
    ``(1 − ε) · 1{s = rule(x)} + ε / (N!/(N−K)!)`` (as :mod:`fedrec.train.collect`'s mixtures)."""

    rule: str = "top_x"
    epsilon: float = 0.5

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown logging rule {self.rule!r}; known: {sorted(RULES)}")
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")

    def act(
        self, rng: np.random.Generator, candidates: np.ndarray, size: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slates (n, K) and their logging propensities (n,)."""
        n, num = candidates.shape
        greedy = RULES[self.rule](candidates, size)
        uniform = random_slates(rng, n, num, size)
        explore = rng.random(n) < self.epsilon
        slates = np.where(explore[:, None], uniform, greedy)
        match = np.all(slates == greedy, axis=1)
        propensity = (1.0 - self.epsilon) * match + self.epsilon / math.perm(num, size)
        return slates, propensity


@dataclasses.dataclass(frozen=True)
class PlatformLog:
    """n logged visits to one platform (flattened over users and steps).

    ``candidates`` (n, N) the candidates' feature x, ``reading`` (n,) the noisy satisfaction in
    the observation, ``slates`` (n, K), ``propensities`` (n,) the logger's probability of each
    logged slate, ``users`` (n,) the user of each visit (the independent unit of the intervals).
    ``rewards`` (engagement) and ``clicked_slot`` (-1: nothing) exist only on a platform with
    feedback; on one without they are None.
    """

    candidates: np.ndarray
    reading: np.ndarray
    slates: np.ndarray
    propensities: np.ndarray
    users: np.ndarray
    rewards: np.ndarray | None = None
    clicked_slot: np.ndarray | None = None

    def __post_init__(self) -> None:
        candidates = _array("candidates", self.candidates, (None, None))
        n, num = candidates.shape
        if n == 0:
            raise ValueError("a platform log needs at least one visit")
        slates = _array("slates", self.slates, (n, None), np.int64)
        if slates.shape[1] > num or np.any((slates < 0) | (slates >= num)):
            raise ValueError(f"slates must hold distinct candidate indices in [0, {num})")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("candidates", candidates)
        set_("slates", slates)
        set_("reading", _array("reading", self.reading, (n,)))
        propensities = _array("propensities", self.propensities, (n,))
        if np.any(propensities <= 0) or np.any(propensities > 1 + 1e-9):
            raise ValueError(
                "propensities must be the logger's probabilities of the logged slates, in (0, 1]"
            )
        set_("propensities", propensities)
        set_("users", _array("users", self.users, (n,), np.int64))
        if (self.rewards is None) != (self.clicked_slot is None):
            raise ValueError("give both rewards and clicked_slot (feedback) or neither")
        if self.rewards is not None:
            set_("rewards", _array("rewards", self.rewards, (n,)))
            clicked = _array("clicked_slot", self.clicked_slot, (n,), np.int64)
            if np.any((clicked < -1) | (clicked >= slates.shape[1])):
                raise ValueError(f"clicked_slot must be -1 or in [0, {slates.shape[1]})")
            set_("clicked_slot", clicked)

    @property
    def n(self) -> int:
        return len(self.slates)

    @property
    def slate_size(self) -> int:
        return self.slates.shape[1]

    @property
    def feedback(self) -> bool:
        return self.rewards is not None

    def _need_feedback(self, who: str) -> np.ndarray:
        if self.rewards is None:
            raise ValueError(
                f"{who} needs a log with feedback (rewards and clicks): this platform observes "
                "no responses (use its log only for its contexts: federated_dm)"
            )
        return self.rewards


@dataclasses.dataclass(frozen=True)
class SimulatedRun:
    """Both platforms' logs of one run; ``target_engagement`` (n,) the engagement the target's
    slate drew at each logged visit of ``target_platform`` (None without a target)."""

    logs: dict[str, PlatformLog]
    target_engagement: np.ndarray | None = None
    target_platform: str | None = None


def simulate(
    num_users: int,
    *,
    seed: int,
    loggers: Mapping[str, EpsilonLogger] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    target: str | SlatePolicy | None = None,
    target_platform: str = "platform_b",
) -> SimulatedRun:
    """One episode of ``num_users`` users on the two-platform env (A with feedback, B without),
    each platform acting with its logger (default: ``EpsilonLogger("top_x", 0.5)`` on both).

    The env is reset with ``seed``; the loggers draw from ``numpy.random.default_rng([seed, 1])``.
    With a ``target``, before every joint step the env is saved, stepped with the target's slate
    on ``target_platform`` (the other platform shows its logged slate) and restored, so the
    target's engagement at each logged visit is drawn from the same state and the logged run is
    exactly the run without the target.
    """
    env = ChocKaleMultiPlatformBatchEnv(num_users, **dict(env_kwargs or {}))
    agents = env.possible_agents
    if len(agents) != 2 or env.feedback != {agents[0]: True, agents[1]: False}:
        raise ValueError(
            "simulate needs two platforms, the first with feedback, the second without"
        )
    loggers = dict(loggers or {agent: EpsilonLogger() for agent in agents})
    if set(loggers) != set(agents):
        raise ValueError(f"loggers must be keyed by {agents}, got {sorted(loggers)}")
    if target is not None and target_platform not in agents:
        raise ValueError(f"target_platform must be one of {agents}, got {target_platform!r}")
    size = env.params.slate_size
    rng = np.random.default_rng([seed, 1])
    obs, _ = env.reset(seed=seed)
    records: dict[str, list[dict[str, np.ndarray]]] = {agent: [] for agent in agents}
    drawn: list[np.ndarray] = []
    users = np.arange(num_users)
    running = True
    while running:
        slates, rows = {}, {}
        for agent in agents:
            candidates = np.asarray(obs[agent]["candidates"], dtype=np.float64)[..., 0]
            reading = (
                np.asarray(obs[agent]["user"], dtype=np.float64)[:, 0]
                if "user" in obs[agent]
                else np.zeros(num_users)
            )
            slates[agent], propensity = loggers[agent].act(rng, candidates, size)
            rows[agent] = {
                "candidates": candidates,
                "reading": reading,
                "slates": slates[agent],
                "propensities": propensity,
                "users": users,
            }
        if target is not None:
            row = rows[target_platform]
            chosen = _target_slates(target, row["candidates"], row["reading"], size)
            saved = env.state_dict()
            before = env.evaluation_engagement()[target_platform]
            env.step({**slates, target_platform: chosen})
            drawn.append(env.evaluation_engagement()[target_platform] - before)
            env.load_state_dict(saved)
        before = env.evaluation_engagement()
        obs, _, terminated, truncated, infos = env.step(slates)
        after = env.evaluation_engagement()
        for agent in agents:
            if env.feedback[agent]:
                rows[agent]["rewards"] = after[agent] - before[agent]
                rows[agent]["clicked_slot"] = np.asarray(infos[agent]["clicked_slot"])
            records[agent].append(rows[agent])
        running = not (terminated[agents[0]].all() or truncated[agents[0]].all())
    logs = {
        agent: PlatformLog(**{key: np.concatenate([r[key] for r in rec]) for key in rec[0]})
        for agent, rec in records.items()
    }
    engagement = np.concatenate(drawn) if target is not None else None
    return SimulatedRun(logs, engagement, target_platform if target is not None else None)


# --------------------------------------------------------------------------------------------
# Per-user terms
# --------------------------------------------------------------------------------------------


def _per_user(values: np.ndarray, users: np.ndarray) -> np.ndarray:
    """The mean of ``values`` within each user (users with no visit are left out)."""
    _, index = np.unique(users, return_inverse=True)
    counts = np.bincount(index)
    return np.bincount(index, weights=values) / counts


def _check_equal_visits(users: np.ndarray) -> None:
    counts = np.unique(users, return_counts=True)[1]
    if counts.min() != counts.max():
        raise ValueError(
            "every user must have the same number of logged visits (the mean of the per-user "
            f"means is then the per-visit mean); got {counts.min()} to {counts.max()}"
        )


def _user_mean(name: str, terms: np.ndarray, users: np.ndarray, confidence: float) -> Estimate:
    _check_confidence(confidence)
    _check_equal_visits(users)
    return _mean_estimate(name, _per_user(terms, users), confidence)


def true_value(run: SimulatedRun, *, confidence: float = 0.95) -> Estimate:
    """The Monte Carlo value of the target on ``run.target_platform``: the mean engagement its
    slates drew at the logged visits (interval over users)."""
    if run.target_engagement is None or run.target_platform is None:
        raise ValueError("this run has no target engagement: call simulate(..., target=...)")
    users = run.logs[run.target_platform].users
    return _user_mean("true value", run.target_engagement, users, confidence)


# --------------------------------------------------------------------------------------------
# Estimators
# --------------------------------------------------------------------------------------------


def naive(log_a: PlatformLog, *, confidence: float = 0.95) -> Estimate:
    """A's mean logged engagement: the value of A's logger on A, whatever the target."""
    rewards = log_a._need_feedback("naive")
    return _user_mean("naive (A's logged mean)", rewards, log_a.users, confidence)


def _weights(log: PlatformLog, target: str | SlatePolicy) -> np.ndarray:
    chosen = _target_slates(target, log.candidates, log.reading, log.slate_size)
    return np.all(chosen == log.slates, axis=1) / log.propensities


def transfer_ips(
    log_a: PlatformLog, target: str | SlatePolicy, *, confidence: float = 0.95
) -> Estimate:
    """Slate IPS on A's logs, ``1/n Σ_i 1{π(x_i) = s_i} / μ_A(s_i|x_i) · r_i``: unbiased for
    V_A(π), hence for V_B(π) under the transfer assumption; variance grows with 1/μ_A(π(x))."""
    rewards = log_a._need_feedback("transfer IPS")
    return _user_mean("transfer IPS", _weights(log_a, target) * rewards, log_a.users, confidence)


def transfer_snips(
    log_a: PlatformLog, target: str | SlatePolicy, *, confidence: float = 0.95
) -> Estimate:
    """Self-normalised slate IPS on A's logs (per-user sums; delta-method interval)."""
    _check_confidence(confidence)
    rewards = log_a._need_feedback("transfer SNIPS")
    _check_equal_visits(log_a.users)
    weights = _weights(log_a, target)
    numerators = _per_user(weights * rewards, log_a.users)
    denominators = _per_user(weights, log_a.users)
    total = denominators.sum()
    if not total > 0:
        raise ValueError("transfer SNIPS: the target never chose a logged slate (all weights 0)")
    ratio = numerators.sum() / total
    n = len(numerators)
    if n > 1:
        residual = numerators - ratio * denominators
        se = float(np.sqrt(np.sum(residual**2) / (n - 1)) / (math.sqrt(n) * total / n))
        half = t_quantile(confidence, n - 1) * se
    else:
        se = half = math.nan
    return Estimate("transfer SNIPS", ratio, se, ratio - half, ratio + half, n, confidence)


# --------------------------------------------------------------------------------------------
# The reward model A fits and may share
# --------------------------------------------------------------------------------------------

#: Number of parameters of :class:`RewardModel` (choice slope, 4 coefficients, residual variance).
NUM_MODEL_PARAMETERS = 6


@dataclasses.dataclass(frozen=True)
class RewardModel:
    """A's model of one visit: an MNL choice with logit ``−θ·x`` (no null item) and a log-normal
    engagement, ``log e ~ N(β·[1, x, u, x·u], σ²)`` (x the consumed item's feature, u the
    satisfaction reading), so ``E[slate] = Σ_j p_j exp(β·φ_j + σ²/2)``. The env's model has this
    form (θ = 1, log-location ``(4 + x)·satisfaction``) up to the reading's noise."""

    choice_slope: float
    coefficients: np.ndarray
    residual_variance: float

    def parameters(self) -> np.ndarray:
        """The float32 vector that may travel as a ``MODEL_PARAMETERS`` message."""
        return np.array(
            [self.choice_slope, *self.coefficients, self.residual_variance], dtype=np.float32
        )

    @classmethod
    def from_parameters(cls, parameters: np.ndarray) -> RewardModel:
        values = _array("parameters", parameters, (NUM_MODEL_PARAMETERS,))
        if values[-1] < 0:
            raise ValueError(f"the residual variance must be >= 0, got {values[-1]}")
        return cls(float(values[0]), values[1:5].copy(), float(values[-1]))

    def slate_value(
        self, candidates: np.ndarray, reading: np.ndarray, slates: np.ndarray
    ) -> np.ndarray:
        """Expected engagement (n,) of each slate."""
        x = np.take_along_axis(candidates, slates, axis=1)
        u = reading[:, None]
        logits = -self.choice_slope * x
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        b = self.coefficients
        engagement = np.exp(b[0] + b[1] * x + b[2] * u + b[3] * x * u + self.residual_variance / 2)
        return np.sum(p * engagement, axis=1)


def fit_reward_model(log_a: PlatformLog, *, iterations: int = 50) -> RewardModel:
    """Fit :class:`RewardModel` on a log with feedback: the choice slope by Newton's method on
    the conditional-logit likelihood of the clicked slots, the engagement by least squares on
    the log engagement of the consumed items. Visits without a click are left out (the model
    has no null item)."""
    rewards = log_a._need_feedback("fit_reward_model")
    clicked = log_a.clicked_slot
    assert clicked is not None
    hit = clicked >= 0
    if hit.sum() < 10 or np.any(rewards[hit] <= 0):
        raise ValueError(
            f"fit_reward_model needs >= 10 clicked visits with positive engagement, "
            f"got {int(hit.sum())}"
        )
    x = np.take_along_axis(log_a.candidates[hit], log_a.slates[hit], axis=1)
    chosen = x[np.arange(len(x)), clicked[hit]]
    theta = 0.0
    for _ in range(iterations):
        logits = -theta * x
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        mean = np.sum(p * x, axis=1)
        gradient = np.sum(mean - chosen)
        curvature = np.sum(np.sum(p * x * x, axis=1) - mean**2)
        if not curvature > 0:
            break
        step = gradient / curvature
        theta += step
        if abs(step) < 1e-10:
            break
    u = log_a.reading[hit]
    design = np.column_stack([np.ones_like(chosen), chosen, u, chosen * u])
    target = np.log(rewards[hit])
    beta, *_ = np.linalg.lstsq(design, target, rcond=None)
    residual = target - design @ beta
    variance = float(np.sum(residual**2) / max(len(target) - design.shape[1], 1))
    return RewardModel(float(theta), beta, variance)


def carry_reward_model(
    model: RewardModel,
    *,
    num_candidates: int,
    kinds: frozenset[MessageKind] = PARAMETER_SHARING_KINDS,
    sender: str = "platform_a",
    receiver: str = "platform_b",
) -> RewardModel:
    """Send A's model parameters to B through a validated :class:`Channel` (A → server → B, as
    ``MODEL_PARAMETERS``) and return the model B receives (float32 parameters).

    Under FedSlate's own contract (``kinds=FEDSLATE_KINDS``) the channel refuses the message with
    :class:`~fedrec.federation.messages.PrivacyViolation`: FedSlate carries per-candidate values
    and TD labels, not model parameters.
    """
    channel = Channel([sender, receiver], num_candidates=num_candidates, kinds=kinds)
    channel.send(MessageKind.MODEL_PARAMETERS, sender, SERVER, model.parameters())
    at_server = channel.receive(SERVER, MessageKind.MODEL_PARAMETERS)
    channel.send(MessageKind.MODEL_PARAMETERS, SERVER, receiver, np.array(at_server))
    return RewardModel.from_parameters(channel.receive(receiver, MessageKind.MODEL_PARAMETERS))


def transfer_dr(
    log_a: PlatformLog,
    target: str | SlatePolicy,
    model: RewardModel,
    *,
    confidence: float = 0.95,
) -> Estimate:
    """Doubly robust on A's logs: ``1/n Σ_i [q̂(x_i, π(x_i)) + w_i (r_i − q̂(x_i, s_i))]``,
    unbiased for V_A(π) with exact propensities whatever the model."""
    rewards = log_a._need_feedback("transfer DR")
    chosen = _target_slates(target, log_a.candidates, log_a.reading, log_a.slate_size)
    weights = np.all(chosen == log_a.slates, axis=1) / log_a.propensities
    on_target = model.slate_value(log_a.candidates, log_a.reading, chosen)
    on_logged = model.slate_value(log_a.candidates, log_a.reading, log_a.slates)
    terms = on_target + weights * (rewards - on_logged)
    return _user_mean("transfer DR", terms, log_a.users, confidence)


def federated_dm(
    log_b: PlatformLog,
    target: str | SlatePolicy,
    model: RewardModel,
    *,
    replicates: Sequence[RewardModel] = (),
    confidence: float = 0.95,
) -> Estimate:
    """Direct method on **B's own contexts** with the model A carried: ``1/n Σ_i q̂(x_i, π(x_i))``
    over B's logged visits. Needs no rewards on B; adapts to B's context distribution, but is
    as biased as the model where B's users respond unlike A's (no interval shows that).

    Without ``replicates`` the interval counts only the spread over B's contexts, not the error
    of A's fitted model. With ``replicates`` (bootstrap refits, :func:`bootstrap_reward_models`,
    carried like the model) the standard error adds their spread:
    ``SE² = SE_contexts² + Var_r[V̂(q̂_r)]`` (t with users − 1 degrees of freedom; named
    "federated DM (bootstrap)").
    """
    chosen = _target_slates(target, log_b.candidates, log_b.reading, log_b.slate_size)
    terms = model.slate_value(log_b.candidates, log_b.reading, chosen)
    base = _user_mean("federated DM", terms, log_b.users, confidence)
    if not replicates:
        return base
    if len(replicates) < 2:
        raise ValueError(f"replicates must hold at least 2 bootstrap models, got {len(replicates)}")
    values = [
        float(np.mean(r.slate_value(log_b.candidates, log_b.reading, chosen))) for r in replicates
    ]
    se = math.sqrt(base.std_error**2 + float(np.var(values, ddof=1)))
    half = t_quantile(confidence, base.n - 1) * se
    value = base.value
    return Estimate(
        "federated DM (bootstrap)", value, se, value - half, value + half, base.n, confidence
    )


#: The per-visit fields of a :class:`PlatformLog` with feedback.
_LOG_FIELDS = (
    "candidates", "reading", "slates", "propensities", "users", "rewards", "clicked_slot"
)  # fmt: skip


def bootstrap_reward_models(log_a: PlatformLog, replicates: int, *, seed: int) -> list[RewardModel]:
    """``replicates`` refits of :func:`fit_reward_model` on A's users resampled with replacement
    (``numpy.random.default_rng(seed)``): the spread of A's fitted model, for
    :func:`federated_dm`'s interval."""
    if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 2:
        raise ValueError(f"replicates must be an integer >= 2, got {replicates!r}")
    log_a._need_feedback("bootstrap_reward_models")
    rng = np.random.default_rng(seed)
    ids, index = np.unique(log_a.users, return_inverse=True)
    rows_of = np.split(np.argsort(index, kind="stable"), np.cumsum(np.bincount(index))[:-1])
    models = []
    for _ in range(replicates):
        drawn = rng.integers(0, len(ids), len(ids))
        rows = np.concatenate([rows_of[u] for u in drawn])
        sample = dataclasses.replace(
            log_a, **{field: getattr(log_a, field)[rows] for field in _LOG_FIELDS}
        )
        models.append(fit_reward_model(sample))
    return models
