"""The multi-platform agent interface: the peer of :class:`~fedrec.agents.base.SlateAgent` for
methods where several platforms recommend to the same user (FedSlate, FedQ, your own).

**Parties.** A multi-platform agent is a set of parties: one per platform (``platform_a``,
``platform_b``, ... in env order) and, for federated methods, a server
(:data:`fedrec.federation.messages.SERVER`). What each may hold:

* a platform holds its own observations and slates; if it has **feedback** also its rewards and
  clicks; and its own models, replay and optimiser state. A platform *without* feedback never
  sees a reward, a click or an engagement of its own: the training loop passes ``observe`` the
  rewards of the feedback platforms only, and the env leaves the response keys out of that
  platform's observation;
* the server holds only what reaches it through the channel, and its own models;
* **every value that crosses a party boundary goes through** a
  :class:`fedrec.federation.channel.Channel`, which validates it against the method's
  contract (FedSlate's, the default: only per-candidate values, their gradients, TD labels and
  replay indices; no observations, rewards, parameters or dicts. A method that shares model
  weights opens its channel with that contract instead, as :class:`fedrec.agents.fedcem.FedCEMAgent`
  does), counts its bytes per party and per user-episode, and delivers it. A method builds
  its channel with :meth:`MultiPlatformAgent.make_channel`; the loop reports its traffic.

Keep each party in its own object with no reference to the others, as
:class:`fedrec.agents.fedslate.FedSlateAgent` does, so the contract holds by construction;
``docs/agents.md`` walks through a complete example.

**Interface.** Observations are ``{platform: {key: (U, ...) array}}`` for U users; slates are
``{platform: (U, n) int64}``. Only :meth:`act` is required:

* ``act`` -- greedy slates (evaluation); ``explore`` -- behaviour slates while training
  (default ``act``);
* ``observe(observations, slates, rewards, next_observations, terminated)`` -- one joint step of
  experience; ``rewards`` holds the feedback platforms only; returns training metrics;
* ``end_episode(episodes)`` -- the U users' episodes ended (all users are synchronised);
* ``state_dict`` / ``load_state_dict`` -- everything needed to resume exactly, as data;
* ``traffic()`` -- bytes and messages per user-episode and party (from the channel).

To be built by name (``fedrec train path.py:Class --env fedrec/ChocKaleMultiPlatform-v0``,
``fedrec bench fedslate --methods path.py:Class``), a class defines a ``Config`` dataclass (one
field per hyperparameter, ``help`` in the field metadata); ``from_env(env, *, config, seed)``
builds it from the batched multi-platform env. A class that needs something of the env (e.g.
one candidate catalogue shared by every platform) declares it in ``REQUIRES``, checked before
training or evaluation starts.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from fedrec.agents.base import NoConfig, random_slates
from fedrec.envs.choc_kale_model import ChocKaleParams
from fedrec.federation.channel import Channel, Transport
from fedrec.federation.messages import FEDSLATE_KINDS, MessageKind

#: ``{platform: {observation key: (U, ...) array}}``
Observations = Mapping[str, Mapping[str, np.ndarray]]
#: ``{platform: (U, n) int64 slate}``
Slates = dict[str, np.ndarray]


class MultiPlatformAgent(abc.ABC):
    """Recommends a slate on every platform of a multi-platform env, for U users at once.

    :param platforms: platform names in env order (``env.possible_agents``).
    :param feedback: which platforms observe the user's responses and get rewards.
    :param params: the env's Choc-vs-Kale parameters (N candidates, slate size n, ...).
    :param config: an instance of the class's ``Config`` (default: its defaults).
    :param seed: seeds :attr:`rng`, the agent's own randomness.
    """

    #: Hyperparameters, for construction by name; a frozen dataclass.
    Config: ClassVar[type] = NoConfig
    #: True only for reference policies that read the users' hidden state; a learning method
    #: never gets it, in training or in evaluation.
    oracle: ClassVar[bool] = False
    #: What the method needs of the env, as ``{env attribute: value}``, e.g.
    #: ``{"shared_catalogue": True}`` for a method that relays one platform's candidate scores
    #: to another (it assumes both show the same candidates). Training and evaluation check it
    #: before they start (:func:`check_requirements`) and refuse another env in one line.
    REQUIRES: ClassVar[Mapping[str, Any]] = {}

    def __init__(
        self,
        *,
        platforms: Sequence[str],
        feedback: Mapping[str, bool],
        params: ChocKaleParams,
        config: Any = None,
        seed: int | None = None,
    ) -> None:
        self.names = list(platforms)
        missing = [p for p in self.names if p not in feedback]
        if missing:
            raise ValueError(f"feedback is not given for platforms {missing}")
        self.feedback = {p: bool(feedback[p]) for p in self.names}
        self.params = params
        self.config = config if config is not None else type(self).Config()
        self.rng = np.random.default_rng(seed)
        #: the channel of a federated method (see :meth:`make_channel`); None for local ones.
        self.channel: Channel | None = None

    @classmethod
    def from_env(
        cls, env: Any, *, config: Any = None, seed: int | None = None
    ) -> MultiPlatformAgent:
        """Build for a :class:`~fedrec.envs.multi_platform.ChocKaleMultiPlatformBatchEnv`."""
        return cls(
            platforms=env.possible_agents,
            feedback=env.feedback,
            params=env.params,
            config=config,
            seed=seed,
        )

    # ------------------------------------------------------------------ parties
    @property
    def feedback_platforms(self) -> list[str]:
        return [p for p in self.names if self.feedback[p]]

    @property
    def silent_platforms(self) -> list[str]:
        """Platforms without feedback."""
        return [p for p in self.names if not self.feedback[p]]

    def make_channel(
        self, transport: Transport | None = None, *, kinds: Iterable[MessageKind] = FEDSLATE_KINDS
    ) -> Channel:
        """The validated, accounted channel between the platforms and the server (stored in
        :attr:`channel`, whose traffic the loop reports). ``kinds`` is the method's contract:
        the message kinds it may send (default FedSlate's; see
        :mod:`fedrec.federation.messages`)."""
        self.channel = Channel(
            self.names,
            num_candidates=self.params.num_candidates,
            transport=transport,
            kinds=kinds,
        )
        return self.channel

    # ------------------------------------------------------------------ acting
    @abc.abstractmethod
    def act(self, observations: Observations) -> Slates:
        """Greedy slates of every platform (evaluation)."""

    def explore(self, observations: Observations) -> Slates:
        """Behaviour slates while training (default: :meth:`act`)."""
        return self.act(observations)

    def act_joint(
        self, observations: Observations, oracle: Mapping[str, np.ndarray] | None = None
    ) -> Slates:
        """The evaluation rollouts' interface. ``oracle`` (the users' hidden state) is None
        unless the class declares ``oracle = True``, which only reference policies do."""
        del oracle
        return self.act(observations)

    # ------------------------------------------------------------------ learning
    def observe(
        self,
        observations: Observations,
        slates: Mapping[str, np.ndarray],
        rewards: Mapping[str, np.ndarray],
        next_observations: Observations,
        terminated: np.ndarray,
    ) -> dict[str, float]:
        """One joint step for U users; ``rewards`` has the feedback platforms only."""
        del observations, slates, rewards, next_observations, terminated
        return {}

    def end_episode(self, episodes: int) -> None:
        """``episodes`` user-episodes just ended (closes the channel's traffic counters)."""
        if self.channel is not None:
            self.channel.end_episode(episodes)

    def traffic(self) -> dict[str, dict[str, float]]:
        """Mean bytes and messages per user-episode and party (empty without a channel)."""
        return self.channel.per_episode() if self.channel is not None else {}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly, as data (default: RNG and channel counters)."""
        return {
            "rng": self.rng.bit_generator.state,
            "channel": self.channel.state_dict() if self.channel is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        if self.channel is not None:
            self.channel.load_state_dict(state["channel"])


def check_requirements(agent: Any, env: Any) -> None:
    """Refuse ``env`` when it does not have what the agent's class declares in ``REQUIRES``
    (one ``ValueError`` naming the method, the attribute, the value it needs and the option
    that sets it); an env attribute the env does not have counts as not met."""
    cls = agent if isinstance(agent, type) else type(agent)
    requires = getattr(cls, "REQUIRES", None) or {}
    unmet = []
    for key, needed in requires.items():
        actual = getattr(getattr(env, "unwrapped", env), key, _ABSENT)
        if actual is _ABSENT or actual != needed:
            shown = "not set" if actual is _ABSENT else repr(actual)
            unmet.append(f"{key}={needed!r} (this env: {shown}; --env-kwarg {key}={needed})")
    if unmet:
        raise ValueError(
            f"{cls.__name__} requires an env with {', '.join(unmet)}: without it the method's "
            "assumptions do not hold and its results are meaningless"
        )


_ABSENT = object()


def episode_length_of(env: Any) -> int:
    """Joint steps per episode of a multi-platform env: each platform's share of the shared time
    budget, or the env's cycle cap where that is shorter."""
    length = env.params.time_budget // env.num_platforms
    if getattr(env, "max_cycles", None):
        length = min(length, int(env.max_cycles))
    return length


class RandomMultiPolicy(MultiPlatformAgent):
    """Uniformly random slates of n distinct items on every platform (the papers' baseline)."""

    def act(self, observations: Observations) -> Slates:
        p = self.params
        users = len(observations[self.names[0]]["candidates"])
        return {
            name: random_slates(self.rng, users, p.num_candidates, p.slate_size)
            for name in self.names
        }


@dataclasses.dataclass(frozen=True)
class HeuristicConfig:
    rule: Literal["top_x", "bottom_x"] = dataclasses.field(
        default="top_x",
        metadata={"help": "top_x: the n largest-feature candidates; bottom_x: the n smallest"},
    )

    def __post_init__(self) -> None:
        if self.rule not in ("top_x", "bottom_x"):
            raise ValueError(f"rule must be 'top_x' or 'bottom_x', got {self.rule!r}")


class HeuristicMultiPolicy(MultiPlatformAgent):
    """A fixed heuristic on every platform: ``top_x`` (the n candidates with the largest feature)
    or ``bottom_x`` (the smallest). No learning, no oracle, nothing crosses a party boundary."""

    Config = HeuristicConfig

    def act(self, observations: Observations) -> Slates:
        sign = -1.0 if self.config.rule == "top_x" else 1.0
        n = self.params.slate_size
        return {
            name: np.argsort(sign * np.asarray(obs["candidates"])[..., 0], axis=1, kind="stable")[
                :, :n
            ].astype(np.int64)
            for name, obs in observations.items()
        }
