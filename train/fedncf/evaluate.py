"""How a FedNCF model is scored: HR@K / NDCG@K of the test items through the logged-data
environment's evaluation mode (:func:`evaluate_model`) and of the validation items
(:func:`evaluate_candidates`), together as one :class:`~fedrec.train.fedncf.results.EvalPoint`
(:func:`evaluate_point`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from fedrec.agents.fedncf_agent import NCFRankingAgent
from fedrec.agents.ncf import NCF
from fedrec.envs.datasets.catalog import spec_of
from fedrec.envs.datasets.environments import score_rankings
from fedrec.envs.datasets.preprocess import PreparedData
from fedrec.envs.datasets.registry import LOGGED_DATA_ENVIRONMENTS
from fedrec.eval.ranking_metrics import RankingResult, evaluate_ranking_agent
from fedrec.train.fedncf.results import EvalPoint


def env_id_of(dataset: str) -> str:
    """The registered logged-data environment id of ``dataset`` (e.g. fedrec/MovieLens100K-v0)."""
    name = spec_of(dataset).name
    for entry in LOGGED_DATA_ENVIRONMENTS:
        if entry.kwargs.get("dataset") == name:
            return entry.id
    raise ValueError(f"no ranking environment is registered for data set {dataset!r}")


def evaluate_model(
    model: NCF, *, dataset: str, data_dir: str | Path | None = None, top_k: int = 10
) -> RankingResult:
    """HR@K / NDCG@K of a trained model through the logged-data env's evaluation mode."""
    agent = NCFRankingAgent(model, slate_size=top_k)
    return evaluate_ranking_agent(env_id_of(dataset), agent, data_dir=data_dir, top_k=top_k)


def evaluate_candidates(
    model: NCF, *, candidates: np.ndarray, target: np.ndarray, top_k: int = 10
) -> RankingResult:
    """HR@K / NDCG@K of ranking each user's ``candidates`` (U, N) row, whose column ``target``
    is the held-out item, with the ranking agent and metric of the environments' evaluation mode
    (used for the validation items, which the environments do not hold)."""
    agent = NCFRankingAgent(model, slate_size=top_k, seed=0)
    users = np.arange(len(candidates))[:, None]
    rankings = agent.act_batch({"user_id": users, "candidate_ids": candidates})
    scores = score_rankings(rankings, np.asarray(target))
    return RankingResult(
        float(scores["hit"].mean()), float(scores["ndcg"].mean()), len(candidates), top_k
    )


def evaluate_point(
    model: NCF,
    *,
    data: PreparedData,
    dataset: str,
    data_dir: str | Path | None,
    top_k: int,
    global_round: float,
    aggregation_round: int,
    seconds: float,
) -> EvalPoint:
    """An :class:`EvalPoint` of ``model``: the test metrics (through the environment) and, when
    ``data`` has a validation split, the validation metrics."""
    test = evaluate_model(model, dataset=dataset, data_dir=data_dir, top_k=top_k)
    point = EvalPoint(global_round, aggregation_round, test.hit_rate, test.ndcg, seconds)
    if data.held_out < 2:
        return point
    assert data.validation_candidates is not None and data.validation_target is not None
    validation = evaluate_candidates(
        model, candidates=data.validation_candidates, target=data.validation_target, top_k=top_k
    )
    return dataclasses.replace(
        point, validation_hit_rate=validation.hit_rate, validation_ndcg=validation.ndcg
    )
