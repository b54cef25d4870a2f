"""The package's layers can be checked: import-linter's contracts (pyproject.toml) hold, and the
module import graph has no cycle beyond the known config one."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "grpo_lightning"


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (TYPE_CHECKING and in-function imports too)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Kosaraju)."""
    order, seen = [], set()
    for start in graph:
        stack = [(start, iter(sorted(graph[start])))] if start not in seen else []
        seen.add(start)
        while stack:
            node, edges = stack[-1]
            nxt = next((m for m in edges if m not in seen), None)
            if nxt is None:
                order.append(node)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(graph[nxt]))))
    reverse = {name: set() for name in graph}
    for name, targets in graph.items():
        for target in targets:
            reverse[target].add(name)
    found, assigned = [], set()
    for root in reversed(order):
        if root in assigned:
            continue
        component, todo = set(), [root]
        while todo:
            node = todo.pop()
            if node not in assigned:
                assigned.add(node)
                component.add(node)
                todo.extend(reverse[node] - assigned)
        if len(component) > 1:
            found.append(component)
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_layer_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(lint_imports), "--config", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
