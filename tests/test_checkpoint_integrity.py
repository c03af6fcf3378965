"""Checkpoints are checked on load (issue 29): a flipped bit anywhere, a NaN tensor and an orphan
temporary file of a killed write are never taken silently."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrec.train import checkpoint as ckpt
from fedrec.train.checkpoint import (
    atomic_write,
    clean_orphans,
    load_checkpoint,
    save_checkpoint,
    write_json,
)


def _state() -> dict:
    return {
        "weights": torch.linspace(-1.0, 1.0, 257, dtype=torch.float32),
        "counts": torch.arange(10, dtype=torch.int64),
        "table": np.arange(12, dtype=np.float64).reshape(3, 4) / 7.0,
        "flags": np.array([True, False]),
        "nested": {"lr": 0.5, "name": "run", "steps": [1, 2, 3], "pair": (4, "x")},
    }


def _assert_equal(loaded: dict, state: dict) -> None:
    assert torch.equal(loaded["weights"], state["weights"])
    assert loaded["weights"].dtype == torch.float32
    assert torch.equal(loaded["counts"], state["counts"])
    assert loaded["table"].dtype == np.float64
    np.testing.assert_array_equal(loaded["table"], state["table"])
    np.testing.assert_array_equal(loaded["flags"], state["flags"])
    assert loaded["nested"] == state["nested"]


def test_round_trip_is_exact_and_the_file_stays_a_torch_zip(tmp_path):
    state = _state()
    path = save_checkpoint(tmp_path / "checkpoint.pt", state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checksummed checkpoint loads without a warning
        loaded = load_checkpoint(path)
    _assert_equal(loaded, state)
    assert loaded["format"] == ckpt.CHECKPOINT_FORMAT
    with zipfile.ZipFile(path) as archive:  # still a valid zip, CRCs intact
        assert archive.testzip() is None
        assert archive.comment.startswith(b"fedrec-sha256:") and len(archive.comment) == 78
    assert torch.equal(torch.load(path, weights_only=True)["weights"], state["weights"])


def _offsets(size: int) -> list[int]:
    """Offsets spread over the whole file: the head, tensor records, the central directory, the
    end-of-central-directory record and the checksum itself."""
    return sorted({0, 1, 31, 64, size // 5, size // 3, size // 2, (2 * size) // 3, size - 120,
                   size - 90, size - 79, size - 78, size - 70, size - 2, size - 1})  # fmt: skip


def test_a_flipped_bit_anywhere_is_refused_naming_the_file(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoint.pt", _state())
    good = path.read_bytes()
    for offset in _offsets(len(good)):
        for bit in (0, 5):
            bad = bytearray(good)
            bad[offset] ^= 1 << bit
            path.write_bytes(bytes(bad))
            with pytest.raises(ValueError, match=r"checkpoint .*checkpoint\.pt is corrupt"):
                load_checkpoint(path)
    path.write_bytes(good)
    _assert_equal(load_checkpoint(path), _state())


def test_a_flipped_bit_inside_a_tensor_record_is_refused(tmp_path):
    """The case of the issue: torch.load alone reads the altered value without a word."""
    weights = torch.full((4096,), 0.25)
    path = save_checkpoint(tmp_path / "checkpoint.pt", {"weights": weights})
    data = bytearray(path.read_bytes())
    record = bytes(data).index(weights.numpy().tobytes()[:64])  # the tensor's bytes in the zip
    data[record + 1001] ^= 0x10
    path.write_bytes(bytes(data))
    silently = torch.load(path, weights_only=True)["weights"]  # what happened before
    assert not torch.equal(silently, weights)
    with pytest.raises(ValueError, match="is corrupt: its SHA-256 does not match"):
        load_checkpoint(path)


def test_a_truncated_file_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoint.pt", _state())
    data = path.read_bytes()
    for keep in (0, 10, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:keep])
        with pytest.raises(ValueError, match=r"checkpoint .*checkpoint\.pt is corrupt"):
            load_checkpoint(path)


def test_an_old_checkpoint_without_checksum_loads_with_a_warning(tmp_path):
    path = tmp_path / "checkpoint.pt"
    state = _state()
    torch.save(ckpt.to_plain({"format": ckpt.CHECKPOINT_FORMAT, **state}), path)  # the old way
    with pytest.warns(UserWarning, match=r"checkpoint .*checkpoint.pt has no checksum"):
        loaded = load_checkpoint(path)
    _assert_equal(loaded, state)


@pytest.mark.parametrize(
    "bad",
    [
        {"weights": torch.tensor([0.0, float("nan")])},
        {"agent": {"items": torch.tensor([[1.0], [float("inf")]], dtype=torch.float64)}},
        {"agent": {"moments": np.array([0.0, -np.inf], dtype=np.float32)}},
        {"agents": [{"ok": torch.zeros(2)}, {"w": torch.tensor([float("nan")], dtype=torch.half)}]},
    ],
)
def test_a_non_finite_tensor_is_refused(tmp_path, bad):
    path = save_checkpoint(tmp_path / "checkpoint.pt", bad)
    with pytest.raises(ValueError, match=r"checkpoint .*checkpoint.pt: checkpoint\.\S+ holds NaN"):
        load_checkpoint(path)


def test_the_refusal_names_where_the_nan_is(tmp_path):
    state = {"agent": {"user_store": torch.zeros(3), "items": torch.tensor([1.0, float("nan")])}}
    path = save_checkpoint(tmp_path / "checkpoint.pt", state)
    with pytest.raises(ValueError, match=r"checkpoint\.agent\.items holds NaN or inf"):
        load_checkpoint(path)


def test_integer_tensors_and_nan_marker_arrays_pass(tmp_path):
    readings = np.full((2, 3), np.nan)
    readings[0, 2] = 0.5
    state = {
        "counts": torch.tensor([0, -(2**62)], dtype=torch.int64),
        "mask": torch.tensor([True]),
        "agent": {"readings": readings, "mean": np.zeros(3)},
        "best": float("-inf"),  # plain numbers are not tensors: not checked
    }
    loaded = load_checkpoint(save_checkpoint(tmp_path / "checkpoint.pt", state))
    np.testing.assert_array_equal(loaded["agent"]["readings"], readings)
    assert loaded["best"] == float("-inf")
    with pytest.raises(ValueError, match=r"checkpoint\.agent\.readings holds NaN"):
        load_checkpoint(tmp_path / "checkpoint.pt", nan_markers=())


def _orphan(directory: Path, name: str, content: bytes = b"half a checkpoint") -> Path:
    """The temporary file a process killed inside atomic_write leaves behind."""
    orphan = directory / f".{name}.k1ll3d_x.tmp"
    orphan.write_bytes(content)
    return orphan


def test_a_killed_write_leaves_an_orphan_that_the_next_save_removes(tmp_path):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"x": torch.ones(2)})
    killed = subprocess.run(  # a process SIGKILLed in the middle of writing the checkpoint
        [
            sys.executable,
            "-c",
            "import os, signal, sys\n"
            "from fedrec.train.checkpoint import atomic_write\n"
            "def write(file):\n"
            "    file.write(b'half a checkpoint'); file.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "atomic_write(sys.argv[1], write)\n",
            str(path),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert killed.returncode == -signal.SIGKILL
    orphans = list(tmp_path.glob(".checkpoint.pt.*.tmp"))
    assert len(orphans) == 1 and orphans[0].read_bytes() == b"half a checkpoint"
    assert torch.equal(load_checkpoint(path)["x"], torch.ones(2))  # the old file is intact
    save_checkpoint(path, {"x": torch.zeros(2)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
    assert torch.equal(load_checkpoint(path)["x"], torch.zeros(2))


def test_only_orphans_of_the_pattern_are_removed(tmp_path):
    keep = [
        tmp_path / "checkpoint.pt.bak",
        tmp_path / ".checkpoint.pt.tmp",  # no random part
        tmp_path / ".checkpoint.pt.abc.tmp",  # not 8 characters
        tmp_path / ".checkpoint.pt.ABCDEFGH.tmp",  # not mkstemp's alphabet
        tmp_path / "notes.txt",
        tmp_path / ".other.json.abcdefgh.tmp",  # another target's
    ]
    for path in keep:
        path.write_bytes(b"keep me")
    orphan = _orphan(tmp_path, "checkpoint.pt")
    save_checkpoint(tmp_path / "checkpoint.pt", {"x": 1})
    assert not orphan.exists()
    assert all(path.read_bytes() == b"keep me" for path in keep)
    removed = clean_orphans(tmp_path)  # every target's orphans
    assert removed == [tmp_path / ".other.json.abcdefgh.tmp"]


def test_a_write_in_progress_is_not_an_orphan(tmp_path):
    """A live writer's temporary file (locked) survives a concurrent clean; so does a fresh
    empty one (a writer between mkstemp and its lock); an old empty one is removed."""
    seen = []

    def write(file):
        tmp = next(tmp_path.glob(".config.json.*.tmp"))
        assert clean_orphans(tmp_path, "config.json") == []  # locked by this writer
        seen.append(tmp)
        file.write(b"{}\n")

    atomic_write(tmp_path / "config.json", write)
    assert seen and not seen[0].exists()  # renamed onto the target
    fresh = _orphan(tmp_path, "config.json", b"")
    assert clean_orphans(tmp_path, "config.json") == []
    old = time.time() - 3600
    os.utime(fresh, (old, old))
    assert clean_orphans(tmp_path, "config.json") == [fresh]


def test_write_json_removes_its_orphans_too(tmp_path):
    orphan = _orphan(tmp_path, "config.json")
    write_json(tmp_path / "config.json", {"a": 1})
    assert not orphan.exists() and (tmp_path / "config.json").read_text() == '{\n  "a": 1\n}\n'


def test_clean_orphans_of_a_missing_directory_is_a_no_op(tmp_path):
    assert clean_orphans(tmp_path / "nowhere") == []


def test_the_checksum_covers_what_torch_save_wrote(tmp_path):
    """The bytes before the comment are torch.save's own, except the comment's length."""
    state = {"w": torch.arange(6.0)}
    path = save_checkpoint(tmp_path / "checkpoint.pt", state)
    buffer = io.BytesIO()
    torch.save(ckpt.to_plain({"format": ckpt.CHECKPOINT_FORMAT, **state}), buffer)
    raw, data = buffer.getvalue(), path.read_bytes()
    assert data[: len(raw) - 2] == raw[:-2] and len(data) == len(raw) + 78


def _fedncf_run(data_dir: Path, out: Path, *, resume: bool = False, rounds: int = 2):
    from fedrec.agents.ncf import NCFConfig
    from fedrec.train.fedncf import FedNCFConfig, train_federated

    config = FedNCFConfig(
        model=NCFConfig(model="neumf"), global_rounds=rounds, clients_per_round=10, eval_every=1,
        client_optimizer="federated", seed=3,
    )  # fmt: skip
    return train_federated(
        dataset="ml-100k", data_dir=data_dir, config=config, out_dir=out, resume=resume,
        checkpoint_every=1, progress=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def ml100k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fedrec.envs.datasets.synthetic import synthetic_log, write_ml100k

    root = tmp_path_factory.mktemp("integrity-ml100k")
    write_ml100k(root / "ml-100k", synthetic_log(num_users=50, num_items=300, seed=1))
    return root


def test_a_fedncf_run_refuses_to_resume_from_nan_or_a_flipped_bit(ml100k, tmp_path):
    """The FedNCF trainer resumes through load_checkpoint (train/core.py), so both checks hold
    for it: a checkpoint with a NaN item table, and one with a flipped bit, are refused."""
    out = tmp_path / "run"
    _fedncf_run(ml100k, out)
    path = out / "checkpoint.pt"
    good = path.read_bytes()
    state = load_checkpoint(path)
    state["agent"]["items"][0, 0] = float("nan")
    save_checkpoint(path, {k: v for k, v in state.items() if k != "format"})
    with pytest.raises(ValueError, match=r"checkpoint\.agent\.items holds NaN or inf"):
        _fedncf_run(ml100k, out, resume=True, rounds=3)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x04
    path.write_bytes(bytes(bad))
    with pytest.raises(ValueError, match=r"checkpoint\.pt is corrupt"):
        _fedncf_run(ml100k, out, resume=True, rounds=3)
    path.write_bytes(good)
    _fedncf_run(ml100k, out, resume=True, rounds=3)  # the intact file resumes
