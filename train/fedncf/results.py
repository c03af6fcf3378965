"""What a FedNCF run produces: its evaluation points (:class:`EvalPoint`), the model selected on
validation (:func:`select_by_validation`) and the run's result (:class:`TrainResult`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fedrec.agents.ncf import NCF
from fedrec.eval.ranking_metrics import RankingResult


@dataclass(frozen=True)
class EvalPoint:
    """HR@K / NDCG@K after a number of global rounds (or epochs)."""

    global_round: float
    """global rounds (federated) or epochs (centralised) completed."""
    aggregation_round: int
    """aggregation rounds completed (equal to epochs when centralised)."""
    hit_rate: float
    ndcg: float
    seconds: float
    """training wall time so far (evaluation excluded)."""
    validation_hit_rate: float | None = None
    """HR@K of the validation items (None without a validation split)."""
    validation_ndcg: float | None = None


def select_by_validation(history: Sequence[EvalPoint]) -> EvalPoint | None:
    """The evaluation point with the best validation HR@K (the earliest of equals; NDCG@K
    breaks ties of HR@K), or None without validation metrics."""
    scored = [p for p in history if p.validation_hit_rate is not None]
    if not scored:
        return None
    return max(scored, key=lambda p: (p.validation_hit_rate, p.validation_ndcg or 0.0))


@dataclass
class TrainResult:
    """What a training run produced: the model, its learning curve and costs."""

    model: NCF
    history: list[EvalPoint]
    final: RankingResult
    train_seconds: float
    aborted_rounds: int = 0
    """MF-SecAvg rounds aborted because too many clients dropped (global model kept)."""
    participations: int = 0
    """client participations in all (a client trained in a round)"""
    client_samples: int = 0
    """sum of n_k over the participations (for the per-client cost); a running total, not a
    list: a list grows by U entries per global round and every checkpoint would copy it"""
    aggregation_seconds: float = 0.0
    """time spent in the aggregator (server side, plus client masking for MF-SecAvg)."""

    @property
    def selected(self) -> EvalPoint | None:
        """With a validation split: the evaluation point with the best validation HR@K, whose
        test metrics are the run's model-selected result (:func:`select_by_validation`)."""
        return select_by_validation(self.history)
