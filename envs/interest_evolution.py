"""The single-user Gymnasium interest-evolution environment (RecSim's ``interest_evolution``)."""

from __future__ import annotations

import itertools
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.interest_evolution_model import (
    HIDDEN_STATE_KEYS,
    ChoiceModel,
    InterestEvolutionParams,
    InterestEvolutionSimulator,
)
from fedrec.envs.slates import SlateSpace, checked_slate
from fedrec.envs.state import SimulatorEnvState
from fedrec.envs.vector_utils import check_render_mode

Observation = dict[str, np.ndarray]

#: The keyword arguments of RecSim's ``create_environment`` (and RLlib's default and tuned
#: ``InterestEvolutionRecSimEnv`` config) that fedrec's defaults reproduce.
RECSIM_CONFIG: dict[str, Any] = {
    "num_candidates": 10,
    "slate_size": 2,
    "resample_documents": True,
    "seed": 0,
}


def observation_space(params: InterestEvolutionParams) -> spaces.Dict:
    """The per-user observation space: a flat Dict of fixed-shape float32 Boxes."""
    n, k, s = params.num_candidates, params.num_topics, params.slate_size
    big = float(np.finfo(np.float32).max)  # the quality is a normal: unbounded
    return spaces.Dict(
        {
            "user": spaces.Box(-1.0, 1.0, (k,), np.float32),
            "candidates": spaces.Box(0.0, 1.0, (n, k), np.float32),
            "response_click": spaces.Box(0.0, 1.0, (s,), np.float32),
            "response_watch_time": spaces.Box(0.0, params.video_length, (s,), np.float32),
            "response_quality": spaces.Box(-big, big, (s,), np.float32),
        }
    )


class InterestEvolutionEnv(SimulatorEnvState, gym.Env[Observation, np.ndarray]):
    r"""Interest evolution: recommend videos to a user whose interests drift with what they watch.

    ## Description
    RecSim's interest-evolution environment (Ie et al., 2019; the env of the SlateQ paper and of
    RLlib's SlateQ examples), with every parameter a constructor argument. Each step the user is
    offered ``num_candidates`` videos, each of one of K = 20 topics with a hidden quality; the
    agent picks ``slate_size`` of them; the user watches one or none. Watching spends the
    session's time budget, more so for trashy (low-quality) videos, and moves the user's interest
    in the video's topic. The defaults reproduce RecSim's ``create_environment`` (the
    ``IEvUserModel`` with ``UtilityModelUserSampler`` users, ``UtilityModelVideoSampler`` videos
    and the ``MultinomialProportionalChoiceModel``) with RLlib's default and tuned-example config
    ``num_candidates=10, slate_size=2, resample_documents=True, seed=0``
    (``fedrec/InterestEvolution-v0``).

    ## Action Space
    ``SlateSpace(N, n)``, a ``MultiDiscrete([N] * n)`` (start 0): indices into the current
    ``candidates``. Entries must be distinct integers in ``[0, N)``; anything else raises
    ``ValueError`` before the env changes or draws anything. (RecSim accepts duplicates.)

    ## Observation Space
    A flat ``Dict`` of float32 ``Box``\ es (RecSim's ``user``, ``doc`` and ``response``, with
    fixed keys and shapes):

    | key | shape | meaning |
    |---|---|---|
    | ``user`` | (K,) | the user's interests in [-1, 1] (observed, as in RecSim) |
    | ``candidates`` | (N, K) | each candidate's one-hot topic |
    | ``response_click`` | (n,) | one-hot watched slot of the last step (zeros at reset) |
    | ``response_watch_time`` | (n,) | minutes watched per slot of the last step |
    | ``response_quality`` | (n,) | quality of each video of the last slate (revealed once shown) |

    ## Dynamics
    - videos: topic :math:`c \sim U\{0..K-1\}`, quality :math:`q \sim N(\mu_c, 0.1)` with
      :math:`\mu` linear from -3 to 0 over topics 0-13 and from 0 to 3 over 14-19; length 4.
      ``num_candidates`` new videos are drawn at every reset and step.
    - start: interests :math:`I \sim U(-1, 1)^K`, budget :math:`B = 200` minutes.
    - choice: the affinity with video i is :math:`I_{c_i}`; ``proportional`` (default) watches
      slate item i with probability :math:`\propto I_{c_i} + 1` and nothing with weight
      :math:`2` (``no_click_mass`` 1 minus ``min_normalizer`` -1); ``mnl`` uses the softmax of
      :math:`(I_{c_1}, \dots, I_{c_n}, 1)`.
    - watching video i: watch time :math:`w = \min(B, 4)`; the interest
      :math:`x = I_{c_i}` moves by :math:`\pm \alpha(x)(1 - x)`, :math:`\alpha(x) = 0.3(1 - |x|)`,
      towards (+) with probability :math:`(x + 1)/2`, then is clipped to [-1, 1]; the budget
      becomes :math:`B - w + \frac{0.9}{3.4} w q_i`.
    - no click: :math:`B \leftarrow B - 0.5`.

    ## Rewards
    The watch time :math:`w` (RecSim's ``clicked_watchtime_reward``); 0 without a click.

    ## Starting State
    See *start*. All randomness comes from ``self.np_random`` (RecSim draws users and videos
    from ``RandomState(seed)`` streams and choices from the global ``np.random``), so
    ``reset(seed=s)`` fixes the whole trajectory.

    ## Episode End
    The episode **terminates** when the budget reaches 0 or below (about 80 steps under a random
    policy). There is no truncation unless ``max_episode_steps`` is set.

    ## Info
    ``clicked_slot`` (-1 for none) and **hidden** ground truth, declared in
    ``metadata["hidden_info_keys"]`` and stripped by fedrec's loops for every agent that is not
    an oracle: ``budget_left`` (minutes left) and ``candidate_quality`` (N,), the quality of the
    current candidates (a recommender sees a video's quality only after showing it).

    ## Arguments
    ``num_candidates=10, slate_size=2, num_topics=20, time_budget=200.0, video_length=4.0,
    min_utility=-3.0, max_utility=3.0, quality_stddev=0.1, choice_model="proportional",
    no_click_mass=1.0, min_normalizer=-1.0, step_penalty=0.5, user_update_alpha=0.9/3.4,
    user_quality_factor=0.0, document_quality_factor=1.0, alpha_x_intercept=1.0,
    alpha_y_intercept=0.3, render_mode=None`` (see
    :class:`fedrec.envs.interest_evolution_model.InterestEvolutionParams`). RecSim's
    ``resample_documents=False`` (one candidate set for the env's whole life) is not offered.

    ## Vectorized environment
    ``gymnasium.make_vec(id, num_envs=B)`` returns the native
    :class:`fedrec.envs.interest_evolution_vector.InterestEvolutionVectorEnv`; with
    ``num_envs=1`` and the same seed it reproduces this env exactly.

    ## Saving and restoring
    ``state_dict()`` / ``load_state_dict(state)``: everything that changes, as plain data.

    ## Reproduces
    RecSim ``interest_evolution.create_environment`` (recsim-no-tf 0.2.3 = google-research/recsim
    55e50e4) as wrapped by RLlib; statistical parity is tested in
    ``tests/test_interest_evolution.py`` and reported in ``docs/interest_evolution.md``.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4, HIDDEN_INFO_KEYS: HIDDEN_STATE_KEYS}

    def __init__(
        self,
        *,
        num_candidates: int = 10,
        slate_size: int = 2,
        num_topics: int = 20,
        time_budget: float = 200.0,
        video_length: float = 4.0,
        min_utility: float = -3.0,
        max_utility: float = 3.0,
        quality_stddev: float = 0.1,
        choice_model: ChoiceModel = "proportional",
        no_click_mass: float = 1.0,
        min_normalizer: float = -1.0,
        step_penalty: float = 0.5,
        user_update_alpha: float = 0.9 / 3.4,
        user_quality_factor: float = 0.0,
        document_quality_factor: float = 1.0,
        alpha_x_intercept: float = 1.0,
        alpha_y_intercept: float = 0.3,
        render_mode: str | None = None,
    ) -> None:
        check_render_mode(render_mode, self.metadata)
        self.params = InterestEvolutionParams(
            num_candidates=num_candidates,
            slate_size=slate_size,
            num_topics=num_topics,
            time_budget=time_budget,
            video_length=video_length,
            min_utility=min_utility,
            max_utility=max_utility,
            quality_stddev=quality_stddev,
            choice_model=choice_model,
            no_click_mass=no_click_mass,
            min_normalizer=min_normalizer,
            step_penalty=step_penalty,
            user_update_alpha=user_update_alpha,
            user_quality_factor=user_quality_factor,
            document_quality_factor=document_quality_factor,
            alpha_x_intercept=alpha_x_intercept,
            alpha_y_intercept=alpha_y_intercept,
        )
        self.render_mode = render_mode
        self.observation_space = observation_space(self.params)
        self.action_space = SlateSpace(num_candidates, slate_size)
        # The state lives in the B = 1 simulator's arrays, but the step runs a scalar code path
        # of its own (NumPy's per-call overhead on batch-of-one arrays made the simulator slower
        # than RecSim); it draws the same numbers in the same order with the same arithmetic,
        # and a test pins it to InterestEvolutionVectorEnv(num_envs=1).
        self._sim = InterestEvolutionSimulator(self.params, num_users=1)
        self._topic_means = self._sim.topic_means
        self._candidate_rows = np.arange(num_candidates)
        self._interests: list[float] = []
        self._topics: list[int] = []
        self._quality: list[float] = []
        self._budget = 0.0
        self._last: tuple[list[int], int, float] | None = None
        self._needs_reset = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        self._sim.reset(self.np_random)
        self._pull()
        self._needs_reset = False
        self._last = None
        return self._observation(), self._info(-1)

    def step(self, action: np.ndarray) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        p, rng, sim = self.params, self.np_random, self._sim
        slate = checked_slate(action, num_candidates=p.num_candidates, slate_size=p.slate_size)
        topics = [self._topics[i] for i in slate]
        quality = [self._quality[i] for i in slate]
        affinity = [self._interests[c] for c in topics]
        u_choice, u_direction = rng.random(2).tolist()
        next_topics = rng.integers(0, p.num_topics, p.num_candidates)
        next_quality = self._topic_means[next_topics] + p.quality_stddev * rng.standard_normal(
            p.num_candidates
        )

        n = p.slate_size
        if p.choice_model == "proportional":
            weights = [a - p.min_normalizer for a in affinity]
            weights.append(p.no_click_mass - p.min_normalizer)
        else:  # the simulator's own arithmetic (np.exp)
            weights = sim.choice_weights(np.array([affinity]))[0].tolist()
        cumulative = list(itertools.accumulate(weights))  # sequential, like np.cumsum
        threshold = u_choice * cumulative[-1]
        slot = min(sum(total <= threshold for total in cumulative), n)
        budget, reward = self._budget, 0.0
        click_row = np.zeros(n, dtype=np.float32)
        watch_row = np.zeros(n, dtype=np.float32)
        if slot < n:
            reward = min(budget, p.video_length)
            topic, x = topics[slot], affinity[slot]
            alpha = (-p.alpha_y_intercept / p.alpha_x_intercept) * abs(x) + p.alpha_y_intercept
            update = alpha * (1.0 - x)
            moved = x + update if u_direction < (x + 1.0) / 2.0 else x - update
            self._interests[topic] = min(max(moved, -1.0), 1.0)
            sim.interests[0, topic] = self._interests[topic]
            if p.choice_model == "proportional":
                expected = x - p.min_normalizer
            else:
                expected = float(sim.expected_utility(np.array([x]))[0])
            utility = p.user_quality_factor * expected + p.document_quality_factor * quality[slot]
            budget = budget - reward + p.user_update_alpha * reward * utility
            click_row[slot], watch_row[slot] = 1.0, reward
        else:
            slot = -1
            budget = budget - p.step_penalty
        self._budget = budget
        sim.budget[0] = budget
        sim.topics[0], sim.quality[0] = next_topics, next_quality
        self._topics, self._quality = next_topics.tolist(), next_quality.tolist()
        sim.response_click[0], sim.response_watch_time[0] = click_row, watch_row
        sim.response_quality[0] = quality
        terminated = budget <= 0.0
        self._needs_reset = terminated
        self._last = (slate, slot, reward)
        return self._observation(), reward, terminated, False, self._info(slot)

    def _simulator_loaded(self) -> None:
        self._pull()

    def _pull(self) -> None:
        """Copy the simulator's user and candidates into the scalar path's lists."""
        sim = self._sim
        self._interests = sim.interests[0].tolist()
        self._topics = sim.topics[0].tolist()
        self._quality = sim.quality[0].tolist()
        self._budget = float(sim.budget[0])

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        head = f"budget={self._budget:.2f} min"
        if self._last is None:
            return head
        slate, slot, reward = self._last
        chosen = "none" if slot < 0 else f"slot {slot} (item {slate[slot]})"
        return f"{head} | slate={slate} watched={chosen} watch_time={reward:.2f}"

    def _observation(self) -> Observation:
        sim = self._sim
        candidates = np.zeros((self.params.num_candidates, self.params.num_topics), np.float32)
        candidates[self._candidate_rows, sim.topics[0]] = 1.0
        return {
            "user": sim.interests[0].astype(np.float32),
            "candidates": candidates,
            "response_click": sim.response_click[0].copy(),
            "response_watch_time": sim.response_watch_time[0].copy(),
            "response_quality": sim.response_quality[0].copy(),
        }

    def _info(self, clicked_slot: int) -> dict[str, Any]:
        return {
            "clicked_slot": clicked_slot,
            "budget_left": self._budget,
            "candidate_quality": self._sim.quality[0].copy(),
        }
