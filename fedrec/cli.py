"""The ``fedrec`` command line: ``fedrec envs``, ``fedrec demo``, ``fedrec bench ...``, ``fedrec data ...``.

Each command lives in its own module and adds itself to the parser through a small
``add_parser(subparsers)`` function, so this file only wires them together.

Errors: a user error -- a bad option value, a path that cannot be read or written, a malformed
run file, an agent module that cannot be imported -- exits with status 2 and one line on stderr,
``fedrec COMMAND: error: ...``, without a traceback (:func:`is_user_error` says which exceptions
count: ``ValueError`` and its subclasses, ``OSError`` and ``FileNotFoundError``, argparse's usage
errors, a data set download's ``FetchError``). Anything else is a bug and keeps its traceback.
``fedrec --debug COMMAND ...`` shows the traceback of a user error too.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from fedrec._version import __version__
from fedrec.cli_parser import ArgumentParser, RawDescriptionHelpFormatter, UsageError

EPILOG = """examples:
  fedrec envs                          list the registered environment ids
  fedrec demo                          roll out baseline policies on the Choc-vs-Kale envs
  fedrec bench envs                    environment throughput, fedrec vs RecSim
  fedrec data info ml-100k             statistics of a logged data set

Environments are also available directly:
  python -c "import gymnasium as gym, fedrec; env = gym.make('fedrec/ChocKale-v0')"
"""


def _threads_default() -> None:
    # Small-tensor PyTorch on 2 shared cores runs fastest single-threaded with a passive wait policy;
    # set before torch is imported by any command. Users can override both variables.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


class CommandExit(SystemExit):
    """Status 2 after a command's one-line error; ``str()`` is the message (raised by
    :func:`main` for a command that stops with ``SystemExit("message")``)."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def is_user_error(error: BaseException) -> bool:
    """Whether ``error`` is the user's (one line, status 2) rather than a bug (traceback).

    ``ValueError`` (bad values, malformed files: every validation in fedrec raises it or a
    subclass), ``OSError`` (a path that cannot be created, read or written: not a directory,
    permission denied, disk full) and a data set download's ``FetchError``. A ``TypeError``,
    ``ImportError`` or anything else raised inside fedrec is a bug and keeps its traceback; the
    commands turn the user's own ones (an agent module that cannot be imported, an env argument
    of the wrong type) into ``ValueError`` where they arise.
    """
    if isinstance(error, (ValueError, OSError)):
        return True
    try:
        from fedrec.envs.datasets.fetch import FetchError
    except ImportError:  # pragma: no cover - the loaders are always installed
        return False
    return isinstance(error, FetchError)


def error_line(error: BaseException) -> str:
    """The one-line text of a user error (an ``OSError`` as ``reason: path``)."""
    if isinstance(error, OSError) and error.strerror:
        where = [str(p) for p in (error.filename, error.filename2) if p is not None]
        text = f"{error.strerror}: {' -> '.join(where)}" if where else error.strerror
    else:
        text = str(error) or type(error).__name__
    return " ".join(text.split())  # one line, whatever the message holds


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every command registers itself here)."""
    from fedrec import cli_bench, cli_demo, cli_envs, cli_eval, cli_evaluate, cli_train

    parser = ArgumentParser(
        prog="fedrec",
        description="fedrec: federated and cross-platform recommendation with reinforcement "
        "learning. Environments, agents, federation and benchmarks.",
        epilog=EPILOG,
        formatter_class=RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fedrec {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show the full traceback of an error instead of the one-line message",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (cli_envs, cli_demo, cli_train, cli_eval, cli_evaluate, cli_bench):
        module.add_parser(subparsers)
    for optional in ("fedrec.cli_data", "fedrec.cli_flower"):
        try:
            module = __import__(optional, fromlist=["add_parser"])
        except ModuleNotFoundError as error:
            if error.name != optional:
                raise
            continue
        module.add_parser(subparsers)
    return parser


def _usage_line(error: UsageError) -> str:
    words = error.prog.split()
    command = " ".join(words[:2])  # "fedrec train", whatever the subcommand's own prog
    hint = f" (see {error.prog} --help)" if len(words) > 1 else ""
    return f"{command}: error: {' '.join(error.message.split())}{hint}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedrec`` console script (see the module doc for errors)."""
    _threads_default()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as error:
        print(_usage_line(error), file=sys.stderr)
        return 2
    if args.command is None:
        parser.print_help()
        return 0
    prefix = f"fedrec {args.command}: error:"
    try:
        return int(args.handler(args) or 0)
    except UsageError as error:  # a command that parses its own options (fedrec train)
        if args.debug:
            raise
        print(_usage_line(error), file=sys.stderr)
        return 2
    except SystemExit as exit_:
        if args.debug or not isinstance(exit_.code, str):
            raise
        print(f"{prefix} {' '.join(exit_.code.split())}", file=sys.stderr)
        raise CommandExit(exit_.code) from None
    except KeyboardInterrupt as stop:
        # A training loop stopped by SIGINT/SIGTERM has checkpointed at a step boundary
        # (fedrec.train.core.Interrupted); anything else was stopped where it was.
        saved = (
            "; checkpoint written, rerun with --resume to continue"
            if hasattr(stop, "signum")
            else ""
        )
        print(f"interrupted{saved}", file=sys.stderr)
        return 128 + int(getattr(stop, "signum", 2))
    except Exception as error:
        if args.debug or not is_user_error(error):
            raise
        print(f"{prefix} {error_line(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
