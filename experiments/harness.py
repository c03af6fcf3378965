"""The one harness of the ``fedrec bench`` drivers: output folders, run caches, the worker pool,
confidence intervals and command-line options generated from a configuration dataclass.

**Output folders.** A driver's default ``--out`` is ``runs/bench/NAME/[LABEL-]HASH`` (git-ignored;
HASH is :func:`config_hash` of what the run depends on), so a default run never writes into the
committed ``results/`` and two configurations never share a folder. ``results/...`` is written
only when ``--out`` names it. A folder given with ``--out`` is checked before anything runs: a
file of another configuration in it is refused (:func:`check_same`), and so is a folder whose
table would drop runs this call does not make (:func:`check_subset`); the error is one line and
asks for another ``--out``.

**Benchmark scripts.** The standalone scripts of ``benchmarks/`` follow the same rule: their
default output is ``runs/benchmarks/SCRIPT/`` (:func:`script_out`; ``--out`` and ``--overwrite``
from :func:`add_out_arguments`), and before any work they refuse to replace a file an earlier run
wrote unless ``--overwrite`` is given (:func:`claim_outputs`); :func:`run_script` turns that
refusal into a one-line error.

**Run caches.** Cached records are read with :func:`read_json` and checked whole with the small
schemas below (:func:`validate`: keys, types, record counts, finite values) before anything is
used; a bad file is a :class:`BenchError` (a ``ValueError``: ``fedrec`` prints one line naming
the file and the problem, exit status 2). :func:`write_json` writes atomically.

**Worker pool.** :func:`run_jobs` runs jobs serially or in spawned processes, in order.

**Tables.** :func:`mean_ci` is :func:`fedrec.eval.stats.mean_ci` (95% t-interval over seeds).

**Options.** :func:`add_options` adds one ``--option`` per field of a configuration dataclass:
the field's attribute docstring (or ``metadata["help"]``) is the help text, its annotation the
type (``int``, ``float``, ``str``, ``bool``, ``tuple[X, ...]``, ``X | None``) and
``metadata["choices"]`` the allowed values; :func:`config_from_args` builds the dataclass back
(its ``__post_init__`` validates). :func:`option` declares such a field. Help texts are plain
text (:func:`plain_text` removes Sphinx markup); :func:`add_bench_parser` registers a driver's
command with its options, ``--quick``, ``--wide`` / ``--csv`` and handler; :func:`key_value` parses
``KEY=VALUE``.

**Views.** Every driver gets ``--wide`` and ``--csv [PATH]`` (:mod:`fedrec.eval.tables`): its
handler runs with that view set, and :func:`show_tables` prints its tables in it (compact within
100 characters by default; :func:`show_markdown` for Markdown tables); :func:`log` prints a
message where it does not mix with CSV on stdout.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import hashlib
import inspect
import itertools
import json
import math
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Where the drivers' default output folders go (``runs/`` is git-ignored).
RUNS_ROOT = Path("runs") / "bench"

#: Where the standalone scripts of ``benchmarks/`` write by default (:func:`script_out`).
SCRIPTS_ROOT = Path("runs") / "benchmarks"


class BenchError(ValueError):
    """A bench input the user must fix (a bad cache file, a folder of another configuration)."""


# ------------------------------------------------------------------------------ output folders


def json_ready(value: Any) -> Any:
    """``value`` as plain JSON data (tuples as lists, ``inf`` kept as JSON's ``Infinity``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value, default=str))


def config_hash(key: Any) -> str:
    """A short, stable hash of a configuration (its JSON with sorted keys)."""
    text = json.dumps(json_ready(key), sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def default_out(bench: str, key: Any, label: str | None = None) -> Path:
    """``runs/bench/BENCH/[LABEL-]HASH``: a default output folder of its own per configuration."""
    name = config_hash(key)
    return RUNS_ROOT / bench / (f"{label}-{name}" if label else name)


def differences(saved: Any, expected: Any, prefix: str = "") -> list[str]:
    """The top-level keys (dotted below mappings) where two JSON-ready values differ."""
    if isinstance(saved, Mapping) and isinstance(expected, Mapping):
        out = []
        for key in sorted(set(saved) | set(expected), key=str):
            if saved.get(key, _MISSING) != expected.get(key, _MISSING):
                out.append(f"{prefix}{key}")
        return out
    return [] if saved == expected else [prefix.rstrip(".") or "value"]


_MISSING = object()


def check_same(path: Path, saved: Any, expected: Any, *, what: str = "results") -> None:
    """Refuse ``path`` when it was written by another configuration than ``expected``."""
    differ = differences(json_ready(saved), json_ready(expected))
    if differ:
        shown = ", ".join(differ[:4]) + (", ..." if len(differ) > 4 else "")
        raise BenchError(
            f"{path} holds {what} of another configuration ({shown} differ): "
            "choose another --out (or move the folder away)"
        )


def check_subset(folder: Path, present: Iterable[str], made: Iterable[str], *, what: str) -> None:
    """Refuse to rewrite ``folder``'s table when it holds runs (``present``) this call does not
    make (``made``): the table would drop them."""
    extra = sorted(set(present) - set(made))
    if extra:
        shown = ", ".join(extra[:4]) + (", ..." if len(extra) > 4 else "")
        raise BenchError(
            f"{folder} holds {what} this call does not include ({shown}): its table would drop "
            "them; include them or choose another --out"
        )


# ------------------------------------------------------------------------- benchmark scripts


def script_out(script: str, out: str | Path | None, name: str | None = None) -> Path:
    """Where a ``benchmarks/SCRIPT.py`` script writes: ``out`` when given, else
    ``runs/benchmarks/SCRIPT`` (git-ignored; ``/NAME`` below it for a script whose ``--out`` is
    one file)."""
    if out is not None:
        return Path(out)
    folder = SCRIPTS_ROOT / script
    return folder / name if name else folder


def claim_outputs(paths: Iterable[str | Path], *, overwrite: bool) -> None:
    """Refuse to start a script that would replace a file it did not make in this run: raise
    :class:`BenchError` naming the first of ``paths`` that exists, unless ``overwrite``. Called
    with every file the script will write, before any expensive work."""
    if overwrite:
        return
    for path in paths:
        if Path(path).exists():
            raise BenchError(
                f"{path} exists (written by an earlier run): pass --overwrite to replace it, "
                "or choose another --out"
            )


def add_out_arguments(
    parser: argparse.ArgumentParser, script: str, *, name: str | None = None, what: str = ""
) -> None:
    """Add ``--out`` (default ``None``: :func:`script_out`'s ``runs/benchmarks/SCRIPT[/NAME]``)
    and ``--overwrite`` to a benchmark script's parser; ``what`` describes ``--out``."""
    default = script_out(script, None, name)
    text = f"{what}; " if what else ""
    parser.add_argument(
        "--out",
        default=None,
        help=f"{text}default {default.as_posix()}; results/ only when --out names it",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace output files of an earlier run (refused without it)",
    )


def run_script(main: Callable[[], Any]) -> Any:
    """Run a benchmark script's ``main``: a :class:`BenchError` ends it with one line
    (``error: ...``, exit status 1) instead of a traceback."""
    try:
        return main()
    except BenchError as error:
        raise SystemExit(f"error: {error}") from None


# ------------------------------------------------------------------------------ run caches


def read_json(path: Path, what: str) -> Any:
    """The JSON in ``path`` (gzipped when its name ends in ``.gz``, as in a compacted run); a
    file that cannot be read or parsed is a one-line :class:`BenchError`."""
    import gzip

    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return json.loads(data.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, ValueError) as error:
        reason = getattr(error, "msg", None) or getattr(error, "strerror", None) or str(error)
        raise BenchError(
            f"{path} is not a valid {what} ({reason}): delete it to run again, or choose "
            "another --out"
        ) from None


def write_json(path: Path, data: Any, *, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON atomically (a crash leaves the old file or none)."""
    from fedrec.train.checkpoint import atomic_write

    text = json.dumps(data, indent=indent, default=float)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda f: f.write(text.encode()))


#: A schema check: the problem with a value, or None.
Check = Callable[[Any], "str | None"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value: Any) -> str | None:
    """A finite number."""
    if not _is_number(value):
        return f"{value!r} is not a number"
    return None if math.isfinite(value) else f"{value!r} is not finite"


def number(value: Any) -> str | None:
    """A number, possibly infinite, never NaN."""
    if not _is_number(value):
        return f"{value!r} is not a number"
    return "NaN" if math.isnan(value) else None


def unit(value: Any) -> str | None:
    """A finite number in [0, 1] (a rate, an AUC, a hit rate)."""
    problem = finite(value)
    if problem is None and not 0 <= value <= 1:
        problem = f"{value!r} is not in [0, 1]"
    return problem


def non_negative(value: Any) -> str | None:
    """A finite number >= 0 (a count of seconds)."""
    problem = finite(value)
    return problem if problem is not None or value >= 0 else f"{value!r} is negative"


def integer(value: Any) -> str | None:
    """An integer (not a bool)."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    return None if ok else f"{value!r} is not an integer"


def string(value: Any) -> str | None:
    return None if isinstance(value, str) else f"{value!r} is not a string"


def equal(expected: Any) -> Check:
    """Exactly ``expected``."""
    return lambda value: None if value == expected else f"{value!r} is not {expected!r}"


def one_of(*choices: Any) -> Check:
    return lambda value: None if value in choices else f"{value!r} is not one of {list(choices)}"


def optional(check: Check) -> Check:
    """None or ``check``."""
    return lambda value: None if value is None else check(value)


def list_of(check: Check, *, length: int | None = None, min_length: int = 0) -> Check:
    def run(value: Any) -> str | None:
        if not isinstance(value, list):
            return f"not a list but {type(value).__name__}"
        if length is not None and len(value) != length:
            return f"{len(value)} entries, expected {length}"
        if len(value) < min_length:
            return f"{len(value)} entries, expected at least {min_length}"
        for i, item in enumerate(value):
            problem = check(item)
            if problem:
                return f"[{i}]: {problem}"
        return None

    return run


def mapping_of(check: Check, *, min_length: int = 0) -> Check:
    """A JSON object whose every value passes ``check``."""

    def run(value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"not an object but {type(value).__name__}"
        if len(value) < min_length:
            return f"{len(value)} entries, expected at least {min_length}"
        for key, item in value.items():
            problem = check(item)
            if problem:
                return f"{key}: {problem}"
        return None

    return run


def record(required: Mapping[str, Check], optional_keys: Mapping[str, Check] = {}) -> Check:
    """A JSON object with every ``required`` key (and any ``optional_keys``) passing its check."""

    def run(value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"not an object but {type(value).__name__}"
        missing = [key for key in required if key not in value]
        if missing:
            return f"missing key(s) {', '.join(missing)}"
        for key, check in (*required.items(), *optional_keys.items()):
            if key in value:
                problem = check(value[key])
                if problem:
                    return f"{key}: {problem}"
        return None

    return run


def validate(value: Any, check: Check, path: Path, what: str) -> Any:
    """``value`` if it passes ``check``, else a one-line :class:`BenchError` naming ``path``."""
    problem = check(value)
    if problem:
        raise BenchError(
            f"{path} is not a valid {what}: {problem} (delete it to run again, or choose "
            "another --out)"
        )
    return value


def read_cached(path: Path, check: Check, what: str) -> Any:
    """:func:`read_json` then :func:`validate`."""
    return validate(read_json(path, what), check, path, what)


# ------------------------------------------------------------------------------ worker pool


def _one_thread() -> None:
    """A pool process: one thread per library (the jobs share the cores)."""
    import os

    for name in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"


def run_jobs(
    job: Callable[[Any], Any],
    specs: Sequence[Any],
    *,
    jobs: int = 1,
    initializer: Callable[[], None] | None = _one_thread,
) -> Iterator[tuple[Any, Any]]:
    """``(spec, job(spec))`` for every spec, in order: in this process when ``jobs`` is 1, else
    in ``jobs`` spawned processes (``job`` must be importable: a module-level function)."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    if jobs == 1 or len(specs) <= 1:
        for spec in specs:
            yield spec, job(spec)
        return
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(
        jobs, mp_context=get_context("spawn"), initializer=initializer
    ) as pool:
        futures = [(spec, pool.submit(job, spec)) for spec in specs]
        for spec, future in futures:
            yield spec, future.result()


# ------------------------------------------------------------------------------ tables


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the t-interval (:func:`fedrec.eval.stats.mean_ci`: the half-width
    is NaN for one value, and such a cell prints the mean alone)."""
    from fedrec.eval.stats import mean_ci as t_mean_ci  # scipy.stats: imported when needed

    return t_mean_ci(list(values), confidence)


def plus_minus(
    mean: float, half: float | None, digits: int = 4, *, zero_is_none: bool = False
) -> str:
    """``mean ± half`` (the mean alone for a missing or NaN half-width, "–" for a NaN mean).
    ``zero_is_none``: a half-width of 0 is no interval either (summaries of one seed written
    before the half-width became NaN hold 0)."""
    if not math.isfinite(mean):
        return "–"
    if half is None or not math.isfinite(half) or (zero_is_none and half == 0):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


# ------------------------------------------------------------------------------ options


def option(default: Any = dataclasses.MISSING, *, cli: bool = True, **metadata: Any) -> Any:
    """A configuration field with command-line metadata: ``help`` (else the attribute docstring),
    ``choices`` (a sequence, or a function returning one: checked by :func:`check_fields`),
    ``cli_choices`` (what argparse accepts, when it differs; a function is called when the parser
    is built), ``flag`` (the option's name), ``metavar``, ``parse`` (argparse's ``type``),
    ``nargs``, ``append`` (a repeatable option, each value one entry), ``exclusive`` (fields with
    the same name exclude each other), ``min``; ``cli=False`` keeps it off the command line. A
    list or tuple default is copied per instance."""
    meta = {"cli": cli, **metadata}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")


def plain_text(text: str) -> str:
    """Sphinx markup as plain text for ``--help``: ``:func:`~a.b``` as ``b``, ``:mod:`a.b``` as
    ``a.b``, ````code```` as ``code``; whitespace runs as one space."""

    def role(match: re.Match[str]) -> str:
        name = match.group(1)
        return name.rsplit(".", 1)[-1] if match.group(0).split("`")[1].startswith("~") else name

    return " ".join(_ROLE.sub(role, text).replace("``", "").split())


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string literal right below a field)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # pragma: no cover - no source at hand
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _parse_type(annotation: Any) -> tuple[type, bool, bool]:
    """``(scalar type, is a sequence, may be None)`` of a field annotation."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        scalar, many, _ = _parse_type(inner[0])
        return scalar, many, True
    if origin in (tuple, list, Sequence):
        return _parse_type(args[0])[0], True, False
    return annotation, False, False


def _fields(cls: type) -> list[tuple[dataclasses.Field, type, bool, bool]]:
    hints = typing.get_type_hints(cls)
    return [
        (f, *_parse_type(hints[f.name]))
        for f in dataclasses.fields(cls)
        if f.metadata.get("cli", True) and f.init
    ]


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def flag_of(field: dataclasses.Field) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` for argparse (:func:`fedrec.util.parse_key_value`; a usage error when
    malformed)."""
    from fedrec.util import parse_key_value

    try:
        return parse_key_value(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    skip: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """One option per field of ``cls`` (not in ``skip``): see the module doc. Options default to
    None (the dataclass's default applies); ``defaults`` replaces some defaults in the help."""
    skip = set(skip)
    docs = field_docs(cls)
    groups: dict[str, Any] = {}
    for field, scalar, many, _ in _fields(cls):
        if field.name in skip:
            continue
        meta = field.metadata
        default = (defaults or {}).get(field.name, _default(field))
        text = plain_text(meta.get("help") or docs.get(field.name, "")).replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": field.name, "default": None}
        if "metavar" in meta:
            kwargs["metavar"] = meta["metavar"]
        target = parser
        if "exclusive" in meta:
            if meta["exclusive"] not in groups:
                groups[meta["exclusive"]] = parser.add_mutually_exclusive_group()
            target = groups[meta["exclusive"]]
        if scalar is bool and not many:
            shown = "on" if default else "off"
            kwargs["action"] = argparse.BooleanOptionalAction
            target.add_argument(flag_of(field), help=_help(text, shown), **kwargs)
            continue
        kwargs["type"] = meta.get("parse", scalar)
        choices = meta.get("cli_choices", meta.get("choices"))
        if "cli_choices" in meta and callable(choices):
            choices = LazyChoices(choices)  # called when an option is checked or --help shown
        if choices is not None and not callable(choices):  # a registry's: by check_fields
            kwargs["choices"] = choices if isinstance(choices, LazyChoices) else tuple(choices)
        if "choices" in kwargs and "metavar" in kwargs:  # the metavar hides them in the usage
            text = _with_choices(text, kwargs["choices"], many)
        shown = default
        if meta.get("append"):
            kwargs["action"] = "append"
            shown = None
        elif many:
            kwargs["nargs"] = meta.get("nargs", "+")
            shown = " ".join(str(v) for v in default) if default else "none"
        target.add_argument(flag_of(field), help=_help(text, shown), **kwargs)


class LazyChoices(Sequence):
    """The allowed values of an option, from a function called on first use (a registry's names
    may need heavy imports: building the parser for ``fedrec --help`` does not call it)."""

    def __init__(self, function: Callable[[], Iterable[Any]]) -> None:
        self.function = function

    @functools.cached_property
    def values(self) -> tuple[Any, ...]:
        return tuple(self.function())

    def __getitem__(self, index: Any) -> Any:
        return self.values[index]

    def __len__(self) -> int:
        return len(self.values)

    def __contains__(self, value: object) -> bool:
        return value in self.values

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values)


def _with_choices(text: str, choices: Sequence[Any], many: bool) -> str:
    """The doc line with its allowed values (argparse's ``%(choices)s``, filled in when the help
    is shown) unless it names them all already."""
    if not isinstance(choices, LazyChoices) and all(str(c) in text for c in choices):
        return text
    text = text[:-1] if text.endswith(".") and not text.endswith("...") else text
    which = "one or more of" if many else "one of"
    return f"{text}; {which}: %(choices)s"


def _help(text: str, default: Any) -> str:
    """The doc line (without a closing full stop), with the default unless the doc names it
    (an argparse help string: a literal % is written %%)."""
    if text.endswith(".") and not text.endswith("..."):
        text = text[:-1]
    if default is None or "default" in text:
        return text
    return f"{text} (default {default})"


def options_of(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` that were given on the command line (sequences as tuples, repeated
    values of a ``tuple[X, ...]`` option once)."""
    given = {}
    for field, _, many, _ in _fields(cls):
        value = getattr(args, field.name, None)
        if value is None:
            continue
        if field.metadata.get("append"):
            value = tuple(value)
        elif many:
            value = tuple(dict.fromkeys(value))
        given[field.name] = value
    return given


def config_from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """``cls`` from the given options, then ``overrides`` (e.g. shortened ``--quick`` defaults
    for the fields not given); its ``__post_init__`` validates."""
    given = options_of(args, cls)
    return cls(**{**overrides, **given})


def add_bench_parser(
    subparsers: argparse._SubParsersAction,
    name: str,
    *configs: type,
    help: str,
    description: str,
    handler: Callable[[argparse.Namespace], int],
    quick: str | None = None,
) -> argparse.ArgumentParser:
    """Register ``fedrec bench NAME``: its options generated from the ``configs`` dataclasses
    (:func:`add_options`), ``--quick`` with its help when given, ``--wide`` / ``--csv`` and its
    handler. The description is plain text (:func:`plain_text`). With fedrec's parser
    (:class:`fedrec.cli_parser.ArgumentParser`) the options are added when the command is
    parsed or its help shown, not when ``fedrec --help`` builds the parser."""
    parser = subparsers.add_parser(name, help=help, description=plain_text(description))

    def build(parser: argparse.ArgumentParser) -> None:
        from fedrec.eval.tables import add_view_options

        for cls in configs:
            add_options(parser, cls)
        if quick is not None:
            parser.add_argument("--quick", action="store_true", help=quick)
        add_view_options(parser)

    if hasattr(parser, "defer"):  # fedrec's parser: built when the command is used
        parser.defer(build)
    else:
        build(parser)
    parser.set_defaults(handler=functools.partial(_in_view, handler))
    return parser


def _in_view(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a driver's handler with its ``--wide`` / ``--csv`` view set
    (:func:`fedrec.eval.tables.using_view`: :func:`show_tables` and ``fedrec eval``'s report
    read it)."""
    from fedrec.eval.tables import using_view, view_of

    with using_view(view_of(args)):
        return handler(args)


def show_tables(tables: Sequence[Any], *, wide: Callable[[], None] | None = None) -> list[Path]:
    """Print a driver's tables (:class:`fedrec.eval.tables.TextTable`) in the view of its
    ``--wide`` / ``--csv`` options: compact within 100 characters by default, ``wide()`` (the
    full rendering) with ``--wide``, CSV with ``--csv``; returns the CSV files written."""
    from fedrec.eval.tables import show

    return show(tables, wide=wide)


def show_markdown(
    markdown: str,
    *,
    compact: Mapping[str, str] | None = None,
    legend: Mapping[str, str] | None = None,
) -> list[Path]:
    """Print a driver's Markdown tables in the view of its options: compact (the ``compact``
    columns, full header -> short one, of each table that has them, else every column cut to
    100 characters, with the ``legend``), the Markdown itself with ``--wide``, CSV with
    ``--csv``; the headings and paragraphs outside the tables go to the first table's title and
    notes."""
    from fedrec.eval.tables import tables_from_markdown

    tables, loose = tables_from_markdown(markdown)
    for table in tables:
        if compact:
            table.compact = {c: compact[c] for c in table.columns if c in compact} or None
        table.legend = dict(legend or {})
    if tables and loose:  # the document's title and the paragraphs outside the tables
        first = tables[0]
        first.title = f"{loose[0]}: {first.title}" if first.title else loose[0]
        first.notes = [*loose[1:], *first.notes]
    return show_tables(tables, wide=lambda: print(markdown))


def log(*parts: Any) -> None:
    """Print a driver's message: to stderr when ``--csv`` sends the table to stdout."""
    from fedrec.eval.tables import current_view

    current_view().log(*parts)


def check_fields(config: Any) -> None:
    """Check a configuration's fields against their metadata: ``choices`` (a sequence, or a
    function returning one, for names read from a registry) for the value or each entry of a
    sequence, and ``min``; one ``ValueError`` listing every problem, each by its option's name
    and field name (a config is built from the command line and from Python alike)."""
    problems = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if value is None:
            continue
        values = value if isinstance(value, (tuple, list)) else (value,)
        choices = field.metadata.get("choices")
        if callable(choices):
            choices = choices()
        name = f"{flag_of(field)} ({field.name})"
        if choices is not None:
            bad = [v for v in values if v not in choices]
            if bad or (isinstance(value, (tuple, list)) and not value):
                problems.append(f"{name} must be one of {tuple(choices)}, got {value!r}")
        low = field.metadata.get("min")
        if low is not None and any(v < low for v in values):
            problems.append(f"{name} must be >= {low}, got {value!r}")
    if problems:
        raise ValueError("; ".join(problems))
