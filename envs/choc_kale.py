"""The single-user Gymnasium Choc-vs-Kale environment (RecSim long-term satisfaction)."""

from __future__ import annotations

import itertools
import math
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
from fedrec.envs.choc_kale_sim import HIDDEN_STATE_KEYS
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.slates import SlateSpace, checked_slate
from fedrec.envs.state import StateReader, generator_state, last_step_state, parse_last_step
from fedrec.envs.vector_utils import check_render_mode

Observation = dict[str, np.ndarray]

#: Keyword arguments of RecSim's library ``long_term_satisfaction`` env (docs/choc_kale.md, "RecSim's library env (A)").
LIBRARY_DEFAULTS: dict[str, Any] = {}
#: The FedSlate paper code's single-platform variant (docs/choc_kale.md, "The FedSlate code's
#: variant (B)").
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
    non-integer dtype raises ``ValueError`` before the env changes or draws anything. (RecSim
    silently accepts duplicates and short slates.)

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
      With ``user_sensitivities`` (hidden user types, ``fedrec/ChocKaleUserTypes-v0``) the user's
      :math:`\tau` is drawn uniformly from those values at every reset and is not observed.
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
    ``clicked_slot`` (the consumed slot, -1 for none; also in the observation's response), and
    the user's **hidden** state, ground truth for reference policies and analysis:
    ``user_exposure``, ``user_satisfaction``, ``budget_left`` (before the next step) and
    ``user_sensitivity`` (with hidden user types). These four are declared in
    ``metadata["hidden_info_keys"]`` (:data:`fedrec.envs.choc_kale_sim.HIDDEN_STATE_KEYS`);
    fedrec's loops, rollouts and SB3 adapters strip them, at every depth of the info (a vector
    env's ``final_info`` too), for every agent that is not an oracle
    (:func:`fedrec.envs.hidden.strip_hidden`).

    ## Arguments
    ``num_candidates=10, slate_size=3, choice_model="first_slot", choice_intercept=1.0,
    no_click_logit=None, semantics="code", memory_discount=0.7, sensitivity=0.01,
    user_sensitivities=None, innovation_stddev=0.05, choc_mean=5.0, choc_stddev=1.0, kale_mean=4.0, kale_stddev=1.0,
    time_budget=60, satisfaction_noise_stddev=None, history_length=1, engagement_clip=100.0,
    render_mode=None`` (see :class:`fedrec.envs.choc_kale_model.ChocKaleParams`).

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B)`` returns the native
    :class:`fedrec.envs.choc_kale_vector.ChocKaleVectorEnv` (all users in one NumPy operation).

    ## Saving and restoring
    ``state_dict()`` returns everything that changes while the env runs (the generator state,
    the user's exposure and budget, candidates, response history) as plain data, and
    ``load_state_dict(state)`` restores it into an env built with the same arguments, so a
    resumed run continues bit-for-bit (see :mod:`fedrec.envs.state`; no pickling).

    ## Reproduces
    RecSim ``long_term_satisfaction`` (google-research/recsim 55e50e4) by default; the FedSlate
    code (TianYaDY/FedSlate 9df49d8) with ``FEDSLATE_KWARGS``. Statistical parity with RecSim is
    tested in ``tests/test_recsim_parity.py``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4, HIDDEN_INFO_KEYS: HIDDEN_STATE_KEYS}

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
        user_sensitivities: tuple[float, ...] | None = None,
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
        check_render_mode(render_mode, self.metadata)
        self.params = ChocKaleParams(
            num_candidates=num_candidates,
            slate_size=slate_size,
            choice_model=choice_model,
            choice_intercept=choice_intercept,
            no_click_logit=no_click_logit,
            semantics=semantics,
            memory_discount=memory_discount,
            sensitivity=sensitivity,
            user_sensitivities=user_sensitivities,
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
        # Scalar user state. The single env runs its own scalar code path, because NumPy's per-call
        # overhead on batch-of-one arrays made it slower than RecSim; it draws random numbers in
        # exactly the simulator's order, and a test pins it to ChocKaleVectorEnv(num_envs=1).
        self._exposure = 0.0
        self._sensitivity = self.params.sensitivity  # this user's tau (hidden user types)
        self._budget = 0
        self._documents = np.zeros(num_candidates, dtype=np.float32)
        h, n = history_length, slate_size
        self._click_history = np.zeros((h, n), dtype=np.float32)
        self._engagement_history = np.zeros((h, n), dtype=np.float32)
        self._last: tuple[list[int], int, float] | None = None
        self._needs_reset = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        rng, p = self.np_random, self.params
        self._exposure = (rng.random() - 0.5) / (1.0 - p.memory_discount)
        self._budget = p.time_budget
        self._documents = rng.random(p.num_candidates, dtype=np.float32)
        if p.heterogeneous:  # the simulator's draw: floor(u * k)
            types = len(p.user_sensitivities)
            self._sensitivity = p.user_sensitivities[min(int(rng.random() * types), types - 1)]
        self._click_history[:] = 0.0
        self._engagement_history[:] = 0.0
        self._needs_reset = False
        self._last = None
        return self._observation(), self._info(clicked_slot=-1)

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        p, rng = self.params, self.np_random
        slate = checked_slate(action, num_candidates=p.num_candidates, slate_size=p.slate_size)
        features = self._documents[slate].tolist()

        slot = 0
        if p.choice_model == "mnl":  # same arithmetic as ChocKaleModel.sample_choice
            weights = [math.exp(p.choice_intercept - x) for x in features]
            null = math.exp(p.no_click_logit) if p.no_click_logit is not None else 0.0
            cumulative = list(itertools.accumulate(weights))  # sequential, like np.cumsum
            threshold = rng.random() * (cumulative[-1] + null)
            slot = next((i for i, total in enumerate(cumulative) if total > threshold), -1)
        z_engagement = rng.standard_normal()
        z_innovation = rng.standard_normal()
        self._documents = rng.random(p.num_candidates, dtype=np.float32)

        reward = 0.0
        if slot >= 0:
            x = features[slot]
            chocness = x if p.semantics == "code" else 1.0 - x
            satisfaction = 1.0 / (1.0 + math.exp(-self._sensitivity * self._exposure))
            loc = (p.kale_mean + (p.choc_mean - p.kale_mean) * chocness) * satisfaction
            scale = p.kale_stddev + (p.choc_stddev - p.kale_stddev) * chocness
            reward = math.exp(loc + scale * z_engagement)
            self._exposure = (
                p.memory_discount * self._exposure
                - 2.0 * (chocness - 0.5)
                + p.innovation_stddev * z_innovation
            )
        self._budget -= 1
        self._record(slot, reward)
        terminated = self._budget <= 0
        self._needs_reset = terminated
        self._last = (slate, slot, reward)
        return self._observation(), reward, terminated, False, self._info(clicked_slot=slot)

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        state = {
            "np_random": generator_state(self._np_random),
            "np_random_seed": self._np_random_seed,
            "exposure": float(self._exposure),
            "budget": int(self._budget),
            "documents": self._documents.copy(),
            "click_history": self._click_history.copy(),
            "engagement_history": self._engagement_history.copy(),
            "last": last_step_state(self._last),
            "needs_reset": bool(self._needs_reset),
        }
        if self.params.heterogeneous:
            state["sensitivity"] = float(self._sensitivity)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments.

        The whole state is checked first (``ValueError`` naming the problem; nothing changes).
        """
        p = self.params
        read = StateReader(state, type(self).__name__)
        rng = read.generator()
        seed = read.seed()
        exposure = read.float("exposure")
        budget = read.int("budget", low=0, high=p.time_budget)
        documents = read.array(
            "documents", (p.num_candidates,), np.float32, hint=f"num_candidates={p.num_candidates}"
        )
        h, n = p.history_length, p.slate_size
        hint = f"history_length={h}, slate_size={n}"
        click_history = read.array("click_history", (h, n), np.float32, hint=hint)
        engagement_history = read.array("engagement_history", (h, n), np.float32, hint=hint)
        last = read.raw("last")
        needs_reset = read.bool("needs_reset")
        sensitivity = self._sensitivity
        if p.heterogeneous:
            sensitivity = read.float("sensitivity")
            if sensitivity not in p.user_sensitivities:
                raise read.fail("sensitivity", f"must be one of {p.user_sensitivities}")
        read.finish()
        last = parse_last_step(read, last, with_reward=True)
        if last is not None:
            if len(last[0]) != n or not -1 <= last[1] < n:
                raise read.fail("last", f"does not fit slate_size={n}: {state['last']!r}")
        self._np_random, self._np_random_seed = rng, seed
        self._exposure = exposure
        self._sensitivity = sensitivity
        self._budget = budget
        self._documents = documents
        self._click_history = click_history
        self._engagement_history = engagement_history
        self._last = last
        self._needs_reset = needs_reset

    def _record(self, slot: int, engagement: float) -> None:
        clip = self.params.engagement_clip
        for history in (self._click_history, self._engagement_history):
            history[:-1] = history[1:]
            history[-1] = 0.0
        if slot >= 0:
            self._click_history[-1, slot] = 1.0
            self._engagement_history[-1, slot] = (
                engagement if clip is None else min(engagement, clip)
            )

    def _satisfaction(self) -> float:
        return 1.0 / (1.0 + math.exp(-self._sensitivity * self._exposure))

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        head = (
            f"budget={self._budget} satisfaction={self._satisfaction():.4f} "
            f"exposure={self._exposure:+.3f}"
        )
        if self._last is None:
            return head
        slate, slot, reward = self._last
        chosen = "none" if slot < 0 else f"slot {slot} (item {slate[slot]})"
        return f"{head} | slate={slate} consumed={chosen} engagement={reward:.2f}"

    def _observation(self) -> Observation:
        obs = {"candidates": self._documents[:, None].copy()}
        if self.params.observes_satisfaction:
            sigma = self.params.satisfaction_noise_stddev or 0.0
            z = self.np_random.standard_normal()
            while abs(z) > NOISE_TRUNCATION:  # the exact truncated normal (as ChocKaleModel)
                z = self.np_random.standard_normal()
            obs["user"] = np.array([self._satisfaction() + sigma * z], dtype=np.float32)
        obs["response_click"] = self._click_history.copy()
        obs["response_engagement"] = self._engagement_history.copy()
        return obs

    def _info(self, *, clicked_slot: int) -> dict[str, Any]:
        info = {
            "user_exposure": self._exposure,
            "user_satisfaction": self._satisfaction(),
            "budget_left": self._budget,
            "clicked_slot": clicked_slot,
        }
        if self.params.heterogeneous:
            info["user_sensitivity"] = self._sensitivity
        return info
