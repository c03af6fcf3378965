"""Plain-data helpers every layer may use: ``KEY=VALUE`` parsing and JSON-ready values.

This module sits below every other part of fedrec (it imports only the standard library), so
``envs``, ``agents``, ``train``, ``experiments`` and the command line can share it without an
upward import.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any


def parse_value(text: str) -> Any:
    """A Python literal (``3``, ``0.5``, ``(1, 2)``, ``True``, ``'x'``) or, failing that, the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_key_value(text: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` as ``(key, value)`` with the value parsed by :func:`parse_value`.

    :raises ValueError: the text has no ``=`` or an empty key.
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key, parse_value(value)


def json_ready(value: Any) -> Any:
    """``value`` with mappings' keys as strings and tuples as lists, as ``json.dumps`` writes it."""
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value
