"""Every ``fedrec`` command's ``--help`` (issue 33, item 8): plain text without Sphinx markup, a
description, the allowed values of every option with choices and the default of every option
that has one."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from fedrec.cli import build_parser

#: Sphinx / reStructuredText markup that must not reach a terminal.
MARKUP = re.compile(r"``|:(class|func|mod|meth|attr|data|obj|exc|ref|doc):`")
#: Actions whose default says nothing (flags, help, version, subcommands).
SILENT = (
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._SubParsersAction,
    argparse._CountAction,
)


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command line, by its command (``fedrec bench fel``), depth first."""
    todo = [("fedrec", build_parser())]
    while todo:
        name, parser = todo.pop(0)
        if hasattr(parser, "populate"):
            parser.populate()  # the options a command adds when it is used
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items()]


PARSERS = dict(_parsers())


def _action_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """An option's help as printed (``%(default)s`` and the like expanded), on one line."""
    formatter = parser._get_formatter()
    text = formatter._expand_help(action) if action.help else ""
    return " ".join(text.split())


def _problems(name: str, parser: argparse.ArgumentParser) -> list[str]:
    problems = []
    text = parser.format_help()
    if MARKUP.search(text):
        problems.append(f"{name}: Sphinx markup {MARKUP.search(text).group(0)!r}")
    if name != "fedrec" and not (parser.description or "").strip():
        problems.append(f"{name}: no description")
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flag = "/".join(action.option_strings) or action.dest
        shown = _action_help(parser, action)
        usage = " ".join(parser._get_formatter()._format_args(action, action.dest).split())
        if action.choices is not None:
            missing = [c for c in action.choices if str(c) not in shown and str(c) not in usage]
            if missing:
                problems.append(f"{name} {flag}: choices not listed ({missing[:3]})")
        default = action.default
        if isinstance(action, SILENT) or default is None or default is argparse.SUPPRESS:
            continue
        if isinstance(action, argparse.BooleanOptionalAction) or not action.option_strings:
            continue
        if "default" not in shown:
            problems.append(f"{name} {flag}: default {default!r} not shown")
    return problems


def test_every_command_is_walked() -> None:
    for command in ("fedrec bench fel", "fedrec data list", "fedrec eval", "fedrec demo"):
        assert command in PARSERS
    assert sum(name.startswith("fedrec bench ") for name in PARSERS) >= 5


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_is_plain_and_complete(name: str) -> None:
    assert _problems(name, PARSERS[name]) == []


def test_bench_longterm_lists_its_settings() -> None:
    text = " ".join(PARSERS["fedrec bench longterm"].format_help().split())
    assert "one or more of: 10x3, 100x10, user-types" in text


def test_demo_help_names_the_policies_it_runs() -> None:
    from fedrec.cli_demo import POLICIES

    text = " ".join(PARSERS["fedrec demo"].format_help().split())
    for policy in POLICIES:
        assert policy.replace("_", " ") in text.replace("_", " "), policy
