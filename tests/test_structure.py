"""The package layers import one way and hold no import circle; thread settings stay scoped."""

from __future__ import annotations

import ast
from pathlib import Path

from mara_common.paths import PROJECT_ROOT

LAYERS = ("mara_common", "mara_fm", "mara_env", "mara_live", "mara_rl")  # each may import only those before it


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for layer in LAYERS:
        for path in (PROJECT_ROOT / layer).rglob("*.py"):
            name = ".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LAYERS:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    graph[name].add(target if target in modules else node.module)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name.split(".")[0] in LAYERS}
    return graph


def test_layers_import_downwards_only() -> None:
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = [(a, b) for a, targets in import_graph().items() for b in targets
              if rank[b.split(".")[0]] > rank[a.split(".")[0]]]
    assert not upward


def test_no_import_circle() -> None:
    graph = import_graph()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node] & graph.keys()):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles


def test_no_function_local_project_imports() -> None:
    """A local import of a project module would hide a circle (or a layering slip)."""
    local = []
    for layer in LAYERS:
        for path in (PROJECT_ROOT / layer).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    for inner in ast.walk(node):
                        if isinstance(inner, ast.ImportFrom) and (inner.module or "").split(".")[0] in LAYERS:
                            local.append(f"{path.relative_to(PROJECT_ROOT)}:{inner.lineno}")
    assert not local


def test_thread_settings_are_entered_with_with() -> None:
    """`torch_threads(n)` and `blas_threads(n)` are context managers: called as a bare statement
    they set nothing, and the block runs on however many threads the caller had."""
    scoped = {"torch_threads", "blas_threads"}
    bare = []
    for root in (*LAYERS, "experiments"):
        for path in (PROJECT_ROOT / root).rglob("*.py"):
            tree = ast.parse(path.read_text())
            entered = {id(item.context_expr) for node in ast.walk(tree) if isinstance(node, ast.With)
                       for item in node.items}
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in scoped
                        and id(node) not in entered):
                    bare.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}")
    assert not bare
