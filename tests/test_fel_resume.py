"""FEL's federated training on the training core: a run killed after a checkpoint and resumed is
the uninterrupted run bit for bit (leaves, log, final evaluation), and equals the in-memory run;
a checkpoint of another setup is refused; a finished run is extended by resuming with more
rounds, except when its target ε fixed the noise for its length."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from resume_helpers import die_after_checkpoint, final_eval_without_clock

from fedrec.envs.datasets.click_data import ClickData, click_data_from_taobao
from fedrec.envs.datasets.taobao_synthetic import write_taobao_groups
from fedrec.train.fel import (
    DPConfig,
    FedConfig,
    LeafConfig,
    cluster_clients,
    train_baseline,
    train_federated,
)

CONFIG = FedConfig(
    rounds=6,
    sample_rate=0.2,
    leaf=LeafConfig(hidden=4),
    dp=DPConfig(noise_multiplier=0.5, clip_norm=0.5),
    seed=2,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> ClickData:
    folder = tmp_path_factory.mktemp("fel-resume")
    return click_data_from_taobao(write_taobao_groups(folder, num_users=200, num_ads=60, seed=0))


@pytest.fixture(scope="module")
def assignment(data: ClickData) -> np.ndarray:
    return cluster_clients(
        data.public, data.public_names, "feature", features=("final_gender_code",)
    )


def _same_leaves(a, b) -> None:
    assert a.params.keys() == b.params.keys()
    for name in a.params:
        assert torch.equal(a.params[name], b.params[name]), name
    assert a.client_updates == b.client_updates
    assert a.loss_history == b.loss_history
    assert a.privacy == b.privacy


def test_kill_and_resume_is_bit_identical(data, assignment, tmp_path, monkeypatch) -> None:
    def run(out: Path, **kwargs):
        return train_federated(data, assignment, CONFIG, out_dir=out, checkpoint_every=2, **kwargs)

    whole = run(tmp_path / "whole")
    # the process is killed right after its second checkpoint (round 4 of 6)
    die_after_checkpoint(monkeypatch, lambda: run(tmp_path / "killed"), checkpoints=2)
    assert not (tmp_path / "killed" / "final_eval.json").exists()
    resumed = run(tmp_path / "killed", resume=True)
    _same_leaves(whole, resumed)
    _same_leaves(whole, train_federated(data, assignment, CONFIG))  # as without a run directory
    log = "rounds.csv"
    assert (tmp_path / "whole" / log).read_bytes() == (tmp_path / "killed" / log).read_bytes()
    assert len((tmp_path / "whole" / log).read_text().splitlines()) == 1 + CONFIG.rounds
    final = final_eval_without_clock(tmp_path / "whole")
    assert final == final_eval_without_clock(tmp_path / "killed")
    assert final["client_updates"] == whole.client_updates
    assert final["privacy"]["epsilon"] == whole.privacy.epsilon
    assert not list((tmp_path / "killed").glob(".*.tmp"))


def test_the_baseline_and_an_offset_resume_too(data, tmp_path, monkeypatch) -> None:
    offset = np.linspace(-1.0, 1.0, len(data.label)).astype(np.float32)
    config = FedConfig(rounds=4, sample_rate=0.2, seed=1)

    def run(out: Path | None, **kwargs):
        return train_baseline(
            data, config, offset=offset, out_dir=out, checkpoint_every=1, **kwargs
        )

    whole = run(None)
    die_after_checkpoint(monkeypatch, lambda: run(tmp_path / "killed"), checkpoints=3)
    _same_leaves(whole, run(tmp_path / "killed", resume=True))


def test_a_changed_setup_is_refused(data, assignment, tmp_path) -> None:
    out = tmp_path / "run"
    short = FedConfig(rounds=2, sample_rate=0.2, seed=2)
    train_federated(data, assignment, short, out_dir=out)
    with pytest.raises(ValueError, match=r"different setup.*seed: saved 2, now 3"):
        train_federated(data, assignment, FedConfig(rounds=2, sample_rate=0.2, seed=3), out_dir=out, resume=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"different setup.*assignment"):
        train_federated(data, np.zeros_like(assignment), short, out_dir=out, resume=True)
    other = tmp_path / "other"
    train_federated(data, assignment, FedConfig(rounds=2, sample_rate=0.3, seed=2), out_dir=other)
    (out / "checkpoint.pt").write_bytes((other / "checkpoint.pt").read_bytes())
    with pytest.raises(ValueError, match=r"belongs to another run.*sample_rate"):
        train_federated(data, assignment, short, out_dir=out, resume=True)


def test_a_finished_run_is_extended_by_resuming_with_more_rounds(data, assignment, tmp_path):
    fixed = FedConfig(rounds=3, sample_rate=0.2, dp=DPConfig(noise_multiplier=0.7), seed=4)
    longer = FedConfig(rounds=5, sample_rate=0.2, dp=DPConfig(noise_multiplier=0.7), seed=4)
    train_federated(data, assignment, fixed, out_dir=tmp_path / "run")
    extended = train_federated(data, assignment, longer, out_dir=tmp_path / "run", resume=True)
    _same_leaves(train_federated(data, assignment, longer), extended)
    assert json.loads((tmp_path / "run" / "final_eval.json").read_text())["rounds"] == 5
    # a target ε fixes the noise multiplier for the run's length: more rounds, other noise
    target = FedConfig(rounds=3, sample_rate=0.2, dp=DPConfig(target_epsilon=8.0), seed=4)
    train_federated(data, assignment, target, out_dir=tmp_path / "target")
    with pytest.raises(ValueError, match=r"different setup.*noise_multiplier"):
        train_federated(
            data,
            assignment,
            FedConfig(rounds=5, sample_rate=0.2, dp=DPConfig(target_epsilon=8.0), seed=4),
            out_dir=tmp_path / "target",
            resume=True,
        )
