"""Choice models for SlateQ: P(i | s, A) = v(s, i) / (v(s, null) + sum_{j in A} v(s, j)).

Two kinds, as the SlateQ paper allows:

* :class:`TrueChoiceModel` -- the environment's own model, read from its parameters (known in
  simulation; an oracle of the *choice* only, not of the user state).
* :class:`LearnedMNLChoiceModel` -- a multinomial logit with a null item, fitted by maximum
  likelihood to the logged clicks. RLlib's SlateQ fits such a model and then never uses it; here
  acting and TD targets use it.

Both return weights for *all* N candidates (B, N) and the null weight (B,). A positional model
(RecSim's Choc-vs-Kale default, where the user always takes slot 0) is not of this form and is
flagged by ``positional = True``; SlateQ then values a slate by its first item.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedrec.envs.choc_kale_model import ChocKaleModel, ChocKaleParams


class TrueChoiceModel:
    """The Choc-vs-Kale environment's true choice model (MNL over its item logits, or slot 0)."""

    learned = False

    def __init__(self, params: ChocKaleParams) -> None:
        self.model = ChocKaleModel(params)
        self.positional = params.choice_model == "first_slot"

    def weights(
        self, candidates: np.ndarray, user: torch.Tensor | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(v, v_null)`` for raw candidate features ``candidates`` (B, N, 1)."""
        del user
        features = np.asarray(candidates, dtype=np.float64)[..., 0]
        if self.positional:  # every candidate could be slot 0; the value is the first item's
            return np.ones_like(features), np.zeros(len(features))
        v, v_null = self.model.choice_weights(features)
        return v, np.full(len(features), v_null)


class LearnedMNLChoiceModel(nn.Module):
    """MNL with a null item: logit(s, i) = MLP([u, d_i]), logit(s, null) = linear(u).

    Fitted by cross-entropy on (slate, clicked slot or null) from replay; the weights returned to
    the slate optimiser are ``exp(logit - max)`` (the common shift cancels in P(i | s, A)).
    """

    learned = True
    positional = False

    def __init__(self, user_dim: int, item_dim: int, *, hidden: int = 32) -> None:
        super().__init__()
        self.item_score = nn.Sequential(
            nn.Linear(user_dim + item_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )
        self.null_score = nn.Linear(user_dim, 1)

    def logits(self, user: torch.Tensor, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Item logits (B, N) and null logits (B,) from normalised features."""
        expanded = user[:, None, :].expand(-1, items.shape[1], -1)
        item_logits = self.item_score(torch.cat([expanded, items], dim=-1)).squeeze(-1)
        return item_logits, self.null_score(user).squeeze(-1)

    def loss(
        self,
        user: torch.Tensor,
        items: torch.Tensor,
        slates: torch.Tensor,
        clicked_slot: torch.Tensor,
    ) -> torch.Tensor:
        """Negative log-likelihood of the observed choices (slot index, -1 for null)."""
        item_logits, null_logits = self.logits(user, items)
        slate_logits = torch.gather(item_logits, 1, slates)
        all_logits = torch.cat([slate_logits, null_logits[:, None]], dim=1)
        target = torch.where(clicked_slot >= 0, clicked_slot, slates.shape[1])
        return nn.functional.cross_entropy(all_logits, target)

    @torch.no_grad()
    def weights_from_features(
        self, user: torch.Tensor, items: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray]:
        item_logits, null_logits = self.logits(user, items)
        shift = torch.maximum(item_logits.max(dim=1).values, null_logits)
        v = torch.exp(item_logits - shift[:, None]).double().numpy()
        v_null = torch.exp(null_logits - shift).double().numpy()
        return v, v_null
