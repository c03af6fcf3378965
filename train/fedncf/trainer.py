"""Federated NCF training on the training core: :class:`FedNCFTrainer` (one step is one
aggregation round: select, train the clients, aggregate; evaluation, logging, checkpoints and
exact resume) and :func:`train_federated`, which runs it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.agents.ncf import NCF
from fedrec.envs.datasets.catalog import load_prepared
from fedrec.eval.ranking_metrics import RankingResult
from fedrec.federation.registry import make_aggregator
from fedrec.federation.secagg import SecAggAborted
from fedrec.train.core import Trainer
from fedrec.train.fedncf.config import FedNCFConfig
from fedrec.train.fedncf.evaluate import evaluate_point
from fedrec.train.fedncf.optim_state import (
    FEDERATED_STATE,
    AdamStateStore,
    ClientOptimizerStore,
    FederatedOptimizerState,
)
from fedrec.train.fedncf.results import EvalPoint, TrainResult
from fedrec.train.fedncf.rounds import (
    aggregate_round,
    round_extras,
    round_trainer,
    select_round,
    train_clients,
)
from fedrec.train.fedncf.sampling import ClientData, round_rng

#: FedNCFConfig fields that set a run's length, not its setup (a finished run can be extended).
LENGTH_FIELDS = ("global_rounds", "aggregation_rounds", "eval_every")
#: What defines a FedNCF run: resuming with any of these changed is refused.
SETUP_KEYS = ("agent", "dataset", "seed", "agent_config")


def _setup_config(config: Any) -> dict[str, Any]:
    values = dataclasses.asdict(config)
    return {k: v for k, v in values.items() if k not in LENGTH_FIELDS}


#: The values of fields that a saved run may predate (its ``config.json`` lacks them): the
#: defaults, except that a run from before ``simulation`` existed trained the batched simulation
#: (the default "auto" resolves to "compiled" where Numba imports, and would not be that run).
PREDATED_DEFAULTS = _setup_config(FedNCFConfig(simulation="batched"))


class FedNCFTrainer(Trainer):
    """Federated NCF on the training core: one :meth:`step` is one aggregation round.

    The log (``eval.csv``) has one row per evaluation: ``aggregation_round, global_round,
    hit_rate, ndcg``; a checkpoint holds the private user store, the global item table and
    network, every client's persistent optimiser state (when kept), the selection RNG and the
    round's client groups, so a resumed run is bit-for-bit the uninterrupted one.
    """

    header = ("aggregation_round", "global_round", "hit_rate", "ndcg")
    row_tag = "eval"
    unit = "global rounds"
    log_name = "eval.csv"

    def __init__(
        self,
        *,
        dataset: str,
        config: FedNCFConfig,
        data_dir: str | Path | None = None,
        progress: bool = True,
        on_eval: Callable[[EvalPoint], None] | None = None,
        out_dir: str | Path | None = None,
        resume: bool = False,
        checkpoint_every: int = 10,
    ) -> None:
        self.dataset, self.config, self.data_dir, self.on_eval = dataset, config, data_dir, on_eval
        data = load_prepared(dataset, data_dir)
        if config.validation:
            data = data.with_validation()
            self.header = (*self.header, "validation_hit_rate", "validation_ndcg")
        self.data = data
        self.clients = ClientData.of(data)
        self.num_users, num_items = data.num_users, data.num_items
        generator = torch.Generator().manual_seed(config.seed)
        self.model = NCF(
            config.model, num_users=self.num_users, num_items=num_items, generator=generator
        )
        self.user_store = self.model.user_table()  # the clients' private rows (never sent)
        self.items, self.network = self.model.item_table(), self.model.network_vector()
        self.aggregator = make_aggregator(config.aggregator)
        self.selection_rng = np.random.default_rng([config.seed, 1])
        self.per_global = config.rounds_per_global(self.num_users)
        self.total_rounds = config.total_aggregation_rounds(self.num_users)
        self.train_round = round_trainer(config.simulation)
        self.extra: dict[str, Any] = round_extras(config)
        self.optimizer_store: AdamStateStore | None = None
        if config.client_optimizer != "fresh":
            kind = (
                FederatedOptimizerState
                if config.client_optimizer == "federated"
                else ClientOptimizerStore
            )
            self.optimizer_store = kind(config.model, num_users=self.num_users, num_items=num_items)
            self.extra["optimizer_store"] = self.optimizer_store
        self.rounds_done = 0
        self.history: list[EvalPoint] = []
        self.participations = 0
        self.samples = 0  # sum of n_k over the participations
        self.aborted = 0
        self.train_seconds = self.aggregation_seconds = 0.0
        self.groups: list[np.ndarray] = []
        run_config = {
            "agent": f"fed{config.model.model}",
            "dataset": dataset,
            "seed": config.seed,
            "agent_config": _setup_config(config),
            **{name: getattr(config, name) for name in LENGTH_FIELDS},
        }
        super().__init__(
            run_config=run_config,
            setup_keys=SETUP_KEYS,
            out_dir=out_dir,
            resume=resume,
            progress=progress,
            checkpoint_every=checkpoint_every,
            total=self.total_rounds / self.per_global,
            config_defaults=PREDATED_DEFAULTS,
        )

    def start(self) -> None:
        pass  # everything starts from the seeded initialisation built in __init__

    def finished(self) -> bool:
        return self.rounds_done >= self.total_rounds

    def progress(self) -> float:
        return self.rounds_done / self.per_global

    def parse_row(self, row: list[str]) -> list[Any]:
        return [int(row[0]), float(row[1]), float(row[2]), float(row[3])]

    def postfix(self) -> dict[str, str]:
        last = self.history[-1]
        return {"hr": f"{last.hit_rate:.4f}", "ndcg": f"{last.ndcg:.4f}"}

    def _evaluate(self, done: int) -> list[Any]:
        self.model.load_federated(
            user_table=self.user_store, item_table=self.items, network=self.network
        )
        point = evaluate_point(
            self.model,
            data=self.data,
            dataset=self.dataset,
            data_dir=self.data_dir,
            top_k=self.config.top_k,
            global_round=done / self.per_global,
            aggregation_round=done,
            seconds=self.train_seconds,
        )
        self.history.append(point)
        if self.on_eval is not None:
            self.on_eval(point)
        row = [done, point.global_round, point.hit_rate, point.ndcg]
        if self.config.validation:
            row += [point.validation_hit_rate, point.validation_ndcg]
        return row

    def step(self) -> tuple[list[Any], dict[str, float]]:
        c, r, per_global = self.config, self.rounds_done, self.per_global
        start = time.perf_counter()
        self.groups, users = select_round(
            self.groups,
            self.selection_rng,
            aggregation_round=r,
            num_users=self.num_users,
            per_global=per_global,
            selection=c.selection,
        )
        updates, new_rows = train_clients(
            c,
            self.clients,
            users,
            round_rng(c.seed, r),
            user_rows=self.user_store[torch.from_numpy(users)],
            items=self.items,
            network=self.network,
            train_round=self.train_round,
            extras=self.extra,
        )
        self.user_store[torch.from_numpy(users)] = new_rows
        self.participations += len(updates.num_samples)
        self.samples += int(np.sum(updates.num_samples))
        agg_start = time.perf_counter()
        try:
            self.items, self.network = aggregate_round(
                self.aggregator,
                self.optimizer_store,
                items=self.items,
                network=self.network,
                updates=updates,
            )
        except SecAggAborted:
            self.aborted += 1
        now = time.perf_counter()
        self.aggregation_seconds += now - agg_start
        self.train_seconds += now - start
        self.rounds_done = done = r + 1
        every = c.eval_every
        end_of_global = done % per_global == 0
        if done == self.total_rounds or (
            every and end_of_global and (done // per_global) % every == 0
        ):
            return [self._evaluate(done)], {}
        return [], {}

    def loop_state(self) -> dict[str, Any]:
        aggregator_rng = getattr(self.aggregator, "rng", None)
        return {
            "rounds_done": self.rounds_done,
            "groups": list(self.groups),
            "selection_rng": self.selection_rng.bit_generator.state,
            "aggregator_rng": aggregator_rng.bit_generator.state if aggregator_rng else None,
            "history": [dataclasses.asdict(p) for p in self.history],
            "participations": self.participations,
            "samples": self.samples,
            "aborted": self.aborted,
            "train_seconds": self.train_seconds,
            "aggregation_seconds": self.aggregation_seconds,
        }

    def load_loop_state(self, state: Mapping[str, Any]) -> None:
        self.rounds_done = int(state["rounds_done"])
        self.groups = [np.asarray(g) for g in state["groups"]]
        self.selection_rng.bit_generator.state = state["selection_rng"]
        if state["aggregator_rng"] is not None:
            self.aggregator.rng.bit_generator.state = state["aggregator_rng"]
        self.history = [EvalPoint(**p) for p in state["history"]]
        samples = state["samples"]
        if np.ndim(samples):  # a checkpoint of an older fedrec kept every n_k
            self.participations, self.samples = len(samples), int(np.sum(samples))
        else:
            self.participations, self.samples = int(state["participations"]), int(samples)
        self.aborted = int(state["aborted"])
        self.train_seconds = float(state["train_seconds"])
        self.aggregation_seconds = float(state["aggregation_seconds"])

    def component_states(self) -> dict[str, Any]:
        store = self.optimizer_store
        saved: dict[str, Any] | None = None
        if isinstance(store, FederatedOptimizerState):
            saved = {
                "step_count": store.step_count,
                "user_moments": store.user_moments,
                "network_moments": store.network_moments,
                "item_moments": store.item_moments,
            }
        elif isinstance(store, ClientOptimizerStore):
            saved = {
                "steps": store.steps,
                "dense_m": store.dense_m,
                "dense_v": store.dense_v,
                "item_moments": store.item_moments,
                "torch_states": {str(k): v for k, v in store.torch_states.items()},
            }
        return {
            "agent": {
                "user_store": self.user_store,
                "items": self.items,
                "network": self.network,
                "optimizer_store": saved,
            }
        }

    def load_component_states(self, states: Mapping[str, Any]) -> None:
        agent = states["agent"]
        for name in ("user_store", "items", "network"):
            current, saved = getattr(self, name), agent[name]
            if tuple(saved.shape) != tuple(current.shape):
                raise ValueError(
                    f"checkpoint: {name} has shape {tuple(saved.shape)}, this run's data set "
                    f"gives {tuple(current.shape)}"
                )
        store, saved = self.optimizer_store, agent["optimizer_store"]
        arrays: dict[str, np.ndarray] = {}
        if isinstance(store, FederatedOptimizerState):  # checked before anything is replaced
            if not isinstance(saved, Mapping) or not {"step_count", *FEDERATED_STATE} <= set(saved):
                raise ValueError("checkpoint: no federated optimizer state for this run")
            arrays = {name: np.array(saved[name], np.float32) for name in FEDERATED_STATE}
            for name, array in arrays.items():
                if array.shape != getattr(store, name).shape:
                    raise ValueError(
                        f"checkpoint: optimizer state {name} has shape {array.shape}, this run "
                        f"needs {getattr(store, name).shape}"
                    )
        self.user_store, self.items, self.network = (
            agent["user_store"].clone(),
            agent["items"].clone(),
            agent["network"].clone(),
        )
        if isinstance(store, FederatedOptimizerState):
            store.step_count = int(saved["step_count"])
            for name, array in arrays.items():
                setattr(store, name, array)
        elif isinstance(store, ClientOptimizerStore):
            store.steps = np.array(saved["steps"])
            store.dense_m = np.array(saved["dense_m"])
            store.dense_v = np.array(saved["dense_v"])
            store.item_moments = np.array(saved["item_moments"])
            store.torch_states = {int(k): v for k, v in saved["torch_states"].items()}

    def evaluate(self) -> dict[str, Any]:
        final = self.history[-1]
        return {
            "hit_rate": final.hit_rate,
            "ndcg": final.ndcg,
            "top_k": self.config.top_k,
            "num_users": self.num_users,
            "history": [dataclasses.asdict(p) for p in self.history],
            "aborted_rounds": self.aborted,
            "aggregation_seconds": self.aggregation_seconds,
        }


def train_federated(
    *,
    dataset: str,
    config: FedNCFConfig,
    data_dir: str | Path | None = None,
    progress: bool = True,
    on_eval: Callable[[EvalPoint], None] | None = None,
    out_dir: str | Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 10,
) -> TrainResult:
    """Federated training of ``config.model`` on ``dataset`` (see :mod:`fedrec.train.fedncf`).

    :param out_dir: a run directory (``config.json``, ``eval.csv``, ``checkpoint.pt``,
        ``final_eval.json``); None keeps everything in memory.
    :param resume: continue the run in ``out_dir`` exactly where its checkpoint left it.
    :param checkpoint_every: global rounds between checkpoints (0: only at the end).
    """
    trainer = FedNCFTrainer(
        dataset=dataset,
        config=config,
        data_dir=data_dir,
        progress=progress,
        on_eval=on_eval,
        out_dir=out_dir,
        resume=resume,
        checkpoint_every=checkpoint_every,
    )
    trainer.run()
    trainer.model.load_federated(
        user_table=trainer.user_store, item_table=trainer.items, network=trainer.network
    )
    final = trainer.history[-1]
    return TrainResult(
        model=trainer.model,
        history=trainer.history,
        final=RankingResult(final.hit_rate, final.ndcg, trainer.num_users, config.top_k),
        train_seconds=trainer.train_seconds,
        aborted_rounds=trainer.aborted,
        participations=trainer.participations,
        client_samples=trainer.samples,
        aggregation_seconds=trainer.aggregation_seconds,
    )
