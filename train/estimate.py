"""Estimate a target policy's value from one logged dataset (``fedrec data estimate``).

:func:`estimate_dataset` reads a Minari dataset of :mod:`fedrec.train.collect` with
:func:`fedrec.train.offline.load_offline_dataset` (validated whole, with its per-step logging
propensities), replays the *target* policy on the logged observations to get the target's
propensities of every logged slate (as :func:`fedrec.train.collect.collect` computes the logger's:
``(1 − ε) · policy + ε · random``, each component deterministic or uniform), and runs the
estimators of :mod:`fedrec.eval.ope` that apply:

* one-step episodes: the slate estimators on :class:`~fedrec.eval.ope.LoggedSlates` (slate IPS,
  IIPS, RIPS; PseudoInverse under a uniform logger) and, under a uniform logger, the top-item
  bandit estimators (IPS, DM, DR) on :class:`~fedrec.eval.ope.LoggedBandit` with the quadratic
  reward model of :mod:`fedrec.eval.ope.validation`, cross-fit on the log;
* any episodes: PDIS, WDR (the per-step linear model of :mod:`fedrec.eval.ope.validation`) and MIS
  with the state-distribution ratio set to 1, on :class:`~fedrec.eval.ope.LoggedEpisodes`.

Every estimate is of the expected *episode return*. An estimator that cannot be computed on this
data (e.g. every importance weight of a long episode is 0) is reported with its reason, not
dropped. ``truth_episodes`` rolls the target on the dataset's env (its recorded id and kwargs) for
the Monte Carlo value with its 95% interval. A target that puts probability where the logger puts
none, a dataset without propensities and an unknown or stochastic target are each one
``ValueError``.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np

from fedrec.eval import ope
from fedrec.eval.ope import validation
from fedrec.eval.rollout import EVAL_SEED_OFFSET, evaluate_policy
from fedrec.eval.stats import mean_ci
from fedrec.train.collect import (
    UNIFORM,
    check_deterministic,
    component_propensities,
    policy_components,
)
from fedrec.train.offline import LoggingPolicy, load_offline_dataset, single_env

__all__ = ["ESTIMATORS", "EstimateReport", "estimate_dataset", "parse_target"]

#: Estimator names (as the CLI takes them) -> (display name, what it assumes).
ESTIMATORS: dict[str, tuple[str, str]] = {
    "slate-ips": ("slate IPS", "exact propensities; any reward (one-step episodes)"),
    "iips": ("IIPS", "additive: a slot's reward depends on its own item only"),
    "rips": ("RIPS", "cascade: slot k's reward depends on slots 1..k"),
    "pseudoinverse": ("PseudoInverse", "additive slate reward; uniform logger"),
    "ips": ("IPS", "the reward depends on the top item only; uniform logger"),
    "dm": ("DM", "a quadratic reward model of the top item's score (fit on the log) is right"),
    "dr": ("DR", "the reward depends on the top item only (any reward model)"),
    "pdis": ("PDIS", "exact propensities; any reward"),
    "wdr": ("WDR", "self-normalised (O(1/n) bias); a per-step linear reward model"),
    "mis": ("MIS (ratio 1)", "the target's state distribution is the logger's (ratio set to 1)"),
}
#: What the estimators read from the infos of a collected dataset.
PROPENSITY_INFOS = {
    "propensity_slate": "no logging propensities: estimate from a dataset of `fedrec data collect`",
    "propensity_slot": "no per-slot logging propensities: collect the dataset again",
    "propensity_prefix": "no per-prefix logging propensities: collect the dataset again",
    "slot_rewards": "no per-slot rewards: collect the dataset again",
}


def parse_target(text: str) -> tuple[str, float]:
    """``"top_x"`` -> ``("top_x", 0.0)``; ``"top_x@0.1"`` -> ``("top_x", 0.1)``: the target
    ``(1 − ε) · policy + ε · random``. Raises ValueError for an ε outside [0, 1]."""
    name, _, epsilon = text.partition("@")
    if not name:
        raise ValueError(f"target {text!r} names no policy (POLICY or POLICY@EPSILON)")
    try:
        value = float(epsilon) if epsilon else 0.0
    except ValueError:
        raise ValueError(f"target {text!r}: {epsilon!r} is not a number (POLICY@EPSILON)") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"target {text!r}: epsilon must be in [0, 1], got {value:g}")
    return name, value


@dataclasses.dataclass
class EstimateReport:
    """What :func:`estimate_dataset` found (``as_dict`` for JSON)."""

    dataset: str
    env_id: str
    env_kwargs: dict[str, Any]
    logger: str
    target: str
    episodes: int
    steps: int
    logged: dict[str, float]
    """the logged episodes' mean return and its 95% half-width (the logger's value)"""
    estimates: list[dict[str, Any]]
    """per estimator: estimator, value, std_error, ci_low, ci_high, n, assumption, error"""
    truth: dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        return _finite(dataclasses.asdict(self))


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _uniform_weight(policy: str, epsilon: float, other: str) -> float:
    return (1.0 - epsilon) * (policy == UNIFORM) + epsilon * (other == UNIFORM)


def _episode_rows(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of episode i's step t, clipped to its last step (n, T); mask of the real steps)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    horizon = int(lengths.max())
    steps = np.arange(horizon)
    mask = steps[None, :] < lengths[:, None]
    rows = starts[:, None] + np.minimum(steps[None, :], lengths[:, None] - 1)
    return rows, mask


def _target_proposals(
    name: str, env: Any, seed: int, observations: dict[str, np.ndarray], rows: np.ndarray
) -> np.ndarray | None:
    """The deterministic target component's slate at every (episode, step): (n, T, K), replayed
    on the logged observations (a finished episode repeats its last one); None for 'random'."""
    kind, agent = policy_components(name, env, seed)
    if agent is None:
        return None
    n, horizon = rows.shape
    agent.begin_episodes(np.ones(n, dtype=bool))
    first = {key: value[rows[:, 0]] for key, value in observations.items()}
    check_deterministic(kind, agent, first, None)
    out = []
    for t in range(horizon):
        batch = {key: value[rows[:, t]] for key, value in observations.items()}
        out.append(np.asarray(agent.act_batch(batch, infos=None), dtype=np.int64))
    return np.stack(out, axis=1)


def estimate_dataset(
    path: str | Path,
    target: str,
    *,
    estimators: list[str] | None = None,
    truth_episodes: int = 0,
    seed: int = 0,
    confidence: float = 0.95,
) -> EstimateReport:
    """Estimate ``target`` (``POLICY`` or ``POLICY@EPSILON``) on the dataset at ``path``; see the
    module doc. ``estimators``: keys of :data:`ESTIMATORS` (None: every one that applies; one
    asked for that does not apply is a ValueError). ``seed`` seeds the target's construction and
    the truth's episodes (``EVAL_SEED_OFFSET + seed``, not the dataset's)."""
    if truth_episodes < 0:
        raise ValueError(f"truth_episodes must be >= 0, got {truth_episodes}")
    unknown = [e for e in estimators or [] if e not in ESTIMATORS]
    if unknown:
        raise ValueError(f"unknown estimator {unknown[0]!r}: use one of {', '.join(ESTIMATORS)}")
    name, epsilon = parse_target(target)
    if name != UNIFORM:
        from fedrec.agents.registry import resolve_agent

        resolve_agent(name)  # an unknown policy fails before the dataset is read
    dataset = load_offline_dataset(path, infos=PROPENSITY_INFOS)
    meta = dataset.metadata
    for key in ("policy", "epsilon", "mixture_with"):
        if key not in meta:
            raise ValueError(f"dataset {path}: its metadata has no {key!r} (the logger is unknown)")
    data, infos = dataset.data, dataset.infos
    for key in ("propensity_slate", "propensity_slot", "propensity_prefix"):
        value = infos[key]
        if np.any(value <= 0) or np.any(value > 1 + 1e-9):
            row = int(np.argwhere((value <= 0) | (value > 1 + 1e-9))[0, 0])
            raise ValueError(f"dataset {path}: {key} of logged step {row} is not in (0, 1]")
    slates = data["slate"]
    num_candidates = int(meta.get("num_candidates") or 0)
    assert dataset.lengths is not None
    rows, mask = _episode_rows(dataset.lengths)
    observations = {k[4:]: v for k, v in data.items() if k.startswith("obs/")}
    env = single_env(dataset.env_id, dataset.env_kwargs)
    try:
        num_candidates = num_candidates or int(env.single_action_space.num_candidates)
        proposals = _target_proposals(name, env, seed, observations, rows)
    finally:
        env.close()
    flat = proposals[mask] if proposals is not None else None  # (steps, K), rows in data order
    components = [(1.0 - epsilon, UNIFORM if flat is None else "policy", flat), (epsilon, UNIFORM, None)]  # fmt: skip
    target_p = [np.zeros(len(slates)), np.zeros(slates.shape), np.zeros(slates.shape)]
    for weight, kind, proposed in components:
        if weight > 0:
            parts = component_propensities(kind, proposed, slates, num_candidates)
            for total, part in zip(target_p, parts, strict=True):
                total += weight * part
    logger = str(meta.get("logger") or meta["policy"])
    _check_support(path, logger, meta, name, epsilon, flat, slates, dataset.lengths)

    returns = np.bincount(np.repeat(np.arange(dataset.episodes), dataset.lengths), data["reward"])
    mean, half = mean_ci(returns, confidence)
    one_step = bool(np.all(dataset.lengths == 1))
    uniform_logger = _uniform_weight(meta["policy"], float(meta["epsilon"]), meta["mixture_with"])
    uniform_logger = math.isclose(uniform_logger, 1.0)
    applies = {key: True for key in ("pdis", "wdr", "mis")}
    for key in ("slate-ips", "iips", "rips", "pseudoinverse", "ips", "dm", "dr"):
        applies[key] = one_step
    for key in ("pseudoinverse", "ips", "dm", "dr"):
        applies[key] = applies[key] and uniform_logger
    chosen = estimators or [key for key in ESTIMATORS if applies[key]]
    for key in chosen:
        if not applies[key]:
            if not one_step:
                needs = f"one-step episodes; dataset {path} has up to {dataset.lengths.max()} steps"
            else:
                needs = f"a uniformly random logger; dataset {path} was logged by {logger}"
            raise ValueError(f"estimator {key} needs {needs}")
    inputs = _Inputs(
        slates=slates,
        rewards=data["reward"],
        slot_rewards=infos["slot_rewards"].astype(np.float64),
        behaviour=(infos["propensity_slate"], infos["propensity_slot"], infos["propensity_prefix"]),
        target=tuple(target_p),
        proposals=flat,
        epsilon=epsilon,
        num_candidates=num_candidates,
        scores=validation.item_scores(observations),
        rows=rows,
        mask=mask,
    )
    results = []
    for key in chosen:
        label, assumption = ESTIMATORS[key]
        row: dict[str, Any] = {"estimator": label, "assumption": assumption, "error": None}
        try:
            found = _ESTIMATE[key](inputs, confidence)
            row.update(
                value=found.value,
                std_error=found.std_error,
                ci_low=found.ci_low,
                ci_high=found.ci_high,
                n=found.n,
            )
        except ValueError as error:  # the estimator cannot be computed on this data: say why
            row.update(value=math.nan, std_error=math.nan, ci_low=math.nan, ci_high=math.nan)
            row.update(n=dataset.episodes, error=" ".join(str(error).split()))
        results.append(row)
    truth = None
    if truth_episodes:
        truth = true_value(
            dataset.env_id, dataset.env_kwargs, name, epsilon, truth_episodes, seed, confidence
        )
    return EstimateReport(
        dataset=str(path),
        env_id=dataset.env_id,
        env_kwargs=dict(dataset.env_kwargs),
        logger=logger,
        target=name if epsilon == 0 else f"(1 - {epsilon:g}) * {name} + {epsilon:g} * random",
        episodes=dataset.episodes,
        steps=dataset.transitions,
        logged={"value": float(mean), "ci_half_width": float(half)},
        estimates=results,
        truth=truth,
    )


def _check_support(
    path: str | Path,
    logger: str,
    meta: dict[str, Any],
    name: str,
    epsilon: float,
    proposals: np.ndarray | None,
    slates: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """Refuse a target that can play a slate the logger could not have played: the logger is
    uniform with weight > 0 (full support), or the target must play the logged slate."""
    if _uniform_weight(meta["policy"], float(meta["epsilon"]), meta["mixture_with"]) > 0:
        return
    problem = None
    if proposals is None or epsilon > 0:
        problem = "the target plays random slates"
    elif not np.array_equal(proposals, slates):
        row = int(np.argwhere(np.any(proposals != slates, axis=1))[0, 0])
        starts = np.concatenate([[0], np.cumsum(lengths)])
        episode = int(np.searchsorted(starts, row, side="right") - 1)
        problem = (
            f"the target's slate {proposals[row].tolist()} is not the logged "
            f"{slates[row].tolist()} (episode {episode}, step {row - int(starts[episode])})"
        )
    if problem:
        raise ValueError(
            f"target {name if epsilon == 0 else f'{name}@{epsilon:g}'} has support outside the "
            f"logger's ({logger}, which plays no random slates): {problem}; importance sampling "
            f"cannot estimate it from {path} (collect with --epsilon > 0)"
        )


def true_value(
    env_id: str,
    env_kwargs: dict[str, Any],
    name: str,
    epsilon: float,
    episodes: int,
    seed: int,
    confidence: float = 0.95,
) -> dict[str, float]:
    """The target's Monte Carlo value on the env: mean return of ``episodes`` episodes (seeds
    ``EVAL_SEED_OFFSET + seed`` on), its standard error and ``confidence`` half-width."""
    env = single_env(env_id, env_kwargs)
    target = {"policy": name, "epsilon": epsilon, "mixture_with": UNIFORM}
    policy = LoggingPolicy(env, target, seed=EVAL_SEED_OFFSET + seed)
    env.close()
    summary = evaluate_policy(
        env_id,
        policy,
        episodes=episodes,
        num_envs=min(episodes, 500),
        seed=EVAL_SEED_OFFSET + seed,
        env_kwargs=env_kwargs,
    )
    returns = np.asarray(summary.returns, dtype=np.float64)
    mean, half = mean_ci(returns, confidence)
    se = float(np.std(returns, ddof=1) / math.sqrt(len(returns))) if len(returns) > 1 else math.nan
    return {
        "value": float(mean),
        "std_error": se,
        "ci_half_width": float(half),
        "episodes": int(episodes),
        "seed": EVAL_SEED_OFFSET + seed,
    }


# -------------------------------------------------------------------------------- estimators


@dataclasses.dataclass
class _Inputs:
    slates: np.ndarray  # (steps, K), every logged step in episode order
    rewards: np.ndarray  # (steps,)
    slot_rewards: np.ndarray  # (steps, K)
    behaviour: tuple[np.ndarray, np.ndarray, np.ndarray]  # slate, slot, prefix
    target: tuple[np.ndarray, np.ndarray, np.ndarray]
    proposals: np.ndarray | None  # the deterministic target component's slates (steps, K)
    epsilon: float  # the target's uniform weight (1 for 'random')
    num_candidates: int
    scores: np.ndarray  # (steps, N): the per-candidate score of the validation's reward models
    rows: np.ndarray  # (episodes, T) row of each episode's step
    mask: np.ndarray  # (episodes, T)

    @property
    def uniform_weight(self) -> float:
        return 1.0 if self.proposals is None else self.epsilon

    def slates_data(self) -> ope.LoggedSlates:
        target_marginals = np.full(
            (*self.slates.shape, self.num_candidates), self.uniform_weight / self.num_candidates
        )
        if self.proposals is not None:
            n, size = self.proposals.shape
            target_marginals[np.arange(n)[:, None], np.arange(size), self.proposals] += (
                1.0 - self.epsilon
            )
        return ope.LoggedSlates(
            slates=self.slates,
            rewards=self.slot_rewards,
            behaviour_slate=self.behaviour[0],
            target_slate=self.target[0],
            behaviour_slot=self.behaviour[1],
            target_slot=self.target[1],
            behaviour_prefix=self.behaviour[2],
            target_prefix=self.target[2],
            target_marginals=target_marginals,
            num_items=self.num_candidates,
        )

    def bandit(self) -> tuple[ope.LoggedBandit, np.ndarray]:
        n = len(self.slates)
        target = np.full((n, self.num_candidates), self.uniform_weight / self.num_candidates)
        if self.proposals is not None:
            target[np.arange(n), self.proposals[:, 0]] += 1.0 - self.epsilon
        actions = self.slates[:, 0]
        data = ope.LoggedBandit(
            actions=actions,
            rewards=self.rewards,
            behaviour=np.full((n, self.num_candidates), 1.0 / self.num_candidates),
            target=target,
        )
        return data, validation.bandit_q_hat(self.scores, actions, self.rewards)

    def episodes(self) -> ope.LoggedEpisodes:
        pad = lambda v, fill: np.where(self.mask, v[self.rows], fill)  # noqa: E731
        return ope.LoggedEpisodes(
            rewards=pad(self.rewards, 0.0),
            behaviour=pad(self.behaviour[0], 1.0),
            target=pad(self.target[0], 1.0),
            mask=self.mask,
        )

    def sequential_models(self) -> tuple[np.ndarray, np.ndarray]:
        steps = np.arange(len(self.slates))
        phi = self.scores[steps, self.slates[:, 0]]
        phi_target = self.uniform_weight * self.scores.mean(axis=1)
        if self.proposals is not None:
            phi_target = (
                phi_target + (1.0 - self.epsilon) * self.scores[steps, self.proposals[:, 0]]
            )
        pad = lambda v: np.where(self.mask, v[self.rows], 0.0)  # noqa: E731
        data = {
            "phi": pad(phi),
            "phi_target": pad(phi_target),
            "rewards": pad(self.rewards),
            "mask": self.mask,
        }
        return validation.sequential_q_hat(data, np.arange(len(self.rows)))


def _pseudoinverse(inputs: _Inputs, confidence: float) -> ope.Estimate:
    return ope.pseudoinverse(inputs.slates_data(), logger="uniform", confidence=confidence)


def _bandit(method: str) -> Any:
    def run(inputs: _Inputs, confidence: float) -> ope.Estimate:
        data, q_hat = inputs.bandit()
        if method == "ips":
            return ope.ips(data, confidence=confidence)
        if method == "dm":
            return ope.direct_method(data, q_hat, confidence=confidence)
        return ope.doubly_robust(data, q_hat, confidence=confidence)

    return run


def _wdr(inputs: _Inputs, confidence: float) -> ope.Estimate:
    q, v = inputs.sequential_models()
    return ope.weighted_doubly_robust(inputs.episodes(), q, v, confidence=confidence)


def _mis(inputs: _Inputs, confidence: float) -> ope.Estimate:
    data = inputs.episodes()
    return ope.marginalized_is(data, np.ones(data.rewards.shape), confidence=confidence)


_ESTIMATE = {
    "slate-ips": lambda i, c: ope.slate_ips(i.slates_data(), confidence=c),
    "iips": lambda i, c: ope.independent_ips(i.slates_data(), confidence=c),
    "rips": lambda i, c: ope.reward_interaction_ips(i.slates_data(), confidence=c),
    "pseudoinverse": _pseudoinverse,
    "ips": _bandit("ips"),
    "dm": _bandit("dm"),
    "dr": _bandit("dr"),
    "pdis": lambda i, c: ope.per_decision_is(i.episodes(), confidence=c),
    "wdr": _wdr,
    "mis": _mis,
}


def format_report(report: EstimateReport) -> str:
    """The report as a compact text table (estimator, value, 95% CI, n, assumption)."""
    lines = [
        f"dataset {report.dataset}: {report.episodes} episodes, {report.steps} steps of "
        f"{report.env_id}",
        f"logger: {report.logger}",
        f"target: {report.target}",
        f"logged value (the logger's mean return): {report.logged['value']:.4g} ± "
        f"{report.logged['ci_half_width']:.2g}",
        "",
        f"{'estimator':<14} {'value':>10} {'95% CI':>23} {'n':>7}  assumption",
    ]
    for row in report.estimates:
        if row["error"]:
            lines.append(
                f"{row['estimator']:<14} {'-':>10} {'-':>23} {row['n']:>7}  {row['error']}"
            )
            continue
        interval = f"[{row['ci_low']:.4g}, {row['ci_high']:.4g}]"
        lines.append(
            f"{row['estimator']:<14} {row['value']:>10.4g} {interval:>23} {row['n']:>7}  "
            f"{row['assumption']}"
        )
    if report.truth is not None:
        truth = report.truth
        low = truth["value"] - truth["ci_half_width"]
        high = truth["value"] + truth["ci_half_width"]
        interval = f"[{low:.4g}, {high:.4g}]"
        lines.append(
            f"{'truth (MC)':<14} {truth['value']:>10.4g} {interval:>23} {truth['episodes']:>7}  "
            f"the target rolled on {report.env_id} (seed {truth['seed']})"
        )
    return "\n".join(lines)
