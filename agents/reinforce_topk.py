"""REINFORCE with the top-K off-policy correction (Chen et al., WSDM 2019), for slates.

"Top-K Off-Policy Correction for a REINFORCE Recommender System": a softmax policy
``pi(i | s)`` over the candidates, whose score of candidate i is a network of the user's state and
the candidate's features, is trained by REINFORCE on the item the user consumed. Read top to
bottom like a CleanRL script: the hyperparameters (:class:`ReinforceTopKConfig`), the network
(:class:`SoftmaxSlatePolicy`), then the agent, whose :meth:`ReinforceTopKAgent._gradient_step` is
the whole update.

What follows the paper:

* **the slate**: K distinct candidates sampled from ``pi`` without replacement while training
  (Gumbel top-K: a Plackett-Luce draw, the most probable slot first); the K most probable at
  evaluation (``act_batch``).
* **the top-K correction** (paper Sec. 4.3): the gradient of the consumed item a is multiplied by
  ``lambda_K(s, a) = K (1 - pi(a | s))^(K - 1)`` (no gradient through it); ``topk_correction=False``
  gives plain REINFORCE for comparison.
* **the off-policy correction** (Sec. 4.1-4.2): the importance weight ``pi(a | s) / beta(a | s)``,
  capped at ``weight_cap``, with a learned behaviour policy ``beta``: a second softmax head on the
  policy's shared body, fit by maximum likelihood to the logged slates' items, the gradient
  *blocked* into the body (``beta`` learns from the body's features but does not shape them).
* **discounted returns** ``R_t = sum_k gamma^k r_{t+k}`` of each finished user-episode.

**On- and off-policy.** fedrec's loop is on-policy: the agent acts with its own current policy.
With ``off_policy=False`` (default) it updates once per ``batch_episodes`` finished user-episodes
of its current policy, on all their steps, and forgets them: then ``beta = pi`` and there is no
importance weight. With ``off_policy=True`` the agent learns as the paper's does, from logged data
of *earlier* policies: finished episodes go to a replay of past episodes (``buffer_size``
transitions), every ``train_frequency`` transitions a minibatch is drawn from it, and the
correction ``min(pi / beta, weight_cap)`` re-weights each consumed item for the mixture of past
policies that logged it (``beta`` is that mixture, learned on the same minibatches). This choice --
the replay of this agent's own past episodes stands for the paper's logs of other recommenders --
is what makes the off-policy case arise inside an on-policy loop.

Not in the paper, both labelled by their flags: ``normalize_returns`` (standardise the returns of
each update batch: a variance-reducing baseline; the paper names none) and ``normalize_inputs``
(standardise features with statistics frozen after ``learning_starts``, as fedrec's SlateQ does).
The paper's user state is an RNN over the user's history; here it is the observation (as in
SlateQ): the noisy satisfaction reading and the last ``history_length`` responses.

A user-episode cut by a time limit (``truncated``) has no bootstrap (REINFORCE has no critic): its
returns sum the rewards it saw. The reward of a step is credited to the consumed item of its
slate (``response_click``); a step without consumption adds its reward to the returns of earlier
steps but gives no gradient of its own.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from fedrec.agents.base import Info, Observation, SlateAgent, Transitions, slate_size_of
from fedrec.agents.replay import PlatformReplay
from fedrec.agents.slateq import ITEM_KEY, FeatureNormalizer, split_features

CLICK_KEY = "response_click"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class ReinforceTopKConfig:
    """REINFORCE top-K hyperparameters. Counts are in transitions (user-steps) unless named
    otherwise."""

    off_policy: bool = dataclasses.field(
        default=False,
        metadata=_help(
            "learn from a replay of past episodes with the capped pi/beta correction and a learned "
            "behaviour head (False: on-policy batches, beta = pi, no importance weight)"
        ),
    )
    topk_correction: bool = dataclasses.field(
        default=True,
        metadata=_help("multiply the gradient by lambda_K = K (1 - pi)^(K-1) (False: REINFORCE)"),
    )
    gamma: float = dataclasses.field(default=0.9, metadata=_help("discount of the returns"))
    hidden_sizes: tuple[int, ...] = dataclasses.field(
        default=(64, 32), metadata=_help("hidden layers of the shared [user, item] body")
    )
    learning_rate: float = dataclasses.field(
        default=3e-3, metadata=_help("Adam step size (policy and behaviour heads)")
    )
    batch_episodes: int = dataclasses.field(
        default=16, metadata=_help("on-policy: finished user-episodes per update")
    )
    batch_size: int = dataclasses.field(
        default=256, metadata=_help("off-policy: replay transitions per gradient step")
    )
    buffer_size: int = dataclasses.field(
        default=50_000, metadata=_help("off-policy: replay capacity in transitions")
    )
    train_frequency: int = dataclasses.field(
        default=16, metadata=_help("off-policy: transitions per gradient step")
    )
    learning_starts: int = dataclasses.field(
        default=1_000,
        metadata=_help("transitions before the first update (input statistics are frozen then)"),
    )
    weight_cap: float = dataclasses.field(
        default=10.0, metadata=_help("off-policy: cap c of the importance weight min(pi/beta, c)")
    )
    normalize_returns: bool = dataclasses.field(
        default=True,
        metadata=_help("standardise each batch's returns (a baseline; not in the paper)"),
    )
    normalize_inputs: bool = dataclasses.field(
        default=True,
        metadata=_help("standardise features with mean/std frozen at learning_starts"),
    )
    max_grad_norm: float = dataclasses.field(
        default=10.0, metadata=_help("gradient-norm clip per update (0: none)")
    )

    def __post_init__(self) -> None:
        checks = {
            "gamma": 0.0 <= self.gamma <= 1.0,
            "hidden_sizes": len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1,
            "learning_rate": self.learning_rate > 0,
            "batch_episodes": self.batch_episodes >= 1,
            "batch_size": self.batch_size >= 1,
            "buffer_size": self.buffer_size >= self.batch_size,
            "train_frequency": self.train_frequency >= 1,
            "learning_starts": self.learning_starts >= 0,
            "weight_cap": self.weight_cap > 0,
            "max_grad_norm": self.max_grad_norm >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise ValueError(f"invalid reinforce_topk config: {values}")


class SoftmaxSlatePolicy(nn.Module):
    """Scores of every candidate from a body over [user features, item features], shared by all
    candidates, with two linear heads: the policy ``pi`` and the behaviour policy ``beta``, whose
    input is the body's output *detached* (the paper's blocked gradient)."""

    def __init__(self, user_dim: int, item_dim: int, hidden_sizes: tuple[int, ...]) -> None:
        super().__init__()
        first, *rest = hidden_sizes
        self.user_layer = nn.Linear(user_dim, first)
        self.item_layer = nn.Linear(item_dim, first, bias=False)
        layers: list[nn.Module] = [nn.ReLU()]
        width = first
        for size in rest:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.body = nn.Sequential(*layers)
        self.pi_head = nn.Linear(width, 1)
        self.beta_head = nn.Linear(width, 1)

    def forward(self, user: torch.Tensor, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, U) and (B, N, D) -> logits of pi and of beta, each (B, N)."""
        hidden = self.body(self.user_layer(user)[:, None, :] + self.item_layer(items))
        pi = self.pi_head(hidden).squeeze(-1)
        beta = self.beta_head(hidden.detach()).squeeze(-1)
        return pi, beta


def check_slate_env(env: Any, agent: str, *, needs_clicks: bool) -> tuple[Any, np.ndarray]:
    """The per-user observation space of ``env`` and a batch-of-one sample, after checking that
    the env shows candidate features (``candidates``: (N, D) floats) and, if ``needs_clicks``,
    the consumed slot (``response_click``); a clear error otherwise."""
    space = getattr(env, "single_observation_space", None) or env.observation_space
    keys = sorted(getattr(space, "spaces", {}) or {})
    item_space = getattr(space, "spaces", {}).get(ITEM_KEY) if keys else None
    if item_space is None or len(getattr(item_space, "shape", ()) or ()) != 2:
        raise ValueError(
            f"{agent} needs candidate features under {ITEM_KEY!r} with shape (N, D) (a "
            f"Choc-vs-Kale env, fedrec/ChocKale*-v0); this env observes {keys or space}"
        )
    if needs_clicks and CLICK_KEY not in keys:
        raise ValueError(
            f"{agent} learns from the consumed item ({CLICK_KEY!r} in the observation), which this "
            f"env does not show (observation keys {keys}): a platform without feedback cannot "
            "train it"
        )
    if needs_clicks and space.spaces[CLICK_KEY].shape[-1:] != (slate_size_of(env),):
        raise ValueError(
            f"{agent} reads the consumed slot from {CLICK_KEY!r} of shape (H, n) or (n,) for "
            f"slates of n = {slate_size_of(env)}; this env's has {space.spaces[CLICK_KEY].shape}"
        )
    sample = {key: np.asarray(value)[None] for key, value in space.sample().items()}
    return space, sample


def consumed_slots(next_observations: Observation, slates: np.ndarray) -> np.ndarray:
    """The slot of each user's last slate that was consumed (the first clicked one), -1 for none,
    read from ``response_click``: the latest row of an (H, n) history, or an (n,) response."""
    clicks = np.asarray(next_observations[CLICK_KEY])
    last = clicks[:, -1, :] if clicks.ndim == 3 else clicks
    if last.shape != np.shape(slates):
        raise ValueError(
            f"{CLICK_KEY} {clicks.shape[1:]} does not describe slates of {np.shape(slates)[1]}"
        )
    return np.where(last.max(axis=1) > 0, last.argmax(axis=1), -1).astype(np.int64)


def gumbel_top_k(rng: np.random.Generator, logits: np.ndarray, k: int) -> np.ndarray:
    """K distinct indices per row drawn from softmax(logits) without replacement, in draw order
    (the Gumbel top-K trick: a Plackett-Luce sample)."""
    keys = logits - np.log(-np.log(rng.random(logits.shape)))
    return np.argsort(-keys, axis=1, kind="stable")[:, :k].astype(np.int64)


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``R_t = r_t + gamma R_{t+1}`` of one episode's rewards (no bootstrap after the last)."""
    returns = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        returns[t] = running
    return returns


#: What each step of an open user-episode keeps, until the episode ends.
STEP_KEYS = ("user", "items", "slate", "consumed", "reward")


class ReinforceTopKAgent(SlateAgent):
    """Chen et al.'s top-K off-policy-corrected REINFORCE (see the module doc). Build it with
    :meth:`from_env`."""

    Config = ReinforceTopKConfig

    def __init__(
        self,
        *,
        slate_size: int,
        num_candidates: int,
        user_dim: int,
        item_dim: int,
        config: ReinforceTopKConfig | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        if slate_size > num_candidates:
            raise ValueError(f"slate_size {slate_size} exceeds num_candidates {num_candidates}")
        self.config = config if config is not None else ReinforceTopKConfig()
        self.num_candidates = num_candidates
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.default_rng(seed).integers(2**31)))
            self.policy = SoftmaxSlatePolicy(user_dim, item_dim, self.config.hidden_sizes)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.config.learning_rate)
        self.normalizer = FeatureNormalizer()
        # Steps of the users' open episodes: one (B, ...) array per vector step, from the oldest
        # step an open episode still needs; start[u] indexes user u's first step in them.
        self.open: dict[str, list[np.ndarray]] = {key: [] for key in STEP_KEYS}
        self.start = np.zeros(0, dtype=np.int64)
        # Finished episodes' steps with their returns: the on-policy batch, or the replay.
        self.batch: list[dict[str, np.ndarray]] = []
        self.replay = PlatformReplay(self.config.buffer_size, feedback=True)
        self.transitions_seen = 0
        self.updates = 0
        self._train_debt = 0

    @classmethod
    def from_env(
        cls, env: Any, *, config: Any = None, seed: int | None = None
    ) -> ReinforceTopKAgent:
        _, sample = check_slate_env(env, "reinforce_topk", needs_clicks=True)
        user, items = split_features(sample)
        return cls(
            slate_size=slate_size_of(env),
            num_candidates=items.shape[1],
            user_dim=user.shape[1],
            item_dim=items.shape[2],
            config=config,
            seed=seed,
        )

    # ----------------------------------------------------------------------------- acting
    def _tensors(self, user: np.ndarray, items: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        user, items = self.normalizer("user", user), self.normalizer("items", items)
        return (
            torch.from_numpy(np.ascontiguousarray(user, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(items, dtype=np.float32)),
        )

    @torch.no_grad()
    def policy_logits(self, observations: Observation) -> np.ndarray:
        """The logits of pi over the candidates (B, N)."""
        user, items = self._tensors(*split_features(observations))
        return self.policy(user, items)[0].double().numpy()

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        """The K most probable candidates under pi, most probable first."""
        logits = self.policy_logits(observations)
        order = np.argsort(-logits, axis=1, kind="stable")
        return order[:, : self.slate_size].astype(np.int64)

    def explore_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        """K candidates sampled from pi without replacement."""
        return gumbel_top_k(self.rng, self.policy_logits(observations), self.slate_size)

    # ----------------------------------------------------------------------------- learning
    def learn(self, transitions: Transitions) -> dict[str, float]:
        c = self.config
        user, items = split_features(transitions.observations)
        slates = np.asarray(transitions.slates, dtype=np.int64)
        clicked = consumed_slots(transitions.next_observations, slates)
        rows = np.arange(len(slates))
        consumed = np.where(clicked >= 0, slates[rows, clicked.clip(min=0)], -1)
        self._record(
            user=user,
            items=items,
            slate=slates,
            consumed=consumed,
            reward=np.asarray(transitions.rewards, dtype=np.float64),
        )
        done = np.asarray(transitions.terminated, bool) | np.asarray(transitions.truncated, bool)
        finished = self._close_episodes(done)
        if c.off_policy:
            for episode in finished:
                self.replay.add(**episode)
        else:  # the current policy's episodes (no update has happened since they began)
            self.batch += finished
        before = self.transitions_seen
        self.transitions_seen += len(slates)
        if before < c.learning_starts:
            self.normalizer.update(user=user, items=items)
            if self.transitions_seen < c.learning_starts:
                return {}
            if c.normalize_inputs:
                self.normalizer.freeze()
        if not c.off_policy:
            if len(self.batch) < c.batch_episodes:
                return {}
            batch = {key: np.concatenate([e[key] for e in self.batch]) for key in self.batch[0]}
            self.batch = []
            return self._gradient_step(batch)
        self._train_debt += self.transitions_seen - max(before, c.learning_starts)
        metrics: dict[str, float] = {}
        while self._train_debt >= c.train_frequency and self.replay.size > 0:
            self._train_debt -= c.train_frequency
            index = self.rng.integers(0, self.replay.size, c.batch_size)
            metrics = self._gradient_step(self.replay.take(index))
        return metrics

    def _record(self, **step: np.ndarray) -> None:
        users = len(step["slate"])
        if len(self.start) != users:
            if len(self.start) and any(self.open.values()):
                raise ValueError(
                    f"reinforce_topk learns from {len(self.start)} users at a time, got {users}"
                )
            self.start = np.zeros(users, dtype=np.int64)
        for key in STEP_KEYS:
            self.open[key].append(np.asarray(step[key]))

    def _close_episodes(self, done: np.ndarray) -> list[dict[str, np.ndarray]]:
        """One dict of rows per finished user-episode, with its returns; drops the steps no open
        episode needs any more."""
        last = len(self.open["slate"])
        finished = []
        for u in np.flatnonzero(done):
            steps = slice(int(self.start[u]), last)
            episode = {key: np.stack([a[u] for a in self.open[key][steps]]) for key in STEP_KEYS}
            episode["ret"] = discounted_returns(episode.pop("reward"), self.config.gamma)
            finished.append(episode)
        self.start[done] = last
        keep = int(self.start.min())
        if keep:
            for key in STEP_KEYS:
                del self.open[key][:keep]
            self.start -= keep
        return finished

    def _gradient_step(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        c = self.config
        user, items = self._tensors(batch["user"], batch["items"])
        slates = torch.from_numpy(np.asarray(batch["slate"], dtype=np.int64))
        consumed = torch.from_numpy(np.asarray(batch["consumed"], dtype=np.int64))
        returns = torch.from_numpy(np.asarray(batch["ret"], dtype=np.float32))
        if c.normalize_returns and len(returns) > 1:
            returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        pi_logits, beta_logits = self.policy(user, items)
        log_pi = torch.log_softmax(pi_logits, dim=1)
        rows = torch.arange(len(consumed))
        has_item = consumed >= 0
        log_pi_a = log_pi[rows, consumed.clamp(min=0)]
        pi_a = log_pi_a.detach().exp()
        # The top-K correction: d alpha / d pi with alpha = 1 - (1 - pi)^K (no gradient).
        if c.topk_correction:
            lam = self.slate_size * (1.0 - pi_a) ** (self.slate_size - 1)
        else:
            lam = torch.ones_like(pi_a)
        metrics: dict[str, float] = {}
        if c.off_policy:
            log_beta = torch.log_softmax(beta_logits, dim=1)
            # Maximum likelihood of the logged slates' items under beta (its own head only).
            beta_loss = -log_beta.gather(1, slates).mean()
            beta_a = log_beta[rows, consumed.clamp(min=0)].detach().exp()
            weight = (pi_a / beta_a.clamp(min=1e-8)).clamp(max=c.weight_cap)
            metrics.update(
                beta_loss=float(beta_loss.detach()), weight=float(weight[has_item].mean())
            )
        else:
            beta_loss = torch.zeros(())
            weight = torch.ones_like(pi_a)
        terms = weight * lam * returns * log_pi_a
        pg_loss = -(terms * has_item).sum() / has_item.sum().clamp(min=1)
        loss = pg_loss + beta_loss
        self.optimizer.zero_grad()
        loss.backward()
        if c.max_grad_norm > 0:
            nn.utils.clip_grad_norm_(self.policy.parameters(), c.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        with torch.no_grad():
            entropy = -(log_pi.exp() * log_pi).sum(1).mean()
        metrics.update(
            pg_loss=float(pg_loss.detach()),
            entropy=float(entropy),
            lambda_k=float(lam[has_item].mean()) if bool(has_item.any()) else math.nan,
            updates=float(self.updates),
        )
        return metrics

    # ----------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "config": dataclasses.asdict(self.config),
            "policy": {k: v.detach().clone() for k, v in self.policy.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "normalizer": self.normalizer.state_dict(),
            "open": {key: [a.copy() for a in arrays] for key, arrays in self.open.items()},
            "start": self.start.copy(),
            "batch": [{k: v.copy() for k, v in episode.items()} for episode in self.batch],
            "replay": self.replay.state_dict(),
            "transitions_seen": self.transitions_seen,
            "updates": self.updates,
            "train_debt": self._train_debt,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.normalizer.load_state_dict(state["normalizer"])
        self.open = {key: [np.array(a) for a in state["open"][key]] for key in STEP_KEYS}
        self.start = np.array(state["start"], dtype=np.int64)
        self.batch = [{k: np.array(v) for k, v in episode.items()} for episode in state["batch"]]
        self.replay.load_state_dict(state["replay"])
        self.transitions_seen = int(state["transitions_seen"])
        self.updates = int(state["updates"])
        self._train_debt = int(state["train_debt"])
