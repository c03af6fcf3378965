"""The one training core under all three loops: exact resume after a kill, safe checkpoints that are
refused when crafted or foreign, TensorBoard and a progress bar that does not flood log files."""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from resume_helpers import die_after_checkpoint, final_eval_without_clock

import fedrec.train.core as core
from fedrec.agents.ncf import NCFConfig
from fedrec.agents.slateq import SlateQAgent, SlateQConfig
from fedrec.envs.datasets.synthetic import synthetic_log, write_ml100k
from fedrec.train.checkpoint import load_checkpoint, save_checkpoint
from fedrec.train.fedncf import FedNCFConfig, train_federated
from fedrec.train.loop import TrainConfig, train
from fedrec.train.multi_platform import MultiPlatformTrainConfig, train_multi_platform

SMALL = {"num_candidates": 10, "slate_size": 3}
TINY_SLATEQ = SlateQConfig(hidden_sizes=(16,), learning_starts=300, epsilon_decay=1000)
TINY_FEDSLATE = {
    "learning_starts": 300,
    "batch_size": 8,
    "local_hidden": (16,),
    "global_hidden": (16,),
}


@pytest.fixture(scope="module")
def ml100k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("core-ml100k")
    write_ml100k(root / "ml-100k", synthetic_log(num_users=50, num_items=300, seed=1))
    return root


def _slate(out: Path | None, *, seed: int = 3, resume: bool = False, progress: bool = False):
    return train(
        lambda env: SlateQAgent.from_env(env, config=TINY_SLATEQ, seed=seed),
        config=TrainConfig(
            env_id="fedrec/ChocKaleSlate-v0", episodes=12, num_envs=4, seed=seed,
            env_kwargs=SMALL, eval_episodes=4, references=False, checkpoint_every=4,
            progress=progress,
        ),
        out_dir=out, resume=resume, run_info={"agent": "slateq"},
    )  # fmt: skip


def _multi(out: Path | None, *, seed: int = 3, resume: bool = False, progress: bool = False):
    return train_multi_platform(
        MultiPlatformTrainConfig(
            method="fedslate", episodes=12, num_users=4, seed=seed, env_kwargs=SMALL,
            agent_kwargs=TINY_FEDSLATE, checkpoint_every=4, eval_episodes=4, planner=False,
            progress=progress,
        ),
        out_dir=out, resume=resume,
    )  # fmt: skip


def _fedncf(data_dir: Path):
    def run(out: Path | None, *, seed: int = 3, resume: bool = False, progress: bool = False):
        config = FedNCFConfig(
            model=NCFConfig(model="neumf"), global_rounds=4, clients_per_round=10, eval_every=1,
            client_optimizer="federated", seed=seed,
        )  # fmt: skip
        return train_federated(
            dataset="ml-100k", data_dir=data_dir, config=config, out_dir=out, resume=resume,
            checkpoint_every=1, progress=progress,
        )  # fmt: skip

    return run


LOG = {"slate": "episodes.csv", "multi": "episodes.csv", "fedncf": "eval.csv"}


def _runner(kind: str, ml100k: Path) -> Callable[..., object]:
    return {"slate": _slate, "multi": _multi, "fedncf": _fedncf(ml100k)}[kind]


@pytest.mark.parametrize("kind", ["slate", "multi", "fedncf"])
def test_kill_and_resume_is_byte_identical_for_every_loop(kind, ml100k, tmp_path, monkeypatch):
    run = _runner(kind, ml100k)
    run(tmp_path / "whole")
    # the process is killed right after its second checkpoint
    die_after_checkpoint(monkeypatch, lambda: run(tmp_path / "killed"), checkpoints=2)
    assert not (tmp_path / "killed" / "final_eval.json").exists()  # it died mid-run
    run(tmp_path / "killed", resume=True)
    log = LOG[kind]
    assert (tmp_path / "whole" / log).read_bytes() == (tmp_path / "killed" / log).read_bytes()
    assert final_eval_without_clock(tmp_path / "whole") == final_eval_without_clock(
        tmp_path / "killed"
    )
    assert not list((tmp_path / "killed").glob(".*.tmp"))  # atomic writes leave no temporaries


@pytest.mark.parametrize("kind", ["slate", "multi", "fedncf"])
def test_a_checkpoint_from_another_seed_is_refused(kind, ml100k, tmp_path):
    run = _runner(kind, ml100k)
    run(tmp_path / "seed3", seed=3)
    run(tmp_path / "seed4", seed=4)
    shutil.copy(tmp_path / "seed4" / "checkpoint.pt", tmp_path / "seed3" / "checkpoint.pt")
    before = (tmp_path / "seed3" / LOG[kind]).read_bytes()
    with pytest.raises(ValueError, match=r"belongs to another run.*seed: saved 4, now 3"):
        run(tmp_path / "seed3", seed=3, resume=True)
    assert (tmp_path / "seed3" / LOG[kind]).read_bytes() == before  # nothing was changed


def test_resume_with_a_changed_setup_names_the_difference(tmp_path):
    _multi(tmp_path / "run")
    with pytest.raises(ValueError, match=r"different setup.*seed: saved 3, now 5"):
        _multi(tmp_path / "run", seed=5, resume=True)


class _Payload:
    """Unpickling this creates a file: what a crafted checkpoint would do."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def test_a_crafted_checkpoint_is_refused_and_runs_nothing(tmp_path):
    _slate(tmp_path / "run")
    marker = tmp_path / "pwned"
    assert not marker.exists()
    pickle.loads(pickle.dumps(_Payload(marker)))  # the payload works when unpickled ...
    assert marker.exists()
    marker.unlink()
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    torch.save({"format": 2, "loop": _Payload(marker)}, checkpoint)
    with pytest.raises(ValueError, match="not plain data"):
        _slate(tmp_path / "run", resume=True)
    assert not marker.exists()  # ... but loading the checkpoint never unpickled it


def test_checkpoints_hold_plain_data_only(tmp_path):
    _multi(tmp_path / "multi")
    with zipfile.ZipFile(tmp_path / "multi" / "checkpoint.pt") as archive:
        names = archive.namelist()
        data = archive.read(next(n for n in names if n.endswith("data.pkl")))
    imported = {arg.split(" ")[0] for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}
    assert imported <= {"torch._utils", "torch", "collections"}  # no pickled env, agent or numpy
    state = torch.load(tmp_path / "multi" / "checkpoint.pt", weights_only=True)
    assert state["setup"]["seed"] == 3 and len(state["setup_hash"]) == 64
    with pytest.raises(TypeError, match=r"checkpoint\.agent: a object cannot"):
        save_checkpoint(tmp_path / "x.pt", {"agent": object()})
    assert load_checkpoint(tmp_path / "multi" / "checkpoint.pt")["rows"] == 12


@pytest.mark.parametrize("kind", ["slate", "multi", "fedncf"])
def test_every_loop_logs_to_tensorboard(kind, ml100k, tmp_path, monkeypatch):
    logged: list[tuple[str, float, float]] = []

    class FakeWriter:  # stands in for torch.utils.tensorboard.SummaryWriter
        def add_scalar(self, tag, value, step):
            logged.append((tag, float(value), step))

        def close(self):
            logged.append(("closed", 0.0, 0))

    monkeypatch.setattr(core, "tensorboard_writer", lambda out: FakeWriter())
    _runner(kind, ml100k)(tmp_path / "tb")
    tags = {tag for tag, _, _ in logged}
    expected = {
        "slate": "episode/return",
        "multi": "episode/return/platform_b",
        "fedncf": "eval/hit_rate",
    }
    assert expected[kind] in tags and logged[-1][0] == "closed"


@pytest.mark.parametrize("kind", ["slate", "multi", "fedncf"])
def test_progress_bar_does_not_flood_a_log_file(kind, ml100k, tmp_path, monkeypatch):
    stream = io.StringIO()  # not a terminal, like a redirected log file
    monkeypatch.setattr("sys.stderr", stream)
    _runner(kind, ml100k)(tmp_path / "bar", progress=True)
    text = stream.getvalue()
    assert text  # the bar was shown ...
    assert text.count("\r") <= 3  # ... but not redrawn step by step


def test_a_checkpoint_written_before_a_hyperparameter_existed_is_accepted(tmp_path):
    """A run saved by a fedrec without SlateQ's memory_decay resumes (the option at its default):
    the checkpoint's setup record is checked against its own hash, then compared with defaults."""
    from fedrec.train.checkpoint import setup_hash

    _slate(tmp_path / "old")
    checkpoint = tmp_path / "old" / "checkpoint.pt"
    state = load_checkpoint(checkpoint)
    del state["setup"]["agent_config"]["memory_decay"]  # as an older fedrec wrote it
    state["setup_hash"] = setup_hash(state["setup"])
    save_checkpoint(checkpoint, {k: v for k, v in state.items() if k != "format"})
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["agent_config"]["memory_decay"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    log = (tmp_path / "old" / "episodes.csv").read_bytes()
    _slate(tmp_path / "old", resume=True)  # accepted: nothing to add, the log is unchanged
    assert (tmp_path / "old" / "episodes.csv").read_bytes() == log
    state["setup_hash"] = "0" * 64  # a record that does not match its hash is refused
    save_checkpoint(checkpoint, {k: v for k, v in state.items() if k != "format"})
    with pytest.raises(ValueError, match="no valid setup record"):
        _slate(tmp_path / "old", resume=True)
