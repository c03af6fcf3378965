"""A trained FEL ensemble (or the plain FL model) as an agent in the logged-data environments.

- :class:`FELTaobaoAgent` scores ``fedrec/TaobaoAds-v0`` impressions: it returns the predicted
  click probability (``Box(0, 1, (1,))``), and :func:`fedrec.eval.ranking_metrics.collect_scores`
  and :func:`~fedrec.eval.ranking_metrics.auc` give the AUC, the path FedNCF's agents use.
- :class:`FELRankingAgent` ranks the 101 candidates of the MovieLens environments' evaluation mode
  (HR@10 / NDCG@10 through :func:`fedrec.eval.ranking_metrics.evaluate_ranking_agent`).

**Feature mapping (Taobao).** The model was trained on :func:`fedrec.envs.datasets.click_data.
click_data_from_taobao`, built from the ``"all"`` split; the env numbers users and ad groups per
split (its ``user_id`` and first ``ad_features`` code are positions in that split's sorted
impressions). :class:`TaobaoFeatureMap` translates them:

- the user: env ``user_id`` -> raw Taobao user id (the split's ``user_ids``) -> the training
  client (position of that raw id among the ``"all"`` split's users), whose cluster routes it;
- the ad group: each split's impressions are a subsequence, in the same order, of the ``"all"``
  split's (both are sorted by raw user, time and file order), so aligning the two gives the
  ``"all"`` code of every split code; it is then hashed into the same buckets as in training;
- cate / campaign / customer / brand and the profile fields are coded from the whole ad and
  profile tables, identically in every split; pid and day of week are the env's own;
- log price is standardised with the training data's mean and standard deviation.

**Feature mapping (MovieLens).** The env's remapped user and item ids are translated through the
raw ids (``u.data``'s ``user`` / ``item``) to the training data's client and item codes; a
candidate the training data never saw gets item code 0 (no item weight).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedrec.agents.base import Info, Observation, SlateAgent
from fedrec.agents.fel_model import FederatedResult, combine, forward
from fedrec.envs.datasets.click_data import ClickData


@dataclass(frozen=True)
class FELModel:
    """The served model: the K leaves (K = 1: plain FL), each client's cluster, and the rule."""

    leaves: FederatedResult
    field_sizes: tuple[int, ...]  # the training data's, to clip unseen codes
    rule: str = "route"

    def logits(self, codes: np.ndarray, dense: np.ndarray, clients: np.ndarray) -> np.ndarray:
        """(B,) ensemble logits of samples given as per-field codes (B, F), dense (B, D) and the
        training client of each (-1: unknown, routed to leaf 0)."""
        params = self.leaves.params
        k = params["wide"].shape[0]
        sizes = np.asarray(self.field_sizes)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        codes = np.minimum(codes, sizes - 1) + offsets
        with torch.no_grad():
            c = torch.as_tensor(codes, dtype=torch.int64).unsqueeze(0).expand(k, -1, -1)
            d = torch.as_tensor(dense, dtype=torch.float32).unsqueeze(0).expand(k, -1, -1)
            leaf = forward(params, c, d).T.numpy()
        cluster = np.where(clients >= 0, self.leaves.assignment[np.maximum(clients, 0)], 0)
        return combine(leaf, self.rule, cluster)


def fel_model(leaves: FederatedResult, data: ClickData, rule: str = "route") -> FELModel:
    """A :class:`FELModel` of leaves trained on ``data`` (plain FL: ``rule`` is irrelevant)."""
    return FELModel(leaves, tuple(data.field_sizes), rule)


class TaobaoFeatureMap:
    """Env observations of one split -> the training data's codes (see the module docstring)."""

    def __init__(
        self, data_dir: str | Path | None, split: str, *, hash_buckets: int = 1000
    ) -> None:
        from fedrec.envs.datasets.taobao import TEST_DAY_START, load_taobao_prepared

        full = load_taobao_prepared(data_dir, "all")
        part = load_taobao_prepared(data_dir, split)  # type: ignore[arg-type]
        if split == "all":
            rows = np.arange(len(full.timestamps))
        else:
            test = full.timestamps >= TEST_DAY_START
            rows = np.flatnonzero(test if split == "test" else ~test)
        if len(rows) != len(part.timestamps) or not np.array_equal(
            full.timestamps[rows], part.timestamps
        ):
            raise ValueError("the split's impressions do not align with the full log")
        self.adgroup = np.zeros(int(part.ad_features[:, 0].max()) + 1, np.int64)
        self.adgroup[part.ad_features[:, 0]] = full.ad_features[rows, 0]
        position = np.searchsorted(full.user_ids, part.user_ids)
        found = (position < len(full.user_ids)) & (
            full.user_ids[np.minimum(position, len(full.user_ids) - 1)] == part.user_ids
        )
        self.client = np.where(found, position, -1).astype(np.int64)
        price = full.ad_price.astype(np.float64)
        self.price_mean, self.price_std = float(price.mean()), float(price.std() + 1e-8)
        self.hash_buckets = hash_buckets

    def features(self, obs: Observation) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes (B, 15), dense (B, 1), clients (B,)) of batched observations."""
        ads = np.asarray(obs["ad_features"], np.int64).reshape(-1, 5).copy()
        ads[:, 0] = self.adgroup[ads[:, 0]]
        ads = np.where(ads > 0, (ads - 1) % (self.hash_buckets - 1) + 1, 0)
        user = np.asarray(obs["user_features"], np.int64).reshape(len(ads), -1)
        context = np.asarray(obs["context"], np.int64).reshape(len(ads), -1)
        codes = np.column_stack([user, ads, context])
        price = np.asarray(obs["ad_price"], np.float64).reshape(-1, 1)
        dense = (price - self.price_mean) / self.price_std
        clients = self.client[np.asarray(obs["user_id"], np.int64).reshape(-1)]
        return codes, dense, clients


class FELTaobaoAgent:
    """Scores ``fedrec/TaobaoAds-v0`` impressions with a :class:`FELModel`."""

    def __init__(self, model: FELModel, features: TaobaoFeatureMap) -> None:
        self.model = model
        self.map = features

    def act_batch(self, observations: Observation) -> np.ndarray:
        """(B, 1) click probabilities."""
        codes, dense, clients = self.map.features(observations)
        logits = self.model.logits(codes, dense, clients)
        return (1.0 / (1.0 + np.exp(-logits)))[:, None].astype(np.float32)

    def act(self, observation: Observation) -> np.ndarray:
        batch = {key: np.asarray(value)[None] for key, value in observation.items()}
        return self.act_batch(batch)[0]

    def score(self, observation: Observation) -> float:
        return float(self.act(observation)[0])


class MovieLensFeatureMap:
    """Env user / item ids of the MovieLens-100K environment -> the training data's codes."""

    def __init__(self, env: object, data_dir: str | Path | None) -> None:
        from fedrec.envs.datasets.catalog import load
        from fedrec.envs.datasets.formats import ML100K_GENRES

        dataset = load("ml-100k", data_dir)
        log = dataset.interactions
        users = np.unique(log["user"].to_numpy())
        items = np.unique(log["item"].to_numpy())
        prepared = env.unwrapped.data  # type: ignore[attr-defined]
        raw_users, raw_items = np.asarray(prepared.user_ids), np.asarray(prepared.item_ids)
        self.client = np.searchsorted(users, raw_users).astype(np.int64)
        if not np.array_equal(users[np.minimum(self.client, len(users) - 1)], raw_users):
            raise ValueError("the env's users are not the training data's")
        pos = np.searchsorted(items, raw_items)
        known = (pos < len(items)) & (items[np.minimum(pos, len(items) - 1)] == raw_items)
        self.item = np.where(known, pos + 1, 0).astype(np.int64)
        genres = dataset.item_features.reindex(raw_items)[list(ML100K_GENRES)]
        self.genres = genres.fillna(0).to_numpy(np.float32)

    def features(
        self, obs: Observation, public: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes (B N, 4), dense (B N, 19), clients (B N,)) of batched observations."""
        users = np.asarray(obs["user_id"], np.int64).reshape(-1)
        candidates = np.asarray(obs["candidate_ids"], np.int64)
        n = candidates.shape[1]
        clients = np.repeat(self.client[users], n)
        codes = np.column_stack([public[clients], self.item[candidates.reshape(-1)]])
        return codes, self.genres[candidates.reshape(-1)], clients


class FELRankingAgent(SlateAgent):
    """Ranks the candidates of each evaluation-mode observation by the FEL model's logit (exact
    ties broken by the agent's rng)."""

    def __init__(
        self,
        model: FELModel,
        features: MovieLensFeatureMap,
        public: np.ndarray,
        *,
        slate_size: int = 10,
        seed: int | None = None,
    ) -> None:
        super().__init__(slate_size=slate_size, seed=seed)
        self.model = model
        self.map = features
        self.public = public

    def act_batch(self, observations: Observation, *, infos: Info | None = None) -> np.ndarray:
        candidates = np.asarray(observations["candidate_ids"])
        codes, dense, clients = self.map.features(observations, self.public)
        scores = self.model.logits(codes, dense, clients).reshape(candidates.shape)
        order = np.lexsort((self.rng.random(scores.shape), -scores), axis=1)
        return order[:, : self.slate_size].astype(np.int64)
