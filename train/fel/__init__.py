"""FEL (Federated Ensemble Learning, arXiv 2206.03852): per-cluster leaf models and server ensembles.

Stages (``docs/fel.md``):

1. clients are clustered on public features (:mod:`fedrec.train.fel.clusters`);
2. each cluster trains its own device-sized **leaf** click model with FedAvg, optionally as
   DP-FedAvg (:mod:`fedrec.federation.privacy`), on the training core
   (:class:`~fedrec.train.fel.trainer.FELTrainer`: run directory, checkpoints, exact resume);
3. the server combines the K leaves' logits: a fixed rule (``mean``, ``median``, ``max``), the
   user's own cluster's leaf (``route``), or a learned over-arch
   (:class:`~fedrec.agents.fel_model.OverArch`) trained centrally on opt-in users' data or by
   federated learning over every user (:mod:`fedrec.train.fel.overarch`).

The plain FL baseline is the same training with one cluster holding every client, the same
client sampling rate and the same number of rounds, hence the same expected number of client
updates (:func:`train_baseline`).

Where each piece lives: the leaf model, its stacked parameters, the ensembles and the over-arch
module in :mod:`fedrec.agents.fel_model` (what an agent serves); the click data in
:mod:`fedrec.envs.datasets.click_data`; DP aggregation and accounting in
:mod:`fedrec.federation.privacy`; here the training: :mod:`~fedrec.train.fel.config` (settings),
:mod:`~fedrec.train.fel.rounds` (one round, shared with the Flower apps),
:mod:`~fedrec.train.fel.trainer` (the loop on the core), :mod:`~fedrec.train.fel.overarch`,
:mod:`~fedrec.train.fel.ensemble` (a run against the baseline), :mod:`~fedrec.train.fel.private`
(the private leaf), :mod:`~fedrec.train.fel.clusters` and :mod:`~fedrec.train.fel.flower` (the
Flower apps; not imported here, as they need Flower).

This package re-exports the names of the FEL modules it replaces (``fedrec.train.fel``,
``fel_clusters``, ``fel_overarch``, ``fel_private``) and the leaf model's.

What it may import: the layers below ``train`` (envs, federation, agents, eval) and
``fedrec.train.core``; never ``fedrec.experiments`` or the command line (tests/test_layers.py).
"""

from fedrec.agents.fel_model import (
    LOGIT_BOUND,
    RULES,
    FederatedResult,
    LeafConfig,
    OverArch,
    combine,
    flatten,
    forward,
    init_params,
    over_arch_logits,
    predict,
    unflatten,
)
from fedrec.train.fel.clusters import (
    cluster_clients,
    feature_clusters,
    kmeans_clusters,
    one_hot,
    random_clusters,
)
from fedrec.train.fel.config import DPConfig, FedConfig
from fedrec.train.fel.ensemble import FELResult, baseline_auc, ensemble_aucs, run_fel
from fedrec.train.fel.overarch import (
    FederatedOverArch,
    OverArchTrainer,
    over_arch_features,
    train_over_arch,
    train_over_arch_federated,
)
from fedrec.train.fel.private import (
    HISTORY_BUCKETS,
    FELServer,
    PrivateFELResult,
    PrivateLeaf,
    history_codes,
    private_fel_privacy,
    run_private_fel,
    split_private,
    train_private_leaf,
)
from fedrec.train.fel.rounds import (
    aggregate_leaves,
    client_schedules,
    local_train,
    noise_multiplier_of,
    select_clients,
    train_rows_of,
)
from fedrec.train.fel.trainer import FELTrainer, train_baseline, train_federated

__all__ = [
    "HISTORY_BUCKETS",
    "LOGIT_BOUND",
    "RULES",
    "DPConfig",
    "FELResult",
    "FELServer",
    "FELTrainer",
    "FedConfig",
    "FederatedOverArch",
    "FederatedResult",
    "LeafConfig",
    "OverArch",
    "OverArchTrainer",
    "PrivateFELResult",
    "PrivateLeaf",
    "aggregate_leaves",
    "baseline_auc",
    "client_schedules",
    "cluster_clients",
    "combine",
    "ensemble_aucs",
    "feature_clusters",
    "flatten",
    "forward",
    "history_codes",
    "init_params",
    "kmeans_clusters",
    "local_train",
    "noise_multiplier_of",
    "one_hot",
    "over_arch_features",
    "over_arch_logits",
    "predict",
    "private_fel_privacy",
    "random_clusters",
    "run_fel",
    "run_private_fel",
    "select_clients",
    "split_private",
    "train_baseline",
    "train_federated",
    "train_over_arch",
    "train_over_arch_federated",
    "train_private_leaf",
    "train_rows_of",
    "unflatten",
]
