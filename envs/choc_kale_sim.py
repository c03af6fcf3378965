"""Batched state of Choc-vs-Kale users across one or more platforms.

:class:`ChocKaleSimulator` holds B users, each with one latent exposure and one time budget shared
by K platforms, and per platform a candidate set and a response history. The Gymnasium envs use
K = 1 (B = 1 single, B = num_envs vector); the multi-platform envs use K >= 2. The simulator never
decides what a platform may see: the env classes build observations from its state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedrec.envs.choc_kale_model import ChocKaleModel, ChocKaleParams
from fedrec.envs.state import StateReader

#: The user's hidden state: the keys of :meth:`ChocKaleSimulator.oracle_state`, which every
#: Choc-vs-Kale env declares hidden (``metadata["hidden_info_keys"]``, see
#: :mod:`fedrec.envs.hidden`): a recommender observes candidates and responses, never these.
HIDDEN_STATE_KEYS = frozenset(
    {"user_exposure", "user_satisfaction", "budget_left", "user_sensitivity"}
)


@dataclass(frozen=True)
class VisitOutcome:
    """What happened when the users visited one platform (arrays of shape (B,))."""

    clicked_slot: np.ndarray
    """Slot of the consumed item, -1 for the null item or an inactive user."""
    engagement: np.ndarray
    """True (unclipped) engagement; 0 without a consumption."""
    visited: np.ndarray
    """Which users actually visited (active and with budget left)."""


class ChocKaleSimulator:
    """B users x K platforms, all updated with whole-array NumPy operations."""

    def __init__(
        self,
        params: ChocKaleParams,
        *,
        num_users: int,
        num_platforms: int = 1,
        shared_catalogue: bool = False,
    ) -> None:
        if num_users < 1:
            raise ValueError(f"num_users must be >= 1, got {num_users}")
        if num_platforms < 1:
            raise ValueError(f"num_platforms must be >= 1, got {num_platforms}")
        self.params = params
        #: every platform shows the first platform's candidates of the same joint step (the
        #: FedSlate code's basic runs, whose document samplers share the seed 42)
        self.shared_catalogue = bool(shared_catalogue)
        self.model = ChocKaleModel(params)
        self.num_users = num_users
        self.num_platforms = num_platforms
        b, k, n, h = num_users, num_platforms, params.slate_size, params.history_length
        self.exposure = np.zeros(b)
        #: each user's tau (hidden; drawn per episode when the params have user_sensitivities)
        self.sensitivity = np.full(b, params.sensitivity)
        self.budget = np.zeros(b, dtype=np.int64)
        self.documents = np.zeros((k, b, params.num_candidates), dtype=np.float32)
        self.click_history = np.zeros((k, b, h, n), dtype=np.float32)
        self.engagement_history = np.zeros((k, b, h, n), dtype=np.float32)
        self._rows = np.arange(b)

    def reset(self, rng: np.random.Generator, mask: np.ndarray | None = None) -> None:
        """Start new episodes for the users in ``mask`` (all when None)."""
        if mask is None:
            count = self.num_users
            self.exposure[:] = self.model.initial_exposure(rng, count)
            self.budget[:] = self.params.time_budget
            self._draw_documents(rng, slice(None), count)
            if self.params.heterogeneous:
                self.sensitivity[:] = self.model.draw_sensitivities(rng, count)
            self.click_history[:] = 0.0
            self.engagement_history[:] = 0.0
            return
        count = int(mask.sum())
        if count == 0:
            return
        self.exposure[mask] = self.model.initial_exposure(rng, count)
        self.budget[mask] = self.params.time_budget
        self._draw_documents(rng, mask, count)
        if self.params.heterogeneous:
            self.sensitivity[mask] = self.model.draw_sensitivities(rng, count)
        self.click_history[:, mask] = 0.0
        self.engagement_history[:, mask] = 0.0

    def _draw_documents(self, rng: np.random.Generator, users: Any, count: int) -> None:
        """Fresh candidates for ``users`` (a mask or slice of ``count`` users) on every platform;
        with a shared catalogue the first platform draws and the others copy it."""
        for platform in range(1 if self.shared_catalogue else self.num_platforms):
            self.documents[platform, users] = self.model.sample_documents(rng, count)
        if self.shared_catalogue:
            self.documents[1:, users] = self.documents[0, users]

    def state_dict(self) -> dict[str, Any]:
        """The users' state as plain data (copies): exposure, budget, candidates, histories, and
        with hidden user types each user's sensitivity."""
        state = {
            "exposure": self.exposure.copy(),
            "budget": self.budget.copy(),
            "documents": self.documents.copy(),
            "click_history": self.click_history.copy(),
            "engagement_history": self.engagement_history.copy(),
        }
        if self.params.heterogeneous:
            state["sensitivity"] = self.sensitivity.copy()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of a simulator with the same users, platforms and params.

        Every array is checked (shape, dtype) before anything changes; ``ValueError`` otherwise.
        """
        read = StateReader(state, "ChocKaleSimulator")
        b, k, p = self.num_users, self.num_platforms, self.params
        n, h = p.slate_size, p.history_length
        users = f"num_users={b}"
        grid = f"num_platforms={k}, num_users={b}"
        exposure = read.array("exposure", (b,), np.float64, hint=users)
        budget = read.array("budget", (b,), np.int64, hint=users)
        documents = read.array(
            "documents",
            (k, b, p.num_candidates),
            np.float32,
            hint=f"{grid}, num_candidates={p.num_candidates}",
        )
        histories = {
            key: read.array(
                key, (k, b, h, n), np.float32, hint=f"{grid}, history_length={h}, slate_size={n}"
            )
            for key in ("click_history", "engagement_history")
        }
        sensitivity = self.sensitivity
        if p.heterogeneous:
            sensitivity = read.array("sensitivity", (b,), np.float64, hint=users)
            if not np.isin(sensitivity, p.user_sensitivities).all():
                raise read.fail("sensitivity", f"must hold values of {p.user_sensitivities}")
        read.finish()
        if budget.min() < 0 or budget.max() > p.time_budget:
            raise read.fail("budget", f"must lie in [0, time_budget={p.time_budget}]")
        self.sensitivity = sensitivity
        self.exposure = exposure
        self.budget = budget
        self.documents = documents
        self.click_history = histories["click_history"]
        self.engagement_history = histories["engagement_history"]

    def satisfaction(self) -> np.ndarray:
        """Current true satisfaction of every user."""
        return self.model.satisfaction(self.exposure, self.sensitivity)

    def observation(
        self, rng: np.random.Generator, *, platform: int = 0, feedback: bool = True
    ) -> dict[str, np.ndarray]:
        """All users' observations on one platform (copies, leading batch axis).

        Keys as in :func:`fedrec.envs.choc_kale.observation_space`; the noisy satisfaction is
        drawn afresh for each call, and ``feedback=False`` leaves out the platform's responses.
        """
        obs = {"candidates": self.documents[platform][:, :, None].copy()}
        if self.params.observes_satisfaction:
            noisy = self.model.observe_satisfaction(rng, self.satisfaction())
            obs["user"] = noisy.astype(np.float32)[:, None]
        if feedback:
            obs["response_click"] = self.click_history[platform].copy()
            obs["response_engagement"] = self.engagement_history[platform].copy()
        return obs

    def oracle_state(self) -> dict[str, np.ndarray]:
        """Ground-truth user state, for reference policies (myopic, planner) and analysis only
        (its keys are :data:`HIDDEN_STATE_KEYS`)."""
        state = {
            "user_exposure": self.exposure.copy(),
            "user_satisfaction": self.satisfaction(),
            "budget_left": self.budget.copy(),
        }
        if self.params.heterogeneous:
            state["user_sensitivity"] = self.sensitivity.copy()
        return state

    def visit(
        self,
        rng: np.random.Generator,
        platform: int,
        slates: np.ndarray,
        active: np.ndarray | None = None,
    ) -> VisitOutcome:
        """Every active user with budget left consumes from ``slates`` (B, n) on ``platform``.

        Order of random draws (fixed, for reproducibility): the choice uniform (MNL only), the
        log-engagement normal, the exposure innovation, then the platform's next candidates. All
        are drawn for all B users so the streams do not depend on who is active (none at all when
        no user visits). With a shared catalogue only the first platform draws candidates; the
        others take its candidates of the same joint step.
        """
        model, rows = self.model, self._rows
        visited = self.budget > 0
        if active is not None:
            visited &= active
        if not visited.any():  # nobody visits: no draws, nothing changes
            none = np.full(self.num_users, -1)
            return VisitOutcome(
                clicked_slot=none, engagement=np.zeros(self.num_users), visited=visited
            )
        docs = self.documents[platform]
        slate_x = docs[rows[:, None], slates]
        slot = model.sample_choice(rng, slate_x)
        z_engagement = rng.standard_normal(self.num_users)
        z_innovation = rng.standard_normal(self.num_users)
        if self.shared_catalogue and platform > 0:
            next_docs = self.documents[0].copy()
        else:
            next_docs = model.sample_documents(rng, self.num_users)

        clicked = visited & (slot >= 0)
        clicked_x = slate_x[rows, np.maximum(slot, 0)].astype(np.float64)
        chocness = model.chocness(clicked_x)
        loc, scale = model.engagement_params(self.satisfaction(), chocness)
        engagement = np.where(clicked, np.exp(loc + scale * z_engagement), 0.0)
        new_exposure = model.next_exposure(
            self.exposure, chocness, self.params.innovation_stddev * z_innovation
        )
        self.exposure = np.where(clicked, new_exposure, self.exposure)
        self.budget -= visited

        if visited.all():
            self.documents[platform] = next_docs
        else:
            docs[visited] = next_docs[visited]
        self._record(platform, np.where(clicked, slot, -1), engagement, visited)
        return VisitOutcome(
            clicked_slot=np.where(clicked, slot, -1), engagement=engagement, visited=visited
        )

    def _record(
        self, platform: int, slot: np.ndarray, engagement: np.ndarray, visited: np.ndarray
    ) -> None:
        """Push this visit's response (one-hot click, observed engagement) into the history."""
        n = self.params.slate_size
        clip = self.params.engagement_clip
        observed = engagement if clip is None else np.minimum(engagement, clip)
        click_row = np.zeros((self.num_users, n), dtype=np.float32)
        engagement_row = np.zeros((self.num_users, n), dtype=np.float32)
        hit = slot >= 0
        click_row[self._rows[hit], slot[hit]] = 1.0
        engagement_row[self._rows[hit], slot[hit]] = observed[hit]
        for history, row in (
            (self.click_history[platform], click_row),
            (self.engagement_history[platform], engagement_row),
        ):
            if visited.all():
                history[:, :-1] = history[:, 1:]
                history[:, -1] = row
            else:
                history[visited, :-1] = history[visited, 1:]
                history[visited, -1] = row[visited]
