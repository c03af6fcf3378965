"""The command line's argument parser: usage errors raise :class:`UsageError`, which
:func:`fedrec.cli.main` reports in one line (exit status 2). Below every command module, so a
command that builds its own parser (``fedrec train``) imports it without importing
:mod:`fedrec.cli`."""

from __future__ import annotations

import argparse
from typing import NoReturn


class UsageError(Exception):
    """An argparse usage error, reported by :func:`main` in one line (exit status 2)."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog, self.message = prog, message


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose usage errors raise :class:`UsageError` (one line from
    :func:`main`) instead of printing the usage and exiting; its subparsers are of this class."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)
