"""kvcompat's imports run one way: no circle, and nothing below the dispatch module reaches up.

The data path is adapters -> :mod:`kvcompat._ops` (the one dispatch module: validate,
plan, pick the torch twin or the Triton kernel) -> ``kernels/`` | the torch twins in
``layouts/`` -> layout specs and addressing. These tests read every module's source
with :mod:`ast` (imports at module level and inside functions, and
``importlib.import_module("kvcompat...")`` calls with a literal name; imports under
``if TYPE_CHECKING:`` are skipped, they never run) and check the graph:

* no import circle anywhere in the package (every strongly connected component is one
  module);
* no module of ``kvcompat/layouts/`` imports ``kvcompat.kernels`` or the dispatch
  module, and no module of ``kvcompat/kernels/`` imports the dispatch module. One edge
  is allowed (:data:`FACADES`): the ``kvcompat.layouts`` package re-exports the dispatch
  module's public entry points (``kvcompat.layouts.dequantize``, ...) from its PEP 562
  ``__getattr__``, on first use, never at import time;
* ``import kvcompat`` imports no engine and no triton.

An import of ``a.b.c`` counts as an edge to the module ``a.b.c`` only, not to the
packages ``a`` and ``a.b`` that Python initialises on the way.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvcompat

PACKAGE = Path(kvcompat.__file__).parent
DISPATCH = "kvcompat._ops"
"""The one module that validates, plans and picks the implementation of a read or write."""
FACADES = {("kvcompat.layouts", DISPATCH)}
"""``(package, module)``: a public name of the package is the module's, imported lazily."""


def _module_name(path: Path) -> str:
    parts = ("kvcompat", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _target(name: str) -> str | None:
    """The kvcompat module an import of ``name`` loads (its longest known prefix)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imported(module: str, node: ast.AST) -> list[str]:
    """The module names one AST node imports (before resolving them to kvcompat modules)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        source = _absolute(module, node)
        # ``from a import b`` loads the submodule a.b when there is one, else just a.
        return [
            f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
            for alias in node.names
        ]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def imports_of(module: str, source: str | None = None, *, eager: bool = False) -> set[str]:
    """The kvcompat modules ``module`` imports at run time (TYPE_CHECKING blocks skipped).

    With ``eager``, only the imports that run when the module itself is imported (none
    inside a function).
    """
    tree = ast.parse(MODULES[module].read_text() if source is None else source)
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if eager and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        for name in _imported(module, node):
            target = _target(name)
            if target is not None and target != module:
                found.add(target)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph(overrides: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Every kvcompat module and the kvcompat modules it imports."""
    overrides = overrides or {}
    return {module: imports_of(module, overrides.get(module)) for module in MODULES}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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
    return found


def upward(graph: dict[str, set[str]], overrides: dict[str, str] | None = None) -> list[str]:
    """Imports that run against the data path's direction, as ``"importer -> imported"``."""
    overrides = overrides or {}
    bad: list[str] = []
    for module, found in sorted(graph.items()):
        targets = {
            target
            for target in found
            if (module, target) not in FACADES
            or target in imports_of(module, overrides.get(module), eager=True)
        }
        if module.startswith("kvcompat.layouts"):
            banned = [t for t in targets if t == DISPATCH or t.startswith("kvcompat.kernels")]
        elif module.startswith("kvcompat.kernels"):
            banned = [t for t in targets if t == DISPATCH]
        else:
            banned = []
        bad.extend(f"{module} -> {target}" for target in sorted(banned))
    return bad


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert DISPATCH in graph
    assert "kvcompat.layouts._spec" in graph["kvcompat.layouts.dsv4_v4"]
    assert len(graph) > 50


def test_no_import_circle_anywhere_in_the_package() -> None:
    assert circles(import_graph()) == []


def test_layouts_and_kernels_never_import_upward() -> None:
    assert upward(import_graph()) == []


def _added(module: str, line: str, *, in_function: bool) -> dict[str, str]:
    source = MODULES[module].read_text()
    if in_function:
        line = f"def _back_edge() -> None:\n    {line}\n"
    return {module: f"{source}\n{line}\n"}


@pytest.mark.parametrize("in_function", [False, True], ids=["module-level", "in-a-function"])
def test_a_back_edge_is_caught(in_function: bool) -> None:
    """The checks are not vacuous: one upward import makes both fail."""
    graph = import_graph(
        _added(
            "kvcompat.layouts._spec",
            "from kvcompat import _ops  # noqa",
            in_function=in_function,
        )
    )
    assert "kvcompat.layouts._spec -> kvcompat._ops" in upward(graph)
    assert any("kvcompat.layouts._spec" in circle for circle in circles(graph))


def test_the_facade_may_import_the_dispatch_module_lazily_only() -> None:
    module = "kvcompat.layouts"
    assert DISPATCH in imports_of(module)  # kvcompat.layouts.dequantize is the dispatch's
    assert DISPATCH not in imports_of(module, eager=True)
    eager = _added(module, "from kvcompat import _ops  # noqa", in_function=False)
    assert f"{module} -> {DISPATCH}" in upward(import_graph(eager), eager)


def test_an_import_under_type_checking_and_a_literal_import_module_are_told_apart() -> None:
    guarded = "if TYPE_CHECKING:\n    from kvcompat.kernels import _launch\n"
    dynamic = "import importlib\n_X = importlib.import_module('kvcompat.kernels._launch')\n"
    base = MODULES["kvcompat.layouts._pages"].read_text()
    assert "kvcompat.kernels._launch" not in imports_of("kvcompat.layouts._pages", base + guarded)
    assert "kvcompat.kernels._launch" in imports_of("kvcompat.layouts._pages", base + dynamic)


def test_import_kvcompat_imports_no_engine_and_no_triton() -> None:
    code = textwrap.dedent(
        """
        import sys
        import kvcompat, kvcompat.layouts, kvcompat.kernels, kvcompat._ops, kvcompat.adapters
        roots = {m.split(".")[0] for m in sys.modules}
        print(sorted(roots & {"sglang", "vllm", "nixl", "triton"}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
