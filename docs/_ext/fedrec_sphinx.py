"""Sphinx extension of fedrec's docs: API pages by package, and the environments' cards.

* ``.. fedrec-package:: fedrec.envs`` documents a package and every public module under it,
  found by walking the package at build time (a new module appears without editing a page): the
  package's docstring and a table of the names it exports (``__all__``), then one section per
  module (``automodule`` with its members). ``:exclude:`` takes module-name patterns.
* ``.. fedrec-env-cards::`` renders the card of every environment class (the Gymnasium-style
  Markdown card of its docstring: ``## Description``, ``## Action Space``, ...), one section per
  class with the ids it is registered under.
* In autodoc, Markdown headings (``## Rewards``) become rubrics and pipe tables list-tables, so
  the rest of a docstring (reStructuredText roles, ``literals``) renders as written; ``|x|``
  (an absolute value, a set's size) stays text: fedrec's docstrings define no substitutions.
* Napoleon (Google/NumPy sections) reads every docstring but an attribute's: it would take the
  first ``text: more text`` of a prose attribute docstring for ``type: description``.
* A guide's link to a repository file outside ``docs/`` (``../results/x.md``) renders as its
  text: it works on the repository host, not in the built site.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib
import inspect
import pkgutil
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

#: A card's section heading: ``## Action Space``.
HEADING = re.compile(r"^(?P<indent>\s*)## (?P<title>.+?)\s*$")
#: The separator row of a Markdown pipe table: ``|---|:--:|``.
TABLE_RULE = re.compile(r"^\s*\|(\s*:?-+:?\s*\|)+\s*$")


def is_card(lines: Iterable[str]) -> bool:
    """Whether a docstring is an environment card (it has ``## Description``)."""
    return any((m := HEADING.match(line)) and m["title"] == "Description" for line in lines)


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def card_to_rst(lines: list[str], *, heading: str | None = None) -> list[str]:
    """A card's Markdown headings and pipe tables in reStructuredText; other lines unchanged.

    ``heading=None`` turns a heading into a rubric (inside an API entry); a character (``"~"``)
    turns it into a section title underlined with it (on the cards page).
    """
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        match = HEADING.match(line)
        if match:
            indent, title = match["indent"], match["title"]
            if heading is None:
                out += ["", f"{indent}.. rubric:: {title}", ""]
            else:
                out += ["", f"{indent}{title}", f"{indent}{heading * len(title)}", ""]
            i += 1
            continue
        if line.lstrip().startswith("|") and i + 1 < len(lines) and TABLE_RULE.match(lines[i + 1]):
            indent = line[: len(line) - len(line.lstrip())]
            rows = [_cells(line)]
            i += 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out += ["", f"{indent}.. list-table::", f"{indent}   :header-rows: 1", ""]
            for row in rows:
                out += [f"{indent}   * - {row[0]}"] + [f"{indent}     - {cell}" for cell in row[1:]]
            out.append("")
            continue
        out.append(line)
        i += 1
    return out


#: ``|x|`` outside literals and roles: reStructuredText's substitution reference.
SUBSTITUTION = re.compile(r"(?<![\\|\w])\|(?=\S)([^|`]*?\S)\|(?![\w|])")
#: Inline literals and interpreted text (roles), where ``|`` is plain text already.
CODE = re.compile(r"(``.+?``|`[^`]+`)")


def escape_substitutions(line: str) -> str:
    """``|S|`` -> ``\\|S\\|`` outside literals and roles (no substitution is defined)."""
    parts = CODE.split(line)
    for i in range(0, len(parts), 2):
        parts[i] = SUBSTITUTION.sub(r"\\|\1\\|", parts[i])
    return "".join(parts)


def _process_docstring(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    lines[:] = [escape_substitutions(line) for line in card_to_rst(lines)]


def _napoleon_except_attributes(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    from sphinx.ext import napoleon

    if what not in ("attribute", "data"):
        napoleon._process_docstring(app, what, name, obj, options, lines)


class RepositoryLinks(SphinxPostTransform):
    """A guide's Markdown link to a file outside the docs (``../results/x.md``) as plain text.

    Runs before MyST's resolver (priority 9), which would warn that no such page exists.
    """

    default_priority = 8

    def run(self, **kwargs: Any) -> None:
        source = Path(self.env.srcdir).resolve()
        for node in list(self.document.findall(addnodes.pending_xref)):
            if node.get("reftype") != "myst" or node.get("refdomain") != "doc":
                continue
            target = Path(source, node["reftarget"]).resolve()
            if not target.is_relative_to(source):
                node.replace_self(node[0].deepcopy() if node.children else nodes.Text(""))


def _public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def submodules(package: ModuleType) -> Iterator[pkgutil.ModuleInfo]:
    """Every public module under a package, depth first, in name order."""
    path = getattr(package, "__path__", None)
    if path is None:
        return
    for info in sorted(pkgutil.iter_modules(path, package.__name__ + "."), key=lambda i: i.name):
        if not _public(info.name):
            continue
        yield info
        if info.ispkg:
            yield from submodules(importlib.import_module(info.name))


def imported_names(module: ModuleType) -> list[str]:
    """The names a module's top level imports (documented where they are defined, not here).

    autodoc documents the names of a module's ``__all__`` even when imported: a re-export
    would be documented twice and make its short name an ambiguous cross-reference.
    """
    source = inspect.getsource(module)
    names: set[str] = set()
    statements = list(ast.parse(source).body)
    while statements:
        statement = statements.pop()
        if isinstance(statement, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in statement.names)
        elif not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for field in ("body", "orelse", "finalbody", "handlers"):
                statements.extend(getattr(statement, field, []))
    return sorted(name for name in names if name != "*" and not name.startswith("_"))


def _canonical(package: ModuleType, name: str) -> str | None:
    """Where an exported name is documented: its defining module, or None."""
    obj = getattr(package, name)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if (inspect.isclass(obj) or inspect.isroutine(obj)) and module and qualname:
        return f"{module}.{qualname}"
    prefix = package.__name__ + "."
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith(prefix) or vars(module).get(name, object()) is not obj:
            continue
        if ("", name) in ModuleAnalyzer.for_module(module_name).find_attr_docs():
            return f"{module_name}.{name}"
    return None


def _package_lines(package: ModuleType) -> list[str]:
    """The package's docstring, then the names it exports: a summary table, linked."""
    lines = [f".. automodule:: {package.__name__}", ""]
    exported = getattr(package, "__all__", None)
    if not exported:
        return lines
    lines += [f".. rubric:: Exported by ``{package.__name__}``", ""]
    where = {name: _canonical(package, name) for name in exported}
    linked = [target for target in where.values() if target]
    if linked:
        # The table's names are absolute: no current module for it.
        lines += [".. currentmodule:: None", "", ".. autosummary::", "   :nosignatures:", ""]
        lines += [f"   ~{target}" for target in linked] + [""]
    plain = [name for name, target in where.items() if not target]
    if plain:
        lines += ["Also exported: " + ", ".join(f"``{name}``" for name in plain) + ".", ""]
    return lines


class PackageDirective(SphinxDirective):
    """``.. fedrec-package:: NAME``: the package's docstring, exports and every public module."""

    required_arguments = 1
    option_spec = {"exclude": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        package = importlib.import_module(self.arguments[0])
        exclude = (self.options.get("exclude") or "").replace(",", " ").split()
        lines = _package_lines(package)
        for info in submodules(package):
            if any(fnmatch.fnmatch(info.name, pattern) for pattern in exclude):
                continue
            title = f"``{info.name}``"
            lines += [title, "-" * len(title), ""]
            if info.ispkg:
                lines += _package_lines(importlib.import_module(info.name))
            else:
                lines += [f".. automodule:: {info.name}", "   :members:", "   :undoc-members:"]
                imported = imported_names(importlib.import_module(info.name))
                if imported:
                    lines.append(f"   :exclude-members: {', '.join(imported)}")
                lines.append("")
        return self._parse(lines)

    def _parse(self, lines: list[str]) -> list[nodes.Node]:
        source = f"<fedrec-package {self.arguments[0]}>"
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source=source), node)
        return node.children


def card_classes() -> list[tuple[type, list[str], str | None]]:
    """Every environment class with a card: (class, ids registered to it, factory or None)."""
    from fedrec.registration import ENVIRONMENTS

    found: dict[type, tuple[list[str], str | None]] = {}
    for entry in ENVIRONMENTS:
        module_name, _, attribute = entry.entry_point.partition(":")
        module = importlib.import_module(module_name)
        target = getattr(module, attribute)
        if inspect.isclass(target):
            classes, factory = [target], None
        else:  # a factory: the card classes of its module
            classes = [v for v in vars(module).values() if inspect.isclass(v)]
            factory = f"{module_name}.{attribute}"
        for cls in classes:
            if is_card(inspect.getdoc(cls).splitlines() if cls.__doc__ else []):
                found.setdefault(cls, ([], factory))[0].append(entry.id)
    import fedrec.envs

    for info in submodules(fedrec.envs):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and value.__module__ == info.name
                and value.__doc__
                and is_card(inspect.getdoc(value).splitlines())
            ):
                found.setdefault(value, ([], None))
    return [(cls, ids, factory) for cls, (ids, factory) in found.items()]


class EnvCardsDirective(SphinxDirective):
    """``.. fedrec-env-cards::``: one section per environment class, its card as written."""

    def run(self) -> list[nodes.Node]:
        lines: list[str] = []
        for cls, ids, factory in card_classes():
            doc = inspect.getdoc(cls).splitlines()
            title = cls.__name__
            path = f"{cls.__module__}.{cls.__qualname__}"
            lines += [title, "-" * len(title), "", f".. currentmodule:: {cls.__module__}", ""]
            where = f":class:`{path}`"
            if ids:
                names = ", ".join(f"``{i}``" for i in ids)
                via = f" (through :func:`{factory}`)" if factory else ""
                lines += [f"{where}, registered as {names}{via}.", ""]
            else:
                lines += [f"{where}.", ""]
            lines += [escape_substitutions(line) for line in card_to_rst(doc, heading="~")]
            lines.append("")
        node = nodes.section()
        node.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="<fedrec-env-cards>"), node)
        return node.children


def setup(app: Sphinx) -> dict[str, Any]:
    from sphinx.ext import napoleon

    app.setup_extension("sphinx.ext.autodoc")
    app.setup_extension("sphinx.ext.napoleon")
    for listener in list(app.events.listeners["autodoc-process-docstring"]):
        if listener.handler is napoleon._process_docstring:
            app.disconnect(listener.id)
    app.connect("autodoc-process-docstring", _process_docstring, priority=400)
    app.connect("autodoc-process-docstring", _napoleon_except_attributes)
    app.add_post_transform(RepositoryLinks)
    app.add_directive("fedrec-package", PackageDirective)
    app.add_directive("fedrec-env-cards", EnvCardsDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
