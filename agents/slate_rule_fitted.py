"""A slate rule that fits a model of the satisfaction readings from what it observed, acts on the
model's posterior that a user does not respond, and searches the decision by the cross-entropy
method.

Where users of hidden types need different plans (``fedrec/ChocKaleUserTypes-v0``),
:class:`~fedrec.agents.slate_rule_evidence.EvidenceRuleSearchAgent` weighs the evidence with a
statistic whose decay, effect and centre it searches from returns alone; a good statistic sits in
a narrow region that the search does not find on every seed. This rule learns those numbers where
the data says the most about them, from the readings themselves, and leaves only the decision to
the returns:

* **The readings' model** (:class:`ReadingsModel`), a two-component mixture. A *responsive* user
  reads ``centre + offset * decay^t + effect * E_t + noise``, where ``E_t`` is the trace of what
  the user consumed (``E <- decay * E + 1/2 - x`` of the consumed document; the slate's mean
  where no click is observed), ``offset`` a per-user Gaussian (the user's start, fading at the
  trace's rate) and the noise Gaussian; an *unresponsive* user reads ``flat_centre + noise``.
  Its seven numbers are fitted by maximum likelihood (the offset integrated out in closed form,
  L-BFGS from SciPy) to the last ``fit_episodes`` training episodes' (consumed feature, reading)
  sequences, every ``refit_every`` search updates.
* **The filter.** Per user and step, the log posterior odds that the user is unresponsive, from
  running sums of the residuals (exact under the model).
* **The decision** (5 numbers, searched as
  :class:`~fedrec.agents.slate_rule.RuleSearchAgent` does, every rule scored on
  ``episodes_per_rule`` user-episodes): a user whose log odds exceed ``threshold`` is served by
  the weight ``p_unresponsive``, every other user by ``p_early`` before step ``s`` and by
  ``p_late`` from it on. A weight p serves the n candidates with the largest p * x (p < 0:
  bottom-x, p > 0: top-x). Nothing is latched.

What the agent brings is the model's form (a linear response to a fading trace of what was
consumed, or none), not its numbers: it reads no info key and knows neither the types, tau, the
memory discount nor the noise. Until the first fit it gives no verdicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, logit

from fedrec.agents.base import Observation
from fedrec.agents.slate_rule import ScoredRuleSearchAgent, observed_satisfaction
from fedrec.agents.slate_rule_sequential import SequentialRuleSearchConfig

#: The decision's numbers: name -> (centre, scale) of theta = centre + scale * z. The threshold is
#: in log posterior odds, the switch step a fraction of the episode, the weights signs in effect.
UNITS: dict[str, tuple[float, float]] = {
    "threshold": (0.0, 2.0),
    "switch_at": (0.75, 0.15),  # s / episode length: p_early -> p_late
    "p_early": (0.0, 1.0),
    "p_unresponsive": (0.0, 1.0),
    "p_late": (0.0, 1.0),
}


@dataclasses.dataclass(frozen=True)
class FittedRuleSearchConfig(SequentialRuleSearchConfig):
    """The search settings of :class:`SequentialRuleSearchConfig` and the model fit's."""

    fit_episodes: int = dataclasses.field(
        default=2048, metadata={"help": "latest training episodes the readings' model is fitted to"}
    )
    refit_every: int = dataclasses.field(
        default=4, metadata={"help": "search updates between two fits of the readings' model"}
    )
    control_variate: bool = dataclasses.field(
        default=True,
        metadata={
            "help": "score a rule by its returns less beta times each user's final posterior "
            "that it does not respond (beta fitted on the last population)"
        },
    )
    min_weight_std: float = dataclasses.field(
        default=0.5,
        metadata={
            "help": "floor of the search spread of the three weights, in their scale (their "
            "signs stay explored)"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("fit_episodes", "refit_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.fit_episodes < 16:
            raise ValueError(f"fit_episodes must be >= 16, got {self.fit_episodes}")
        if not self.min_weight_std >= 0:
            raise ValueError(f"min_weight_std must be >= 0, got {self.min_weight_std}")

    @property
    def size(self) -> int:
        """Numbers of one decision rule."""
        return len(UNITS)


@dataclasses.dataclass(frozen=True)
class ReadingsModel:
    """The two-type model of the satisfaction readings (see the module docstring)."""

    decay: float  #: per-step decay of the trace and of the user's offset
    effect: float  #: reading per unit of the trace, responsive users
    centre: float  #: reading at a zero trace and offset, responsive users
    flat_centre: float  #: mean reading of unresponsive users
    noise: float  #: std of a reading around the model
    offset_std: float  #: std of a responsive user's offset at step 0
    responsive_share: float  #: prior probability that a user responds

    def as_array(self) -> np.ndarray:
        return np.array(dataclasses.astuple(self), dtype=np.float64)

    @classmethod
    def from_array(cls, values: np.ndarray) -> ReadingsModel:
        return cls(*(float(v) for v in np.asarray(values, dtype=np.float64)))


class FilterSums:
    """Running sums of one or many users' residuals under both types: what the log odds need."""

    def __init__(self, users: int) -> None:
        self.trace, self.offset_weight = np.zeros(users), np.ones(users)
        self.rr, self.fr, self.ff, self.flat = (np.zeros(users) for _ in range(4))

    def reset(self, mask: np.ndarray) -> None:
        self.trace[mask], self.offset_weight[mask] = 0.0, 1.0
        for sums in (self.rr, self.fr, self.ff, self.flat):
            sums[mask] = 0.0

    def add(
        self,
        model: ReadingsModel,
        consumed: np.ndarray | None,
        reading: np.ndarray,
        moved: np.ndarray | bool = True,
    ) -> None:
        """One step: where ``moved`` (not a user's first step), the trace takes in the last
        consumed feature and the offset fades; the sums take in the reading."""
        if consumed is not None:
            self.trace = np.where(moved, model.decay * self.trace + (0.5 - consumed), self.trace)
            self.offset_weight = np.where(
                moved, model.decay * self.offset_weight, self.offset_weight
            )
        residual = reading - model.centre - model.effect * self.trace
        self.rr += residual * residual
        self.fr += self.offset_weight * residual
        self.ff += self.offset_weight * self.offset_weight
        flat = reading - model.flat_centre
        self.flat += flat * flat

    def log_densities(
        self, model: ReadingsModel, users: Any = slice(None)
    ) -> tuple[np.ndarray, np.ndarray]:
        """Log densities of the readings so far as a responsive and as an unresponsive user,
        each less the term both share (-n/2 log(2 pi noise^2)), for ``users`` (an index)."""
        var, v = model.noise**2, model.offset_std**2
        rr, fr, ff = self.rr[users], self.fr[users], self.ff[users]
        # responsive: the residuals are N(0, var I + v f f^T); the determinant lemma and
        # Sherman-Morrison give its log density from the sums
        responsive = -0.5 * (np.log1p(v * ff / var) + (rr - v * fr**2 / (var + v * ff)) / var)
        unresponsive = -0.5 * self.flat[users] / var
        return responsive, unresponsive

    def log_odds_unresponsive(self, model: ReadingsModel, users: Any = slice(None)) -> np.ndarray:
        """log P(unresponsive | readings) - log P(responsive | readings) under ``model``."""
        responsive, unresponsive = self.log_densities(model, users)
        share = model.responsive_share
        return np.log1p(-share) - np.log(share) + unresponsive - responsive


def _model_from_free(free: np.ndarray) -> ReadingsModel:
    d, effect, centre, flat_centre, log_noise, log_offset, share = free
    return ReadingsModel(
        decay=float(expit(d)),
        effect=float(effect),
        centre=float(centre),
        flat_centre=float(flat_centre),
        noise=float(np.exp(log_noise)),
        offset_std=float(np.exp(log_offset)),
        responsive_share=float(np.clip(expit(share), 1e-6, 1 - 1e-6)),
    )


def _free_from_model(model: ReadingsModel) -> np.ndarray:
    return np.array(
        [
            logit(np.clip(model.decay, 1e-4, 1 - 1e-4)),
            model.effect,
            model.centre,
            model.flat_centre,
            np.log(model.noise),
            np.log(model.offset_std),
            logit(model.responsive_share),
        ]
    )


def mixture_log_likelihood(
    model: ReadingsModel, consumed: np.ndarray, readings: np.ndarray
) -> float:
    """Mean log-likelihood per episode of (episodes, T) readings, ``consumed[:, t]`` the feature
    consumed at step t (it moves the reading of step t + 1)."""
    sums = FilterSums(len(readings))
    for t in range(readings.shape[1]):
        sums.add(model, None if t == 0 else consumed[:, t - 1], readings[:, t])
    norm = -0.5 * readings.shape[1] * np.log(2 * np.pi * model.noise**2)
    responsive, unresponsive = sums.log_densities(model)
    share = model.responsive_share
    mixture = np.logaddexp(np.log(share) + responsive, np.log1p(-share) + unresponsive)
    return float((norm + mixture).mean())


def fit_readings_model(
    consumed: np.ndarray, readings: np.ndarray, start: ReadingsModel | None = None
) -> ReadingsModel:
    """Maximum-likelihood :class:`ReadingsModel` of (episodes, T) sequences (L-BFGS; without
    ``start``, from three decays and a neutral guess, the best kept)."""
    consumed = np.asarray(consumed, dtype=np.float64)
    readings = np.asarray(readings, dtype=np.float64)
    if consumed.shape != readings.shape or readings.ndim != 2 or readings.shape[1] < 2:
        raise ValueError(
            f"need consumed and readings of one shape (episodes, steps >= 2), got "
            f"{consumed.shape} and {readings.shape}"
        )
    mean, spread = float(readings.mean()), float(readings.std()) + 1e-6
    starts = (
        [start]
        if start is not None
        else [
            ReadingsModel(decay, 0.1 * spread, mean, mean, spread, spread, 0.5)
            for decay in (0.3, 0.6, 0.9)
        ]
    )

    def loss(free: np.ndarray) -> float:
        value = -mixture_log_likelihood(_model_from_free(free), consumed, readings)
        return value if np.isfinite(value) else 1e12

    best = min(
        (minimize(loss, _free_from_model(s), method="L-BFGS-B") for s in starts),
        key=lambda result: result.fun,
    )
    return _model_from_free(best.x)


def rule_numbers(z: np.ndarray, episode_length: int) -> dict[str, np.ndarray]:
    """(..., 5) standard units -> the decision's numbers (the switch in steps)."""
    z = np.asarray(z, dtype=np.float64)
    out = {
        name: centre + scale * z[..., i] for i, (name, (centre, scale)) in enumerate(UNITS.items())
    }
    out["switch_at"] = np.clip(np.rint(out["switch_at"] * episode_length), 0, episode_length)
    return out


class FittedRuleSearchAgent(ScoredRuleSearchAgent):
    """Cross-entropy search over a decision on the posterior of a readings' model fitted from the
    agent's own observations (see the module docstring). Needs an env that observes the
    satisfaction (observation key ``user``); reads no hidden state."""

    Config = FittedRuleSearchConfig
    config: FittedRuleSearchConfig

    def __init__(
        self,
        *,
        slate_size: int,
        episode_length: int,
        config: FittedRuleSearchConfig | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            slate_size=slate_size,
            episode_length=episode_length,
            config=config,
            seed=seed,
        )
        self.model: ReadingsModel | None = None
        self.sums = FilterSums(0)
        self.last_slate = np.zeros((0, slate_size))  # per user: features of the served slate
        # per user: this episode's consumed features and readings, step by step
        self.consumed_log = np.zeros((0, self.episode_length))
        self.reading_log = np.zeros((0, self.episode_length))
        # the latest finished training episodes, oldest first (what the model is fitted to)
        self.fit_consumed = np.zeros((0, self.episode_length))
        self.fit_readings = np.zeros((0, self.episode_length))
        # the control variate: its coefficient, and this population's (return, posterior) pairs
        self.beta = 0.0
        self.cv_pairs: list[tuple[float, float]] = []

    def _ensure_users(self, users: int) -> None:
        if len(self.last_slate) != users:
            self.sums = FilterSums(users)
            self.last_slate = np.zeros((users, self.slate_size))
            self.consumed_log = np.zeros((users, self.episode_length))
            self.reading_log = np.zeros((users, self.episode_length))
        super()._ensure_users(users)

    def _consumed(self, observations: Observation) -> np.ndarray:
        """The feature each user consumed at the last step (the slate's mean without a click)."""
        consumed = self.last_slate.mean(axis=1)
        clicks = observations.get("response_click")
        if clicks is not None:
            last = np.asarray(clicks, dtype=np.float64)[:, -1, :]  # (U, n) one-hot or zeros
            clicked = last.sum(axis=1) > 0
            picked = (last * self.last_slate).sum(axis=1)
            consumed = np.where(clicked, picked, consumed)
        return consumed

    def _scores(self, observations: Observation, weights: np.ndarray) -> np.ndarray:
        reading = observed_satisfaction(observations, self)
        x = np.asarray(observations["candidates"], dtype=np.float64)[..., 0]
        users = len(reading)
        rule = rule_numbers(
            np.broadcast_to(weights, (users, self.config.size)), self.episode_length
        )
        fresh = self.steps == 0  # a new episode forgets the last one's sums
        consumed = self._consumed(observations)
        step = np.minimum(self.steps, self.episode_length - 1)
        rows = np.arange(users)
        self.consumed_log[rows[~fresh], step[~fresh] - 1] = consumed[~fresh]
        self.reading_log[rows, step] = reading
        if self.model is None:
            unresponsive = np.zeros(users, dtype=bool)
        else:
            # (a model fitted while an episode runs reads that episode's earlier steps' sums as
            # they were: a few episodes at each fit)
            self.sums.reset(fresh)
            self.sums.add(self.model, consumed, reading, moved=~fresh)
            unresponsive = self.sums.log_odds_unresponsive(self.model) > rule["threshold"]
        p = np.where(
            unresponsive,
            rule["p_unresponsive"],
            np.where(self.steps < rule["switch_at"], rule["p_early"], rule["p_late"]),
        )
        return p[:, None] * x

    def _slates(self, observations: Observation, weights: np.ndarray) -> np.ndarray:
        slates = super()._slates(observations, weights)
        x = np.asarray(observations["candidates"], dtype=np.float64)[..., 0]
        self.last_slate = np.take_along_axis(x, slates, axis=1)
        return slates

    def _unresponsive_posterior(self, user: int) -> float:
        """P(the user does not respond | its readings so far) under the fitted model."""
        return float(expit(self.sums.log_odds_unresponsive(self.model, user)))

    def _episode_score(self, user: int) -> float:
        # A control variate: whatever the rule, the mean of a calibrated posterior is the prior
        # share, so subtracting beta * posterior leaves every rule's expected score shifted by the
        # same amount while it removes the part of the return that the user's type explains.
        ret = float(self.returns[user])
        if not self.config.control_variate or self.model is None:
            return ret
        posterior = self._unresponsive_posterior(user)
        self.cv_pairs.append((ret, posterior))
        return ret - self.beta * posterior

    def _std_floor(self) -> np.ndarray:
        floor = np.full(self.config.size, self.config.min_std)
        floor[[i for i, name in enumerate(UNITS) if name.startswith("p_")]] = max(
            self.config.min_std, self.config.min_weight_std
        )
        return floor

    def _close(self, users: np.ndarray) -> None:
        super()._close(users)
        if len(users):
            keep = self.config.fit_episodes
            self.fit_consumed = np.concatenate([self.fit_consumed, self.consumed_log[users]])[
                -keep:
            ]
            self.fit_readings = np.concatenate([self.fit_readings, self.reading_log[users]])[-keep:]

    def _population(self) -> tuple[np.ndarray, np.ndarray] | None:
        population = super()._population()
        if population is None:
            return None
        if len(self.cv_pairs) >= 16:
            returns, posteriors = np.array(self.cv_pairs).T
            spread = posteriors.var()
            covariance = np.cov(returns, posteriors, bias=True)[0, 1]
            self.beta = float(covariance / spread) if spread > 0 else 0.0
        self.cv_pairs = []
        # (8 episodes at least: a fit to fewer says little; the consumption at an episode's last
        # step moves no reading, so that column is unused)
        if len(self.fit_readings) >= 8 and self.updates % self.config.refit_every == 0:
            self.model = fit_readings_model(self.fit_consumed, self.fit_readings, start=self.model)
        return population

    def greedy_rule(self) -> dict[str, float]:
        """The mean decision's numbers (the switch in steps) and the fitted model's."""
        rule = {k: float(v) for k, v in rule_numbers(self.mean, self.episode_length).items()}
        if self.model is not None:
            rule.update({f"model_{k}": v for k, v in dataclasses.asdict(self.model).items()})
        return rule

    def state_dict(self) -> dict[str, Any]:
        s = self.sums
        return {
            **super().state_dict(),
            "model": np.zeros(0) if self.model is None else self.model.as_array(),
            "filter": np.stack([s.trace, s.offset_weight, s.rr, s.fr, s.ff, s.flat]),
            "last_slate": self.last_slate.copy(),
            "consumed_log": self.consumed_log.copy(),
            "reading_log": self.reading_log.copy(),
            "fit_consumed": self.fit_consumed.copy(),
            "fit_readings": self.fit_readings.copy(),
            "beta": self.beta,
            "cv_pairs": np.array(self.cv_pairs, dtype=np.float64).reshape(-1, 2),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        model = np.array(state["model"], dtype=np.float64)
        self.model = None if model.size == 0 else ReadingsModel.from_array(model)
        rows = np.array(state["filter"], dtype=np.float64)
        self.sums = FilterSums(rows.shape[1])
        s = self.sums
        s.trace, s.offset_weight, s.rr, s.fr, s.ff, s.flat = (row.copy() for row in rows)
        self.last_slate = np.array(state["last_slate"], dtype=np.float64)
        self.consumed_log = np.array(state["consumed_log"], dtype=np.float64)
        self.reading_log = np.array(state["reading_log"], dtype=np.float64)
        self.fit_consumed = np.array(state["fit_consumed"], dtype=np.float64)
        self.fit_readings = np.array(state["fit_readings"], dtype=np.float64)
        self.beta = float(state["beta"])
        self.cv_pairs = [
            (float(r), float(q)) for r, q in np.array(state["cv_pairs"], dtype=np.float64)
        ]
