"""FEL on Flower: with one node it is the in-process ``train_federated`` bit for bit; the round's
pieces (selection, a node's batched local training, combining nodes' uploads, the server step)
reproduce the in-process round; unsupported settings are refused before any process starts; and
a small loopback deployment with two nodes trains only the users each node hosts."""

from __future__ import annotations

import dataclasses
import json
import types

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from fedrec.envs.datasets.click_data import ClickData, click_data_from_taobao
from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups
from fedrec.train.fel import (
    DPConfig,
    FedConfig,
    LeafConfig,
    aggregate_leaves,
    client_schedules,
    flatten,
    init_params,
    noise_multiplier_of,
    select_clients,
    train_federated,
    train_rows_of,
)
from fedrec.train.fel.flower import (
    FELClustering,
    FELJob,
    Uploads,
    combine_uploads,
    local_round,
    node_of,
    run_deployment,
    run_simulation,
)

CLUSTERING = FELClustering("feature", features=("final_gender_code", "age_level"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("flower-fel")
    return str(write_taobao_groups(path, num_users=300, num_ads=100, ctr=0.1, seed=0))


@pytest.fixture(scope="module")
def data(folder: str) -> ClickData:
    return click_data_from_taobao(folder)


# One node is train_federated bit for bit (identical leaves): the "FEL on Flower" example of
# docs/fel.md asserts it, and tests/test_docs.py runs it (one Ray start, not two).


@pytest.mark.parametrize(
    "config",
    [
        FedConfig(rounds=1, sample_rate=0.2, seed=0),
        FedConfig(
            rounds=1, sample_rate=0.2, seed=0, dp=DPConfig(clip_norm=0.5, noise_multiplier=1)
        ),
        FedConfig(rounds=1, sample_rate=0.3, seed=2, local_epochs=2, leaf=LeafConfig(hidden=4)),
    ],
    ids=["fedavg", "dp-fedavg", "mlp-leaves"],
)
def test_two_nodes_round_is_the_in_process_round(data: ClickData, config: FedConfig) -> None:
    assignment = CLUSTERING.assign(data)
    k = int(assignment.max()) + 1
    reference = flatten(train_federated(data, assignment, config).params)
    # the server's side of round 0, then the in-process schedules of every chosen user
    rows = train_rows_of(data)
    rng = np.random.default_rng(config.seed)
    clients = select_clients(rng, assignment, np.array([len(r) > 0 for r in rows]), config)
    index, mask = client_schedules(data, clients, rows, config, rng)
    flat = flatten(init_params(data, config.leaf, k, config.seed))
    denominator = torch.as_tensor(config.sample_rate * np.bincount(assignment), dtype=torch.float32)

    def server_step(uploads: Uploads) -> torch.Tensor:
        return aggregate_leaves(
            flat,
            uploads.clients,
            uploads.num_samples,
            uploads.deltas,
            assignment,
            config,
            noise_multiplier=noise_multiplier_of(config),
            denominator=denominator,
            generator=torch.Generator().manual_seed(config.seed + 1),
        )

    def node(users: np.ndarray, take: np.ndarray) -> Uploads:
        needed, which = np.unique(assignment[users], return_inverse=True)  # its users' leaves
        steps = int(mask[take].any(axis=2).sum(1).max())
        return local_round(
            data,
            train_rows=rows,
            users=users,
            leaves=flat[torch.from_numpy(needed)].numpy(),
            which=which,
            index=index[take, :steps],
            mask=mask[take, :steps],
            config=config,
        )

    # one node training every chosen user: the in-process round, bit for bit
    assert torch.equal(server_step(node(clients, np.ones(len(clients), bool))), reference)
    # two nodes, each training only the users it hosts
    parts = [node(clients[node_of(clients, 2) == p], node_of(clients, 2) == p) for p in (0, 1)]
    assert all(np.all(node_of(part.clients, 2) == p) for p, part in enumerate(parts))
    combined = combine_uploads(parts)
    assert combined.clients.tolist() == clients.tolist()  # back in the in-process order
    swapped = combine_uploads(parts[::-1])
    assert torch.equal(swapped.deltas, combined.deltas) and swapped.first_loss == pytest.approx(
        combined.first_loss, abs=1e-12
    )
    # smaller batches of the same clients round differently in float32, nothing more
    torch.testing.assert_close(server_step(combined), reference, rtol=0, atol=1e-6)


def test_the_job_round_trips_through_json() -> None:
    dp = DPConfig(clip_norm=0.5, target_epsilon=2.0, delta=1e-6)
    config = FedConfig(leaf=LeafConfig(hidden=16), rounds=7, sample_rate=0.1 / 3, dp=dp, seed=4)
    job = FELJob(
        data="taobao-synthetic",
        data_dir="/tmp/x",
        clustering=FELClustering("kmeans", num_clusters=6, features=("age_level",), seed=2),
        config=config,
        num_nodes=3,
        result_path="/tmp/result.json",
        baseline=True,
        opt_in_fraction=0.25,
    )
    assert FELJob.from_dict(json.loads(job.to_json())) == job
    plain = dataclasses.replace(job, config=FedConfig(), clustering=CLUSTERING)
    assert FELJob.from_dict(json.loads(plain.to_json())) == plain


def test_unsupported_settings_are_refused(folder: str) -> None:
    refused = {
        "num_nodes": dict(num_nodes=0),
        "data must be one of": dict(data="criteo"),
        "needs data_dir": dict(data="taobao", data_dir=None),
        "clustering method": dict(clustering=FELClustering("spectral")),
        "needs num_clusters": dict(clustering=FELClustering("random")),
        "sample_rate": dict(config=FedConfig(sample_rate=0.0)),
        "local_epochs": dict(config=FedConfig(local_epochs=0)),
        "exactly one of": dict(config=FedConfig(dp=DPConfig())),
        "opt_in_fraction": dict(opt_in_fraction=2.0),
    }
    for match, settings in refused.items():
        for runner in (run_simulation, run_deployment):
            with pytest.raises(ValueError, match=match):
                runner(**({"data": "taobao-synthetic", "data_dir": folder} | settings))
    with pytest.raises(ValueError, match="'zodiac'] are not public features"):  # in the data
        run_simulation(data_dir=folder, clustering=FELClustering("feature", features=("zodiac",)))


def test_the_deployed_apps_read_their_job_from_the_run_configuration() -> None:
    """`flwr run` imports the module-level apps; they read the job `run_deployment` wrote into
    the run configuration (the loopback deployment itself is tested with FedNCF's apps, which
    share the launcher: tests/test_flower_fedncf.py)."""
    from fedrec.federation.flower_common import JOB_KEY
    from fedrec.train.fel import flower as flower_fel

    job = FELJob(
        data="taobao-synthetic",
        data_dir="/tmp/x",
        clustering=CLUSTERING,
        config=FedConfig(rounds=3, seed=2),
        num_nodes=2,
        result_path="/tmp/result.json",
    )
    context = types.SimpleNamespace(run_config={JOB_KEY: job.to_json()})
    assert FELJob.of(context) == job
    assert callable(flower_fel.server_app) and callable(flower_fel.client_app)
    with pytest.raises(ValueError, match="fedrec flower"):
        FELJob.of(types.SimpleNamespace(run_config={}))
