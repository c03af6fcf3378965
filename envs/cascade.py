"""The single-user Gymnasium cascade-click environment over Choc-vs-Kale items."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fedrec.envs.cascade_model import (
    DEFAULT_ATTRACTION,
    HIDDEN_STATE_KEYS,
    CascadeParams,
    CascadeSimulator,
    attraction_probabilities,
    optimal_slates,
)
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.slates import SlateSpace, validate_slates
from fedrec.envs.state import SimulatorEnvState
from fedrec.envs.vector_utils import check_render_mode

Observation = dict[str, np.ndarray]

__all__ = [
    "ChocKaleCascadeEnv",
    "attraction_probabilities",
    "observation_space",
    "optimal_slates",
]


def observation_space(params: CascadeParams) -> spaces.Dict:
    """The per-user observation space: a flat Dict of fixed-shape float32 Boxes."""
    return spaces.Dict(
        {
            "candidates": spaces.Box(0.0, 1.0, (params.num_candidates, 1), np.float32),
            "response_click": spaces.Box(0.0, 1.0, (params.slate_size,), np.float32),
        }
    )


class ChocKaleCascadeEnv(SimulatorEnvState, gym.Env[Observation, np.ndarray]):
    r"""Cascade clicks on Choc-vs-Kale items: the user clicks the first attractive item of the slate.

    ## Description
    The cascade model of Kveton et al. (2015), "Cascading bandits: learning to rank in the
    cascade model". Each step the user is offered ``num_candidates`` Choc-vs-Kale documents
    (feature x ~ U(0, 1), the Choc-vs-Kale candidate sampler); the agent ranks ``slate_size`` of
    them; the user scans the slate top-down and clicks the first item that attracts them, then
    stops. Item i attracts with probability :math:`a(x_i)`, a fixed function of its feature. The
    optimal slate is known exactly (below), so a cascading bandit's regret can be measured
    against it: ``info`` reports both click probabilities of every step.

    ## Action Space
    ``SlateSpace(N, n)`` (``MultiDiscrete([N] * n)``, start 0): distinct candidate indices, in
    the order the user scans them. Anything else raises ``ValueError`` before the env changes.

    ## Observation Space
    | key | shape | meaning |
    |---|---|---|
    | ``candidates`` | (N, 1) | feature x of each candidate, in [0, 1] |
    | ``response_click`` | (n,) | one-hot clicked position of the last step (zeros: no click); the positions above it were examined and not clicked, those below were not examined |

    ## Dynamics
    - attraction: :math:`a(x) = \sigma(c_0 + c_1 x + c_2 x^2)` with
      ``attraction_coefficients`` :math:`(c_0, c_1, c_2) = (-3, 6, -4)`: 0.047 at x = 0, a
      peak of 0.32 at x = 0.75, 0.27 at x = 1 (:func:`attraction_probabilities`).
    - click: independently per position k = 1..n, the item attracts with probability
      :math:`a(x_{s_k})`; the click is on the first attractive position (at most one click).
      :math:`P(\text{click}) = 1 - \prod_k (1 - a(x_{s_k}))`.
    - optimum: the n candidates of highest attraction, most attractive first
      (:func:`optimal_slates`; the order does not change the click probability, it makes the
      click come earliest).
    - candidates: a fresh set every step (``resample_candidates=True``, a contextual cascading
      bandit) or one set per episode (``False``: Kveton et al.'s fixed items).

    ## Rewards
    1 for a click, 0 otherwise.

    ## Starting State
    Candidates drawn from ``self.np_random`` (all randomness comes from it).

    ## Episode End
    The episode **terminates** after ``time_budget`` steps (60). No truncation.

    ## Info
    ``clicked_slot`` (-1 for none) and **hidden** ground truth, declared in
    ``metadata["hidden_info_keys"]`` and stripped by fedrec's loops for every agent that is not
    an oracle: ``candidate_attraction`` (N,), the attraction of the current candidates (what
    :class:`fedrec.agents.cascade_oracle.CascadeOraclePolicy` ranks by);
    ``slate_click_probability`` and ``optimal_click_probability``, the click probabilities of
    the slate just played and of the optimal slate for the same candidates (0 at reset): their
    difference is the step's expected regret.

    ## Arguments
    ``num_candidates=10, slate_size=3, time_budget=60,
    attraction_coefficients=(-3.0, 6.0, -4.0), resample_candidates=True, render_mode=None``.

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B)`` returns the native
    :class:`fedrec.envs.cascade_vector.ChocKaleCascadeVectorEnv` (equal to this env for B = 1).

    ## Saving and restoring
    ``state_dict()`` / ``load_state_dict(state)``: everything that changes, as plain data.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4, HIDDEN_INFO_KEYS: HIDDEN_STATE_KEYS}
    LAST_HAS_REWARD = False  # _last is (slate, slot): the reward is whether slot >= 0

    def __init__(
        self,
        *,
        num_candidates: int = 10,
        slate_size: int = 3,
        time_budget: int = 60,
        attraction_coefficients: tuple[float, float, float] = DEFAULT_ATTRACTION,
        resample_candidates: bool = True,
        render_mode: str | None = None,
    ) -> None:
        check_render_mode(render_mode, self.metadata)
        self.params = CascadeParams(
            num_candidates=num_candidates,
            slate_size=slate_size,
            time_budget=time_budget,
            attraction_coefficients=attraction_coefficients,
            resample_candidates=resample_candidates,
        )
        self.render_mode = render_mode
        self.observation_space = observation_space(self.params)
        self.action_space = SlateSpace(num_candidates, slate_size)
        self._sim = CascadeSimulator(self.params, num_users=1)
        self._last: tuple[list[int], int] | None = None
        self._needs_reset = True

    def attraction_probabilities(self, features: np.ndarray) -> np.ndarray:
        """This env's attraction probability of items with ``features`` (any shape)."""
        return attraction_probabilities(features, self.params.attraction_coefficients)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        self._sim.reset(self.np_random)
        self._needs_reset = False
        self._last = None
        return self._observation(), self._info(-1)

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        p = self.params
        slate = validate_slates(action, num_candidates=p.num_candidates, slate_size=p.slate_size)
        clicked, _ = self._sim.step(self.np_random, slate[None, :])
        slot = int(clicked[0])
        terminated = bool(self._sim.budget[0] <= 0)
        self._needs_reset = terminated
        self._last = (slate.tolist(), slot)
        return self._observation(), float(slot >= 0), terminated, False, self._info(slot)

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        head = f"steps_left={int(self._sim.budget[0])}"
        if self._last is None:
            return head
        slate, slot = self._last
        chosen = "none" if slot < 0 else f"position {slot} (item {slate[slot]})"
        return f"{head} | slate={slate} clicked={chosen}"

    def _observation(self) -> Observation:
        return {key: value[0] for key, value in self._sim.observation().items()}

    def _info(self, clicked_slot: int) -> dict[str, Any]:
        hidden = self._sim.oracle_state()
        return {
            "clicked_slot": clicked_slot,
            "candidate_attraction": hidden["candidate_attraction"][0],
            "slate_click_probability": float(hidden["slate_click_probability"][0]),
            "optimal_click_probability": float(hidden["optimal_click_probability"][0]),
        }
