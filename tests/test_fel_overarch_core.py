"""FEL's federated over-arch on the training core: in memory it gives what the loop before the
core gave, bit for bit; a run stopped midway and resumed is the uninterrupted run bit for bit; a
changed setup is refused, naming what changed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from resume_helpers import die_after_checkpoint, final_eval_without_clock

from fedrec.envs.datasets.click_data import ClickData, click_data_from_taobao
from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups
from fedrec.train.fel import DPConfig, FedConfig, LeafConfig, train_federated
from fedrec.train.fel.clusters import cluster_clients
from fedrec.train.fel.overarch import FederatedOverArch, train_over_arch_federated

LEAVES = FedConfig(
    rounds=6, sample_rate=0.2, seed=0, fill_empty_clusters=False, leaf=LeafConfig(hidden=4)
)
PLAIN = dataclasses.replace(LEAVES, client_lr=5.0, local_epochs=3)
DP = dataclasses.replace(PLAIN, dp=DPConfig(clip_norm=0.5, noise_multiplier=1.0, delta=1e-5))
ROUNDS = 20


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: with two, the leaves' training is not bit-reproducible (at HEAD too),
    and the numbers below were computed with one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, one_thread) -> tuple[ClickData, dict, object]:
    folder = tmp_path_factory.mktemp("fel-overarch")
    data = click_data_from_taobao(
        write_taobao_groups(folder, num_users=200, num_ads=60, ctr=0.1, seed=0)
    )
    clusters = cluster_clients(
        data.public, data.public_names, "feature", features=("final_gender_code", "age_level")
    )
    return data, train_federated(data, clusters, LEAVES).params, clusters


def _digest(result: FederatedOverArch) -> str:
    h = hashlib.sha256()
    for name, value in result.arch.named_parameters():
        h.update(name.encode())
        h.update(value.detach().numpy().tobytes())
    return h.hexdigest()


def _same(a: FederatedOverArch, b: FederatedOverArch) -> None:
    for (name, x), (_, y) in zip(a.arch.named_parameters(), b.arch.named_parameters(), strict=True):
        assert torch.equal(x, y), name
    assert a.client_updates == b.client_updates
    assert a.loss_history == b.loss_history
    assert a.noise_multiplier == b.noise_multiplier and a.mechanism == b.mechanism


# Computed (one torch thread) with train_over_arch_federated as it was before it moved onto the
# training core (its own ``for`` loop over the rounds): the sha-256 of the over-arch's parameters (name, then bytes,
# in named_parameters order), the client updates, the first two and last loss, linear.bias.
BEFORE = {
    "plain": (
        "4bcab4f750ce522ffeafd9ef8f87274149e5274e6c3e2cb9bcdaa7a2e6c5a5dc",
        824,
        [0.6594528675079345, 0.2796416411528716],
        0.34418805440266925,
        -0.8407725095748901,
    ),
    "dp": (
        "79a67d4c492bf35bec5c77cbaadc61cb41dae3aa250499b0945e2656e126b3b2",
        824,
        [0.6594528675079345, 0.5317205480627112],
        0.3855373291742234,
        -0.9628440141677856,
    ),
}


@pytest.mark.parametrize("which", ["plain", "dp"])
def test_in_memory_equals_the_loop_before_the_core(setup, which) -> None:
    data, leaves, clusters = setup
    calls: list[int] = []
    config = {"plain": PLAIN, "dp": DP}[which]
    result = train_over_arch_federated(
        data, leaves, clusters, config, rounds=ROUNDS, progress=calls.append
    )
    digest, updates, first, last, bias = BEFORE[which]
    assert result.client_updates == updates
    assert result.loss_history[:2] == first and result.loss_history[-1] == last
    assert result.arch.linear.bias.item() == bias
    assert _digest(result) == digest
    assert calls == [1] * ROUNDS


def test_stopped_midway_and_resumed_is_bit_identical(setup, tmp_path, monkeypatch) -> None:
    data, leaves, clusters = setup

    def run(out: Path, **kwargs) -> FederatedOverArch:
        return train_over_arch_federated(
            data, leaves, clusters, DP, rounds=ROUNDS, out_dir=out, checkpoint_every=5, **kwargs
        )

    whole = run(tmp_path / "whole")
    assert {"config.json", "rounds.csv", "checkpoint.pt", "final_eval.json"} <= {
        p.name for p in (tmp_path / "whole").iterdir()
    }
    assert json.loads((tmp_path / "whole" / "config.json").read_text())["rounds"] == ROUNDS
    # the process is killed right after its second checkpoint: round 10 of 20
    die_after_checkpoint(monkeypatch, lambda: run(tmp_path / "killed"), checkpoints=2)
    assert not (tmp_path / "killed" / "final_eval.json").exists()
    assert len((tmp_path / "killed" / "rounds.csv").read_text().splitlines()) == 1 + 10
    resumed = run(tmp_path / "killed", resume=True)
    _same(whole, resumed)
    assert _digest(whole) == BEFORE["dp"][0]  # as in memory, and before the core
    log = "rounds.csv"
    assert (tmp_path / "whole" / log).read_bytes() == (tmp_path / "killed" / log).read_bytes()
    final = final_eval_without_clock(tmp_path / "whole")
    assert final == final_eval_without_clock(tmp_path / "killed")
    assert final["client_updates"] == whole.client_updates
    assert final["mechanism"]["steps"] == ROUNDS


def test_a_changed_setup_is_refused(setup, tmp_path) -> None:
    data, leaves, clusters = setup
    out = tmp_path / "run"
    train_over_arch_federated(data, leaves, clusters, PLAIN, rounds=2, out_dir=out)
    with pytest.raises(ValueError, match=r"different setup.*seed: saved 0, now 1"):
        train_over_arch_federated(
            data, leaves, clusters, dataclasses.replace(PLAIN, seed=1), rounds=2, out_dir=out,
            resume=True,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"different setup.*hidden: saved 16, now 8"):
        train_over_arch_federated(
            data, leaves, clusters, PLAIN, rounds=2, hidden=8, out_dir=out, resume=True
        )
    other = {name: value + 1.0 for name, value in leaves.items()}
    with pytest.raises(ValueError, match=r"different setup.*leaves"):
        train_over_arch_federated(data, other, clusters, PLAIN, rounds=2, out_dir=out, resume=True)
