"""The command line's argument parser: usage errors raise :class:`UsageError`, which
:func:`fedrec.cli.main` reports in one line (exit status 2). Below every command module, so a
command that builds its own parser (``fedrec train``) imports it without importing
:mod:`fedrec.cli`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn


class UsageError(Exception):
    """An argparse usage error, reported by :func:`main` in one line (exit status 2)."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog, self.message = prog, message


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with every option's default: ``(default: X)`` after a help text that
    does not name it already (flags, and options without a default, show none)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
        ):
            return text
        if isinstance(default, (list, tuple)) and not default:
            return f"{text} (default: none)"
        return f"{text} (default: %(default)s)"


class RawDescriptionHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """:class:`HelpFormatter` that keeps the description's and epilog's line breaks."""


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose usage errors raise :class:`UsageError` (one line from
    :func:`main`) instead of printing the usage and exiting; its subparsers are of this class,
    and every one shows its options' defaults (:class:`HelpFormatter`).

    :meth:`defer` postpones adding a command's options until the command is parsed or its help
    shown: ``fedrec --help`` then builds no bench driver's options (reading the configuration
    dataclasses' field docstrings for their help texts takes a noticeable part of a second)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self._deferred: list[Callable[[argparse.ArgumentParser], None]] = []

    def defer(self, build: Callable[[argparse.ArgumentParser], None]) -> None:
        """Call ``build(self)`` before this parser is first used."""
        self._deferred.append(build)

    def populate(self) -> ArgumentParser:
        """Run the deferred builds (idempotent); returns the parser."""
        while self._deferred:
            self._deferred.pop(0)(self)
        return self

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self.populate()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.populate()
        return super().format_help()

    def format_usage(self) -> str:
        self.populate()
        return super().format_usage()

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)
