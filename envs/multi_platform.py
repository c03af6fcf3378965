"""Multi-platform Choc-vs-Kale: one user, K platforms, one shared user state and time budget.

:class:`ChocKaleMultiPlatformBatchEnv` simulates B users at once; :class:`ChocKaleMultiPlatformEnv`
is the PettingZoo ``ParallelEnv`` for one user and is a thin view over the batched class, so both
have exactly the same semantics.
"""

from __future__ import annotations

import string
from functools import cache
from typing import Any, Literal

import numpy as np
from gymnasium import spaces
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from fedrec.envs.choc_kale import FEDSLATE_KWARGS, Observation, observation_space
from fedrec.envs.choc_kale_model import ChocKaleParams, make_params
from fedrec.envs.choc_kale_sim import HIDDEN_STATE_KEYS, ChocKaleSimulator
from fedrec.envs.hidden import HIDDEN_INFO_KEYS
from fedrec.envs.slates import SlateSpace, validate_slates
from fedrec.envs.state import StateReader, generator_state
from fedrec.envs.vector_utils import check_render_mode

RewardMode = Literal["individual", "team", "sparse_team"]
#: Steps each platform gets in the FedSlate code (a shared budget of 122 for two platforms).
STEPS_PER_PLATFORM = 61
MAX_PLATFORMS = len(string.ascii_lowercase)


def platform_names(num_platforms: int) -> list[str]:
    """``platform_a``, ``platform_b``, ... (the FedSlate paper's Alpha, Beta, ...)."""
    return [f"platform_{letter}" for letter in string.ascii_lowercase[:num_platforms]]


class ChocKaleMultiPlatformBatchEnv:
    """B users, each active on K platforms; all users advance in one NumPy operation per platform.

    Semantics (shared with the PettingZoo env; see its card): every joint step the user visits the
    platforms in order ``platform_a, platform_b, ...``; each visit is one Choc-vs-Kale step on that
    platform's own candidate set and spends one unit of the shared budget; the other platforms'
    candidate sets are frozen meanwhile, but the user's state carries over (cross-platform
    effect). Episodes of all users are synchronised (fixed length), so there is no autoreset.

    Platforms without feedback get no response in their observation, reward 0 and no click in
    their info; their true engagement is kept apart and read only through
    :meth:`evaluation_engagement`, which a training loop must not hand to a learner.

    :meth:`state_dict` / :meth:`load_state_dict` save and restore the generator, the users'
    state, the episode's engagement, pending team reward and cycle count as plain data (see
    :mod:`fedrec.envs.state`), for an exact resume without pickling.
    """

    #: The users' hidden state (never in the infos; see :meth:`oracle_state`).
    metadata = {HIDDEN_INFO_KEYS: HIDDEN_STATE_KEYS}

    def __init__(
        self,
        num_users: int = 1,
        *,
        num_platforms: int = 2,
        feedback: tuple[bool, ...] | list[bool] | None = None,
        reward_mode: RewardMode = "individual",
        reward_interval: int = 10,
        time_budget: int | None = None,
        max_cycles: int | None = None,
        shared_catalogue: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(shared_catalogue, bool):
            raise ValueError(f"shared_catalogue must be True or False, got {shared_catalogue!r}")
        if isinstance(num_platforms, bool) or not isinstance(num_platforms, int):
            raise ValueError(f"num_platforms must be an integer, got {num_platforms!r}")
        if not 1 <= num_platforms <= MAX_PLATFORMS:
            raise ValueError(f"num_platforms must be in [1, {MAX_PLATFORMS}], got {num_platforms}")
        if feedback is None:
            feedback = (True,) + (False,) * (num_platforms - 1)
        feedback = tuple(feedback)
        if len(feedback) != num_platforms or not all(isinstance(f, bool) for f in feedback):
            raise ValueError(
                f"feedback must be {num_platforms} booleans (one per platform), got {feedback!r}"
            )
        if reward_mode not in ("individual", "team", "sparse_team"):
            raise ValueError(
                f"reward_mode must be 'individual', 'team' or 'sparse_team', got {reward_mode!r}"
            )
        if (
            isinstance(reward_interval, bool)
            or not isinstance(reward_interval, int)
            or reward_interval < 1
        ):
            raise ValueError(f"reward_interval must be a positive integer, got {reward_interval!r}")
        if max_cycles is not None and max_cycles < 1:
            raise ValueError(f"max_cycles must be >= 1 or None, got {max_cycles}")
        if time_budget is None:
            time_budget = STEPS_PER_PLATFORM * num_platforms
        self.params: ChocKaleParams = make_params(
            {**FEDSLATE_KWARGS, **kwargs, "time_budget": time_budget}
        )
        self.num_users = num_users
        self.num_platforms = num_platforms
        self.possible_agents = platform_names(num_platforms)
        self.feedback = dict(zip(self.possible_agents, feedback, strict=True))
        self.reward_mode = reward_mode
        self.reward_interval = reward_interval
        self.max_cycles = max_cycles
        self.observation_spaces = {
            agent: observation_space(self.params, feedback=self.feedback[agent])
            for agent in self.possible_agents
        }
        self.action_spaces = {
            agent: SlateSpace(self.params.num_candidates, self.params.slate_size)
            for agent in self.possible_agents
        }
        self.shared_catalogue = shared_catalogue
        self._sim = ChocKaleSimulator(
            self.params,
            num_users=num_users,
            num_platforms=num_platforms,
            shared_catalogue=shared_catalogue,
        )
        self._np_random: np.random.Generator | None = None
        self._episode_engagement = np.zeros((num_platforms, num_users))
        self._pending_team = np.zeros(num_users)
        self._cycles = 0
        self._running = False

    @property
    def np_random(self) -> np.random.Generator:
        if self._np_random is None:
            self._np_random, _ = seeding.np_random()
        return self._np_random

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Observation], dict[str, dict[str, Any]]]:
        """Start a new episode for every user."""
        if seed is not None:
            self._np_random, _ = seeding.np_random(seed)
        self._sim.reset(self.np_random)
        self._episode_engagement[:] = 0.0
        self._pending_team[:] = 0.0
        self._cycles = 0
        self._running = True
        empty = np.full(self.num_users, -1)
        return self._observations(), self._infos([empty] * self.num_platforms)

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[
        dict[str, Observation],
        dict[str, np.ndarray],
        dict[str, np.ndarray],
        dict[str, np.ndarray],
        dict[str, dict[str, Any]],
    ]:
        """One joint step: the user visits every platform once, in order."""
        if not self._running:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        slates = self._validate(actions)  # every platform's slates, before any change
        sim, rng = self._sim, self.np_random
        engagement = np.zeros((self.num_platforms, self.num_users))
        clicked = []
        for platform, agent in enumerate(self.possible_agents):
            outcome = sim.visit(rng, platform, slates[agent])
            engagement[platform] = outcome.engagement
            clicked.append(outcome.clicked_slot)
        self._episode_engagement += engagement
        self._cycles += 1

        terminated = bool((sim.budget <= 0).all())
        truncated = (
            not terminated and self.max_cycles is not None and self._cycles >= self.max_cycles
        )
        self._running = not (terminated or truncated)
        rewards = self._rewards(engagement, episode_over=not self._running)
        agents = self.possible_agents
        return (
            self._observations(),
            rewards,
            {agent: np.full(self.num_users, terminated) for agent in agents},
            {agent: np.full(self.num_users, truncated) for agent in agents},
            self._infos(clicked),
        )

    def evaluation_engagement(self) -> dict[str, np.ndarray]:
        """True engagement per platform so far this episode, for *evaluation only*.

        This is the one place a no-feedback platform's engagement can be read; learners receive
        observations, rewards and infos, none of which carry it.
        """
        return {
            agent: self._episode_engagement[platform].copy()
            for platform, agent in enumerate(self.possible_agents)
        }

    def oracle_state(self) -> dict[str, np.ndarray]:
        """Ground-truth user state (exposure, satisfaction, visits left) for reference policies."""
        return self._sim.oracle_state()

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        return {
            "np_random": generator_state(self._np_random),
            "simulator": self._sim.state_dict(),
            "episode_engagement": self._episode_engagement.copy(),
            "pending_team": self._pending_team.copy(),
            "cycles": int(self._cycles),
            "running": bool(self._running),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments.

        The whole state is checked first (``ValueError`` naming the problem; nothing changes).
        """
        read = StateReader(state, type(self).__name__)
        k, b = self.num_platforms, self.num_users
        rng = read.generator()
        simulator = read.dict("simulator")
        engagement = read.array(
            "episode_engagement", (k, b), np.float64, hint=f"num_platforms={k}, num_users={b}"
        )
        pending = read.array("pending_team", (b,), np.float64, hint=f"num_users={b}")
        cycles = read.int("cycles", low=0)
        running = read.bool("running")
        read.finish()
        self._sim.load_state_dict(simulator)  # checks before it changes anything
        self._np_random = rng
        self._episode_engagement = engagement
        self._pending_team = pending
        self._cycles = cycles
        self._running = running

    # -- internals --------------------------------------------------------------------------
    def _validate(self, actions: object, *, batched: bool = True) -> dict[str, np.ndarray]:
        """Every platform's slates, checked (nothing changes); ``batched=False``: one user's
        slates of shape (slate_size,) (the PettingZoo env), returned with a batch axis."""
        if not isinstance(actions, dict):
            raise ValueError(
                f"actions must be a dict keyed by platform {self.possible_agents}, "
                f"got {type(actions).__name__} ({actions!r:.80})"
            )
        missing = [agent for agent in self.possible_agents if agent not in actions]
        unknown = [agent for agent in actions if agent not in self.feedback]
        if missing or unknown:
            raise ValueError(
                f"actions must have exactly the keys {self.possible_agents}; "
                f"missing {missing}, unknown {unknown}"
            )
        p = self.params
        slates = {
            agent: validate_slates(
                actions[agent],
                num_candidates=p.num_candidates,
                slate_size=p.slate_size,
                batch_size=self.num_users if batched else None,
                who=f"slate of {agent}",
            )
            for agent in self.possible_agents
        }
        return slates if batched else {agent: slate[None] for agent, slate in slates.items()}

    def _rewards(self, engagement: np.ndarray, *, episode_over: bool) -> dict[str, np.ndarray]:
        if self.reward_mode == "individual":
            values = list(engagement)
        else:
            team = engagement.sum(axis=0)
            if self.reward_mode == "sparse_team":
                self._pending_team += team
                if episode_over or self._cycles % self.reward_interval == 0:
                    team, self._pending_team = self._pending_team, np.zeros(self.num_users)
                else:
                    team = np.zeros(self.num_users)
            values = [team] * self.num_platforms
        zero = np.zeros(self.num_users)
        return {
            agent: (np.array(value) if self.feedback[agent] else zero.copy())
            for agent, value in zip(self.possible_agents, values, strict=True)
        }

    def _observations(self) -> dict[str, Observation]:
        return {
            agent: self._sim.observation(
                self.np_random, platform=platform, feedback=self.feedback[agent]
            )
            for platform, agent in enumerate(self.possible_agents)
        }

    def _infos(self, clicked: list[np.ndarray]) -> dict[str, dict[str, Any]]:
        infos: dict[str, dict[str, Any]] = {}
        for agent, slot in zip(self.possible_agents, clicked, strict=True):
            infos[agent] = {"feedback": self.feedback[agent]}
            if self.feedback[agent]:
                infos[agent]["clicked_slot"] = slot.copy()
        return infos


class ChocKaleMultiPlatformEnv(ParallelEnv):
    r"""Cross-platform Choc-vs-Kale: one user, K platforms that cannot share raw data.

    ## Description
    The FedSlate setting (Deng et al., 2024): one user is active on K platforms (default 2:
    ``platform_a`` with feedback, ``platform_b`` without). Every joint step the user visits the
    platforms in order; each visit is one step of the FedSlate Choc-vs-Kale variant (see
    :class:`fedrec.envs.choc_kale.ChocKaleEnv`) on that platform's own candidate stream. All
    platforms act on the same user: its exposure, hence satisfaction, carries over from one
    platform to the next (cross-platform effect), and one time budget is shared. While the
    user is on one platform, the others' candidate sets are frozen.

    ## Action Space
    Per platform ``MultiDiscrete([N] * n)``: distinct indices into that platform's candidates.
    Every platform must act every joint step; bad slates raise ``ValueError`` naming the platform,
    and so does anything but a dict with exactly one slate per platform, before anything changes.

    ## Observation Space
    Per platform a flat ``Dict``: ``candidates`` (N, 1) and ``user`` (1,) (satisfaction plus
    truncated-normal noise, drawn afresh per platform); platforms **with feedback** also get
    ``response_click`` and ``response_engagement`` (H, n) of their own last H visits. A platform
    without feedback has no response keys at all.

    ## Dynamics
    As in :class:`~fedrec.envs.choc_kale.ChocKaleEnv` with the FedSlate defaults (MNL choice with
    logit ``1 - x`` and no null item, beta = 0.9, tau = 0.01, noise 0.1, H = 5, unclipped
    engagement), applied at each visit in platform order with the pre-visit satisfaction.

    ## Rewards
    - ``individual`` (default): a platform with feedback gets its own engagement.
    - ``team``: every platform with feedback gets the sum of all platforms' engagement.
    - ``sparse_team``: that team sum, accumulated and paid every ``reward_interval`` joint steps
      and at the episode end, 0 otherwise.

    A platform **without feedback always gets 0** and its info carries no click: nothing it
    receives depends on its own engagement. Evaluation reads the true per-platform engagement
    from ``env.evaluation_engagement()`` (never passed to learners).

    ## Info
    Per platform: ``feedback`` (whether it observes responses) and, for a platform with
    feedback, ``clicked_slot``. The user's **hidden** state (``user_exposure``,
    ``user_satisfaction``, ``budget_left``, ``user_sensitivity`` with hidden user types;
    ``metadata["hidden_info_keys"]``) is never in the
    infos: it is read through ``env.oracle_state()``, which the evaluation rollouts call for
    oracles (the joint planner, myopic) only.

    ## Starting State
    As the single env; all randomness comes from the generator seeded by ``reset(seed=...)``.
    With ``user_sensitivities`` (hidden user types, ``fedrec/ChocKaleMultiPlatformUserTypes-v0``:
    tau 0 or 0.1) each user's tau is drawn at every reset and is the same on every platform; it
    is hidden (``user_sensitivity`` in ``oracle_state()`` only), and every platform, with
    feedback or not, sees its own noisy satisfaction reading of the user.

    ## Episode End
    Terminates when the shared budget (default ``61 * K``: 61 visits per platform, the FedSlate
    code's 122 for two) is spent; truncates after ``max_cycles`` joint steps if that is set.

    ## Arguments
    ``num_platforms=2, feedback=None`` (first platform only), ``reward_mode="individual",
    reward_interval=10, time_budget=None`` (61 K), ``max_cycles=None``, ``render_mode=None``,
    ``shared_catalogue=False`` (True: every platform shows the first platform's candidates of the
    same joint step, as the code's basic runs did with one document seed for both platforms),
    and any Choc-vs-Kale parameter (``num_candidates=10, slate_size=3, sensitivity=...``).

    ## Batched version
    :class:`ChocKaleMultiPlatformBatchEnv` runs B users with the same semantics.

    ## Saving and restoring
    ``state_dict()`` returns everything that changes while the env runs (generator, user state,
    candidates, histories, episode bookkeeping, live agents) as plain data, and
    ``load_state_dict(state)`` restores it into an env built with the same arguments, so a
    resumed run continues bit-for-bit (see :mod:`fedrec.envs.state`; no pickling).

    ## Reproduces
    The two-platform environment of the FedSlate code (TianYaDY/FedSlate 9df49d8), with distinct
    candidate streams per platform by default (the code's basic runs shared one catalogue seed:
    ``shared_catalogue=True``).
    """

    metadata = {
        "name": "choc_kale_multi_platform_v0",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
        HIDDEN_INFO_KEYS: HIDDEN_STATE_KEYS,
    }

    def __init__(self, *, render_mode: str | None = None, **kwargs: Any) -> None:
        check_render_mode(render_mode, self.metadata)
        self.render_mode = render_mode
        self.batch = ChocKaleMultiPlatformBatchEnv(num_users=1, **kwargs)
        self.possible_agents = list(self.batch.possible_agents)
        self.agents: list[str] = []
        self.params = self.batch.params
        self.observation_spaces = self.batch.observation_spaces
        self.action_spaces = self.batch.action_spaces
        self.state_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)

    @property
    def max_cycles(self) -> int | None:
        return self.batch.max_cycles

    @max_cycles.setter
    def max_cycles(self, value: int | None) -> None:
        self.batch.max_cycles = value

    @cache  # noqa: B019 (PettingZoo requires the same space object per call)
    def observation_space(self, agent: str) -> spaces.Dict:
        return self.observation_spaces[agent]

    @cache  # noqa: B019
    def action_space(self, agent: str) -> SlateSpace:
        return self.action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Observation], dict[str, dict[str, Any]]]:
        obs, infos = self.batch.reset(seed=seed, options=options)
        self.agents = list(self.possible_agents)
        return _first(obs), _first_info(infos)

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[
        dict[str, Observation],
        dict[str, float],
        dict[str, bool],
        dict[str, bool],
        dict[str, dict[str, Any]],
    ]:
        if not self.agents:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        slates = self.batch._validate(actions, batched=False)  # before any change
        obs, rewards, terminations, truncations, infos = self.batch.step(slates)
        if terminations[self.possible_agents[0]][0] or truncations[self.possible_agents[0]][0]:
            self.agents = []
        return (
            _first(obs),
            {agent: float(value[0]) for agent, value in rewards.items()},
            {agent: bool(value[0]) for agent, value in terminations.items()},
            {agent: bool(value[0]) for agent, value in truncations.items()},
            _first_info(infos),
        )

    def state_dict(self) -> dict[str, Any]:
        """Everything that changes while the env runs, as plain data (see :mod:`fedrec.envs.state`)."""
        return {"batch": self.batch.state_dict(), "agents": list(self.agents)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into an env built with the same arguments.

        The whole state is checked first (``ValueError`` naming the problem; nothing changes).
        """
        read = StateReader(state, type(self).__name__)
        batch = read.dict("batch")
        agents = read.raw("agents")
        read.finish()
        if not isinstance(agents, list | tuple) or list(agents) not in ([], self.possible_agents):
            raise read.fail("agents", f"must be [] or {self.possible_agents}, got {agents!r}")
        self.batch.load_state_dict(batch)  # checks before it changes anything
        self.agents = list(agents)

    def evaluation_engagement(self) -> dict[str, float]:
        """True engagement per platform this episode (evaluation only; see the batched class)."""
        return {agent: float(v[0]) for agent, v in self.batch.evaluation_engagement().items()}

    def oracle_state(self) -> dict[str, float]:
        """Ground-truth user state for reference policies (optimal planner, myopic)."""
        return {key: value[0].item() for key, value in self.batch.oracle_state().items()}

    def state(self) -> np.ndarray:
        """Global simulator state: [exposure, satisfaction, budget left]."""
        s = self.oracle_state()
        return np.array(
            [s["user_exposure"], s["user_satisfaction"], s["budget_left"]], dtype=np.float64
        )

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        s = self.oracle_state()
        totals = self.evaluation_engagement()
        parts = " ".join(f"{agent}={value:.1f}" for agent, value in totals.items())
        return (
            f"budget={s['budget_left']} satisfaction={s['user_satisfaction']:.4f} "
            f"engagement so far: {parts}"
        )

    def close(self) -> None:
        return None


def _first(batched: dict[str, Observation]) -> dict[str, Observation]:
    return {agent: {key: value[0] for key, value in obs.items()} for agent, obs in batched.items()}


def _first_info(batched: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        agent: {
            key: (value[0].item() if isinstance(value, np.ndarray) else value)
            for key, value in info.items()
        }
        for agent, info in batched.items()
    }
