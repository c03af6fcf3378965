"""The one training core every fedrec loop is built on (Tianshou's trainer is the model).

:class:`Trainer` owns what all loops share -- the run directory, ``config.json`` and the refusal to
resume a changed setup (naming the differences), safe atomic checkpoints and exact resume, the CSV
log (truncated to the checkpoint on resume), TensorBoard scalars, the progress bar and the final
evaluation -- and a loop implements only what is its own:

* :meth:`Trainer.start` -- reset the env (a fresh run);
* :meth:`Trainer.step` -- one unit of work (an env step, a batch of episodes, an aggregation
  round), returning the log rows it finished and training metrics;
* :meth:`Trainer.finished`, :meth:`Trainer.progress` -- when to stop, and how far it is;
* :meth:`Trainer.loop_state` / :meth:`Trainer.load_loop_state` -- the loop's own counters, as
  data; the agent's and the env's states (``self.agent``, ``self.env``) are taken through their
  ``state_dict()`` methods;
* :meth:`Trainer.evaluate` -- the final evaluation written to ``final_eval.json``.

**Stopping.** SIGINT (Ctrl-C) and SIGTERM stop a run at the next step boundary: the core writes a
checkpoint there (where the loop checkpoints) and raises :class:`Interrupted`, so ``--resume``
continues exactly. A second signal while the step finishes stops at once, without a checkpoint
(the previous one is kept).

Before it trains, :meth:`Trainer.run` refuses what would only fail later: a run directory that is
a file or lies under one, a run file (``checkpoint.pt``, ...) that is a directory, a directory it
cannot write, and an env that cannot save its state as data (:meth:`Trainer.checkpoint_problem`;
such a run trains only with ``checkpoint_every=0``, then without any checkpoint, and cannot be
resumed). Each is a ``ValueError`` naming the path or the env.

The three loops are :class:`fedrec.train.loop.SlateTrainer` (any single-platform agent),
:class:`fedrec.train.multi_platform.MultiPlatformTrainer` (any multi-platform agent) and
:class:`fedrec.train.fedncf.FedNCFTrainer` (federated supervised training).
"""

from __future__ import annotations

import abc
import contextlib
import csv
import dataclasses
import io
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedrec.envs.state import env_state, load_env_state
from fedrec.train.checkpoint import (
    clean_orphans,
    load_checkpoint,
    save_checkpoint,
    setup_differences,
    setup_hash,
    write_json,
    write_text,
)
from fedrec.util import json_ready

Row = Sequence[Any]
#: What defines an agent's run on an env: resuming with any of these changed is refused.
AGENT_SETUP_KEYS = ("agent", "env_id", "seed", "num_envs", "env_kwargs", "agent_config")


@contextlib.contextmanager
def env_kwargs_errors(env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
    """Turn the ``TypeError`` of an env built with a keyword it does not take (or a value of the
    wrong type) into a ``ValueError`` naming the env and the kwargs; without kwargs it is a bug
    and propagates."""
    try:
        yield
    except TypeError as error:
        if not env_kwargs:
            raise
        raise ValueError(
            f"cannot build {env_id!r} with env kwargs {dict(env_kwargs)}: {error}"
        ) from error


def config_dict(config: Any) -> dict[str, Any]:
    """A dataclass config as a dict (anything else: empty)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return {}


def default_config_dict(config_cls: Any) -> dict[str, Any]:
    """The defaults of a Config dataclass (empty when it has required fields)."""
    try:
        return json_ready(config_dict(config_cls()))
    except TypeError:
        return {}


@dataclasses.dataclass
class RunRecord:
    """What :meth:`Trainer.run` produced."""

    rows: list[list[Any]]
    wall_time: float
    final_eval: dict[str, Any] | None


class CsvLog:
    """A run's CSV log: rewritten atomically up to the checkpoint on resume, then appended."""

    def __init__(self, path: Path | None, header: Sequence[str]) -> None:
        self.path, self.header = path, list(header)
        self.rows: list[list[Any]] = []
        self._file: io.TextIOWrapper | None = None
        self._writer: Any = None

    def read(self, parse: Any) -> list[list[Any]]:
        """The rows on disk, each parsed with ``parse(row)``; a wrong header is an error."""
        assert self.path is not None
        with self.path.open(newline="") as file:
            reader = csv.reader(file)
            header = next(reader, None)
            if header != self.header:
                raise ValueError(
                    f"{self.path}: expected header {','.join(self.header)}, got {header}"
                )
            rows = []
            for line, row in enumerate(reader, start=2):
                try:
                    rows.append(list(parse(row)))
                except (ValueError, IndexError) as error:
                    raise ValueError(f"{self.path}, line {line}: malformed row {row}") from error
            return rows

    def open(self, rows: list[list[Any]]) -> None:
        self.rows = [list(r) for r in rows]
        if self.path is None:
            return
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(self.header)
        writer.writerows(self._format(r) for r in self.rows)
        write_text(self.path, buffer.getvalue())
        self._file = self.path.open("a", newline="")
        self._writer = csv.writer(self._file, lineterminator="\n")

    @staticmethod
    def _format(row: Row) -> list[Any]:
        # repr keeps every bit of a float, so a resumed run's log is byte-identical
        return [repr(v) if isinstance(v, float) else v for v in row]

    def add(self, row: Row) -> None:
        self.rows.append(list(row))
        if self._writer is not None:
            self._writer.writerow(self._format(row))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def progress_bar(
    *, enabled: bool, total: float, unit: str, initial: float = 0, desc: str = ""
) -> Any:
    """A tqdm bar; when stderr is not a terminal (a log file), it redraws at most every 60 s
    instead of thousands of carriage-return updates."""
    from tqdm.auto import tqdm

    terminal = sys.stderr.isatty()
    return tqdm(
        total=total,
        initial=initial,
        unit=f" {unit}",
        desc=desc or None,
        disable=not enabled,
        dynamic_ncols=terminal,
        mininterval=0.1 if terminal else 60.0,
        maxinterval=10.0 if terminal else 600.0,
        smoothing=0.05,
    )


def tensorboard_writer(out_dir: Path | None) -> Any:
    """A TensorBoard SummaryWriter when the ``tensorboard`` package is installed, else None."""
    if out_dir is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(log_dir=str(out_dir / "tensorboard"))


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM at a step boundary, after its checkpoint was written."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_requests() -> Iterator[list[int]]:
    """While inside, SIGINT and SIGTERM only record their number in the yielded list (a second
    one raises ``KeyboardInterrupt`` at once); the handlers before are restored on exit. Outside
    the main thread, where Python cannot install handlers, nothing is recorded."""
    requested: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return

    def record(signum: int, frame: object) -> None:
        if requested:
            raise KeyboardInterrupt
        requested.append(signum)

    before = {signum: signal.signal(signum, record) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield requested
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


class Trainer(abc.ABC):
    """Run directory, setup check, checkpoints, exact resume, logs, progress, final evaluation.

    :param run_config: what ``config.json`` records (JSON-ready dict).
    :param setup_keys: the entries of ``run_config`` that define the run: a resume with any of
        them changed is refused, and the checkpoint records their hash. Lengths (episodes,
        rounds) are not among them, so a finished run can be extended with ``--resume``.
    :param config_defaults: the agent Config's defaults; a hyperparameter that a saved run
        predates is accepted on resume when it still has its default (old behaviour kept).
    """

    #: CSV columns of the log (the first one is the x axis of the TensorBoard scalars).
    header: tuple[str, ...] = ()
    #: TensorBoard tag prefix of the logged rows.
    row_tag: str = "episode"
    #: unit of :meth:`progress` (shown on the bar).
    unit: str = "episodes"
    #: file name of the CSV log inside the run directory.
    log_name: str = "episodes.csv"

    def __init__(
        self,
        *,
        run_config: Mapping[str, Any],
        setup_keys: Sequence[str],
        out_dir: Path | str | None,
        resume: bool,
        progress: bool,
        checkpoint_every: int,
        total: float,
        torch_threads: int = 1,
        config_defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {checkpoint_every}")
        self.run_config = json_ready(dict(run_config))
        self.setup_keys = tuple(setup_keys)
        self.out = Path(out_dir) if out_dir is not None else None
        self.resume = resume
        self.show_progress = progress
        self.checkpoint_every = checkpoint_every
        self.total = total
        self.torch_threads = torch_threads
        self.config_defaults = json_ready(dict(config_defaults or {}))
        self.log = CsvLog(self.out / self.log_name if self.out is not None else None, self.header)
        self.elapsed = 0.0
        self._clock = 0.0
        self._checkpoints = True

    # ------------------------------------------------------------------ what a loop implements
    @abc.abstractmethod
    def start(self) -> None:
        """Begin a fresh run (reset the env with the run's seed)."""

    @abc.abstractmethod
    def step(self) -> tuple[list[Row], Mapping[str, float]]:
        """One unit of work: the log rows it finished, and training metrics (may be empty)."""

    @abc.abstractmethod
    def finished(self) -> bool:
        """True when the run has done what it was asked to."""

    @abc.abstractmethod
    def progress(self) -> float:
        """How far the run is, in :attr:`unit` (the bar's position, the checkpoint schedule)."""

    @abc.abstractmethod
    def loop_state(self) -> dict[str, Any]:
        """The loop's own state (counters, current observations), as data."""

    @abc.abstractmethod
    def load_loop_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`loop_state`."""

    def component_states(self) -> dict[str, Any]:
        """The states of what the loop drives, as data: by default ``self.agent``'s
        ``state_dict()`` and ``self.env``'s (:func:`fedrec.envs.state.env_state`)."""
        return {"agent": self.agent.state_dict(), "env": env_state(self.env)}

    def load_component_states(self, states: Mapping[str, Any]) -> None:
        """Restore :meth:`component_states` (the env first: its state is validated whole)."""
        load_env_state(self.env, states["env"])
        self.agent.load_state_dict(states["agent"])

    def parse_row(self, row: list[str]) -> list[Any]:
        """A CSV row read back on resume (default: the first two columns int, the rest float)."""
        return [int(row[0]), int(row[1]), *map(float, row[2:])]

    def evaluate(self) -> dict[str, Any] | None:
        """The final evaluation (None: none)."""
        return None

    def checkpoint_problem(self) -> str | None:
        """Why this run cannot be checkpointed (None: it can), asked before the run starts so
        that it fails then rather than at its first checkpoint. The default checks that
        ``self.env`` (if any) can save its state as data (:func:`fedrec.envs.state.env_state`
        raises ``TypeError`` for an env without ``state_dict()``, e.g. a Gymnasium env)."""
        env = getattr(self, "env", None)
        if env is None:
            return None
        try:
            env_state(env)
        except TypeError as error:
            return str(error)
        return None

    def postfix(self) -> dict[str, str]:
        """Short numbers shown beside the progress bar."""
        return {}

    # ------------------------------------------------------------------ the shared machinery
    @property
    def setup(self) -> dict[str, Any]:
        return {key: self.run_config.get(key) for key in self.setup_keys}

    def _with_defaults(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        saved = json_ready(dict(saved))
        agent_config = saved.get("agent_config")
        if self.config_defaults and isinstance(agent_config, Mapping):
            saved["agent_config"] = {**self.config_defaults, **agent_config}
        return saved

    def _check_setup(self, saved: Mapping[str, Any], where: Path, what: str) -> None:
        saved = self._with_defaults(saved)
        saved_setup = {key: saved.get(key) for key in self.setup_keys}
        differ = setup_differences(saved_setup, self.setup)
        if differ:
            raise ValueError(f"--resume: {where} {what} ({'; '.join(differ)})")

    def _load(self) -> dict[str, Any] | None:
        """Check the run directory for a resume; the checkpoint, or None for a fresh start."""
        if not self.resume:
            return None
        if self.out is None:
            raise ValueError("--resume needs an output directory")
        config_path = self.out / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"--resume: {config_path} not found (was the run started?)")
        try:
            saved = json.loads(config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"--resume: {config_path} is not valid JSON: {error}") from error
        if not isinstance(saved, Mapping):
            raise ValueError(f"--resume: {config_path} is not a JSON object")
        self._check_setup(saved, config_path, "was made with a different setup")
        path = self.out / "checkpoint.pt"
        if not path.is_file():
            return None
        state = load_checkpoint(path)
        owner = state.get("setup")
        # The record must match the hash it was written with; only then is it compared with this
        # run's setup (with defaults filled in for hyperparameters added since it was written).
        if not isinstance(owner, Mapping) or state.get("setup_hash") != setup_hash(owner):
            raise ValueError(f"--resume: {path} has no valid setup record; refusing it")
        self._check_setup(
            owner, path, "belongs to another run (copied from another run directory?)"
        )
        return state

    def _check_run_directory(self) -> None:
        """Refuse a run directory that cannot hold the run's files (before anything runs)."""
        assert self.out is not None
        existing = self.out
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        if existing.exists() and not existing.is_dir():
            where = "is" if existing == self.out else f"lies under {existing}, which is"
            raise ValueError(f"run directory {self.out} {where} a file, not a directory")
        for name in ("config.json", self.log_name, "checkpoint.pt", "final_eval.json"):
            path = self.out / name
            if path.exists() and not path.is_file():
                raise ValueError(
                    f"{path} is not a file (a directory?): remove it or use another run directory"
                )

    def _check_checkpoints(self) -> None:
        """Refuse, before training, a run whose state cannot be checkpointed, unless it was
        asked for no periodic checkpoints (then it writes none at all)."""
        problem = self.checkpoint_problem()
        if problem is None:
            return
        env = self.run_config.get("env_id") or "this env"
        if self.resume:
            raise ValueError(
                f"--resume: {env} cannot be checkpointed ({problem}), so its runs cannot be resumed"
            )
        if self.checkpoint_every:
            raise ValueError(
                f"{env} cannot be checkpointed ({problem}): train it with --checkpoint-every 0 "
                "(checkpoint_every=0: no checkpoint at all; the run cannot be resumed)"
            )
        self._checkpoints = False

    def checkpoint(self) -> None:
        """Write ``checkpoint.pt`` atomically (after flushing the log it points into)."""
        if self.out is None or not self._checkpoints:
            return
        self.log.flush()
        setup = self.setup
        save_checkpoint(
            self.out / "checkpoint.pt",
            {
                "setup": setup,
                "setup_hash": setup_hash(setup),
                "rows": len(self.log.rows),
                "elapsed": self.elapsed + time.perf_counter() - self._clock,
                "loop": self.loop_state(),
                **self.component_states(),
            },
        )

    def run(self) -> RunRecord:
        """Train to the end (or resume and finish), then evaluate; see the module doc."""
        torch.set_num_threads(self.torch_threads)
        if self.out is not None:
            self._check_run_directory()
            clean_orphans(self.out)  # temporaries of a run killed mid-write
            self._check_checkpoints()
        state = self._load()
        if self.out is not None:
            try:
                write_json(self.out / "config.json", self.run_config)
            except OSError as error:
                raise ValueError(
                    f"cannot write the run directory {self.out}: {error.strerror or error}"
                ) from error
        if state is not None:
            assert self.out is not None
            rows = self.log.read(self.parse_row)[: int(state["rows"])]
            if len(rows) != int(state["rows"]):
                raise ValueError(f"{self.log.path} has fewer rows than the checkpoint records")
            self.load_component_states(state)
            self.load_loop_state(state["loop"])
            self.elapsed = float(state["elapsed"])
        else:
            rows = []
            self.start()
        self.log.open(rows)
        writer = tensorboard_writer(self.out)
        bar = progress_bar(
            enabled=self.show_progress, total=self.total, unit=self.unit, initial=self.progress()
        )
        self._clock = time.perf_counter()
        every = self.checkpoint_every
        next_checkpoint = (self.progress() // every + 1) * every if every else None
        try:
            with stop_requests() as requested:
                while not self.finished():
                    before = self.progress()
                    rows_done, metrics = self.step()
                    for row in rows_done:
                        self.log.add(row)
                        if writer is not None:
                            for name, value in zip(self.header[1:], row[1:], strict=True):
                                writer.add_scalar(f"{self.row_tag}/{name}", value, row[0])
                    if writer is not None:
                        for name, value in metrics.items():
                            writer.add_scalar(f"train/{name}", value, self.progress())
                    bar.update(self.progress() - before)
                    if rows_done:
                        bar.set_postfix(self.postfix(), refresh=False)
                    if next_checkpoint is not None and self.progress() >= next_checkpoint:
                        if not self.finished():
                            self.checkpoint()
                        next_checkpoint = (self.progress() // every + 1) * every
                    if requested:  # SIGINT/SIGTERM: stop here, resumable
                        self.checkpoint()
                        raise Interrupted(requested[0])
                self.checkpoint()
        finally:
            bar.close()
            self.log.close()
            if writer is not None:
                writer.close()
        wall_time = self.elapsed + time.perf_counter() - self._clock
        final_eval = self.evaluate()
        if final_eval is not None:
            final_eval["train_wall_time_s"] = wall_time
            if self.out is not None:
                write_json(self.out / "final_eval.json", json_ready(final_eval))
        return RunRecord(self.log.rows, wall_time, final_eval)
