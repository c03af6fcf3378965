"""FEL's private leaf: a DP leaf over private features whose output never leaves the device.

The public FEL ensemble (:mod:`fedrec.train.fel`) only ever sees **public** inputs: the server
holds the K public leaves and serves, for a sample, the ensemble logit ``s_pub`` (for example the
user's own cluster's leaf, ``route``). The **private leaf** is one more click model, trained by
all clients with DP-FedAvg, over the sample's features *plus private ones*; on the device the
final score is

    s = s_pub + private_leaf(private features)

so the private features, and the private leaf's per-user outputs, stay on the device; only its
DP-noised parameter updates go to the server (like any leaf's). It learns on top of the public
score (the public logit is a fixed offset in its local training, i.e. one boosting step), so an
untrained private leaf (all zero) leaves the public prediction unchanged.

**Private features** (:func:`split_private`):

- ``history_field``: the user's own click history on the sample's value of that field (Taobao:
  the ad category), i.e. an ad-interaction feature derived from the user's private labels. For a
  training row it counts the user's *other* training rows with the same value (leave one out), for
  a test row all of the user's training rows; bucketed as 0 = no such row, 1 = never clicked,
  2 = clicked at most a quarter of the time, 3 = at most half, 4 = more;
- ``fields``: profile fields declared private (e.g. Taobao's ``pvalue_level`` and
  ``shopping_level``): removed from the public data (the leaves' inputs and the clustering
  features) and kept only in the device's data.

**Privacy.** The private leaf is trained on the same users as their cluster's public leaf, so its
RDP curve composes **sequentially** with that leaf's, and the guarantee is the max over clusters
of the composition (:func:`private_fel_privacy`, Opacus's RDP accountant through
:func:`fedrec.federation.privacy.fel_epsilon`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedrec.agents.fel_model import FederatedResult, combine, predict
from fedrec.envs.datasets.click_data import ClickData
from fedrec.eval.ranking_metrics import auc
from fedrec.federation.privacy import FELPrivacy, GaussianMechanism, fel_epsilon
from fedrec.train.fel.config import FedConfig
from fedrec.train.fel.trainer import train_federated

HISTORY_BUCKETS = 5


def history_codes(data: ClickData, field: str) -> np.ndarray:
    """(M,) bucket of each sample's user's click rate on the sample's value of ``field``, from the
    user's training rows only (leave one out for a training row); see the module docstring."""
    if field not in data.field_names:
        raise ValueError(f"no field {field!r}; known: {', '.join(data.field_names)}")
    value = data.sparse[:, data.field_names.index(field)]
    key = data.client * (int(value.max()) + 1) + value
    _, inverse = np.unique(key, return_inverse=True)
    train = (~data.is_test).astype(np.float64)
    count = np.bincount(inverse, weights=train)[inverse] - train
    clicks = np.bincount(inverse, weights=train * data.label)[inverse] - train * data.label
    rate = np.divide(clicks, count, out=np.zeros_like(clicks), where=count > 0)
    codes = 1 + np.digitize(rate, [1e-9, 0.25 + 1e-9, 0.5 + 1e-9])
    return np.where(count > 0, codes, 0).astype(np.int64)


def split_private(
    data: ClickData, *, fields: tuple[str, ...] = (), history_field: str | None = None
) -> tuple[ClickData, ClickData]:
    """(public data, device data): the public data lacks the private ``fields`` (as leaf inputs and
    as clustering features); the device data has every field of ``data`` plus the private click
    history on ``history_field``."""
    missing = [f for f in fields if f not in data.field_names]
    if missing:
        raise ValueError(f"no field(s) {missing}; known: {', '.join(data.field_names)}")
    keep = [i for i, f in enumerate(data.field_names) if f not in fields]
    keep_public = [i for i, f in enumerate(data.public_names) if f not in fields]
    public = dataclasses.replace(
        data,
        sparse=data.sparse[:, keep],
        field_sizes=tuple(data.field_sizes[i] for i in keep),
        field_names=tuple(data.field_names[i] for i in keep),
        public=data.public[:, keep_public],
        public_names=tuple(data.public_names[i] for i in keep_public),
    )
    device = data
    if history_field is not None:
        device = dataclasses.replace(
            data,
            sparse=np.column_stack([data.sparse, history_codes(data, history_field)]),
            field_sizes=(*data.field_sizes, HISTORY_BUCKETS),
            field_names=(*data.field_names, f"private:{history_field}_history"),
        )
    return public, device


@dataclass(frozen=True)
class FELServer:
    """What the server holds and serves: the public leaves and the ensemble rule. Its inputs are
    public data only; it never receives a private feature or a private-leaf output."""

    leaves: FederatedResult
    rule: str = "route"

    def scores(self, public: ClickData, rows: np.ndarray) -> np.ndarray:
        """(len(rows),) public ensemble logits of the samples ``rows``."""
        if public.vocab_size != self.leaves.params["wide"].shape[1]:
            raise ValueError("the server's leaves take the public features only")
        logits = predict(self.leaves.params, public, rows)
        return combine(logits, self.rule, self.leaves.assignment[public.client[rows]])


@dataclass(frozen=True)
class PrivateLeaf:
    """The device-side private leaf (its parameters are shared, like every leaf's, through
    DP-FedAvg; its inputs and outputs are not)."""

    leaf: FederatedResult
    mechanism: GaussianMechanism

    def device_scores(
        self, server_scores: np.ndarray, device: ClickData, rows: np.ndarray
    ) -> np.ndarray:
        """The device's final logits: the served public score plus the private leaf's output."""
        return server_scores + predict(self.leaf.params, device, rows)[:, 0]


def train_private_leaf(
    device: ClickData, server_offset: np.ndarray, config: FedConfig
) -> PrivateLeaf:
    """Train the private leaf with DP-FedAvg over all clients, on top of the public scores
    ``server_offset`` (M,) (each client's own rows' served scores)."""
    if config.dp is None:
        raise ValueError("the private leaf is trained with DP-FedAvg: give FedConfig(dp=...)")
    leaf = train_federated(
        device, np.zeros(device.num_clients, np.int64), config, offset=server_offset
    )
    mechanism = GaussianMechanism(float(leaf.noise_multiplier), config.sample_rate, config.rounds)
    return PrivateLeaf(leaf, mechanism)


def private_fel_privacy(
    public_leaves: FederatedResult, public_config: FedConfig, private: PrivateLeaf
) -> FELPrivacy:
    """ε of the public leaves (parallel across clusters) composed sequentially with the private
    leaf for the same users (δ of the public leaves' DP config)."""
    if public_config.dp is None or public_leaves.noise_multiplier is None:
        raise ValueError("the public leaves were trained without DP: their ε is infinite")
    leaf = GaussianMechanism(
        float(public_leaves.noise_multiplier), public_config.sample_rate, public_config.rounds
    )
    clusters = range(int(public_leaves.assignment.max()) + 1)
    return fel_epsilon({c: [leaf, private.mechanism] for c in clusters}, public_config.dp.delta)


@dataclass
class PrivateFELResult:
    auc_public: float  # the served public ensemble alone
    auc_device: float  # public ensemble + private leaf, on the device
    privacy: FELPrivacy
    server: FELServer
    private: PrivateLeaf


def run_private_fel(
    data: ClickData,
    assignment: np.ndarray,
    public_config: FedConfig,
    private_config: FedConfig,
    *,
    fields: tuple[str, ...] = (),
    history_field: str | None = None,
    rule: str = "route",
) -> PrivateFELResult:
    """Public DP leaves per cluster of ``assignment``, then the private leaf on the device; test
    AUC with and without it, and the composed ε."""
    public, device = split_private(data, fields=fields, history_field=history_field)
    server = FELServer(train_federated(public, assignment, public_config), rule)
    everything = np.arange(len(public.label))
    served = server.scores(public, everything)  # each device gets its own rows' scores
    private = train_private_leaf(device, served, private_config)
    test = np.flatnonzero(data.is_test)
    final = private.device_scores(served[test], device, test)
    return PrivateFELResult(
        auc(served[test], data.label[test]),
        auc(final, data.label[test]),
        private_fel_privacy(server.leaves, public_config, private),
        server,
        private,
    )
