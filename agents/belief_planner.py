"""The belief planner: the model is known, the user's type and exposure are not.

A reference policy for Choc-vs-Kale with hidden user types (``fedrec/ChocKaleUserTypes-v0``). It
knows the env's parameters (:class:`~fedrec.envs.choc_kale_model.ChocKaleParams`), like the
planner, but neither the user's sensitivity tau nor the net exposure e: it tracks the exact
posterior over (tau, e) from what any agent observes (its own slates, the clicks, the observed
engagement, the noisy satisfaction reading) and acts on it. It reads no info key at all, so it
runs with ``infos=None``; it counts each user's steps itself (:meth:`BeliefPlanner.begin_episodes`
resets the count and the belief).

## The filter

The belief b_t(tau, e) is the posterior given the observations up to step t. Per user:

- prior: b_0(tau, e) = p(tau) U(e; -1/(2(1 - beta)), 1/(2(1 - beta))), i.e. the env's
  e_0 = (u - 1/2)/(1 - beta), with p(tau) uniform over the entries of ``user_sensitivities``
  (without hidden types: the one ``sensitivity``, the degenerate case).
- order of events (:mod:`fedrec.envs.choc_kale_sim`): the observation the agent acts on at step
  t carries the response to its previous slate A_{t-1}, whose candidate features it knows: the
  newest row of ``response_click`` (the consumed slot i; a zero row: nothing consumed), the newest
  row of ``response_engagement`` (the observed engagement g), and ``user``, a noisy reading y_t of
  the satisfaction *after* that step. The update is

      b_t(tau, e') ∝ p(y_t | tau, e') ∫ p(e' | e, c_i) p(g | tau, e, c_i) b_{t-1}(tau, e) de.

  The MNL probability of slot i, v_i / (v_null + sum_j v_j) with v_j = exp(a - x_j), does not
  depend on (tau, e), so it cancels. At the first step only the reading of e_0 is folded in.
- engagement, with the satisfaction s = sigmoid(tau e) *before* the step and the consumed item's
  choc-ness c: log g ~ N((c mu_c + (1 - c) mu_k) s, c sigma_c + (1 - c) sigma_k). An engagement
  observed at ``engagement_clip`` only says g >= clip: a censored likelihood (the upper tail).
- transition: e' = beta e - 2 (c - 1/2) + N(0, eta^2) for the consumed item; nothing consumed:
  e' = e.
- reading: y = sigmoid(tau e') + sd z, z a standard normal truncated at +-10
  (``ChocKaleModel.observe_satisfaction``). The truncation is symmetric in z, so its normaliser
  is the same for every state and only the support |y - s| <= 10 sd remains.

Numerics: a histogram over (types x ``exposure_points`` cells of the planner's exposure range,
the two end cells unbounded). The transition integrates the Gaussian over each cell
(:func:`scipy.special.ndtr`); the likelihoods are evaluated at the cell centres, in log space.
The filter is exact up to this discretisation: in the FedSlate variants a cell is 0.09 wide,
against an innovation of 0.05 and a posterior spread that stays above about 0.1, and halving or
doubling the grid changes the return on ``ChocKaleUserTypes-v0`` by less than 0.3.

## Acting: QMDP on the exact posterior

The Bayes-optimal policy of this POMDP (a policy of the whole belief) is intractable. The belief
planner uses QMDP: it scores each candidate x by its posterior-weighted planner item value and
the null item by the posterior-weighted planner value,

    Q(b, x) = sum_{tau, e} b(tau, e) Qbar_tau(t, e, x),
    Q_null(b) = sum_{tau, e} b(tau, e) V_tau(t - 1, e),

with each type's value tables from :mod:`fedrec.agents.planner` and the remaining budget t from
its own step counter, then picks the slate with the planner's exact assortment optimisation.
The MNL denominator does not depend on the state, so this slate maximises the posterior
expectation of the planner's slate value. The item values are tabulated once per type on the
exposure cells and a uniform feature grid (``feature_points``) and interpolated linearly in the
feature (relative error below 1e-4).

QMDP acts as if the state were revealed after this step, so it never pays to learn the type.
It is a feasible policy that uses only observable information, so its expected return is a
**lower bound** on the Bayes-optimal value of the hidden-type problem, and the planner (told the
type and the exposure) is an **upper bound**: belief planner <= Bayes-optimal <= planner, up to
the planner's own discretisation. The planner's lead over the belief planner is therefore an
upper bound on the value of knowing the user's type and exposure (docs/longterm.md, "The belief
planner"). ``map_type=True`` is the certainty-equivalent variant: it acts on the most probable
type (with that type's exposure posterior) instead of weighting by the type posterior.

## Several platforms: :class:`JointBeliefPlanner`

On a multi-platform env (:class:`~fedrec.envs.multi_platform.ChocKaleMultiPlatformBatchEnv`) one
user visits the platforms in order every joint step, each visit a step of the same dynamics with
one shared budget. The joint belief planner is the centralised filter of all platforms: it sees
every platform's observations and slates. Per joint step, in the env's order of events (the
observations are built after the last visit of a step):

- each visit of the previous joint step, in platform order: a platform with feedback folds in its
  newest response as above (engagement at the satisfaction before *its* visit, then the consumed
  item's transition); a platform without feedback never reveals the consumed item, so its visit
  is the choice mixture sum_i p_i T_{c_i} b + p_null b over its slate, with the MNL
  probabilities p of the slate's items and the null item (they do not depend on the state) and
  no engagement likelihood;
- then every platform's reading ``user``: all are of the satisfaction after the step's last
  visit (at the start: of e_0), with independent noise, so their likelihoods multiply.

All platforms act at once, before any visit of the step: platform k scores its candidates by
QMDP with the remaining budget T - (visits so far) on the belief predicted through the slates of
platforms 0..k-1 (their choice mixtures), as the joint planner plans on the expected exposure.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import sparse, special

from fedrec.agents.assortment import optimal_slates
from fedrec.agents.base import Info, Observation, SlateAgent
from fedrec.agents.oracles import ValueGreedyPolicy, env_params
from fedrec.agents.planner import (
    DEFAULT_PLANNER_CONFIG,
    PlannerConfig,
    exposure_grid,
    value_table,
)
from fedrec.envs.choc_kale_model import NOISE_TRUNCATION, ChocKaleModel, ChocKaleParams

#: The transition kernel is integrated over this many innovation standard deviations each side
#: (the tails beyond go to the outermost cells, so no mass is lost).
KERNEL_REACH = 6.0
#: Cells with less than this fraction of a user's largest cell are not moved by a transition.
NEGLIGIBLE_MASS = 1e-12


@dataclasses.dataclass(frozen=True)
class BeliefPlannerConfig:
    """Discretisation of the filter and of the value tables, and how the posterior is used."""

    exposure_points: int = dataclasses.field(
        default=241, metadata={"help": "exposure cells of the filter's grid (per user type)"}
    )
    feature_points: int = dataclasses.field(
        default=201,
        metadata={"help": "feature grid on which each type's planner item values are tabulated"},
    )
    map_type: bool = dataclasses.field(
        default=False,
        metadata={"help": "act on the most probable type only (certainty equivalence)"},
    )

    def __post_init__(self) -> None:
        for name in ("exposure_points", "feature_points"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 3:
                raise ValueError(f"{name} must be an integer >= 3, got {value!r}")
        if not isinstance(self.map_type, bool):
            raise ValueError(f"map_type must be True or False, got {self.map_type!r}")


DEFAULT_BELIEF_CONFIG = BeliefPlannerConfig()


def sensitivities_of(params: ChocKaleParams) -> tuple[float, ...]:
    """The user types a belief ranges over: ``user_sensitivities`` (each entry equally likely, so
    a repeated value counts twice, as in the env's draw), else the one ``sensitivity``."""
    if params.user_sensitivities is not None:
        return tuple(params.user_sensitivities)
    return (float(params.sensitivity),)


def initial_belief(params: ChocKaleParams, grid: np.ndarray) -> np.ndarray:
    """The prior over (type, cell): uniform type x the mass of each cell under
    e_0 ~ U(-1/(2(1 - beta)), 1/(2(1 - beta))); shape (types, cells)."""
    half = 0.5 / (1.0 - params.memory_discount)
    step = grid[1] - grid[0]
    lower = np.maximum(grid - step / 2, -half)
    upper = np.minimum(grid + step / 2, half)
    mass = np.clip(upper - lower, 0.0, None)
    types = len(sensitivities_of(params))
    return np.tile(mass / mass.sum(), (types, 1)) / types


@dataclasses.dataclass(frozen=True)
class QmdpTables:
    """Each type's planner values on the filter's cells, for every remaining budget t = 1..T.

    ``items[t - 1, k * E + j, m]`` = Qbar_tau_k(t, e_j, x_m) on the feature grid x_m, and
    ``null[t - 1, k * E + j]`` = V_tau_k(t - 1, e_j), so that a posterior flattened to
    (types * cells) weights them with one matrix product.
    """

    features: np.ndarray
    items: np.ndarray
    null: np.ndarray


def interpolation_matrix(grid: np.ndarray, points: np.ndarray) -> sparse.csr_matrix:
    """The sparse (points, grid) matrix of linear interpolation on a uniform ``grid``, clamped
    at its ends (the planner's interpolation), so that ``matrix @ table`` interpolates every
    column of ``table`` at once."""
    step = grid[1] - grid[0]
    position = np.clip((points - grid[0]) / step, 0.0, len(grid) - 1.0)
    low = np.minimum(position.astype(np.int64), len(grid) - 2)
    frac = position - low
    rows = np.arange(len(points))
    return sparse.csr_matrix(
        (np.concatenate([1.0 - frac, frac]), (np.tile(rows, 2), np.concatenate([low, low + 1]))),
        shape=(len(points), len(grid)),
    )


@functools.lru_cache(maxsize=4)
def qmdp_tables(
    params: ChocKaleParams,
    exposure_points: int,
    feature_points: int,
    planner_config: PlannerConfig = DEFAULT_PLANNER_CONFIG,
) -> QmdpTables:
    """Tabulate the per-type planner values on the filter grid (cached per argument set).

    The item values are those of :meth:`fedrec.agents.planner.ValueTable.item_values` (expected
    engagement plus the Gauss-Hermite expectation of the interpolated V_{t-1}); the points at
    which V is interpolated do not depend on t, so one sparse matrix does every t at once.
    """
    grid = exposure_grid(params, exposure_points)
    features = np.linspace(0.0, 1.0, feature_points)
    taus = sensitivities_of(params)
    budget, cells = params.time_budget, len(grid)
    items = np.empty((budget, len(taus) * cells, feature_points))
    null = np.empty((budget, len(taus) * cells))
    nodes, node_weights = np.polynomial.hermite_e.hermegauss(planner_config.quadrature_points)
    model = ChocKaleModel(params)
    chocness = model.chocness(features)
    drift = params.memory_discount * grid[:, None] - 2.0 * (chocness[None, :] - 0.5)  # (E, X)
    for k, tau in enumerate(taus):
        table = value_table(
            dataclasses.replace(params, sensitivity=tau, user_sensitivities=None), planner_config
        )
        future = sum(  # (E * X, planner grid): E_eps[V(drift + eps)] as one linear map of V
            weight
            / node_weights.sum()
            * interpolation_matrix(table.grid, (drift + params.innovation_stddev * node).ravel())
            for node, weight in zip(nodes, node_weights, strict=True)
        )
        following = table.values[:budget].T  # column t - 1 is V_{t-1}
        reward = model.expected_engagement(model.satisfaction(grid, tau)[:, None], chocness)
        rows = slice(k * cells, (k + 1) * cells)
        items[:, rows] = reward + (future @ following).T.reshape(budget, cells, feature_points)
        null[:, rows] = (interpolation_matrix(table.grid, grid) @ following).T
    return QmdpTables(features=features, items=items, null=null)


def decision_weights(belief: np.ndarray, *, map_type: bool) -> np.ndarray:
    """What QMDP averages the values over: the posterior (U, types, cells), or with ``map_type``
    the posterior conditioned on each user's most probable type."""
    if not map_type:
        return belief
    best = belief.sum(axis=2).argmax(axis=1)
    keep = np.arange(belief.shape[1])[None, :] == best[:, None]
    weights = belief * keep[:, :, None]
    return weights / weights.sum(axis=(1, 2), keepdims=True)


def qmdp_values(
    tables: QmdpTables, weights: np.ndarray, budget: np.ndarray, features: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """QMDP values of the candidates ``features`` (U, N) and of the null item (U,): each type's
    planner values at remaining budget ``budget`` (U,), in 1..T, averaged over ``weights``
    (U, types, cells), interpolated linearly in the feature."""
    users = len(features)
    weights = weights.reshape(users, -1)
    on_grid = np.empty((users, len(tables.features)))
    null_value = np.empty(users)
    for t in np.unique(budget):
        rows = budget == t
        on_grid[rows] = weights[rows] @ tables.items[t - 1]
        null_value[rows] = weights[rows] @ tables.null[t - 1]
    position = np.clip(features, 0.0, 1.0) * (len(tables.features) - 1)
    low = np.minimum(position.astype(np.int64), len(tables.features) - 2)
    frac = position - low
    left = np.take_along_axis(on_grid, low, axis=1)
    right = np.take_along_axis(on_grid, low + 1, axis=1)
    return left + frac * (right - left), null_value


class BeliefFilter:
    """The grid Bayes filter over (type, exposure) for a batch of users (see the module text).

    Stateless apart from its parameters and grid: every method takes and returns beliefs of shape
    (users, types, cells) that sum to 1 per user.
    """

    def __init__(self, params: ChocKaleParams, exposure_points: int) -> None:
        self.params = params
        self.model = ChocKaleModel(params)
        self.taus = np.array(sensitivities_of(params), dtype=np.float64)
        self.grid = exposure_grid(params, exposure_points)
        self.step = float(self.grid[1] - self.grid[0])
        self.prior = initial_belief(params, self.grid)
        #: satisfaction sigma(tau e) at every (type, cell)
        self.satisfaction = self.model.satisfaction(self.grid[None, :], self.taus[:, None])
        eta = params.innovation_stddev
        self._width = int(np.ceil(2 * KERNEL_REACH * eta / self.step)) + 1 if eta > 0 else 2
        # A reading within this much of 10 sigma still counts as inside the truncation: a cell
        # centre's satisfaction differs from its interior's by up to half a cell's change.
        self._support_slack = 0.5 * self.step * float(np.abs(self.taus).max()) / 4.0 + 1e-6

    # -- likelihoods ----------------------------------------------------------------------------
    def engagement_loglik(
        self, chocness: np.ndarray, engagement: np.ndarray, censored: np.ndarray
    ) -> np.ndarray:
        """log p(observed engagement | type, pre-update cell) for consumed items: (U, types, cells).

        ``censored`` marks engagements observed at the clip (the likelihood is then
        P(log g >= log clip), the log-normal's upper tail).
        """
        loc, scale = self.model.engagement_params(self.satisfaction[None], chocness[:, None, None])
        scale = np.maximum(scale, 1e-12)
        z = (np.log(np.maximum(engagement, 1e-300))[:, None, None] - loc) / scale
        return np.where(censored[:, None, None], special.log_ndtr(-z), -0.5 * z * z)

    def reading_loglik(self, reading: np.ndarray) -> np.ndarray:
        """log p(satisfaction reading | type, cell): a normal of sd ``satisfaction_noise_stddev``
        truncated at 10 sd around sigma(tau e) (only its support depends on the state)."""
        sigma = max(float(self.params.satisfaction_noise_stddev or 0.0), 1e-12)
        gap = reading[:, None, None] - self.satisfaction[None]
        inside = np.abs(gap) <= NOISE_TRUNCATION * sigma + self._support_slack
        return np.where(inside, -0.5 * (gap / sigma) ** 2, -np.inf)

    @staticmethod
    def condition(belief: np.ndarray, loglik: np.ndarray) -> np.ndarray:
        """Bayes' rule in log space; a user whose observation no cell explains keeps its belief
        (only possible through the grid's approximation, never under the exact model)."""
        with np.errstate(divide="ignore"):
            log_post = np.log(belief) + loglik
        top = log_post.max(axis=(1, 2), keepdims=True)
        explained = np.isfinite(top)
        weights = np.exp(log_post - np.where(explained, top, 0.0))
        weights /= np.maximum(weights.sum(axis=(1, 2), keepdims=True), 1e-300)
        return np.where(explained, weights, belief)

    # -- dynamics -------------------------------------------------------------------------------
    def transition(self, belief: np.ndarray, chocness: np.ndarray) -> np.ndarray:
        """Push each user's belief through e' = beta e - 2 (c - 1/2) + N(0, eta^2) (the consumed
        item's c per user), integrating the Gaussian over the cells.

        Only cells holding more than :data:`NEGLIGIBLE_MASS` of a user's largest cell are moved
        (the rest is dropped and the belief renormalised): the posterior soon occupies a few
        dozen of the cells, which makes this several times faster than moving them all.
        """
        users, types, cells = belief.shape
        p, grid, h = self.params, self.grid, self.step
        per_cell = belief.max(axis=1)  # (U, E)
        user, cell = np.nonzero(per_cell > NEGLIGIBLE_MASS * per_cell.max(axis=1, keepdims=True))
        mean = p.memory_discount * grid[cell] + 1.0 - 2.0 * chocness[user]  # one per moved cell
        eta, width = p.innovation_stddev, self._width
        if eta > 0:
            lower_edge = grid[0] - h / 2  # the lower edge of cell 0 (treated as -inf)
            first = np.floor((mean - KERNEL_REACH * eta - lower_edge) / h).astype(np.int64)
            # edge i of the band is the lower edge of cell first + i
            start = (lower_edge + first * h - mean) / eta
            cdf = special.ndtr(start[:, None] + np.arange(width + 1) * (h / eta))
            cdf[:, 0], cdf[:, -1] = 0.0, 1.0  # the kernel's far tails join its end cells
            targets = first[:, None] + np.arange(width + 1)
            ends = (first <= 0) | (first + width >= cells)
            if ends.any():  # cell 0 reaches down to -inf and the last cell up to +inf
                edge = targets[ends]
                cdf[ends] = np.where(edge <= 0, 0.0, np.where(edge >= cells, 1.0, cdf[ends]))
            weights = cdf[:, 1:] - cdf[:, :-1]  # (moved cells, W)
            targets = np.clip(targets[:, :-1], 0, cells - 1)
        else:  # no innovation: split each cell's mass between the two cells around its image
            position = np.clip((mean - grid[0]) / h, 0.0, cells - 1.0)
            low = np.minimum(position.astype(np.int64), cells - 2)
            frac = position - low
            targets = np.stack([low, low + 1], axis=-1)
            weights = np.stack([1.0 - frac, frac], axis=-1)
        flat = (user[:, None] * cells + targets).ravel()
        moved = np.empty_like(belief)
        for k in range(types):
            mass = (belief[user, k, cell][:, None] * weights).ravel()
            moved[:, k] = np.bincount(flat, mass, minlength=users * cells).reshape(users, cells)
        return moved / moved.sum(axis=(1, 2), keepdims=True)

    def _consume(
        self, belief: np.ndarray, users: np.ndarray, features: np.ndarray, observed: np.ndarray
    ) -> None:
        """In place: ``users`` consumed items of ``features`` with observed engagement ``observed``
        (one each); condition on the engagement (censored at the clip), then move by the item."""
        chocness = self.model.chocness(features.astype(np.float64))
        observed = observed.astype(np.float64)
        clip = self.params.engagement_clip
        censored = np.zeros(len(users), dtype=bool)
        if clip is not None:
            censored = observed >= np.float32(clip)
        loglik = self.engagement_loglik(chocness, observed, censored)
        belief[users] = self.transition(self.condition(belief[users], loglik), chocness)

    def observe_response(
        self, belief: np.ndarray, clicks: np.ndarray, engagement: np.ndarray, shown: np.ndarray
    ) -> np.ndarray:
        """One visit whose response was observed: ``clicks`` and ``engagement`` (U, n) are its
        rows of ``response_click`` / ``response_engagement`` and ``shown`` (U, n) the features of
        the slate it responded to. A zero click row (the null item) leaves the exposure as it was.
        """
        belief = belief.copy()
        clicks = np.asarray(clicks)
        consumed = clicks.max(axis=1) > 0
        users, slot = np.flatnonzero(consumed), clicks[consumed].argmax(axis=1)
        if len(users):
            observed = np.asarray(engagement)[users, slot]
            self._consume(belief, users, np.asarray(shown)[users, slot], observed)
        return belief

    def choice_mixture(self, belief: np.ndarray, shown: np.ndarray) -> np.ndarray:
        """One visit whose choice is not observed (a platform without feedback, or a slate not yet
        answered): the mixture over the slate's items and the null item, each weighted by its
        choice probability, of the transitions the choice would cause.

        The choice probabilities depend on the slate's features only (not on the state), and no
        engagement is observed, so nothing conditions the mixture: it is the exact prediction.
        ``shown`` (U, n): the features of each user's slate, in slot order.
        """
        shown = np.asarray(shown, dtype=np.float64)
        users, size = shown.shape
        weights, null_weight = self.model.choice_weights(shown)
        total = weights.sum(axis=1) + null_weight
        moved = self.transition(np.repeat(belief, size, axis=0), self.model.chocness(shown).ravel())
        mixed = np.einsum(
            "us,ustc->utc", weights / total[:, None], moved.reshape(users, size, *belief.shape[1:])
        )
        if null_weight > 0:
            mixed += (null_weight / total)[:, None, None] * belief
        return mixed / mixed.sum(axis=(1, 2), keepdims=True)

    # -- one observation ------------------------------------------------------------------------
    def update(
        self,
        belief: np.ndarray,
        observations: Observation,
        *,
        started: np.ndarray,
        shown: np.ndarray,
    ) -> np.ndarray:
        """Fold one observation into the beliefs of all users of the batch.

        :param started: users that acted before in this episode (their observation carries the
            response to ``shown``); the others get the prior's first reading only.
        :param shown: (U, n) features of each user's previous slate, in slot order.
        """
        belief = belief.copy()
        if started.any():
            users = np.flatnonzero(started)
            clicks = np.asarray(observations["response_click"])[users, -1, :]
            consumed = clicks.max(axis=1) > 0
            users, slot = users[consumed], clicks[consumed].argmax(axis=1)
            if len(users):
                observed = np.asarray(observations["response_engagement"])[users, -1, slot]
                self._consume(belief, users, shown[users, slot], observed)
        if self.params.observes_satisfaction:
            reading = np.asarray(observations["user"], dtype=np.float64)[:, 0]
            belief = self.condition(belief, self.reading_loglik(reading))
        return belief


class _PosteriorSummaries:
    """Read-outs of a posterior ``belief`` (users, types, cells) on ``filter``'s grid."""

    params: ChocKaleParams
    filter: BeliefFilter
    belief: np.ndarray

    @property
    def sensitivities(self) -> tuple[float, ...]:
        """The type of each layer of the belief (``user_sensitivities``, or the one tau)."""
        return sensitivities_of(self.params)

    def type_posterior(self) -> np.ndarray:
        """P(tau = layer k | observations) per user: (users, types)."""
        return self.belief.sum(axis=2)

    def exposure_moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of each user's current exposure."""
        marginal = self.belief.sum(axis=1)
        mean = marginal @ self.filter.grid
        variance = marginal @ self.filter.grid**2 - mean**2
        return mean, np.sqrt(np.maximum(variance, 0.0))


class BeliefPlanner(ValueGreedyPolicy, _PosteriorSummaries):
    """QMDP on the exact (grid) posterior over the user's type and exposure; see the module text.

    Knows the env's parameters (hence ``oracle = True``, like the planner) but reads no info key:
    it infers from the observations, its own past slates and its own step counter, which
    :meth:`begin_episodes` resets. Its return is a lower bound on the Bayes-optimal value of the
    hidden-type problem (the planner's is an upper bound).
    """

    Config = BeliefPlannerConfig
    #: It knows the model's parameters; it never reads the hidden info keys.
    oracle = True

    def __init__(
        self,
        params: ChocKaleParams,
        *,
        config: BeliefPlannerConfig | None = None,
        planner_config: PlannerConfig = DEFAULT_PLANNER_CONFIG,
        seed: int | None = None,
    ) -> None:
        super().__init__(params, seed=seed)
        self.config = config if config is not None else BeliefPlannerConfig()
        self.filter = BeliefFilter(params, self.config.exposure_points)
        self.tables = qmdp_tables(
            params, self.config.exposure_points, self.config.feature_points, planner_config
        )
        types, cells = self.filter.prior.shape
        self.belief = np.zeros((0, types, cells))  # per user: posterior over (type, cell)
        self.steps = np.zeros(0, dtype=np.int64)  # per user: steps acted in this episode
        self.shown = np.zeros((0, params.slate_size))  # per user: features of the last slate

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> SlateAgent:
        """Build for a Choc-vs-Kale env (single or vector): it needs the env's parameters."""
        return cls(env_params(env), config=config, seed=seed)

    # -- per-user memory ------------------------------------------------------------------------
    def begin_episodes(self, mask: np.ndarray) -> None:
        """Users ``mask`` start an episode: their belief returns to the prior, their clock to 0
        (a new batch size starts everyone)."""
        mask = np.asarray(mask, dtype=bool)
        if len(mask) != len(self.steps):
            types, cells = self.filter.prior.shape
            self.belief = np.zeros((len(mask), types, cells))
            self.steps = np.zeros(len(mask), dtype=np.int64)
            self.shown = np.zeros((len(mask), self.slate_size))
            mask = np.ones(len(mask), dtype=bool)
        self.belief[mask] = self.filter.prior
        self.steps[mask] = 0
        self.shown[mask] = 0.0

    # -- acting ---------------------------------------------------------------------------------
    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        """Update each user's posterior with this observation, then the QMDP slate."""
        del infos  # never read: the policy infers what the planner is told
        features = np.asarray(observations["candidates"], dtype=np.float64)[..., 0]
        if len(features) != len(self.steps):
            self.begin_episodes(np.ones(len(features), dtype=bool))
        self.belief = self.filter.update(
            self.belief, observations, started=self.steps > 0, shown=self.shown
        )
        values, null_value = self.values(features)
        slates = self._choose(features, values, null_value)
        self.shown = np.take_along_axis(features, slates, axis=1)
        self.steps += 1
        return slates

    def decision_weights(self) -> np.ndarray:
        """The distribution the values are averaged over: the posterior, or with ``map_type`` the
        posterior conditioned on each user's most probable type."""
        return decision_weights(self.belief, map_type=self.config.map_type)

    def values(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior-weighted planner values of the candidates (U, N) and of the null item (U,),
        at each user's remaining budget T - steps."""
        budget = np.clip(self.params.time_budget - self.steps, 1, self.params.time_budget)
        return qmdp_values(self.tables, self.decision_weights(), budget, features)

    # -- saving ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The generator, and per user the belief, the step counter and the last slate's
        features (plain arrays)."""
        return {
            **super().state_dict(),
            "belief": self.belief.copy(),
            "steps": self.steps.copy(),
            "shown": self.shown.copy(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (checked against this planner's grid and slate size)."""
        belief = np.array(state["belief"], dtype=np.float64)
        steps = np.array(state["steps"], dtype=np.int64)
        shown = np.array(state["shown"], dtype=np.float64)
        users = len(steps)
        expected = (users, *self.filter.prior.shape)
        if belief.shape != expected or shown.shape != (users, self.slate_size):
            raise ValueError(
                f"belief {belief.shape} / shown {shown.shape} do not fit {users} users with "
                f"belief {expected} and slate_size={self.slate_size}"
            )
        super().load_state_dict(state)
        self.belief, self.steps, self.shown = belief, steps, shown


class JointBeliefPlanner(_PosteriorSummaries):
    """The belief planner of a multi-platform env: one centralised filter over every platform's
    observations and slates, and QMDP at every visit (see the module text, "Several platforms").

    Knows the model (``oracle = True``, like the joint planner) but never reads the hidden state:
    :meth:`act_joint` ignores its ``oracle`` argument. Episodes are synchronised and of fixed
    length, so it counts joint steps itself and starts every user afresh (prior belief) when the
    count wraps at the episode length or the batch size changes.
    """

    Config = BeliefPlannerConfig
    #: It knows the model's parameters; it never reads the users' hidden state.
    oracle = True

    def __init__(
        self,
        params: ChocKaleParams,
        platforms: list[str],
        feedback: Mapping[str, bool],
        *,
        episode_length: int | None = None,
        config: BeliefPlannerConfig | None = None,
        planner_config: PlannerConfig = DEFAULT_PLANNER_CONFIG,
    ) -> None:
        """``platforms`` in visit order; ``feedback[platform]``: whether it observes responses;
        ``episode_length``: joint steps per episode (default: the budget's share per platform)."""
        self.params, self.model = params, ChocKaleModel(params)
        self.platforms = list(platforms)
        self.feedback = {platform: bool(feedback[platform]) for platform in self.platforms}
        self.episode_length = episode_length or params.time_budget // len(self.platforms)
        if self.episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {self.episode_length}")
        self.config = config if config is not None else BeliefPlannerConfig()
        self.planner_config = planner_config
        self.filter = BeliefFilter(params, self.config.exposure_points)
        self.belief = np.zeros((0, *self.filter.prior.shape))  # per user: over (type, cell)
        self.shown = {p: np.zeros((0, params.slate_size)) for p in self.platforms}
        self.joint_step = 0  # joint steps acted, counted over episodes of fixed length

    @classmethod
    def for_env(cls, env: Any, *, config: BeliefPlannerConfig | None = None) -> JointBeliefPlanner:
        """Build for a multi-platform env (batched, or the PettingZoo view of one user): its
        parameters, platforms in visit order, which have feedback, and the episode length."""
        from fedrec.agents.multi_platform import episode_length_of

        batch = getattr(env, "batch", env)
        return cls(
            env_params(batch),
            list(batch.possible_agents),
            batch.feedback,
            episode_length=episode_length_of(batch),
            config=config,
        )

    @functools.cached_property
    def tables(self) -> QmdpTables:
        """The per-type planner values (built on first use: the filter alone does not need them,
        and solving the planner's tables for the shared budget takes several seconds)."""
        c = self.config
        return qmdp_tables(self.params, c.exposure_points, c.feature_points, self.planner_config)

    def begin_episodes(self, users: int) -> None:
        """Every one of ``users`` users starts an episode: prior belief, joint step 0."""
        self.belief = np.repeat(self.filter.prior[None], users, axis=0)
        self.shown = {p: np.zeros((users, self.params.slate_size)) for p in self.platforms}
        self.joint_step = 0

    # -- the filter -----------------------------------------------------------------------------
    def fold(
        self,
        belief: np.ndarray,
        observations: Mapping[str, Observation],
        shown: Mapping[str, np.ndarray] | None,
    ) -> np.ndarray:
        """The posterior after one joint observation, in the env's order of events.

        ``shown``: each platform's features of the slates of the previous joint step (None at an
        episode's first observation). Each visit of that step, in platform order: a platform with
        feedback folds in its newest response (engagement likelihood at the satisfaction before
        the visit, then the consumed item's transition), one without moves the belief by the
        choice mixture over its slate. Then every platform's reading ``user``: all are taken
        after the whole joint step (at the start: of e_0), each with its own noise.
        """
        if shown is not None:
            for platform in self.platforms:
                if self.feedback[platform]:
                    observed = observations[platform]
                    belief = self.filter.observe_response(
                        belief,
                        np.asarray(observed["response_click"])[:, -1],
                        np.asarray(observed["response_engagement"])[:, -1],
                        shown[platform],
                    )
                else:
                    belief = self.filter.choice_mixture(belief, shown[platform])
        if self.params.observes_satisfaction:
            loglik = sum(
                self.filter.reading_loglik(np.asarray(observations[p]["user"], np.float64)[:, 0])
                for p in self.platforms
            )
            belief = self.filter.condition(belief, loglik)
        return belief

    # -- acting ---------------------------------------------------------------------------------
    def act_joint(
        self, observations: Mapping[str, Observation], oracle: Any = None
    ) -> dict[str, np.ndarray]:
        """Fold in this joint observation, then every platform's QMDP slate.

        All platforms act now, before any of this step's visits; platform k plans on the belief
        predicted through the slates of platforms 0..k-1 (their choice mixtures) with the budget
        T - (visits so far), as the joint planner plans on the expected exposure.
        """
        del oracle  # never read: the filter infers what the joint planner is told
        users = len(observations[self.platforms[0]]["candidates"])
        step = self.joint_step % self.episode_length
        if step == 0 or users != len(self.belief):
            self.begin_episodes(users)
            step = 0
        self.belief = self.fold(self.belief, observations, self.shown if step else None)
        predicted, slates = self.belief, {}
        visits = step * len(self.platforms)
        for k, platform in enumerate(self.platforms):
            if k:
                predicted = self.filter.choice_mixture(predicted, self.shown[self.platforms[k - 1]])
            features = np.asarray(observations[platform]["candidates"], dtype=np.float64)[..., 0]
            budget = np.clip(self.params.time_budget - (visits + k), 1, self.params.time_budget)
            weights = decision_weights(predicted, map_type=self.config.map_type)
            values, null_value = qmdp_values(self.tables, weights, np.full(users, budget), features)
            slates[platform] = self._choose(features, values, null_value)
            self.shown[platform] = np.take_along_axis(features, slates[platform], axis=1)
        self.joint_step = step + 1
        return slates

    def _choose(
        self, features: np.ndarray, values: np.ndarray, null_value: np.ndarray
    ) -> np.ndarray:
        """The slate of largest choice-weighted value (the planner's assortment optimisation)."""
        size = self.params.slate_size
        if self.params.choice_model == "first_slot":
            return np.argsort(-values, axis=1, kind="stable")[:, :size].astype(np.int64)
        weights, null_weight = self.model.choice_weights(features)
        return optimal_slates(weights, values, size, null_weight=null_weight, null_value=null_value)


__all__ = [
    "DEFAULT_BELIEF_CONFIG",
    "BeliefFilter",
    "BeliefPlanner",
    "BeliefPlannerConfig",
    "JointBeliefPlanner",
    "QmdpTables",
    "decision_weights",
    "exposure_grid",
    "initial_belief",
    "qmdp_tables",
    "qmdp_values",
    "sensitivities_of",
]
