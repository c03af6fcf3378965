"""FEL's learned ensemble, the over-arch (:class:`fedrec.agents.fel_model.OverArch`), trained
centrally or by federated learning.

**Centrally** (:func:`train_over_arch`): on the data of opt-in users only.

**By federated learning** (:func:`train_over_arch_federated`): every user fits it on its own
samples, by (DP-)FedAvg over **every** user: the server broadcasts the
trained leaves and the over-arch; a sampled client computes the K leaf logits on its own training
rows, runs local SGD on the over-arch and sends its update; the server averages the updates
(FedAvg, weights n_k / N) or, with DP, clips each update, adds Gaussian noise to the sum and
divides by the expected number of sampled clients (:func:`fedrec.federation.privacy.dp_aggregate`,
one "cluster" holding every client).

Privacy: the over-arch touches every user's protected data after the leaves did, so its
mechanism composes **sequentially** with each cluster's leaf (``fel_epsilon(..., shared=[...])``):
the reported ε is that composition.

On the training core (:class:`OverArchTrainer`, one step a round, as the leaves'
:class:`~fedrec.train.fel.trainer.FELTrainer`): with a run directory it checkpoints, and a killed
run resumes to the uninterrupted run bit for bit. The round shares the leaves' client sampling,
schedules and local SGD (:mod:`fedrec.train.fel.rounds`); only its aggregation is its own.

Batched like the leaves: all sampled clients' copies are slices of stacked (C, ...) tensors and
one autograd call gives every client's gradient. The features of every training row (the K leaf
logits, the own-cluster logit, the cluster's one-hot) are computed once, since the leaves are
fixed while the over-arch trains (on a device each client computes its own rows' features).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.agents.fel_model import OverArch, flatten, predict, unflatten
from fedrec.envs.datasets.click_data import ClickData
from fedrec.federation.privacy import GaussianMechanism, dp_aggregate
from fedrec.train.fel.config import FedConfig
from fedrec.train.fel.rounds import client_schedules, local_sgd, noise_multiplier_of, poisson_sample
from fedrec.train.fel.trainer import (
    RoundsTrainer,
    checked_params,
    data_digest,
    digest,
    setup_config,
)


def train_over_arch(
    logits: np.ndarray,
    cluster: np.ndarray,
    labels: np.ndarray,
    *,
    hidden: int = 16,
    iterations: int = 100,
    seed: int = 0,
) -> OverArch:
    """Fit an :class:`OverArch` centrally on opt-in users' samples: full-batch L-BFGS with a
    strong-Wolfe line search, ``iterations`` steps. (The over-arch has a few hundred parameters
    and the batch fits in memory; on the synthetic Taobao data, 100 L-BFGS steps reached a test
    AUC 0.04 higher than 200 epochs of full-batch Adam, in a third of the time.)"""
    torch.manual_seed(seed)
    arch = OverArch(logits.shape[1], hidden)
    x = torch.as_tensor(logits, dtype=torch.float32)
    c = torch.as_tensor(cluster, dtype=torch.int64)
    y = torch.as_tensor(labels, dtype=torch.float32)
    opt = torch.optim.LBFGS(
        arch.parameters(), lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe"
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(arch(x, c), y)
        loss.backward()
        return loss

    opt.step(closure)
    return arch


@dataclass
class FederatedOverArch:
    arch: OverArch
    client_updates: int
    noise_multiplier: float | None
    mechanism: GaussianMechanism | None
    """the over-arch's DP mechanism (None without DP), to compose with the leaves'"""
    loss_history: list[float]


def over_arch_features(logits: np.ndarray, cluster: np.ndarray) -> np.ndarray:
    """(M, 2K + 1) float32 inputs of :meth:`OverArch.head` (:meth:`OverArch.features`)."""
    x = OverArch.features(
        torch.as_tensor(logits, dtype=torch.float32),
        torch.as_tensor(cluster, dtype=torch.int64),
        logits.shape[1],
    )
    return x.numpy()


def _head(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """(C, B) over-arch logits of C stacked over-arches on their own batches x (C, B, D):
    ``linear(x) + mlp(x)`` as in :class:`OverArch`."""
    linear = torch.einsum("cbd,cd->cb", x, params["linear.weight"][:, 0])
    linear = linear + params["linear.bias"]
    hidden = torch.relu(
        torch.einsum("cbd,chd->cbh", x, params["mlp.0.weight"]) + params["mlp.0.bias"][:, None]
    )
    mlp = torch.einsum("cbh,ch->cb", hidden, params["mlp.2.weight"][:, 0])
    return linear + mlp + params["mlp.2.bias"]


#: The entries of a federated over-arch run's ``config.json`` that define it: resuming with any of
#: them changed is refused (its number of rounds is not among them, see :class:`OverArchTrainer`).
OVER_ARCH_SETUP_KEYS = (
    "agent",
    "seed",
    "agent_config",
    "hidden",
    "noise_multiplier",
    "data",
    "leaves",
    "assignment",
)


class OverArchTrainer(RoundsTrainer):
    """The federated over-arch on the training core: one :meth:`step` is one over-arch round.

    Like :class:`~fedrec.train.fel.trainer.FELTrainer`: with a run directory it writes
    ``config.json``, ``rounds.csv`` (``round, clients, first_loss``), atomic checksummed
    ``checkpoint.pt`` files (the stacked over-arch parameters and the DP noise generator's state,
    the selection and schedule generator's state, the client updates and the loss history, all as
    data) and ``final_eval.json``; a run killed and resumed is the uninterrupted run bit for bit.
    Without one it trains in memory (:func:`train_over_arch_federated`).

    What defines a run: the configuration without ``rounds`` (the leaves' length, unused here),
    the over-arch's width, the noise multiplier (with a target ε it depends on the over-arch's
    rounds, so such a run cannot be extended), the seed, and digests of the click data, the
    leaves and the cluster assignment.
    """

    def __init__(
        self,
        data: ClickData,
        leaves: dict[str, torch.Tensor],
        assignment: np.ndarray,
        config: FedConfig,
        *,
        rounds: int,
        hidden: int = 16,
        on_round: Callable[[int], None] | None = None,
        out_dir: str | Path | None = None,
        resume: bool = False,
        checkpoint_every: int = 10,
        progress: bool = False,
    ) -> None:
        assignment = np.asarray(assignment, np.int64)
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        if assignment.shape != (data.num_clients,):
            raise ValueError(f"assignment must have one cluster per client ({data.num_clients})")
        self.data, self.config, self.on_round = data, config, on_round
        k = next(iter(leaves.values())).shape[0]
        self.rng = np.random.default_rng(config.seed + 7)
        self.generator = torch.Generator().manual_seed(config.seed + 8)
        torch.manual_seed(config.seed)
        self.template = OverArch(k, hidden)
        self.params = {
            name: value.detach()[None].clone() for name, value in self.template.named_parameters()
        }
        train = np.flatnonzero(~data.is_test)
        self.features = torch.as_tensor(
            over_arch_features(predict(leaves, data, train), assignment[data.client[train]])
        )
        self.labels = torch.as_tensor(data.label[train], dtype=torch.float32)
        # Each client's rows as positions into ``train`` (rows are grouped by client): the
        # features are indexed by training row, the leaves' rounds by row of ``data``.
        bounds = np.searchsorted(train, data.indptr)
        self.client_rows = [np.arange(bounds[u], bounds[u + 1]) for u in range(data.num_clients)]
        self.has_train = np.diff(bounds) > 0
        self.noise_multiplier = noise_multiplier_of(dataclasses.replace(config, rounds=rounds))
        self.denominator = torch.as_tensor(
            [config.sample_rate * data.num_clients], dtype=torch.float32
        )
        self.rounds, self.rounds_done = rounds, 0
        self.updates = 0
        self.history: list[float] = []
        recorded = out_dir is not None  # the digests are only needed in a run directory
        run_config = {
            "agent": "fel-over-arch",
            "seed": config.seed,
            "agent_config": setup_config(config),
            "hidden": hidden,
            "rounds": rounds,
            "noise_multiplier": self.noise_multiplier,
            "data": data_digest(data) if recorded else None,
            "leaves": digest(*(leaves[n].detach().cpu().numpy() for n in sorted(leaves)))
            if recorded
            else None,
            "assignment": digest(assignment) if recorded else None,
        }
        super().__init__(
            run_config=run_config,
            setup_keys=OVER_ARCH_SETUP_KEYS,
            out_dir=out_dir,
            resume=resume,
            progress=progress,
            checkpoint_every=checkpoint_every,
            total=rounds,
            torch_threads=torch.get_num_threads(),  # the caller's, as before the core
            config_defaults=setup_config(FedConfig()),
        )

    def step(self) -> tuple[list[Any], dict[str, float]]:
        config, params = self.config, self.params
        chosen = poisson_sample(self.rng, config.sample_rate, self.has_train)
        clients = np.flatnonzero(chosen)
        flat = flatten(params)
        deltas = torch.zeros(0, flat.shape[1])
        first_loss = float("nan")
        if len(clients):
            index, mask = client_schedules(self.data, clients, self.client_rows, config, self.rng)
            c = len(clients)
            stacked = {name: t.expand(c, *t.shape[1:]) for name, t in params.items()}
            x_all = self.features[index]  # (C, S, B, D)
            trained, first_loss = local_sgd(
                stacked,
                lambda p, s: _head(p, x_all[:, s]),
                self.labels[index],
                mask,
                config.client_lr,
            )
            deltas = flatten(trained) - flat.expand(c, -1)
            self.updates += c
            self.history.append(first_loss)
        if self.on_round is not None:
            self.on_round(1)
        self._aggregate(flat, clients, deltas)
        self.rounds_done += 1
        metrics = {"first_loss": first_loss} if len(clients) else {}
        return [[self.rounds_done, len(clients), first_loss]], metrics

    def _aggregate(self, flat: torch.Tensor, clients: np.ndarray, deltas: torch.Tensor) -> None:
        # Not aggregate_leaves: its FedAvg index_add_ sums in another order than .sum(0).
        config, dp = self.config, self.config.dp
        if dp is None:
            if not len(clients):
                return
            n = torch.as_tensor([len(self.client_rows[c]) for c in clients], dtype=torch.float32)
            step = ((n / n.sum())[:, None] * deltas).sum(0, keepdim=True)
        else:
            step = dp_aggregate(
                deltas,
                torch.zeros(len(clients), dtype=torch.int64),  # one "cluster": every client
                1,
                clip_norm=dp.clip_norm,
                noise_multiplier=self.noise_multiplier,
                denominator=self.denominator,
                generator=self.generator,
            )
        self.params = unflatten(flat + config.server_lr * step, self.params)

    def component_states(self) -> dict[str, Any]:
        return {"agent": {"over_arch": self.params, "noise_generator": self.generator.get_state()}}

    def load_component_states(self, states: Mapping[str, Any]) -> None:
        agent = states["agent"]
        self.params = checked_params(agent["over_arch"], self.params, "over-arch")
        self.generator.set_state(agent["noise_generator"])

    def mechanism(self) -> GaussianMechanism | None:
        """The over-arch's DP mechanism (None without DP)."""
        z = self.noise_multiplier
        return (
            None if z is None else GaussianMechanism(float(z), self.config.sample_rate, self.rounds)
        )

    def evaluate(self) -> dict[str, Any]:
        mechanism = self.mechanism()
        return {
            "rounds": self.rounds_done,
            "client_updates": self.updates,
            "noise_multiplier": self.noise_multiplier,
            "mechanism": None if mechanism is None else dataclasses.asdict(mechanism),
            "loss_history": list(self.history),
        }

    def result(self) -> FederatedOverArch:
        """The trained over-arch (after :meth:`run`)."""
        with torch.no_grad():
            for name, value in self.template.named_parameters():
                value.copy_(self.params[name][0])
        return FederatedOverArch(
            self.template, self.updates, self.noise_multiplier, self.mechanism(), self.history
        )


def train_over_arch_federated(
    data: ClickData,
    leaves: dict[str, torch.Tensor],
    assignment: np.ndarray,
    config: FedConfig,
    *,
    rounds: int,
    hidden: int = 16,
    progress: Callable[[int], None] | None = None,
    out_dir: str | Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 10,
) -> FederatedOverArch:
    """Train an :class:`OverArch` over the fixed ``leaves`` by (DP-)FedAvg over every client.

    ``config`` gives the sampling rate, local epochs, batch size, client learning rate, seed and
    DP settings (``config.dp``: the same clip norm and, given ``noise_multiplier`` or
    ``target_epsilon``, the noise); ``rounds`` is the over-arch's own number of rounds;
    ``progress`` is called with 1 after every round.

    :param out_dir: a run directory (``config.json``, ``rounds.csv``, ``checkpoint.pt``,
        ``final_eval.json``; :class:`OverArchTrainer`); None trains in memory.
    :param resume: continue the run in ``out_dir`` exactly where its checkpoint left it.
    :param checkpoint_every: rounds between checkpoints (0: only at the end).
    """
    trainer = OverArchTrainer(
        data,
        leaves,
        assignment,
        config,
        rounds=rounds,
        hidden=hidden,
        on_round=progress,
        out_dir=out_dir,
        resume=resume,
        checkpoint_every=checkpoint_every,
    )
    trainer.run()
    return trainer.result()
