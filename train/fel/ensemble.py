"""One FEL run against the plain FL baseline: train the leaves and the baseline, fit the central
over-arch on opt-in users, and score every ensemble on the held-out rows (test AUC).

The plain FL baseline is the same training with one cluster holding every client, the same
client sampling rate and the same number of rounds, hence the same expected number of client
updates (:func:`fedrec.train.fel.trainer.train_baseline`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrec.agents.fel_model import RULES, FederatedResult, combine, over_arch_logits, predict
from fedrec.envs.datasets.click_data import ClickData
from fedrec.eval.ranking_metrics import auc
from fedrec.federation.privacy import FELPrivacy
from fedrec.train.fel.config import FedConfig
from fedrec.train.fel.overarch import train_over_arch
from fedrec.train.fel.trainer import train_baseline, train_federated


@dataclass
class FELResult:
    auc: dict[str, float]  # rule ("mean", ..., "over-arch", "baseline") -> test AUC
    num_clusters: int
    client_updates: int
    baseline_client_updates: int
    privacy: FELPrivacy | None
    baseline_privacy: FELPrivacy | None
    opt_in_users: int


def ensemble_aucs(
    data: ClickData,
    fel: FederatedResult,
    *,
    opt_in_fraction: float = 0.1,
    over_arch_iterations: int = 100,
    seed: int = 0,
) -> tuple[dict[str, float], int]:
    """Test AUC of every ensemble rule of trained leaves (``fel``), the over-arch fitted on a
    random ``opt_in_fraction`` of the users' training samples; returns (scores, opt-in users)."""
    assignment = fel.assignment
    test = np.flatnonzero(data.is_test)
    labels = data.label[test]
    leaf_logits = predict(fel.params, data, test)
    cluster = assignment[data.client[test]]
    scores = {rule: auc(combine(leaf_logits, rule, cluster), labels) for rule in RULES}
    rng = np.random.default_rng(seed + 2)
    opt_in = rng.random(data.num_clients) < opt_in_fraction
    rows = np.flatnonzero(~data.is_test & opt_in[data.client])
    if len(rows) and 0 < data.label[rows].sum() < len(rows):
        arch = train_over_arch(
            predict(fel.params, data, rows),
            assignment[data.client[rows]],
            data.label[rows],
            iterations=over_arch_iterations,
            seed=seed,
        )
        scores["over-arch"] = auc(over_arch_logits(arch, leaf_logits, cluster), labels)
    return scores, int(opt_in.sum())


def baseline_auc(data: ClickData, base: FederatedResult) -> float:
    """Test AUC of the plain FL model (a single leaf)."""
    test = np.flatnonzero(data.is_test)
    return auc(predict(base.params, data, test)[:, 0], data.label[test])


def run_fel(
    data: ClickData,
    assignment: np.ndarray,
    config: FedConfig,
    *,
    opt_in_fraction: float = 0.1,
    over_arch_iterations: int = 100,
) -> FELResult:
    """Train the leaves and the baseline, fit the over-arch on a random ``opt_in_fraction`` of the
    users' training samples, and report every ensemble's test AUC."""
    fel = train_federated(data, assignment, config)
    base = train_baseline(data, config)
    scores, opt_in = ensemble_aucs(
        data,
        fel,
        opt_in_fraction=opt_in_fraction,
        over_arch_iterations=over_arch_iterations,
        seed=config.seed,
    )
    scores["baseline"] = baseline_auc(data, base)
    return FELResult(
        scores,
        int(assignment.max()) + 1,
        fel.client_updates,
        base.client_updates,
        fel.privacy,
        base.privacy,
        opt_in,
    )
