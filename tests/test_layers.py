"""The package's layers hold: no module imports a layer above its own, and no import cycles.

The order, lowest first (a module may import its own layer and the ones below it):

``fedrec.util`` / ``fedrec.env_entry`` / ``fedrec._version`` (plain helpers) < ``envs`` (with
``fedrec.registration``, which registers them) < ``federation`` < ``agents`` < ``eval`` <
``train`` < ``experiments`` < the command line (``fedrec.cli*``, the package's ``__init__``).

Every import counts, also one inside a function or under ``TYPE_CHECKING``: an import inside a
function is still a dependency, and hiding one there is how cycles stay open.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("envs", "federation", "agents", "eval", "train", "experiments")
BASE_MODULES = ("fedrec.util", "fedrec.env_entry", "fedrec._version")
LAYERS = ("base", "envs", "federation", "agents", "eval", "train", "experiments", "cli")


def module_name(path: Path) -> str:
    """The dotted name of a library file (its folder is a subpackage of ``fedrec``)."""
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[0] == "fedrec":
        parts = parts[1:]
    return ".".join(["fedrec", *parts])


def layer_of(module: str) -> str:
    if module in BASE_MODULES:
        return "base"
    if module == "fedrec.registration":
        return "envs"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in FOLDERS:
        return parts[1]
    return "cli"


def library_files() -> list[Path]:
    files = sorted((ROOT / "fedrec").glob("*.py"))
    for folder in FOLDERS:
        files += sorted((ROOT / folder).rglob("*.py"))
    return files


def imports_of(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every absolute or relative import of a fedrec module in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = (
        module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    )
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                names = [f"{base}.{node.module}" if node.module else base]
            else:
                names = [node.module or ""]
            # ``from fedrec.envs import hidden`` imports the submodule fedrec.envs.hidden.
            names += [f"{names[0]}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.startswith("fedrec.")]
    return found


def known_modules() -> set[str]:
    return {module_name(path) for path in library_files()}


def test_no_module_imports_a_higher_layer() -> None:
    modules = known_modules()
    upward = []
    for path in library_files():
        source = layer_of(module_name(path))
        for line, target in imports_of(path):
            if target not in modules:
                continue  # ``from fedrec.x import name``: the name, not a module
            if LAYERS.index(layer_of(target)) > LAYERS.index(source):
                upward.append(f"{path.relative_to(ROOT)}:{line} ({source}) imports {target}")
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    modules = known_modules()
    graph = {module_name(path): set() for path in library_files()}
    for path in library_files():
        graph[module_name(path)] |= {
            target
            for _, target in imports_of(path)
            if target in modules
            and target != module_name(path)
            # a module importing its own package: Python has already started that package
            and not module_name(path).startswith(target + ".")
        }
    cycles = [sorted(component) for component in strongly_connected(graph) if len(component) > 1]
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm (a dozen lines; networkx is not a dependency)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in graph:
        if node not in index:
            visit(node)
    return components


@pytest.mark.parametrize(
    ("source", "target", "upward"),
    [
        ("fedrec.envs.datasets.synthetic_clients", "fedrec.train.fedncf", True),
        ("fedrec.agents.per_platform", "fedrec.cli_train", True),
        ("fedrec.federation.flower_fedncf", "fedrec.agents.ncf", True),
        ("fedrec.train.core", "fedrec.agents.registry", False),
        ("fedrec.agents.slateq", "fedrec.util", False),
    ],
)
def test_the_layer_order_itself(source: str, target: str, upward: bool) -> None:
    assert (LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(source))) is upward
