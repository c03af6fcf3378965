"""A trained (Fed)NCF model as a one-step-episode ranking agent for the logged-data environments.

In the environments' evaluation mode each episode is one user with 101 candidates (its held-out
item and 100 fixed negatives); the agent scores every candidate with the model and returns the
top-K positions, best first. So federated and centralised models, popularity and random all get
HR@K and NDCG@K from the same path (:func:`fedrec.eval.ranking_metrics.evaluate_ranking_agent`).
"""

from __future__ import annotations

import numpy as np
import torch

from fedrec.agents.base import Info, Observation, SlateAgent
from fedrec.agents.ncf import NCF


class NCFRankingAgent(SlateAgent):
    """Ranks the candidates of each observation by the model's predicted probability.

    The user of an observation is ``observations["user_id"]`` (the remapped id the model was
    trained with; for a federated model its row is that client's private embedding). Exact score
    ties are broken uniformly at random by the agent's rng, as the popularity baseline does.
    """

    def __init__(self, model: NCF, *, slate_size: int = 10, seed: int | None = None) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        self.model = model

    def scores(self, observations: Observation) -> np.ndarray:
        """(B, N) predicted interaction probabilities of the candidates."""
        users = torch.as_tensor(np.asarray(observations["user_id"], dtype=np.int64)).reshape(-1)
        candidates = torch.as_tensor(np.asarray(observations["candidate_ids"], dtype=np.int64))
        if candidates.ndim != 2 or candidates.shape[0] != users.shape[0]:
            raise ValueError("observations need batched user_id (B, 1) and candidate_ids (B, N)")
        if candidates.shape[1] < self.slate_size:
            raise ValueError(f"{candidates.shape[1]} candidates < slate_size {self.slate_size}")
        if (
            int(users.max()) >= self.model.num_users
            or int(candidates.max()) >= self.model.num_items
        ):
            raise ValueError("user or item id outside the model's tables (wrong data set?)")
        was_training = self.model.training
        self.model.eval()
        scores = self.model.score(users[:, None].expand_as(candidates), candidates)
        self.model.train(was_training)
        return scores.numpy()

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        scores = self.scores(observations)
        tie_break = self.rng.random(scores.shape)
        order = np.lexsort((tie_break, -scores), axis=1)
        return order[:, : self.slate_size].astype(np.int64)
