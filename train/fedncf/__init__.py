"""FedNCF training: federated GMF/MLP/NeuMF with simulated clients, and centralised NCF.

Federated protocol (``docs/fedncf.md`` §2): every user is a client holding its own interactions
and its own user embedding row, which never leaves it (simulated by a private per-user store). In
each *aggregation round* the server picks ``clients_per_round`` clients, sends them the global item
table(s) and network weights; each client rebuilds its local set (its training positives plus
``num_negatives`` fresh uniform negatives per positive, every local epoch), trains for
``local_epochs`` epochs, and uploads its touched item rows, network weights and n_k; the server
aggregates (:mod:`fedrec.federation.aggregators`).

**Units.** A *global round* is one pass over all clients: the users are permuted and split into
``ceil(U / clients_per_round)`` aggregation rounds of ``clients_per_round`` or one fewer clients,
so every user trains exactly once per global round. FedNCF's "400 epochs" are 400 global rounds
(≈ 19k aggregation rounds on ML-100K with 20 clients), not 400 aggregation rounds.

**Optimiser.** Adam (lr 1e-3) on the network weights and, lazily, on embedding rows
(``torch.optim.SparseAdam``, as for ``nn.Embedding(sparse=True)``): a row moves only on steps
whose batch contains it. The batch size (not given by FedNCF) defaults to 64 on clients and 256
(NCF's default) centrally. FedNCF does not say what a client's Adam state is. By default
(``client_optimizer="federated"``, :class:`FederatedOptimizerState`) the Adam state of the item
rows and network is federated like the weights: sent with them, continued by the clients and
aggregated by the server's rule, while a user row's state stays on its client; with one client per
round this is one Adam over all clients' batches. ``"persistent"`` lets each client keep its own
Adam state across its participations (:class:`ClientOptimizerStore`); ``"fresh"`` gives it a new
Adam every participation (the paper's literal reading).

**Simulations.** How a round's clients are trained (``FedNCFConfig.simulation``): "compiled"
(:mod:`.simulate_compiled`, one Numba kernel call per round, clients in parallel) is the default
where Numba installs, and "batched" (:mod:`.simulate_batched`, the clients in lockstep in stacked
NumPy arrays with hand-written gradients) the fallback: the default "auto" picks one when the
configuration is made and the configuration records which (:mod:`.config`). "reference"
(:mod:`.simulate_reference`) is the plain per-client ``torch.optim`` loop both are tested against.

**Modules**, each with one job; each imports only modules listed before it:

- :mod:`.sampling`: a round's local examples (:func:`sample_round`);
- :mod:`.optim_state`: the clients' Adam state between rounds (the three stores);
- :mod:`.simulate_compiled`: the compiled simulation (imports Numba only when it first runs);
- :mod:`.config`: what a run is; :mod:`.results`: what it produces;
- :mod:`.simulate_reference`, :mod:`.batched_plan` with :mod:`.simulate_batched`: the other two
  simulations;
- :mod:`.rounds`: one aggregation round in pieces (selection, local training, aggregation);
- :mod:`.evaluate`: HR@K / NDCG@K of a model;
- :mod:`.trainer`: :class:`FedNCFTrainer` and :func:`train_federated`;
- :mod:`.central`: the centralised upper bound (:func:`train_centralised`);
- :mod:`.flower_job`, :mod:`.flower` (not imported here: the apps need Flower): the same rounds
  as Flower apps, their job and the apps.

Every public name of these modules but :mod:`.flower` is importable from this package.

What it may import: the layers below ``train`` (envs, federation, agents, eval) and
``fedrec.train.core``; never ``fedrec.experiments`` or the command line (tests/test_layers.py).
"""

from __future__ import annotations

from fedrec.train.fedncf.central import train_centralised
from fedrec.train.fedncf.config import (
    CLIENT_OPTIMIZERS,
    SIMULATIONS,
    CentralConfig,
    FedNCFConfig,
    resolve_simulation,
)
from fedrec.train.fedncf.evaluate import (
    env_id_of,
    evaluate_candidates,
    evaluate_model,
    evaluate_point,
)
from fedrec.train.fedncf.optim_state import (
    BETA1,
    BETA2,
    EPS,
    FEDERATED_STATE,
    MOMENT_FRACTION_BITS,
    AdamStateStore,
    ClientOptimizerStore,
    FederatedOptimizerState,
)
from fedrec.train.fedncf.results import EvalPoint, TrainResult, select_by_validation
from fedrec.train.fedncf.rounds import (
    aggregate_round,
    round_extras,
    round_trainer,
    select_round,
    train_clients,
)
from fedrec.train.fedncf.sampling import ClientData, RoundSamples, round_rng, sample_round
from fedrec.train.fedncf.simulate_batched import train_round_batched
from fedrec.train.fedncf.simulate_compiled import (
    compile_kernel,
    numba_available,
    train_round_compiled,
)
from fedrec.train.fedncf.simulate_reference import train_round_reference
from fedrec.train.fedncf.trainer import (
    LENGTH_FIELDS,
    SETUP_KEYS,
    FedNCFTrainer,
    train_federated,
)

__all__ = [
    "BETA1",
    "BETA2",
    "CLIENT_OPTIMIZERS",
    "EPS",
    "FEDERATED_STATE",
    "LENGTH_FIELDS",
    "MOMENT_FRACTION_BITS",
    "SETUP_KEYS",
    "SIMULATIONS",
    "AdamStateStore",
    "CentralConfig",
    "ClientData",
    "ClientOptimizerStore",
    "EvalPoint",
    "FedNCFConfig",
    "FedNCFTrainer",
    "FederatedOptimizerState",
    "RoundSamples",
    "TrainResult",
    "aggregate_round",
    "compile_kernel",
    "env_id_of",
    "evaluate_candidates",
    "evaluate_model",
    "evaluate_point",
    "numba_available",
    "resolve_simulation",
    "round_extras",
    "round_rng",
    "round_trainer",
    "sample_round",
    "select_by_validation",
    "select_round",
    "train_centralised",
    "train_clients",
    "train_federated",
    "train_round_batched",
    "train_round_compiled",
    "train_round_reference",
]
