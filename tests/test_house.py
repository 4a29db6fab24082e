"""The house rules of the codebase (docs/architecture.md): no module over 400 lines, no import cycle
between transduce's modules, and model.py (Section 3) importing only the modules below it, which
import nothing above it either.

The import graph is read with `ast`, not by importing: every `import` and `from ... import` of a
transduce module anywhere in a file counts, those under `if TYPE_CHECKING:` and inside functions
included, so a cycle cannot hide behind a lazy or type-only import."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 400
MODEL_IMPORTS = {
    "transduce.attention",
    "transduce.cache",
    "transduce.config",
    "transduce.masks",
    "transduce.positions",
    "transduce.restricted",
    "transduce.word_positions",
}
"""What model.py may import: modules beside it that import nothing of it, none of the rooms above it."""
BELOW_MODEL = MODEL_IMPORTS | {"transduce.cpu", "transduce.special_ids", "transduce.torch_ops"}
"""What model.py may reach, directly or through what it imports: besides `MODEL_IMPORTS`, the special
ids (the config's defaults), the reading of the machine (`cpu`, which the cache asks where oneDNN runs
AMX) and the shim over PyTorch's private operators (`torch_ops`, which `cpu` tests int8 with)."""


def module_files(src: Path, package: str = "transduce") -> dict[str, Path]:
    """{dotted module name: file} for every .py file of the package (a package is its __init__)."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `name` imports: `from .x import y` is an edge to the module
    x.y if y is a module, else to x."""
    own_package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                prefixes = (".".join(parts[:k]) for k in range(len(parts), 0, -1))
                targets.update(next(([p] for p in prefixes if p in modules), []))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = own_package[: len(own_package) - (node.level - 1)]
                base = ".".join(base_parts + (node.module.split(".") if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    targets.add(f"{base}.{alias.name}")
                elif base in modules:
                    targets.add(base)
    targets.discard(name)
    return targets


def import_graph(src: Path, package: str = "transduce") -> dict[str, set[str]]:
    modules = module_files(src, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that `start` imports, directly or through others (not `start` itself)."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    seen.discard(start)
    return seen


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_is_over_400_lines():
    counts = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in module_files(SRC).items()}
    assert len(counts) > 50  # the whole package was found
    too_long = {name: n for name, n in counts.items() if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"


def test_model_py_imports_only_the_modules_below_it():
    """No import arrow runs back up from the model: not to decoding/, fast/, train/ or anything that builds on it."""
    imported = import_graph(SRC)["transduce.model"]
    assert imported <= MODEL_IMPORTS, f"model.py imports {sorted(imported - MODEL_IMPORTS)}"


def test_nothing_below_the_model_imports_a_room_above_it():
    """No arrow runs back up from what the model imports either: the cache, the attention and the
    rest reach only modules below the model (a lazy import inside a function counts)."""
    graph = import_graph(SRC)
    reached = reachable(graph, "transduce.model")
    assert "transduce.cpu" in reached  # the cache's import of the CPU's reading is seen
    assert reached <= BELOW_MODEL, f"below the model, imports of {sorted(reached - BELOW_MODEL)}: " + "; ".join(
        f"{name} -> {sorted(graph[name] - BELOW_MODEL)}"
        for name in sorted(reached & BELOW_MODEL)
        if graph[name] - BELOW_MODEL
    )


def test_the_package_has_no_import_cycle():
    graph = import_graph(SRC)
    assert "transduce.train.state" in graph["transduce.train.recovery"]  # the graph sees relative imports
    assert "transduce.train.recovery" in graph["transduce.train.trainer"]  # ... and `from . import recovery`
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_check_finds_a_cycle_hidden_under_type_checking(tmp_path):
    """The checker itself: two modules importing each other, one of the imports type-only."""
    pkg = tmp_path / "demo" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "demo" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (pkg / "b.py").write_text("from ..sub import a\n\ndef f():\n    import demo.c\n")
    (tmp_path / "demo" / "c.py").write_text("x = 1\n")
    graph = import_graph(tmp_path, "demo")
    assert graph["demo.sub.b"] == {"demo.sub.a", "demo.c"}
    assert find_cycle(graph) == ["demo.sub.a", "demo.sub.b", "demo.sub.a"]
