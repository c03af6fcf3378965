"""FEL's federated training of K leaves (one per cluster) on the training core.

:class:`FELTrainer` is a :class:`fedrec.train.core.Trainer`: one :meth:`~FELTrainer.step` is one
aggregation round of every cluster (:mod:`fedrec.train.fel.rounds`). With a run directory it
writes ``config.json``, the log ``rounds.csv`` (``round, clients, first_loss``: the round, its
sampled clients and their mean loss on their first local batch, NaN when none was sampled),
atomic checksummed ``checkpoint.pt`` files (the leaves, the selection and schedule generator, the
DP noise generator, the client updates and the loss history) and ``final_eval.json`` (client
updates, noise multiplier, ε); a run killed at any point and resumed (``resume=True``) is the
uninterrupted run bit for bit. Without a run directory it keeps everything in memory
(:func:`train_federated`, as every caller before the core did).

What defines a run -- refused on resume when changed -- is the configuration without its number
of rounds, the noise multiplier it gives (so a finished run without DP, or with a fixed noise
multiplier, can be extended by resuming with more rounds, but one whose target ε fixed the noise
for its length cannot), the seed, and digests of the click data, the cluster assignment and the
training offset.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.agents.fel_model import FederatedResult, flatten, init_params, unflatten
from fedrec.envs.datasets.click_data import ClickData
from fedrec.federation.privacy import FELPrivacy, GaussianMechanism, fel_epsilon
from fedrec.train.core import Trainer
from fedrec.train.fel.config import FedConfig
from fedrec.train.fel.rounds import (
    aggregate_leaves,
    client_schedules,
    local_train,
    noise_multiplier_of,
    select_clients,
    train_rows_of,
)
from fedrec.util import json_ready

#: The entries of a FEL run's ``config.json`` that define it (see the module docstring).
SETUP_KEYS = ("agent", "seed", "agent_config", "noise_multiplier", "data", "assignment", "offset")


def setup_config(config: FedConfig) -> dict[str, Any]:
    """The configuration as JSON data, without its length (``rounds``)."""
    values = json_ready(dataclasses.asdict(config))
    values.pop("rounds")
    return values


def digest(*arrays: np.ndarray) -> str:
    """SHA-256 of the arrays' dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        h.update(f"{array.dtype.str}{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def data_digest(data: ClickData) -> str:
    """SHA-256 of the click data's arrays (:func:`digest`)."""
    return digest(data.sparse, data.dense, data.label, data.client, data.is_test, data.indptr)


def check_assignment(data: ClickData, assignment: np.ndarray, config: FedConfig) -> np.ndarray:
    """``assignment`` as (U,) int64 cluster ids ``0..K-1``, none empty, with a valid sampling
    rate, number of rounds and batch size (``ValueError`` otherwise)."""
    assignment = np.asarray(assignment, np.int64)
    if assignment.shape != (data.num_clients,):
        raise ValueError(f"assignment must have one cluster per client ({data.num_clients})")
    if not 0.0 < config.sample_rate <= 1.0 or config.rounds < 1 or config.batch_size < 1:
        raise ValueError("need 0 < sample_rate <= 1, rounds >= 1 and batch_size >= 1")
    k = int(assignment.max()) + 1
    if assignment.min() < 0 or np.any(np.bincount(assignment, minlength=k) == 0):
        raise ValueError("assignment must number the clusters 0..K-1, none of them empty")
    return assignment


class RoundsTrainer(Trainer):
    """What FEL's round-based loops share on the core: one :meth:`step` is one round, logged as
    ``round, clients, first_loss`` in ``rounds.csv``; the loop state is the rounds done, the
    selection and schedule generator ``self.rng`` (its state as data), the client updates and
    the loss history. A subclass builds those in ``__init__`` and implements :meth:`step`, the
    component states (its parameters and DP noise generator) and :meth:`evaluate`."""

    header = ("round", "clients", "first_loss")
    row_tag = "round"
    unit = "rounds"
    log_name = "rounds.csv"
    rng: np.random.Generator
    rounds_done: int
    rounds: int
    updates: int
    history: list[float]

    def start(self) -> None:
        pass  # everything starts from the seeded state built in __init__

    def finished(self) -> bool:
        return self.rounds_done >= self.rounds

    def progress(self) -> float:
        return self.rounds_done

    def parse_row(self, row: list[str]) -> list[Any]:
        return [int(row[0]), int(row[1]), float(row[2])]

    def postfix(self) -> dict[str, str]:
        return {"loss": f"{self.history[-1]:.4f}"} if self.history else {}

    def loop_state(self) -> dict[str, Any]:
        return {
            "rounds_done": self.rounds_done,
            "rng": self.rng.bit_generator.state,
            "updates": self.updates,
            "history": list(self.history),
        }

    def load_loop_state(self, state: Mapping[str, Any]) -> None:
        self.rounds_done = int(state["rounds_done"])
        self.rng.bit_generator.state = state["rng"]
        self.updates = int(state["updates"])
        self.history = [float(x) for x in state["history"]]


def checked_params(
    saved: Mapping[str, torch.Tensor], current: Mapping[str, torch.Tensor], what: str
) -> dict[str, torch.Tensor]:
    """Copies of a checkpoint's ``saved`` parameters, refused (``ValueError``, naming the
    ``what`` model: "leaf", "over-arch") unless they have the names and shapes of this run's
    ``current`` ones."""
    if set(saved) != set(current):
        raise ValueError(
            f"checkpoint: the saved {what} parameters are {sorted(saved)}, this run's {what} "
            f"model has {sorted(current)}"
        )
    for name, value in current.items():
        if tuple(saved[name].shape) != tuple(value.shape):
            raise ValueError(
                f"checkpoint: {what} parameter {name} has shape {tuple(saved[name].shape)}, "
                f"this run needs {tuple(value.shape)}"
            )
    return {name: saved[name].clone() for name in current}


class FELTrainer(RoundsTrainer):
    """FEL's leaves on the training core: one :meth:`step` is one round (see the module doc)."""

    def __init__(
        self,
        data: ClickData,
        assignment: np.ndarray,
        config: FedConfig,
        *,
        offset: np.ndarray | None = None,
        on_round: Callable[[int], None] | None = None,
        out_dir: str | Path | None = None,
        resume: bool = False,
        checkpoint_every: int = 10,
        progress: bool = False,
        torch_threads: int | None = None,
    ) -> None:
        self.assignment = check_assignment(data, assignment, config)
        self.data, self.config, self.offset, self.on_round = data, config, offset, on_round
        self.k = int(self.assignment.max()) + 1
        self.train_rows = train_rows_of(data)
        self.has_train = np.array([len(r) > 0 for r in self.train_rows])
        sizes = np.bincount(self.assignment, minlength=self.k)
        self.noise_multiplier = noise_multiplier_of(config)
        self.denominator = torch.as_tensor(config.sample_rate * sizes, dtype=torch.float32)
        # One generator draws the selection and the schedules, another the DP noise.
        self.rng = np.random.default_rng(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed + 1)
        self.params = init_params(data, config.leaf, self.k, config.seed)
        self.rounds, self.rounds_done = config.rounds, 0
        self.updates = 0
        self.history: list[float] = []
        self.privacy: FELPrivacy | None = None
        recorded = out_dir is not None  # the digests are only needed in a run directory
        run_config = {
            "agent": "fel",
            "seed": config.seed,
            "agent_config": setup_config(config),
            "rounds": config.rounds,
            "noise_multiplier": self.noise_multiplier,
            "num_clusters": self.k,
            "data": data_digest(data) if recorded else None,
            "assignment": digest(self.assignment) if recorded else None,
            "offset": digest(np.asarray(offset)) if recorded and offset is not None else None,
        }
        super().__init__(
            run_config=run_config,
            setup_keys=SETUP_KEYS,
            out_dir=out_dir,
            resume=resume,
            progress=progress,
            checkpoint_every=checkpoint_every,
            total=config.rounds,
            # the caller's thread count: results do not change with the core's default of one
            torch_threads=torch.get_num_threads() if torch_threads is None else torch_threads,
            config_defaults=setup_config(FedConfig()),
        )

    def step(self) -> tuple[list[Any], dict[str, float]]:
        config, assignment, params = self.config, self.assignment, self.params
        clients = select_clients(self.rng, assignment, self.has_train, config)
        flat = flatten(params)
        deltas = torch.zeros(0, flat.shape[1])
        first_loss = float("nan")
        if len(clients):
            start = {n: t[torch.as_tensor(assignment[clients])] for n, t in params.items()}
            index, mask = client_schedules(self.data, clients, self.train_rows, config, self.rng)
            trained, first_loss = local_train(
                start, self.data, index, mask, config.client_lr, self.offset
            )
            deltas = flatten(trained) - flatten(start)
            self.updates += len(clients)
            self.history.append(first_loss)
        if self.on_round is not None:
            self.on_round(1)
        num_samples = np.array([len(self.train_rows[c]) for c in clients], np.int64)
        self.params = unflatten(
            aggregate_leaves(
                flat,
                clients,
                num_samples,
                deltas,
                assignment,
                config,
                noise_multiplier=self.noise_multiplier,
                denominator=self.denominator,
                generator=self.generator,
            ),
            params,
        )
        self.rounds_done += 1
        metrics = {"first_loss": first_loss} if len(clients) else {}
        return [[self.rounds_done, len(clients), first_loss]], metrics

    def component_states(self) -> dict[str, Any]:
        return {"agent": {"leaves": self.params, "noise_generator": self.generator.get_state()}}

    def load_component_states(self, states: Mapping[str, Any]) -> None:
        agent = states["agent"]
        self.params = checked_params(agent["leaves"], self.params, "leaf")
        self.generator.set_state(agent["noise_generator"])

    def evaluate(self) -> dict[str, Any]:
        """The run's totals and its DP guarantee (the leaves' ε, parallel over the clusters)."""
        self.privacy = None
        if self.config.dp is not None:
            mechanism = GaussianMechanism(
                float(self.noise_multiplier), self.config.sample_rate, self.config.rounds
            )
            self.privacy = fel_epsilon(
                {c: [mechanism] for c in range(self.k)}, self.config.dp.delta
            )
        return {
            "rounds": self.rounds_done,
            "num_clusters": self.k,
            "client_updates": self.updates,
            "noise_multiplier": self.noise_multiplier,
            "privacy": None if self.privacy is None else dataclasses.asdict(self.privacy),
            "loss_history": list(self.history),
        }

    def result(self) -> FederatedResult:
        """The trained leaves (after :meth:`run`)."""
        return FederatedResult(
            self.params,
            self.assignment,
            self.updates,
            self.noise_multiplier,
            self.privacy,
            self.history,
        )


def train_federated(
    data: ClickData,
    assignment: np.ndarray,
    config: FedConfig,
    *,
    offset: np.ndarray | None = None,
    progress: Callable[[int], None] | None = None,
    out_dir: str | Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 10,
) -> FederatedResult:
    """Train one leaf per cluster of ``assignment`` (U,) with (DP-)FedAvg inside each cluster.

    ``offset`` (M,): a fixed logit added to each sample's leaf output in training (see
    :mod:`fedrec.train.fel.private`); ``progress`` is called with 1 after every round.

    :param out_dir: a run directory (``config.json``, ``rounds.csv``, ``checkpoint.pt``,
        ``final_eval.json``); None keeps everything in memory.
    :param resume: continue the run in ``out_dir`` exactly where its checkpoint left it.
    :param checkpoint_every: rounds between checkpoints (0: only at the end).
    """
    trainer = FELTrainer(
        data,
        assignment,
        config,
        offset=offset,
        on_round=progress,
        out_dir=out_dir,
        resume=resume,
        checkpoint_every=checkpoint_every,
    )
    trainer.run()
    return trainer.result()


def train_baseline(data: ClickData, config: FedConfig, **kwargs: object) -> FederatedResult:
    """Plain FL: one global model over all clients, same q and rounds (same expected updates);
    ``kwargs`` go to :func:`train_federated`."""
    return train_federated(data, np.zeros(data.num_clients, np.int64), config, **kwargs)  # type: ignore[arg-type]
