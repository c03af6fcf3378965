"""Validation of the off-policy estimators against the truth, on fedrec's simulators.

For a *setting* (an environment and its kwargs, :data:`SETTINGS`), the target policy π and the
logger μ are Plackett–Luce (softmax without replacement) policies over a per-candidate score
read from the observation (the Choc-vs-Kale feature x; in interest evolution the user's affinity
with the candidate's topic): item j of the candidates left is put next with probability
proportional to ``exp(beta · score_j)``; ``beta = 0`` is the uniformly random slate. Their
propensities (of the slate, of each prefix, of each slot) are therefore exact.

* :func:`true_value` rolls π in the batched env: the Monte Carlo value with its 95% t-interval.
* :func:`log_data` rolls μ once for ``datasets × max(sizes)`` independent episodes (whole
  episodes in the sequential settings, the first step of an episode -- a contextual slate
  bandit -- in the single-step ones) with everything the estimators need.
* :func:`estimate_all` splits the log into ``datasets`` disjoint blocks and runs every estimator
  of the setting's family on the first ``n`` rows of each block, for every ``n`` of ``sizes``.
  The reward models of DM, DR, SNDR, Switch-DR, Cascade-DR and WDR are fit on the logged data
  (two-fold cross-fitting: the model of one half is fit on the other half), never read from the
  simulator.
* :func:`summarise` turns the estimates into bias, its standard error (the spread over data sets
  and the truth's own Monte Carlo error, combined), bias / SE, standard deviation, RMSE and the
  coverage of the estimators' own 95% intervals.

:func:`assumption` says, per setting and estimator, whether the estimator's assumption holds
there (and so whether it should be unbiased); ``docs/ope.md`` ("Validation against the truth")
has the tables of ``fedrec bench ope``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fedrec.eval import ope

#: Episodes per batched env while rolling (memory: a few hundred MB at most).
CHUNK = 50_000


@dataclasses.dataclass(frozen=True)
class Setting:
    """A simulator on which the estimators are validated."""

    env_id: str
    env_kwargs: Mapping[str, Any]
    family: str
    """'slate': single-step slates (the first step of an episode); 'sequential': whole episodes"""
    title: str
    structure: str
    """how the reward depends on the slate (what decides which assumptions hold)"""
    additive: bool = False
    """E[slot reward k | x, s] depends on s_k only (IIPS, PseudoInverse)"""
    cascade: bool = False
    """E[slot reward k | x, s] depends on s_1..s_k only (RIPS, Cascade-DR)"""
    bandit: bool = False
    """the reward depends on the top item only: the bandit estimators apply (action = top item)"""
    max_episode_steps: int | None = None
    multi_platform: bool = False


def _settings(horizon: int) -> dict[str, Setting]:
    from fedrec.envs.choc_kale import FEDSLATE_KWARGS, LIBRARY_DEFAULTS
    from fedrec.registration import LONG_TERM_KWARGS, USER_TYPES_KWARGS

    return {
        "first-slot": Setting(
            "fedrec/ChocKale-v0",
            dict(LIBRARY_DEFAULTS),
            "slate",
            "ChocKale-v0 (first step), the user consumes slot 1",
            "reward = engagement of the item in slot 1: additive and cascade hold",
            additive=True,
            cascade=True,
            bandit=True,
        ),
        "slate-mnl": Setting(
            "fedrec/ChocKaleSlate-v0",
            dict(FEDSLATE_KWARGS),
            "slate",
            "ChocKaleSlate-v0 (first step), multinomial-logit choice",
            "one click per slate, chosen by an MNL over all 3 items: every slot's reward depends "
            "on every item (neither additive nor cascade)",
        ),
        "cascade": Setting(
            "fedrec/ChocKaleCascade-v0",
            {},
            "slate",
            "ChocKaleCascade-v0 (first step), cascade clicks",
            "the user scans from the top and clicks the first attractive item: slot k's reward "
            "depends on slots 1..k (cascade holds, additive does not)",
            cascade=True,
        ),
        "longterm": Setting(
            "fedrec/ChocKaleLongTerm-v0",
            {**LONG_TERM_KWARGS, "time_budget": horizon},
            "sequential",
            f"ChocKaleLongTerm-v0, {horizon} steps",
            "engagement; the slate moves the user's hidden exposure and so later rewards",
        ),
        "user-types": Setting(
            "fedrec/ChocKaleUserTypes-v0",
            {**USER_TYPES_KWARGS, "time_budget": horizon},
            "sequential",
            f"ChocKaleUserTypes-v0, {horizon} steps",
            "as longterm, with a hidden user type (tau 0 or 0.1) per episode",
        ),
        "multi-platform": Setting(
            "fedrec/ChocKaleMultiPlatform-v0",
            {"feedback": (True, True), "time_budget": 2 * horizon},
            "sequential",
            f"ChocKaleMultiPlatform-v0, 2 platforms, {horizon} joint steps",
            "one user on two platforms with a shared state; the joint action is both slates, the "
            "reward both platforms' engagement",
            multi_platform=True,
        ),
        "interest-evolution": Setting(
            "fedrec/InterestEvolution-v0",
            {},
            "sequential",
            f"InterestEvolution-v0, first {horizon} steps",
            "watch time; a click moves the user's interest in the watched topic",
            max_episode_steps=horizon,
        ),
        "first-slot-k5": Setting(
            "fedrec/ChocKale-v0",
            {**LIBRARY_DEFAULTS, "num_candidates": 7, "slate_size": 5},
            "slate",
            "ChocKale-v0 (first step), slates of 5 out of 7, the user consumes slot 1",
            "as first-slot with 2,520 possible slates instead of 720",
            additive=True,
            cascade=True,
            bandit=True,
        ),
        "cascade-k5": Setting(
            "fedrec/ChocKaleCascade-v0",
            {"num_candidates": 7, "slate_size": 5},
            "slate",
            "ChocKaleCascade-v0 (first step), slates of 5 out of 7, cascade clicks",
            "as cascade with 2,520 possible slates instead of 720",
            cascade=True,
        ),
    }


#: The settings at the default horizon (5 steps); :func:`settings` for another.
SETTINGS: dict[str, Setting] = _settings(5)


def settings(horizon: int) -> dict[str, Setting]:
    """The settings with sequential episodes of ``horizon`` steps."""
    if horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {horizon}")
    return _settings(horizon)


SLATE_ESTIMATORS = ("slate IPS", "IIPS", "RIPS", "PseudoInverse", "Cascade-DR")
BANDIT_ESTIMATORS = ("IPS", "SNIPS", "DM", "DR", "SNDR", "Switch-DR")
SEQUENTIAL_ESTIMATORS = ("PDIS", "WDR", "MIS (ratio 1)")
#: Switch-DR's weight threshold in the bandit rows.
SWITCH_THRESHOLD = 2.0


def estimators_of(setting: Setting) -> tuple[str, ...]:
    if setting.family == "sequential":
        return SEQUENTIAL_ESTIMATORS
    return SLATE_ESTIMATORS + (BANDIT_ESTIMATORS if setting.bandit else ())


def assumption(setting: Setting, estimator: str) -> tuple[str, str]:
    """``(expect, why)``: expect is 'unbiased' (its assumption holds), 'consistent' (O(1/n) bias
    by construction: self-normalised), 'biased' (its assumption fails here) or 'model' (unbiased
    only if the fitted reward model is right)."""
    holds = {
        "slate IPS": (True, "no assumption on the reward"),
        "IPS": (True, "exact propensities"),
        "DR": (True, "exact propensities (any reward model)"),
        "PDIS": (True, "exact propensities"),
        "IIPS": (setting.additive, "slot reward depends on its own item only"),
        "PseudoInverse": (setting.additive, "additive slate reward"),
        "RIPS": (setting.cascade, "cascade: slot k depends on slots 1..k"),
        "Cascade-DR": (setting.cascade, "cascade: slot k depends on slots 1..k"),
    }
    if estimator in holds:
        ok, why = holds[estimator]
        return ("unbiased" if ok else "biased"), why
    if estimator in ("SNIPS", "SNDR", "WDR"):
        return "consistent", "self-normalised: O(1/n) bias"
    if estimator in ("DM", "Switch-DR"):
        return "model", "a quadratic reward model of the top item's feature, fit on the log"
    if estimator == "MIS (ratio 1)":
        return "biased", "the state-distribution ratio is unknown and set to 1"
    raise ValueError(f"unknown estimator {estimator!r}")


# -------------------------------------------------------------------------------- policies


def sample_slates(
    rng: np.random.Generator, scores: np.ndarray, beta: float, size: int
) -> np.ndarray:
    """Plackett–Luce slates (B, size) over (B, N) scores with logits ``beta · score`` (the
    Gumbel top-k trick: exact sampling without replacement)."""
    keys = beta * scores + rng.gumbel(size=scores.shape)
    return np.argsort(-keys, axis=1, kind="stable")[:, :size]


def prefix_probabilities(scores: np.ndarray, slates: np.ndarray, beta: float) -> np.ndarray:
    """``P(s_{1:k})`` (B, K) of each slate's top-k prefix under Plackett–Luce(beta)."""
    logits = beta * scores.astype(np.float64)
    logits = logits - logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    left = weights.sum(axis=1)
    out = np.empty(slates.shape)
    probability = np.ones(len(scores))
    rows = np.arange(len(scores))
    for k in range(slates.shape[1]):
        chosen = weights[rows, slates[:, k]]
        probability = probability * chosen / left
        left = left - chosen
        out[:, k] = probability
    return out


def top_probabilities(scores: np.ndarray, beta: float) -> np.ndarray:
    """``P(a_1 = j)`` (B, N): the softmax of ``beta · score``."""
    logits = beta * scores.astype(np.float64)
    logits = logits - logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)


#: Up to this many ordered slates the slot marginals are summed over an enumeration; above it, a
#: dynamic programme over the sets of items placed above (both exact).
ENUMERATION_LIMIT = 1000


def slot_marginals(scores: np.ndarray, beta: float, size: int, chunk: int = 5000) -> np.ndarray:
    """``P(a_k = j)`` (B, K, N) under Plackett–Luce(beta), exact: summed over the enumerated
    ordered slates (chunks of rows) when there are at most :data:`ENUMERATION_LIMIT`, else by
    :func:`_slot_marginals_by_sets`."""
    n, num_items = scores.shape
    if math.perm(num_items, size) > ENUMERATION_LIMIT:
        return _slot_marginals_by_sets(scores, beta, size)
    all_slates = ope.enumerate_slates(num_items, size)
    out = np.empty((n, size, num_items))
    for start in range(0, n, chunk):
        part = scores[start : start + chunk].astype(np.float64)
        weights = np.exp(beta * (part - part.max(axis=1, keepdims=True)))
        probability = ope.plackett_luce_slate_probabilities(weights, all_slates)
        out[start : start + chunk] = ope.slot_marginals(all_slates, probability, num_items)
    return out


def _slot_marginals_by_sets(scores: np.ndarray, beta: float, size: int) -> np.ndarray:
    """The slot marginals by a dynamic programme over the set S of items in the slots above:
    ``P(S) = Σ_{i∈S} P(S∖{i}) w_i / (W − w(S∖{i}))`` and
    ``P(a_{|S|+1} = j) = Σ_{S ∌ j} P(S) w_j / (W − w(S))``."""
    n, num_items = scores.shape
    logits = beta * scores.astype(np.float64)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    total = weights.sum(axis=1)
    out = np.zeros((n, size, num_items))
    layer = {0: (np.ones(n), total)}  # bitmask of S -> (P(S is the set above), W − w(S))
    for k in range(size):
        following: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for mask, (probability, left) in layer.items():
            for j in range(num_items):
                if mask >> j & 1:
                    continue
                step = probability * weights[:, j] / left
                out[:, k, j] += step
                if k + 1 < size:
                    key = mask | 1 << j
                    if key in following:
                        following[key][0][:] += step
                    else:
                        following[key] = (step.copy(), left - weights[:, j])
        layer = following
    return out


# -------------------------------------------------------------------------------- rollouts


def _make_env(setting: Setting, num: int) -> Any:
    import gymnasium as gym

    import fedrec.registration as registration

    if setting.multi_platform:
        return registration.batched_entry_point(setting.env_id)(num, **setting.env_kwargs)
    extra = {}
    if setting.max_episode_steps is not None:
        extra["max_episode_steps"] = setting.max_episode_steps
    return gym.make_vec(setting.env_id, num_envs=num, **setting.env_kwargs, **extra)


def item_scores(observation: Mapping[str, np.ndarray]) -> np.ndarray:
    """Per-candidate scores (B, N): the feature, or the user's affinity with the topic."""
    candidates = np.asarray(observation["candidates"], dtype=np.float64)
    if candidates.shape[-1] == 1:
        return candidates[..., 0]
    return np.einsum("bnk,bk->bn", candidates, np.asarray(observation["user"], np.float64))


def _seeds(seed: int, *key: int) -> tuple[int, np.random.Generator]:
    sequence = np.random.SeedSequence([seed, *key])
    env_seed, policy_seed = sequence.generate_state(2)
    return int(env_seed), np.random.default_rng(int(policy_seed))


def rollout(
    setting: Setting,
    beta: float,
    count: int,
    seed: int,
    *,
    target_beta: float | None = None,
    chunk: int = CHUNK,
) -> dict[str, np.ndarray]:
    """Roll ``count`` episodes (the first step only for a 'slate' setting) with
    Plackett–Luce(``beta``) and return per-episode arrays.

    Always ``returns`` (count,). With ``target_beta`` (logging), also what the estimators need:
    'slate' settings: ``scores`` (n, N), ``slates`` (n, K), ``slot_rewards`` (n, K);
    'sequential': ``rewards``, ``mask``, ``behaviour`` / ``target`` (the joint slate's
    probability under μ and π), ``phi`` (the logged top items' mean score) and ``phi_target``
    (its expectation under π), all (n, T).
    """
    parts: list[dict[str, np.ndarray]] = []
    done_count = 0
    index = 0
    while done_count < count:
        size = min(chunk, count - done_count)
        env_seed, rng = _seeds(seed, index)
        part = _roll_chunk(setting, beta, size, env_seed, rng, target_beta)
        parts.append(part)
        done_count += size
        index += 1
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def _roll_chunk(
    setting: Setting,
    beta: float,
    size: int,
    env_seed: int,
    rng: np.random.Generator,
    target_beta: float | None,
) -> dict[str, np.ndarray]:
    env = _make_env(setting, size)
    log = target_beta is not None
    if setting.multi_platform:
        observations, _ = env.reset(seed=env_seed)
        agents = list(env.possible_agents)
        slate_size = env.params.slate_size
    else:
        observations, _ = env.reset(seed=env_seed)
        agents = [None]
        slate_size = int(env.single_action_space.shape[-1])
    returns = np.zeros(size)
    active = np.ones(size, dtype=bool)
    steps: list[dict[str, np.ndarray]] = []
    while active.any():
        views = [observations[a] for a in agents] if setting.multi_platform else [observations]
        scores = [item_scores(v) for v in views]
        slates = [sample_slates(rng, s, beta, slate_size) for s in scores]
        if setting.multi_platform:
            observations, rewards, terminated, truncated, infos = env.step(
                dict(zip(agents, slates, strict=True))
            )
            reward = sum(np.asarray(rewards[a], np.float64) for a in agents)
            terminated = np.asarray(terminated[agents[0]])
            truncated = np.asarray(truncated[agents[0]])
            clicked = None
        else:
            observations, reward, terminated, truncated, infos = env.step(slates[0])
            reward = np.asarray(reward, np.float64)
            clicked = np.asarray(infos["clicked_slot"])
        reward = np.where(active, reward, 0.0)
        returns += reward
        if log:
            step = {"rewards": reward, "mask": active.copy()}
            if setting.family == "slate":
                slot_rewards = np.zeros((size, slate_size))
                hit = clicked >= 0
                slot_rewards[np.flatnonzero(hit), clicked[hit]] = reward[hit]
                step.update(scores=scores[0], slates=slates[0], slot_rewards=slot_rewards)
            else:
                mu = np.prod([prefix_probabilities(s, a, beta)[:, -1] for s, a in
                              zip(scores, slates, strict=True)], axis=0)  # fmt: skip
                pi = np.prod([prefix_probabilities(s, a, target_beta)[:, -1] for s, a in
                              zip(scores, slates, strict=True)], axis=0)  # fmt: skip
                top = [s[np.arange(size), a[:, 0]] for s, a in zip(scores, slates, strict=True)]
                expected = [np.sum(top_probabilities(s, target_beta) * s, axis=1) for s in scores]
                step.update(
                    behaviour=np.where(active, mu, 1.0),
                    target=np.where(active, pi, 1.0),
                    phi=np.where(active, np.mean(top, axis=0), 0.0),
                    phi_target=np.where(active, np.mean(expected, axis=0), 0.0),
                )
            steps.append(step)
        active &= ~(np.asarray(terminated) | np.asarray(truncated))
        if setting.family == "slate":
            break
    if hasattr(env, "close"):
        env.close()
    out = {"returns": returns}
    if log:
        if setting.family == "slate":
            out.update({k: v for k, v in steps[0].items() if k not in ("mask", "rewards")})
        else:
            for key in steps[0]:
                out[key] = np.stack([s[key] for s in steps], axis=1)
    return out


def true_value(setting: Setting, target_beta: float, episodes: int, seed: int) -> dict[str, float]:
    """The target's value by Monte Carlo: mean return of ``episodes`` rollouts, its standard
    error and 95% t-interval half-width."""
    returns = rollout(setting, target_beta, episodes, seed)["returns"]
    from fedrec.eval.stats import mean_ci

    mean, half = mean_ci(returns)
    return {
        "value": float(mean),
        "std_error": float(np.std(returns, ddof=1) / math.sqrt(len(returns))),
        "ci_half_width": float(half),
        "episodes": int(episodes),
    }


# -------------------------------------------------------------------------------- reward models


def _quadratic(x: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(x), x, x * x], axis=-1)


def _fit(features: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Least-squares coefficients (a tiny ridge keeps a degenerate fold finite)."""
    if len(targets) == 0:
        return np.zeros(features.shape[-1])
    gram = features.T @ features + 1e-6 * np.eye(features.shape[-1])
    return np.linalg.solve(gram, features.T @ targets)


def _folds(n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Two-fold cross-fitting: (fit rows, predict rows) -- even and odd rows."""
    rows = np.arange(n)
    even, odd = rows[rows % 2 == 0], rows[rows % 2 == 1]
    return [(odd, even), (even, odd)] if n > 1 else [(rows, rows)]


def bandit_q_hat(scores: np.ndarray, actions: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """``q̂(x_i, a)`` (n, A): a quadratic in the item's score, cross-fit on the logged rows."""
    q = np.empty(scores.shape)
    chosen = scores[np.arange(len(actions)), actions]
    for fit_rows, rows in _folds(len(actions)):
        coef = _fit(_quadratic(chosen[fit_rows]), rewards[fit_rows])
        q[rows] = _quadratic(scores[rows]) @ coef
    return q


def cascade_q_hat(
    scores: np.ndarray, slates: np.ndarray, slot_rewards: np.ndarray, target_beta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Cascade-DR's ``(Q̂, V̂)`` (n, K) from a cascade model fit on the log (cross-fit).

    Fit on the slots that were reached (no reward above): the click probability p̂(x) and the
    reward of a click m̂(x) (quadratics of the item's score), and the mean reward below a
    reached slot with no click, c_k. ``Q̂_k(s_{1:k}) = g_k (p̂ m̂(s_k) + (1 − p̂(s_k)) c_k)`` with
    ``g_k = Π_{l<k} (1 − p̂(s_l))``; ``V̂_k`` is its expectation over the target's item at slot k
    given the logged items above (exact: the Plackett–Luce conditional).
    """
    n, size = slates.shape
    rows = np.arange(n)
    x = scores[rows[:, None], slates]  # (n, K)
    clicked = slot_rewards != 0
    reached = np.cumsum(np.concatenate([np.zeros((n, 1)), clicked[:, :-1]], axis=1), axis=1) == 0
    below = np.cumsum(slot_rewards[:, ::-1], axis=1)[:, ::-1] - slot_rewards  # Σ_{l>k} r_l
    q = np.empty((n, size))
    v = np.empty((n, size))
    logits = target_beta * scores
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    for fit_rows, out_rows in _folds(n):
        seen = reached[fit_rows]
        xs, cs, rs = x[fit_rows][seen], clicked[fit_rows][seen], slot_rewards[fit_rows][seen]
        p_coef = _fit(_quadratic(xs), cs.astype(np.float64))
        m_coef = _fit(_quadratic(xs[cs]), rs[cs]) if cs.any() else np.zeros(3)
        cont = np.zeros(size)
        for k in range(size):
            keep = reached[fit_rows, k] & ~clicked[fit_rows, k]
            cont[k] = below[fit_rows][keep, k].mean() if keep.any() else 0.0
        p_all = np.clip(_quadratic(scores[out_rows]) @ p_coef, 0.0, 1.0)  # (m, N)
        m_all = _quadratic(scores[out_rows]) @ m_coef
        s = slates[out_rows]
        sub = np.arange(len(out_rows))
        w = weights[out_rows].copy()
        g = np.ones(len(out_rows))
        for k in range(size):
            # the target's item at slot k given the logged items above (Plackett–Luce)
            conditional = w / w.sum(axis=1, keepdims=True)
            expected_pm = np.sum(conditional * p_all * m_all, axis=1)
            expected_p = np.sum(conditional * p_all, axis=1)
            v[out_rows, k] = g * (expected_pm + (1 - expected_p) * cont[k])
            item = s[:, k]
            p_k = p_all[sub, item]
            q[out_rows, k] = g * (p_k * m_all[sub, item] + (1 - p_k) * cont[k])
            g = g * (1 - p_k)
            w[sub, item] = 0.0
    return q, v


def sequential_q_hat(data: Mapping[str, np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """WDR's ``(Q̂, V̂)`` (n, T), cross-fit: per step a line ``r̂_t(φ) = a_t + b_t φ`` of the
    logged top items' mean score, plus the model's mean value of the later steps under π."""
    phi, phi_t = data["phi"][rows], data["phi_target"][rows]
    rewards, mask = data["rewards"][rows], data["mask"][rows]
    n, horizon = rewards.shape
    q = np.zeros((n, horizon))
    v = np.zeros((n, horizon))
    for fit_rows, out_rows in _folds(n):
        coefs = []
        later = np.zeros(horizon)
        for t in range(horizon):
            alive = mask[fit_rows, t]
            features = np.stack([np.ones(alive.sum()), phi[fit_rows, t][alive]], axis=1)
            coefs.append(_fit(features, rewards[fit_rows, t][alive]))
        means = np.array(
            [
                np.mean(
                    np.where(mask[fit_rows, t], coefs[t][0] + coefs[t][1] * phi_t[fit_rows, t], 0)
                )
                for t in range(horizon)
            ]
        )
        later = np.cumsum(means[::-1])[::-1] - means  # Σ_{t' > t}
        for t in range(horizon):
            a, b = coefs[t]
            q[out_rows, t] = a + b * phi[out_rows, t] + later[t]
            v[out_rows, t] = a + b * phi_t[out_rows, t] + later[t]
    return q, v


# -------------------------------------------------------------------------------- estimation


def log_data(
    setting: Setting,
    *,
    logger_beta: float,
    target_beta: float,
    episodes: int,
    seed: int,
) -> dict[str, np.ndarray]:
    """``episodes`` logged episodes (rows) of μ = PL(logger_beta), with what the estimators of
    π = PL(target_beta) need (for slates also the target's exact slot marginals)."""
    data = rollout(setting, logger_beta, episodes, seed, target_beta=target_beta)
    if setting.family == "slate":
        size = data["slates"].shape[1]
        data["behaviour_prefix"] = prefix_probabilities(data["scores"], data["slates"], logger_beta)
        data["target_prefix"] = prefix_probabilities(data["scores"], data["slates"], target_beta)
        data["target_marginals"] = slot_marginals(data["scores"], target_beta, size)
    return data


def _slate_estimates(
    data: Mapping[str, np.ndarray], rows: np.ndarray, setting: Setting, logger_beta: float,
    target_beta: float,
) -> dict[str, ope.Estimate]:  # fmt: skip
    scores, slates = data["scores"][rows], data["slates"][rows]
    slot_rewards = data["slot_rewards"][rows]
    n, size = slates.shape
    sub = np.arange(n)
    marginals = data["target_marginals"][rows]
    num_items = scores.shape[1]
    behaviour_marginals = (
        np.full((n, size, num_items), 1.0 / num_items) if logger_beta == 0.0 else None
    )
    if behaviour_marginals is None:  # only the uniform logger's slot marginals are closed form
        behaviour_marginals = slot_marginals(scores, logger_beta, size)
    slot = lambda m: m[sub[:, None], np.arange(size)[None, :], slates]  # noqa: E731
    logged = ope.LoggedSlates(
        slates=slates,
        rewards=slot_rewards,
        behaviour_slate=data["behaviour_prefix"][rows][:, -1],
        target_slate=data["target_prefix"][rows][:, -1],
        behaviour_slot=slot(behaviour_marginals),
        target_slot=slot(marginals),
        behaviour_prefix=data["behaviour_prefix"][rows],
        target_prefix=data["target_prefix"][rows],
        behaviour_marginals=behaviour_marginals,
        target_marginals=marginals,
        num_items=num_items,
    )
    q, v = cascade_q_hat(scores, slates, slot_rewards, target_beta)
    if logger_beta == 0.0:
        pseudo = ope.pseudoinverse(logged, logger="uniform")
    else:
        weights = np.exp(logger_beta * (scores - scores.max(axis=1, keepdims=True)))
        pseudo = ope.pseudoinverse(logged, logger="plackett_luce", logger_weights=weights)
    out = {
        "slate IPS": ope.slate_ips(logged),
        "IIPS": ope.independent_ips(logged),
        "RIPS": ope.reward_interaction_ips(logged),
        "PseudoInverse": pseudo,
        "Cascade-DR": ope.cascade_doubly_robust(logged, q, v),
    }
    if setting.bandit:
        actions = slates[:, 0]
        rewards = slot_rewards.sum(axis=1)
        bandit = ope.LoggedBandit(
            actions=actions,
            rewards=rewards,
            behaviour=behaviour_marginals[:, 0, :],
            target=marginals[:, 0, :],
        )
        q_hat = bandit_q_hat(scores, actions, rewards)
        out.update(
            {
                "IPS": ope.ips(bandit),
                "SNIPS": ope.snips(bandit),
                "DM": ope.direct_method(bandit, q_hat),
                "DR": ope.doubly_robust(bandit, q_hat),
                "SNDR": ope.self_normalized_doubly_robust(bandit, q_hat),
                "Switch-DR": ope.switch_doubly_robust(bandit, q_hat, threshold=SWITCH_THRESHOLD),
            }
        )
    return out


def _sequential_estimates(data: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, Any]:
    episodes = ope.LoggedEpisodes(
        rewards=data["rewards"][rows],
        behaviour=data["behaviour"][rows],
        target=data["target"][rows],
        mask=data["mask"][rows],
    )
    q, v = sequential_q_hat(data, rows)
    return {
        "PDIS": ope.per_decision_is(episodes),
        "WDR": ope.weighted_doubly_robust(episodes, q, v),
        "MIS (ratio 1)": ope.marginalized_is(episodes, np.ones(episodes.rewards.shape)),
    }


def estimate_all(
    setting: Setting,
    data: Mapping[str, np.ndarray],
    *,
    datasets: int,
    sizes: Sequence[int],
    logger_beta: float,
    target_beta: float,
    progress: Callable[[int], None] | None = None,
) -> dict[int, dict[str, dict[str, np.ndarray]]]:
    """``{n: {estimator: {"value", "std_error", "ci_low", "ci_high"}}}``: one entry per data set
    (the first n rows of each of ``datasets`` disjoint blocks of ``max(sizes)`` rows)."""
    block = max(sizes)
    total = len(data["returns"])
    if total < datasets * block:
        raise ValueError(f"need {datasets * block} logged episodes, got {total}")
    out: dict[int, dict[str, dict[str, list[float]]]] = {}
    for n in sizes:
        table: dict[str, dict[str, list[float]]] = {}
        for d in range(datasets):
            rows = np.arange(d * block, d * block + n)
            if setting.family == "slate":
                found = _slate_estimates(data, rows, setting, logger_beta, target_beta)
            else:
                found = _sequential_estimates(data, rows)
            for name, estimate in found.items():
                cells = table.setdefault(name, {k: [] for k in ESTIMATE_FIELDS})
                for key in ESTIMATE_FIELDS:
                    cells[key].append(getattr(estimate, key))
            if progress is not None:
                progress(1)
        out[n] = table
    return {
        n: {name: {k: np.asarray(v) for k, v in cells.items()} for name, cells in table.items()}
        for n, table in out.items()
    }


ESTIMATE_FIELDS = ("value", "std_error", "ci_low", "ci_high")


def summarise(estimates: Mapping[str, np.ndarray], truth: Mapping[str, float]) -> dict[str, float]:
    """Bias, its standard error and bias / SE, std, RMSE and CI coverage of the estimates of
    one (setting, size, estimator) over its data sets. The SE of the bias combines the spread
    over the D data sets (``std / sqrt(D)``) with the truth's Monte Carlo standard error."""
    values = np.asarray(estimates["value"], dtype=np.float64)
    count = len(values)
    mean = float(values.mean())
    std = float(values.std(ddof=1))
    bias = mean - truth["value"]
    bias_se = math.sqrt(std**2 / count + truth["std_error"] ** 2)
    covered = (estimates["ci_low"] <= truth["value"]) & (truth["value"] <= estimates["ci_high"])
    return {
        "datasets": count,
        "mean": mean,
        "bias": bias,
        "bias_se": bias_se,
        "bias_z": bias / bias_se if bias_se > 0 else (0.0 if bias == 0 else math.inf),
        "std": std,
        "rmse": float(np.sqrt(np.mean((values - truth["value"]) ** 2))),
        "relative_rmse": float(np.sqrt(np.mean((values - truth["value"]) ** 2)))
        / abs(truth["value"])
        if truth["value"] != 0
        else math.nan,
        "coverage": float(np.mean(covered)),
    }
