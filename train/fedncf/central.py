"""The centralised upper bound: the same NCF model, loss, negatives and Adam trained on the
pooled training data of every user (:func:`train_centralised`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.agents.ncf import NCF, make_optimizers
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.envs.datasets.preprocess import sample_training_negatives
from fedrec.eval.ranking_metrics import RankingResult
from fedrec.train.core import progress_bar
from fedrec.train.fedncf.config import CentralConfig
from fedrec.train.fedncf.evaluate import evaluate_point
from fedrec.train.fedncf.results import EvalPoint, TrainResult


def train_centralised(
    *,
    dataset: str,
    config: CentralConfig,
    data_dir: str | Path | None = None,
    progress: bool = True,
) -> TrainResult:
    """Centralised NCF on the pooled training data (same model, loss, negatives and Adam)."""
    data = load_prepared(dataset, data_dir)
    if config.validation:
        data = data.with_validation()
    generator = torch.Generator().manual_seed(config.seed)
    model = NCF(
        config.model, num_users=data.num_users, num_items=data.num_items, generator=generator
    )
    optimizers = make_optimizers(model, lr=config.lr)
    rng = np.random.default_rng([config.seed, 2])
    history: list[EvalPoint] = []
    train_seconds = 0.0
    bar = progress_bar(
        enabled=progress, total=config.epochs, unit="epochs", desc=f"central {config.model.model}"
    )
    for epoch in range(config.epochs):
        start = time.perf_counter()
        epoch_samples = sample_training_negatives(data, rng, config.num_negatives)
        users = torch.from_numpy(epoch_samples.users)
        items = torch.from_numpy(epoch_samples.items)
        labels = torch.from_numpy(epoch_samples.labels)
        for lo in range(0, len(users), config.batch_size):
            hi = lo + config.batch_size
            loss = F.binary_cross_entropy_with_logits(
                model(users[lo:hi], items[lo:hi]), labels[lo:hi]
            )
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
        train_seconds += time.perf_counter() - start
        bar.update(1)
        done = epoch + 1
        if done == config.epochs or (config.eval_every and done % config.eval_every == 0):
            point = evaluate_point(
                model,
                data=data,
                dataset=dataset,
                data_dir=data_dir,
                top_k=config.top_k,
                global_round=done,
                aggregation_round=done,
                seconds=train_seconds,
            )
            history.append(point)
            bar.set_postfix(hr=f"{point.hit_rate:.4f}", ndcg=f"{point.ndcg:.4f}")
    bar.close()
    final = history[-1]
    return TrainResult(
        model=model,
        history=history,
        final=RankingResult(final.hit_rate, final.ndcg, data.num_users, config.top_k),
        train_seconds=train_seconds,
    )
