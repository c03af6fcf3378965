"""Membership inference against FedCEM's search update: which users were in the elite.

What a party other than the feedback platform sees in FedCEM (:mod:`fedrec.agents.fedcem`):
platform B receives every training episode's rule draws, one per user (it serves them), and
after each population the new search distribution (mu, sigma) that the server broadcasts. With
protection "none" the update is a deterministic function of the draws of the feedback
platform's elite (its ``elite_fraction`` best user-episode returns)::

    mu'    = (1 - a) mu + a mean(elite draws)
    sigma' = max((1 - a) sigma + a std(elite draws), min_std)

and a (``smoothing``) and ``min_std`` are public, so B can undo the step (:func:`elite_moments`)
and ask which of the population's draws the elite's mean and spread came from
(:func:`elite_scores`). A high score says "this user's episode return on the feedback platform
was in its top quarter": a per-user value derived from the feedback platform's rewards, which the
contract says does not cross. The server sees the same update (with one feedback platform, the
very vector B gets).

Two scores, both read from the update alone:

- ``"least_squares"``: the elite indicator w (k ones among the n draws) satisfies the linear
  equations sum_i w_i [1, u_i, u_i^2] = k [1, m, s^2 + m^2], with u the draws standardised by
  the old rule and m, s the elite's recovered mean and spread (the spread's equations are left
  out where the floor hid it). The score is their minimum-norm solution, the projection of the
  true indicator onto the span of the draws' features.
- ``"likelihood"``: the log-likelihood ratio of a draw under the elite's fitted Gaussian
  N(m, s^2) against the search distribution it was drawn from.

:class:`SilentObserver` reads what B receives from the channel (the draws and the rules, as
delivered) and :class:`EliteAudit` pairs each observed update with the true elite (read inside
the feedback platform, by the auditor only) and measures the ROC AUC (:func:`roc_auc`; 0.5 is
chance). :func:`play_population` drives a population of synthetic returns through the method's
own code, for regimes the env does not isolate (returns that depend only on the user, or only
on the rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats

if TYPE_CHECKING:
    from fedrec.agents.fedcem import FedCEMAgent
    from fedrec.federation import Channel

#: The attack's scores (see the module doc).
METHODS = ("least_squares", "likelihood")


def elite_moments(
    mean_old: np.ndarray,
    std_old: np.ndarray,
    mean_new: np.ndarray,
    std_new: np.ndarray,
    *,
    smoothing: float,
    min_std: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(elite mean, elite spread, known)`` recovered from one update by undoing the smoothing;
    ``known`` is False where the new spread sits on the floor (the elite's spread is then only
    bounded, and its entry is the old spread)."""
    a = float(smoothing)
    mean_old, std_old = np.asarray(mean_old, float), np.asarray(std_old, float)
    mean_new, std_new = np.asarray(mean_new, float), np.asarray(std_new, float)
    elite_mean = (mean_new - (1 - a) * mean_old) / a
    elite_std = (std_new - (1 - a) * std_old) / a
    known = (std_new > min_std * (1 + 1e-6)) & (elite_std > 0)
    return elite_mean, np.where(known, elite_std, std_old), known


def elite_scores(
    draws: np.ndarray,
    mean_old: np.ndarray,
    std_old: np.ndarray,
    mean_new: np.ndarray,
    std_new: np.ndarray,
    *,
    smoothing: float,
    min_std: float,
    method: str = "least_squares",
) -> np.ndarray:
    """(n,) how likely each of the population's ``draws`` (n, d) was in the elite, from the
    update (old rule -> new rule) alone; higher is more likely (see the module doc)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    draws = np.asarray(draws, float)
    mean_old, std_old = np.asarray(mean_old, float), np.asarray(std_old, float)
    elite_mean, elite_std, known = elite_moments(
        mean_old, std_old, mean_new, std_new, smoothing=smoothing, min_std=min_std
    )
    u = (draws - mean_old) / std_old
    m = (elite_mean - mean_old) / std_old
    s = elite_std / std_old
    if method == "likelihood":
        return np.sum(-0.5 * ((u - m) / s) ** 2 - np.log(s) + 0.5 * u**2, axis=1)
    n = len(draws)
    features = np.concatenate([np.ones((n, 1)), u, (u * u)[:, known]], axis=1)
    targets = np.concatenate([[1.0], m, (s * s + m * m)[known]])  # per elite member
    weights, *_ = np.linalg.lstsq(features.T, targets, rcond=None)
    return weights


def roc_auc(scores: np.ndarray, members: np.ndarray) -> float:
    """The ROC AUC of ``scores`` for the boolean ``members``: the probability that a member
    scores above a non-member (ties count half), from the Mann-Whitney U statistic."""
    scores, members = np.asarray(scores, float), np.asarray(members, bool)
    if members.all() or not members.any():
        raise ValueError("the AUC needs both members and non-members")
    u = stats.mannwhitneyu(scores[members], scores[~members]).statistic
    return float(u / (members.sum() * (~members).sum()))


def elite_mask(returns: np.ndarray, elite_fraction: float) -> np.ndarray:
    """(n,) True for the population's elite, selected exactly as the search selects it."""
    from fedrec.agents.fedcem import elite_indices

    mask = np.zeros(len(returns), dtype=bool)
    mask[elite_indices(returns, elite_fraction)] = True
    return mask


@dataclasses.dataclass
class ObservedUpdate:
    """One update as a party sees it: the population's draws and the rule before and after."""

    draws: np.ndarray
    rule_old: np.ndarray
    rule_new: np.ndarray


class SilentObserver:
    """Records what ``party`` receives over a FedCEM channel and cuts it into updates.

    It knows only the public configuration (rule size, population) and ``rule``, the party's
    current rule (mean and spread, concatenated) when it starts watching, between populations:
    then come the draws of each training episode until a population is complete, then the next
    rule. It watches the channel's deliveries to ``party`` and changes nothing.
    """

    def __init__(
        self, channel: Channel, party: str, *, rule: np.ndarray, size: int, population: int
    ) -> None:
        self.party, self.size, self.population = party, int(size), int(population)
        self.rule = np.asarray(rule, dtype=np.float64).copy()
        self.pending: list[np.ndarray] = []
        self.updates: list[ObservedUpdate] = []
        deliver = channel.transport.deliver

        def watch(message: Any) -> None:
            if message.receiver == self.party:
                self.see(np.asarray(message.payload, dtype=np.float64))
            deliver(message)

        channel.transport.deliver = watch  # type: ignore[method-assign]

    def see(self, payload: np.ndarray) -> None:
        if sum(len(d) for d in self.pending) >= self.population:
            draws = np.concatenate(self.pending)
            self.updates.append(ObservedUpdate(draws, self.rule, payload))
            self.rule, self.pending = payload, []
        else:
            self.pending.append(payload.reshape(-1, self.size))


@dataclasses.dataclass
class UpdateAudit:
    """The attack's result on one update."""

    auc: dict[str, float]
    """ROC AUC of each score (:data:`METHODS`) for the true elite."""
    population: int
    elite: int


class EliteAudit:
    """Attaches to a :class:`~fedrec.agents.fedcem.FedCEMAgent`: ``observer`` (default: the
    first platform without feedback) is the attacker, ``victim`` (default: the first feedback
    platform) the platform whose elite is inferred. The true elite is read inside the victim by
    wrapping its episode end (an auditor's privilege; nothing is sent)."""

    def __init__(
        self, agent: FedCEMAgent, *, observer: str | None = None, victim: str | None = None
    ) -> None:
        self.agent = agent
        self.observer_name = observer or agent.silent_platforms[0]
        self.victim_name = victim or agent.feedback_platforms[0]
        config = agent.config
        seen = agent.platforms[self.observer_name]
        self.observer = SilentObserver(
            agent.channel,
            self.observer_name,
            rule=np.concatenate([seen.mean, seen.std]),
            size=config.size,
            population=config.population,
        )
        self.truth: list[tuple[np.ndarray, np.ndarray]] = []
        platform = agent.platforms[self.victim_name]
        end_episode = platform.end_episode

        def record() -> bool:
            population = [*platform.population]
            if len(platform.draws):
                population.append((platform.draws, platform.returns))
            moved = end_episode()
            if moved:
                thetas = np.concatenate([t for t, _ in population])
                returns = np.concatenate([r for _, r in population])
                self.truth.append((thetas, returns))
            return moved

        platform.end_episode = record  # type: ignore[method-assign]

    def results(self) -> list[UpdateAudit]:
        """The attack on every update so far (the observer's and the victim's populations are
        checked to be the same draws)."""
        config = self.agent.config
        size = config.size
        out = []
        for seen, (thetas, returns) in zip(self.observer.updates, self.truth, strict=False):
            if not np.array_equal(seen.draws, thetas):
                raise RuntimeError("the observer's population is not the victim's")
            members = elite_mask(returns, config.elite_fraction)
            auc = {
                method: roc_auc(
                    elite_scores(
                        seen.draws,
                        seen.rule_old[:size],
                        seen.rule_old[size:],
                        seen.rule_new[:size],
                        seen.rule_new[size:],
                        smoothing=config.smoothing,
                        min_std=config.min_std,
                        method=method,
                    ),
                    members,
                )
                for method in METHODS
            }
            out.append(UpdateAudit(auc, len(returns), int(members.sum())))
        return out


def play_population(
    agent: FedCEMAgent, returns: Callable[[np.ndarray], np.ndarray], *, users: int
) -> None:
    """Episodes of ``users`` synthetic user-episodes through the method's own code until the
    search updates: the server draws one rule per user and sends the draws to every platform,
    each feedback platform records ``returns(draws)`` (n,) as the episode returns, the episode
    ends. No env runs; the messages, the update and its protection are the method's."""
    before = agent.updates
    while agent.updates == before:
        agent.server.broadcast_draws(users)
        for platform in agent.platforms.values():
            platform.receive_draws(users)
        draws = agent.platforms[agent.names[0]].draws
        for name in agent.feedback_platforms:
            agent.platforms[name].record(np.asarray(returns(draws), dtype=np.float64))
        agent.end_episode(users)
