"""The layers point one way: read every import of the package (function-level ones too) and check the graph.

    __main__ (python -m gradwire) -> cli -> compare / predict / bench / profile / emulate -> train -> overlap
    -> hooks -> compress
    backend -> net -> device

``net`` and ``compress`` are pure cores: they import nothing else of
gradwire. Strategies (``overlap``) reach compression only through ``hooks``,
where the one compressed exchange lives.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import gradwire

ROOT = Path(gradwire.__file__).parent


def _unit(parts: list[str]) -> str:
    """The package (``hooks``) or top-level module (``launch``) a dotted path inside gradwire belongs to."""
    if not parts or parts[0] == "__init__":
        return "gradwire"
    return parts[0]


def import_graph() -> dict[str, set[str]]:
    """Edges between gradwire's packages and top-level modules."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        if "_site" in path.parts:  # runs in the user's interpreter, before gradwire is imported
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        src = _unit(parts)
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[list[str]] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = parts[: len(parts) - node.level]
                    targets.append(base + (node.module.split(".") if node.module else []))
                elif node.module and (node.module == "gradwire" or node.module.startswith("gradwire.")):
                    targets.append(node.module.split(".")[1:])
            elif isinstance(node, ast.Import):
                targets += [a.name.split(".")[1:] for a in node.names
                            if a.name == "gradwire" or a.name.startswith("gradwire.")]
            for target in targets:
                dst = _unit(target)
                if dst != src:
                    edges[src].add(dst)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, stack, state = [], [], {}

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_the_graph_was_read() -> None:
    edges = import_graph()
    assert "hooks" in edges["overlap"] and "compress" in edges["hooks"] and "net" in edges["backend"]


def test_no_circle_between_packages() -> None:
    assert _cycles(import_graph()) == []


def test_pure_cores_import_nothing_else() -> None:
    edges = import_graph()
    # the spec grammar names the cluster's device: net reads device's grammar, device reads nothing
    assert edges.get("net", set()) <= {"device"}
    assert edges.get("device", set()) == set()
    assert edges.get("compress", set()) == set()


def test_strategies_reach_compression_only_through_hooks() -> None:
    edges = import_graph()
    assert "compress" not in edges["overlap"]
    assert edges["hooks"] == {"compress"}


def test_lower_layers_never_import_higher_ones() -> None:
    edges = import_graph()
    order = ["compress", "hooks", "overlap", "train", "compare"]
    for low, high in zip(order, order[1:]):
        for higher in order[order.index(high):]:
            assert higher not in edges.get(low, set()), f"{low} imports {higher}"
    # only the command line and ``python -m gradwire`` (its entry) reach cli
    assert "cli" not in set().union(*(e for k, e in edges.items() if k not in ("cli", "__main__")))
    assert edges["backend"] <= {"net", "device"}


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
