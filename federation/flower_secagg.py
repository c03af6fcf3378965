"""FedNCF's MF-FedAvg under Flower's own SecAgg+ (``SecAggPlusWorkflow`` and ``secaggplus_mod``).

The server learns only the sum over the round's nodes of one vector per node, never a node's own:
Flower's SecAgg+ (Bell et al. 2020) masks each node's quantised vector with pairwise masks agreed
with its neighbours plus a private mask, and Shamir shares of the mask seeds let the server remove
the masks of the nodes that answer (and of those that dropped out, down to the reconstruction
threshold). The unit of secure aggregation is the node: a node hosts many users, adds up its
users' uploads first, and takes part in SecAgg+ with that sum. (fedrec's MF-SecAvg,
:mod:`fedrec.federation.secagg`, masks every client's upload instead, inside one process.)

MF-FedAvg needs only sums, so each node sends (every part divided by a public scale so that it
lies inside SecAgg+'s clipping range):

====================  ====================================  ============================
part                  value                                 scale
====================  ====================================  ============================
network               Σ_k n_k θ_k                           1 / (c · n_max)
examples              Σ_k n_k                               1 / (c · n_max)
item sums             Σ_{k touching i} Q_k[i]  (I × E)      1 / c
item counts           |{k touching i}|  (I)                 1 / c
====================  ====================================  ============================

with c the clients per round and n_max the largest n_k in the data set (public bounds: a
deployment fixes them by policy). The server rebuilds MF-FedAvg from the sums: network
Σ n_k θ_k / Σ n_k, item row i the sum over its count (counts are integers and are rounded back
exactly). SecAgg+ quantises every value to ``2 · clip / 2^22``, so the aggregate is exact up to
that step, not bit for bit (docs/flower.md measures it). Flower's quantiser rounds stochastically
with NumPy's global generator; each node seeds it from the run's seed, the round and its partition
id before every SecAgg+ stage, so a secure run is reproducible like every other fedrec run. The
quantisation is as fine as the modulus allows for the number of nodes
(:func:`quantization_range`), not Flower's default 2^22. A value outside the clipping range is an
error, never silently clipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.server.strategy import Strategy

from fedrec.federation.aggregators import ClientUpdates

#: SecAgg+'s modulus (Flower's default).
MODULUS_RANGE = 2**32
#: The most quantisation levels: Flower's quantiser casts to int32.
MAX_QUANTIZATION_RANGE = 2**30


def quantization_range(num_nodes: int) -> int:
    """The finest quantisation whose sum over ``num_nodes`` values (and SecAgg+'s weight entry)
    stays below the modulus: a power of two at most ``2^32 / (num_nodes + 1)``, capped at 2^30
    (Flower's default, 2^22, leaves room for 1,023 summands and is 256 times coarser for 3)."""
    levels = 2 ** int(np.floor(np.log2(MODULUS_RANGE / (num_nodes + 1))))
    return int(min(levels, MAX_QUANTIZATION_RANGE))


def secure_vector(
    updates: ClientUpdates, *, num_items: int, net_scale: float, item_scale: float, clip: float
) -> list[np.ndarray]:
    """A node's four scaled sums (see the module doc); raises if a value leaves ``[-clip, clip]``."""
    n = torch.as_tensor(np.asarray(updates.num_samples), dtype=torch.float64)
    network = (n[:, None] * updates.network.double()).sum(0) * net_scale
    examples = n.sum().reshape(1) * net_scale
    width = updates.item_rows.shape[1]
    sums = torch.zeros(num_items, width, dtype=torch.float64)
    sums.index_add_(0, updates.row_item, updates.item_rows.double())
    counts = torch.bincount(updates.row_item, minlength=num_items).double()
    parts = [network, examples, sums * item_scale, counts * item_scale]
    arrays = [part.numpy() for part in parts]
    largest = max(float(np.abs(a).max(initial=0.0)) for a in arrays)
    if largest > clip:
        raise ValueError(
            f"a scaled upload value ({largest:.3g}) lies outside SecAgg+'s clipping range "
            f"[-{clip}, {clip}]; raise secagg_clip"
        )
    return arrays


def mf_fedavg_from_sums(
    sums: list[np.ndarray],
    *,
    items: torch.Tensor,
    net_scale: float,
    item_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MF-FedAvg's new (items, network) from the round's summed :func:`secure_vector`."""
    network, examples, item_sums, counts = (np.asarray(s, np.float64) for s in sums)
    total = examples[0] / net_scale
    new_network = torch.from_numpy((network / net_scale) / total).to(items.dtype)
    counts = np.rint(counts / item_scale)
    touched = counts > 0
    new_items = items.clone()
    rows = item_sums[touched] / item_scale / counts[touched, None]
    new_items[torch.from_numpy(touched)] = torch.from_numpy(rows).to(items.dtype)
    return new_items, new_network


def secure_mod(job_of_context: Callable[[Any], Any]) -> Callable[..., Any]:
    """A ClientApp mod that runs Flower's ``secaggplus_mod`` when the job is secure and passes
    the message on otherwise (one ClientApp serves both)."""

    def mod(msg: Any, context: Any, call_next: Callable[..., Any]) -> Any:
        job = job_of_context(context)
        if not getattr(job, "secure", False):
            return call_next(msg, context)
        from flwr.client.mod import secaggplus_mod

        # Flower quantises with np.random's global generator: seed it for reproducible runs
        stage_round = int(msg.metadata.group_id or 0)
        pid = int(context.node_config["partition-id"])
        seed = np.random.SeedSequence([job.config.seed, 5, stage_round, pid])
        np.random.seed(seed.generate_state(1)[0])  # noqa: NPY002 (Flower reads the global one)
        return secaggplus_mod(msg, context, call_next)

    return mod


def secure_train_reply(
    msg: Any, context: Any, job: Any, train_shard: Callable[..., tuple[ClientUpdates, int]]
) -> Any:
    """The node's reply to SecAgg+'s collect stage: trains its users (``train_shard``) and
    returns its scaled sums as a legacy FitRes, which ``secaggplus_mod`` masks."""
    import flwr.compat.common.recorddict_compat as compat
    from flwr.app import Message
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    items, network = parameters_to_ndarrays(fitins.parameters)
    config = fitins.config
    users = np.frombuffer(config["users"], dtype=np.int64)
    updates, _ = train_shard(context, job, items, network, users, int(config["round"]))
    vector = secure_vector(
        updates,
        num_items=items.shape[0],
        net_scale=float(config["net-scale"]),
        item_scale=float(config["item-scale"]),
        clip=job.secagg_clip,
    )
    # weight 1 for every node: SecAgg+ then returns the mean, which the server turns into the sum
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(vector), 1, {})
    return Message(compat.fitres_to_recorddict(res, keep_input=False), reply_to=msg)


class SecureAggregation:
    """Runs one FedNCF aggregation round through Flower's ``SecAggPlusWorkflow``.

    The workflow is Flower's legacy-strategy machinery; :class:`_RoundStrategy` is the strategy it
    asks which nodes take part (the nodes hosting the round's users) and hands the unmasked
    result to."""

    def __init__(
        self,
        *,
        grid: Any,
        context: Any,
        nodes: Mapping[int, int],
        clients_per_round: int,
        max_samples: int,
        clip: float,
    ) -> None:
        from flwr.server import ServerConfig
        from flwr.server.compat.grid_client_proxy import GridClientProxy
        from flwr.server.compat.legacy_context import LegacyContext
        from flwr.server.workflow import SecAggPlusWorkflow

        self.strategy = _RoundStrategy()
        self.context = LegacyContext(context, config=ServerConfig(), strategy=self.strategy)
        self.proxies = {
            pid: GridClientProxy(node, grid, context.run_id) for pid, node in nodes.items()
        }
        for proxy in self.proxies.values():
            self.context.client_manager.register(proxy)
        self.grid = grid
        self.dropped = 0
        self.net_scale = 1.0 / (clients_per_round * max_samples)
        self.item_scale = 1.0 / clients_per_round
        # every node of a round shares its secrets with all others; any half of them (at least
        # 2, SecAgg+'s floor) can remove the masks of a node that dropped out
        self.workflow = SecAggPlusWorkflow(
            num_shares=1.0,
            reconstruction_threshold=0.5,
            max_weight=1.0,
            clipping_range=clip,
            quantization_range=quantization_range(len(nodes)),
            modulus_range=MODULUS_RANGE,
        )

    def round(
        self, r: int, users_of: Mapping[int, np.ndarray], items: torch.Tensor, network: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """New (items, network) after aggregation round ``r`` of the nodes in ``users_of``."""
        import flwr.compat.common.recorddict_compat as compat
        from flwr.app import ConfigRecord
        from flwr.common import FitIns, ndarrays_to_parameters
        from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
        from flwr.server.workflow.constant import Key as WorkflowKey

        parameters = ndarrays_to_parameters([items.numpy(), network.numpy()])
        self.strategy.instructions = [
            (
                self.proxies[pid],
                FitIns(
                    parameters,
                    {
                        "round": r,
                        "users": np.asarray(users, np.int64).tobytes(),
                        "net-scale": self.net_scale,
                        "item-scale": self.item_scale,
                    },
                ),
            )
            for pid, users in users_of.items()
        ]
        self.strategy.result = None
        state = self.context.state
        state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: r + 1})
        state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
            parameters, keep_input=True
        )
        flower_log = logging.getLogger("flwr")
        level = flower_log.level
        flower_log.setLevel(logging.WARNING)  # four INFO lines per round otherwise
        try:
            self.workflow(self.grid, self.context)
        finally:
            flower_log.setLevel(level)
        if self.strategy.result is None:
            raise RuntimeError(f"SecAgg+ did not complete aggregation round {r}")
        mean, answered = self.strategy.result
        self.dropped += len(users_of) - answered  # their users are simply not in the sums
        sums = [np.asarray(part, np.float64) * answered for part in mean]
        return mf_fedavg_from_sums(
            sums, items=items, net_scale=self.net_scale, item_scale=self.item_scale
        )


class _RoundStrategy(Strategy):
    """The legacy strategy SecAgg+ needs: it returns the round's prepared instructions and keeps
    the unmasked mean (every node's FitRes carries the same aggregate)."""

    def __init__(self) -> None:
        self.instructions: list[tuple[Any, Any]] = []
        self.result: tuple[list[np.ndarray], int] | None = None

    def initialize_parameters(self, client_manager: Any) -> None:
        return None

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        return list(self.instructions)

    def aggregate_fit(self, server_round: int, results: list, failures: list) -> tuple:
        from flwr.common import parameters_to_ndarrays

        if failures:
            raise RuntimeError(f"SecAgg+ round {server_round} failed: {failures[0]}")
        if results:
            self.result = (parameters_to_ndarrays(results[0][1].parameters), len(results))
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        return []

    def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple:
        return None, {}

    def evaluate(self, server_round: int, parameters: Any) -> None:
        return None
