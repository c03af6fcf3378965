"""Conservative offline SlateQ (``cql_slateq``): SlateQ's item-wise Q learned from logged
transitions with the discrete CQL regulariser over the candidate items.

SlateQ (Ie et al., IJCAI 2019; :mod:`fedrec.agents.slateq`) decomposes the value of a slate as
Q(s, A) = Σ_{i∈A} P(i | s, A) Q̄(s, i) and learns the item value Q̄ by TD on the clicked item:
Q̄(s, i_c) ← r + γ max_B Σ_{j∈B} P(j | s', B) Q̄⁻(s', j). Learned from a fixed dataset, the max in
the target picks candidates the logger rarely showed, whose Q̄ nothing corrects: the classic
overestimation of offline Q-learning. Conservative Q-learning (CQL(H), Kumar et al., NeurIPS
2020, discrete form) adds α · E_s[log Σ_a exp Q(s, a) − E_{a∼data} Q(s, a)], which pushes every
action's value down (softly, the largest most) and the logged actions' values up. Here the
actions are the N candidate items of SlateQ's decomposition, and the logged actions are the K
items of the logged slate:

    loss = TD(clicked items) + α · mean_s [ logsumexp_{i ∈ candidates} Q̄(s, i) − mean_{i ∈ A_logged} Q̄(s, i) ].

α = 0 is plain offline SlateQ. The agent is :class:`fedrec.agents.slateq.SlateQAgent` (its
network, choice models, slate optimisers and TD targets at s') with this loss and the dataset in
place of the replay buffer; its input normalisation and reward scale (1 / mean |reward|) are the
dataset's. Acting is SlateQ's greedy slate under the learned Q̄.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np
import torch

from fedrec.agents.base import slate_size_of
from fedrec.agents.choice_models import TrueChoiceModel
from fedrec.agents.offline import OfflineData, OfflineLearner, minibatch, observations_of
from fedrec.agents.slateq import SlateQAgent, SlateQConfig, split_features


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclasses.dataclass(frozen=True)
class CQLSlateQConfig:
    """Offline SlateQ with the CQL regulariser; counts are gradient steps."""

    alpha: float = dataclasses.field(
        default=1.0,
        metadata=_help("weight of the CQL regulariser over the candidate items (0: plain offline SlateQ)"),
    )  # fmt: skip
    gamma: float = dataclasses.field(default=0.9, metadata=_help("discount"))
    target: Literal["topk", "greedy", "optimal"] = dataclasses.field(
        default="optimal", metadata=_help("next slate of the TD target: topk, greedy or optimal")
    )
    selection: Literal["topk", "greedy", "optimal"] = dataclasses.field(
        default="greedy", metadata=_help("slate optimiser for acting: topk, greedy or optimal")
    )
    optimal_solver: Literal["lp", "dinkelbach"] = dataclasses.field(
        default="dinkelbach", metadata=_help("exact solver behind 'optimal'")
    )
    choice_model: Literal["true", "learned"] = dataclasses.field(
        default="true",
        metadata=_help("the env's true choice model, or an MNL learned from the logged clicks"),
    )
    hidden_sizes: tuple[int, ...] = dataclasses.field(
        default=(64, 32), metadata=_help("hidden layers of the shared item Q network")
    )
    learning_rate: float = dataclasses.field(default=1e-3, metadata=_help("Adam step size"))
    loss: Literal["mse", "huber"] = dataclasses.field(
        default="mse", metadata=_help("TD loss on clicked transitions")
    )
    batch_size: int = dataclasses.field(
        default=256, metadata=_help("logged transitions per gradient step")
    )
    target_update_interval: int = dataclasses.field(
        default=500, metadata=_help("gradient steps between hard target-network copies")
    )
    reward_scale: float = dataclasses.field(
        default=0.0, metadata=_help("multiplies rewards in TD targets; 0 = 1 / mean |reward| of the dataset")
    )  # fmt: skip
    normalize_inputs: bool = dataclasses.field(
        default=True, metadata=_help("standardise features with the dataset's mean/std")
    )

    def __post_init__(self) -> None:
        checks = {
            "alpha": self.alpha >= 0,
            "gamma": 0.0 <= self.gamma <= 1.0,
            "target": self.target in ("topk", "greedy", "optimal"),
            "selection": self.selection in ("topk", "greedy", "optimal"),
            "optimal_solver": self.optimal_solver in ("lp", "dinkelbach"),
            "choice_model": self.choice_model in ("true", "learned"),
            "hidden_sizes": len(self.hidden_sizes) >= 1 and min(self.hidden_sizes) >= 1,
            "learning_rate": self.learning_rate > 0,
            "loss": self.loss in ("mse", "huber"),
            "batch_size": self.batch_size >= 1,
            "target_update_interval": self.target_update_interval >= 1,
            "reward_scale": self.reward_scale >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in bad)
            raise ValueError(f"invalid CQL-SlateQ config: {values}")

    def slateq(self) -> SlateQConfig:
        """The SlateQ config of the same network, choice model, targets and optimiser."""
        return SlateQConfig(
            gamma=self.gamma,
            target=self.target,
            selection=self.selection,
            optimal_solver=self.optimal_solver,
            choice_model=self.choice_model,
            hidden_sizes=self.hidden_sizes,
            learning_rate=self.learning_rate,
            loss=self.loss,
            batch_size=self.batch_size,
            buffer_size=self.batch_size,  # unused: the dataset replaces the replay buffer
            learning_starts=0,
            target_update_interval=self.target_update_interval,
            reward_scale=self.reward_scale,
            normalize_inputs=self.normalize_inputs,
        )


class CQLSlateQAgent(OfflineLearner, SlateQAgent):
    """SlateQ learned offline from logged transitions, with CQL over the candidate items."""

    Config = CQLSlateQConfig

    def __init__(
        self,
        *,
        slate_size: int,
        num_candidates: int,
        user_dim: int,
        item_dim: int,
        config: CQLSlateQConfig = CQLSlateQConfig(),
        true_choice: TrueChoiceModel | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            slate_size=slate_size,
            num_candidates=num_candidates,
            user_dim=user_dim,
            item_dim=item_dim,
            num_envs=1,
            config=config.slateq(),
            true_choice=true_choice,
            seed=seed,
        )
        self.config = config  # the fields SlateQ reads after construction have the same names

    @classmethod
    def from_env(cls, env: Any, *, config: Any = None, seed: int | None = None) -> CQLSlateQAgent:
        config = config if config is not None else CQLSlateQConfig()
        space = getattr(env, "single_observation_space", None) or env.observation_space
        sample = {k: np.asarray(v)[None] for k, v in space.sample().items()}
        user, items = split_features(sample)
        true_choice = None
        if config.choice_model == "true":
            from fedrec.agents.reference import env_params  # a Choc-vs-Kale env is required

            true_choice = TrueChoiceModel(env_params(env))
        return cls(
            slate_size=slate_size_of(env),
            num_candidates=items.shape[1],
            user_dim=user.shape[1],
            item_dim=items.shape[2],
            config=config,
            true_choice=true_choice,
            seed=seed,
        )

    def explore_batch(self, observations: Any, *, infos: Any = None) -> np.ndarray:
        return self.act_batch(observations, infos=infos)  # no exploration: it never explores

    # ----------------------------------------------------------------------------- offline
    def prepare(self, data: OfflineData) -> None:
        user, items = split_features(observations_of(data))
        if self.config.normalize_inputs:
            self.normalizer.update(user=user, items=items)
            self.normalizer.freeze()
        rewards = np.asarray(data["reward"], dtype=np.float64)
        self.transitions_seen = len(rewards)
        self._abs_reward_sum = float(np.abs(rewards).sum())
        if self.config.reward_scale == 0.0:
            mean_abs = self._abs_reward_sum / max(len(rewards), 1)
            self.reward_scale = 1.0 / mean_abs if mean_abs > 0 else 1.0
        self.target_network.load_state_dict(self.q_network.state_dict())

    def offline_step(self, data: OfflineData) -> dict[str, float]:
        sample = minibatch(data, self.rng, self.config.batch_size)
        batch = self._batch(sample)
        metrics = self._fit_choice(batch)
        targets = self._td_targets(sample, batch.next_obs, batch.next_user, batch.next_items)
        q = self.q_network(batch.user, batch.items)  # Q̄(s, i) of every candidate, (B, N)
        slates, clicked_slot = batch.slates, batch.clicked_slot
        rows = torch.arange(len(slates))
        clicked = clicked_slot >= 0
        prediction = q[rows, slates[rows, clicked_slot.clamp(min=0)]][clicked]
        td = self._td_loss(prediction, targets[clicked])
        gap = (torch.logsumexp(q, dim=1) - q.gather(1, slates).mean(dim=1)).mean()
        loss = td + self.config.alpha * gap if self.config.alpha > 0 else td
        self._optimise(loss)
        metrics.update(loss=loss.item(), td_loss=td.item(), cql_gap=gap.item())
        return metrics
