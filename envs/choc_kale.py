"""The single-user Gymnasium Choc-vs-Kale environment (RecSim long-term satisfaction)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fedrec.envs.choc_kale_model import (
    NOISE_TRUNCATION,
    ChocKaleParams,
    ChoiceModelName,
    Semantics,
)
from fedrec.envs.choc_kale_sim import ChocKaleSimulator
from fedrec.envs.slates import SlateSpace, validate_slates

Observation = dict[str, np.ndarray]

#: Keyword arguments of RecSim's library ``long_term_satisfaction`` env (spec part A).
LIBRARY_DEFAULTS: dict[str, Any] = {}
#: The FedSlate paper code's single-platform variant (spec part B).
FEDSLATE_KWARGS: dict[str, Any] = {
    "choice_model": "mnl",
    "memory_discount": 0.9,
    "satisfaction_noise_stddev": 0.1,
    "history_length": 5,
    "engagement_clip": None,
    "time_budget": 61,
}


def observation_space(params: ChocKaleParams, *, feedback: bool = True) -> spaces.Dict:
    """The per-user observation space: a flat Dict of fixed-shape float32 Boxes."""
    n, h = params.slate_size, params.history_length
    entries: dict[str, spaces.Space] = {
        "candidates": spaces.Box(0.0, 1.0, (params.num_candidates, 1), np.float32),
    }
    if params.observes_satisfaction:
        spread = NOISE_TRUNCATION * (params.satisfaction_noise_stddev or 0.0)
        entries["user"] = spaces.Box(-spread, 1.0 + spread, (1,), np.float32)
    if feedback:
        # Unclipped engagement is bounded by float32's range (a finite bound keeps checkers quiet).
        clip = (
            np.finfo(np.float32).max if params.engagement_clip is None else params.engagement_clip
        )
        entries["response_click"] = spaces.Box(0.0, 1.0, (h, n), np.float32)
        entries["response_engagement"] = spaces.Box(0.0, clip, (h, n), np.float32)
    return spaces.Dict(entries)


def batched_observation(
    sim: ChocKaleSimulator, rng: np.random.Generator, *, platform: int = 0, feedback: bool = True
) -> Observation:
    """Observations of all users on one platform, arrays with a leading batch axis (copies)."""
    obs = {"candidates": sim.documents[platform][:, :, None].copy()}
    if sim.params.observes_satisfaction:
        noisy = sim.model.observe_satisfaction(rng, sim.satisfaction())
        obs["user"] = noisy.astype(np.float32)[:, None]
    if feedback:
        obs["response_click"] = sim.click_history[platform].copy()
        obs["response_engagement"] = sim.engagement_history[platform].copy()
    return obs


def oracle_info(sim: ChocKaleSimulator) -> dict[str, np.ndarray]:
    """Ground-truth user state, for reference policies (myopic, planner) and analysis only."""
    return {
        "user_exposure": sim.exposure.copy(),
        "user_satisfaction": sim.satisfaction(),
        "budget_left": sim.budget.copy(),
    }


class ChocKaleEnv(gym.Env[Observation, np.ndarray]):
    r"""Choc-vs-Kale: recommend slates to a user whose satisfaction depends on what they consumed.

    ## Description
    The long-term-satisfaction scenario of RecSim (Ie et al., 2019), with every parameter a plain
    constructor argument. Each step the user is offered a fresh set of ``num_candidates``
    documents; the agent picks ``slate_size`` of them; the user consumes one (or none) and
    engages with it for a random time. *Chocolate* documents engage more now but lower the
    user's satisfaction, which scales all future engagement; *kale* documents do the opposite.
    The defaults reproduce RecSim's library module ``recsim.environments.long_term_satisfaction``
    (``fedrec/ChocKale-v0``); ``fedrec/ChocKaleSlate-v0`` is the FedSlate paper code's variant
    and ``fedrec/ChocKaleLongTerm-v0`` a variant in which planning pays (see the README).

    ## Action Space
    ``MultiDiscrete([N] * n)`` (start 0): indices into the current ``candidates``. Entries must be
    distinct integers in ``[0, N)``; a wrong length, an out-of-range or repeated index, or a
    non-integer dtype raises ``ValueError``. (RecSim silently accepts duplicates and short slates.)

    ## Observation Space
    A flat ``Dict`` of float32 ``Box``\ es:

    | key | shape | meaning |
    |---|---|---|
    | ``candidates`` | (N, 1) | feature x of each candidate, in [0, 1] |
    | ``user`` | (1,) | satisfaction + truncated-normal noise; only if ``satisfaction_noise_stddev`` is set |
    | ``response_click`` | (H, n) | one-hot consumed slot of the last H steps, oldest first |
    | ``response_engagement`` | (H, n) | observed engagement of the last H steps, clipped to ``engagement_clip`` |

    ## Dynamics
    The feature's choc-ness is ``c = x`` (``semantics="code"``: RecSim library and FedSlate code)
    or ``c = 1 - x`` (``semantics="prose"``: x is kaleness, as in the tutorial's prose).
    With net exposure :math:`e_t` and satisfaction :math:`s_t = \sigma(\tau e_t)`:

    - start: :math:`e_0 = (u - 1/2)/(1 - \beta)`, :math:`u \sim U(0, 1)`; budget :math:`T`.
    - choice: ``first_slot`` (library) consumes slot 0; ``mnl`` consumes item i of the slate with
      probability :math:`\propto \exp(a - x_i)` (``choice_intercept`` a = 1), or nothing with
      weight :math:`\exp(\text{no\_click\_logit})` when that is set.
    - engagement of the consumed item, with the pre-update satisfaction:
      :math:`\log g \sim N\big((c\mu_c + (1-c)\mu_k)\, s_t,\; c\sigma_c + (1-c)\sigma_k\big)`.
    - transition (consumed item only): :math:`e_{t+1} = \beta e_t - 2(c - 1/2) + \varepsilon`,
      :math:`\varepsilon \sim N(0, \eta^2)`. A step without consumption leaves :math:`e` as is.
    - a new candidate set :math:`x \sim U(0,1)^N` is drawn every step.

    ## Rewards
    The engagement of the consumed item, **unclipped** (0 if nothing is consumed). Only the
    observed engagement is clipped, as in RecSim.

    ## Starting State
    See *start* above. All randomness comes from ``self.np_random``; unlike RecSim, whose
    samplers ignore the config seed, ``reset(seed=s)`` fixes the whole trajectory.

    ## Episode End
    Every step spends one unit of the time budget; the episode **terminates** when it reaches 0
    (exactly ``time_budget`` steps). There is no truncation.

    ## Info
    Ground truth for reference policies and analysis, not for learners: ``user_exposure``,
    ``user_satisfaction``, ``budget_left`` (before the next step), and ``clicked_slot``.

    ## Arguments
    ``num_candidates=10, slate_size=3, choice_model="first_slot", choice_intercept=1.0,
    no_click_logit=None, semantics="code", memory_discount=0.7, sensitivity=0.01,
    innovation_stddev=0.05, choc_mean=5.0, choc_stddev=1.0, kale_mean=4.0, kale_stddev=1.0,
    time_budget=60, satisfaction_noise_stddev=None, history_length=1, engagement_clip=100.0,
    render_mode=None`` (see :class:`fedrec.envs.choc_kale_model.ChocKaleParams`).

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B)`` returns the native
    :class:`fedrec.envs.choc_kale_vector.ChocKaleVectorEnv` (all users in one NumPy operation).

    ## Reproduces
    RecSim ``long_term_satisfaction`` (google-research/recsim 55e50e4) by default; the FedSlate
    code (TianYaDY/FedSlate 9df49d8) with ``FEDSLATE_KWARGS``. Statistical parity with RecSim is
    tested in ``tests/test_recsim_parity.py``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        *,
        num_candidates: int = 10,
        slate_size: int = 3,
        choice_model: ChoiceModelName = "first_slot",
        choice_intercept: float = 1.0,
        no_click_logit: float | None = None,
        semantics: Semantics = "code",
        memory_discount: float = 0.7,
        sensitivity: float = 0.01,
        innovation_stddev: float = 0.05,
        choc_mean: float = 5.0,
        choc_stddev: float = 1.0,
        kale_mean: float = 4.0,
        kale_stddev: float = 1.0,
        time_budget: int = 60,
        satisfaction_noise_stddev: float | None = None,
        history_length: int = 1,
        engagement_clip: float | None = 100.0,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None")
        self.params = ChocKaleParams(
            num_candidates=num_candidates,
            slate_size=slate_size,
            choice_model=choice_model,
            choice_intercept=choice_intercept,
            no_click_logit=no_click_logit,
            semantics=semantics,
            memory_discount=memory_discount,
            sensitivity=sensitivity,
            innovation_stddev=innovation_stddev,
            choc_mean=choc_mean,
            choc_stddev=choc_stddev,
            kale_mean=kale_mean,
            kale_stddev=kale_stddev,
            time_budget=time_budget,
            satisfaction_noise_stddev=satisfaction_noise_stddev,
            history_length=history_length,
            engagement_clip=engagement_clip,
        )
        self.render_mode = render_mode
        self.observation_space = observation_space(self.params)
        self.action_space = SlateSpace(num_candidates, slate_size)
        self._sim = ChocKaleSimulator(self.params, num_users=1)
        self._last: tuple[np.ndarray, int, float] | None = None
        self._needs_reset = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        self._sim.reset(self.np_random)
        self._needs_reset = False
        self._last = None
        return self._observation(), self._info(clicked_slot=-1)

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        slate = validate_slates(
            action, num_candidates=self.params.num_candidates, slate_size=self.params.slate_size
        )
        outcome = self._sim.visit(self.np_random, 0, slate[None, :])
        slot = int(outcome.clicked_slot[0])
        reward = float(outcome.engagement[0])
        terminated = bool(self._sim.budget[0] <= 0)
        self._needs_reset = terminated
        self._last = (slate, slot, reward)
        return self._observation(), reward, terminated, False, self._info(clicked_slot=slot)

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        sim = self._sim
        head = (
            f"budget={int(sim.budget[0])} satisfaction={float(sim.satisfaction()[0]):.4f} "
            f"exposure={float(sim.exposure[0]):+.3f}"
        )
        if self._last is None:
            return head
        slate, slot, reward = self._last
        chosen = "none" if slot < 0 else f"slot {slot} (item {int(slate[slot])})"
        return f"{head} | slate={slate.tolist()} consumed={chosen} engagement={reward:.2f}"

    def _observation(self) -> Observation:
        batch = batched_observation(self._sim, self.np_random)
        return {key: value[0] for key, value in batch.items()}

    def _info(self, *, clicked_slot: int) -> dict[str, Any]:
        sim = self._sim
        return {
            "user_exposure": float(sim.exposure[0]),
            "user_satisfaction": float(sim.satisfaction()[0]),
            "budget_left": int(sim.budget[0]),
            "clicked_slot": clicked_slot,
        }
