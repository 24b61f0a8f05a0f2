"""The engine's layers (docs/architecture.md): every import goes to the same or a lower layer, no import
cycles, no folder with more than 25 Python files.

Imports inside functions count as much as those at the top of a module: a cycle hidden in a function is
still a cycle (and still loads half the package when a leaf module is imported).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_ort"

# Bottom to top. A module belongs to the layer of the longest prefix it starts with; it may import modules of
# its own layer and of the layers below it, never above.
LAYERS: list[tuple[str, str]] = [
    ("lightning_ort.errors", "the exceptions every layer raises (imports nothing of lightning_ort)"),
    ("lightning_ort.engine.bootstrap", "make ORT importable: torch shims, C++ extensions, the loader"),
    ("lightning_ort.engine.ops", "op coverage: symbolics, ATen kernels, gradients, shape rules"),
    ("lightning_ort.engine.passes", "rewrites of the exported ONNX graph"),
    ("lightning_ort.engine.export", "the export and the checks that refuse what ORT would train wrongly"),
    ("lightning_ort.engine.runtime", "ORTModule's lifecycle: hooks into ORT, options, memory arena, logs"),
    ("lightning_ort.engine", "the engine's facade (engine/__init__.py), what the Lightning layer calls"),
    ("lightning_ort", "the public Lightning layer: strategy, guard, wrapping, callbacks, CLI"),
]
MAX_FILES_PER_FOLDER = 25


def _modules(root: Path = PACKAGE) -> dict[str, Path]:
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the lightning_ort modules it imports, at module level or inside functions.

    ``from package import name`` counts as an import of ``package.name`` when that is a module. A module's own
    enclosing packages are left out (importing a submodule always runs them)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                found = resolve(target)
                if found and found != module and not module.startswith(found + "."):
                    graph[module].add(found)
    return graph


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the layer ``module`` belongs to."""
    matches = [i for i, (prefix, _) in enumerate(LAYERS) if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} is in no layer of {__file__}: add it to LAYERS"
    return max(matches, key=lambda i: len(LAYERS[i][0]))


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(_modules())


def test_every_module_is_in_a_layer() -> None:
    for module in _modules():
        layer_of(module)


def test_imports_go_to_the_same_or_a_lower_layer(graph: dict[str, set[str]]) -> None:
    assert upward_imports(graph) == []


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_no_folder_holds_more_than_25_python_files() -> None:
    counts: dict[Path, int] = defaultdict(int)
    for path in PACKAGE.rglob("*.py"):
        counts[path.parent] += 1
    crowded = {str(folder.relative_to(PACKAGE.parent)): n for folder, n in counts.items() if n > MAX_FILES_PER_FOLDER}
    assert crowded == {}


def test_every_engine_folder_says_what_it_may_import() -> None:
    for init in (PACKAGE / "engine").rglob("__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        if init.parent.name != "engine":
            assert "May import" in docstring or "may import" in docstring, f"{init}: say what the layer may import"


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """The checks themselves: a bootstrap module importing the runtime, and two modules importing each other."""
    engine = tmp_path / "lightning_ort" / "engine"
    for folder in ("bootstrap", "runtime"):
        (engine / folder).mkdir(parents=True)
        (engine / folder / "__init__.py").write_text("")
    (tmp_path / "lightning_ort" / "__init__.py").write_text("")
    (engine / "__init__.py").write_text("")
    (engine / "bootstrap" / "loader.py").write_text(
        "def load():\n    from lightning_ort.engine.runtime import patches\n"
    )
    (engine / "runtime" / "patches.py").write_text("from lightning_ort.engine.bootstrap import loader\n")
    fake = import_graph(_modules(tmp_path / "lightning_ort"))
    assert upward_imports(fake) == [  # the package named in ``from ... import`` counts too
        "lightning_ort.engine.bootstrap.loader (lightning_ort.engine.bootstrap) imports "
        "lightning_ort.engine.runtime (lightning_ort.engine.runtime)",
        "lightning_ort.engine.bootstrap.loader (lightning_ort.engine.bootstrap) imports "
        "lightning_ort.engine.runtime.patches (lightning_ort.engine.runtime)",
    ]
    assert cycles(fake) == [["lightning_ort.engine.bootstrap.loader", "lightning_ort.engine.runtime.patches"]]
