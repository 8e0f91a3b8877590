"""The layers point one way: read every import of the package (function-level ones too) and check the graph.

    __main__ (python -m gradwire) -> cli -> compare / predict / bench / profile / emulate -> train -> strategies
    -> hooks -> exchange -> compress
    backend -> net -> device

``net`` and ``compress`` are pure cores: they import nothing else of
gradwire. Strategies reach compression only through ``exchange``, where the
one compressed exchange lives; ``hooks`` (the DDP comm hooks) is a thin
adapter onto it. No two modules import each other, inside a package either.
The old names (``gradwire.hooks.CompressionState``, ``gradwire.overlap``)
still import for one release, with a warning, and nothing of ours uses them.
"""
from __future__ import annotations

import ast
import importlib
import sys
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Iterator

import pytest

import gradwire

ROOT = Path(gradwire.__file__).parent
REPO = Path(__file__).resolve().parents[1]
#: what ``gradwire.hooks`` itself holds; its other names are the deprecated ones of ``gradwire.exchange``
HOOK_NAMES = {"compression_hook", "scheme_hook"}


def _unit(parts: list[str]) -> str:
    """The package (``hooks``) or top-level module (``launch``) a dotted path inside gradwire belongs to."""
    if not parts or parts[0] == "__init__":
        return "gradwire"
    return parts[0]


def _imports(path: Path, parts: list[str]) -> Iterator[tuple[list[str], list[str]]]:
    """Each import of gradwire in ``path`` (at ``parts`` inside the package): the module's dotted path after
    ``gradwire`` and the names taken from it (``[]`` for ``import gradwire.x``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level:
                base = parts[: len(parts) - node.level]
                yield base + (node.module.split(".") if node.module else []), names
            elif node.module and (node.module == "gradwire" or node.module.startswith("gradwire.")):
                yield node.module.split(".")[1:], names
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "gradwire" or a.name.startswith("gradwire."):
                    yield a.name.split(".")[1:], []


def _sources() -> Iterator[tuple[Path, list[str]]]:
    for path in ROOT.rglob("*.py"):
        if "_site" in path.parts:  # runs in the user's interpreter, before gradwire is imported
            continue
        yield path, list(path.relative_to(ROOT).with_suffix("").parts)


def import_graph() -> dict[str, set[str]]:
    """Edges between gradwire's packages and top-level modules."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path, parts in _sources():
        src = _unit(parts)
        for target, _ in _imports(path, parts):
            dst = _unit(target)
            if dst != src:
                edges[src].add(dst)
    return edges


def module_graph() -> dict[str, set[str]]:
    """Edges between gradwire's modules (``emulate.plan``), a package standing for its ``__init__``."""
    modules = {".".join(parts[:-1] if parts[-1] == "__init__" else parts) for _, parts in _sources()}

    def module_of(dotted: list[str]) -> str:  # ``from gradwire.exchange import CompressionState``: the package
        while dotted and ".".join(dotted) not in modules:
            dotted = dotted[:-1]
        return ".".join(dotted)

    edges: dict[str, set[str]] = defaultdict(set)
    for path, parts in _sources():
        src = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for target, names in _imports(path, parts):
            for dst in [module_of(target + [n]) for n in names] or [module_of(target)]:
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
    assert "exchange" in edges["strategies"] and "hooks" in edges["strategies"] and "net" in edges["backend"]
    assert "compress" in edges["exchange"] and "exchange" in edges["hooks"]
    assert "emulate.layout" in module_graph()["emulate.plan"]


def test_no_circle_between_packages() -> None:
    assert _cycles(import_graph()) == []


def test_no_circle_between_modules() -> None:
    assert _cycles(module_graph()) == []


def test_pure_cores_import_nothing_else() -> None:
    edges = import_graph()
    # the spec grammar names the cluster's device: net reads device's grammar, device reads nothing
    assert edges.get("net", set()) <= {"device"}
    assert edges.get("device", set()) == set()
    assert edges.get("compress", set()) == set()


def test_strategies_reach_compression_only_through_the_exchange() -> None:
    edges = import_graph()
    assert "compress" not in edges["strategies"]
    # and the simulated clock, which prices each stage of an exchange at the instant it runs at
    assert edges["exchange"] == {"compress", "backend"}
    assert edges["hooks"] == {"exchange"}


def test_lower_layers_never_import_higher_ones() -> None:
    edges = import_graph()
    order = ["compress", "exchange", "hooks", "strategies", "train", "compare"]
    for low, high in zip(order, order[1:]):
        for higher in order[order.index(high):]:
            assert higher not in edges.get(low, set()), f"{low} imports {higher}"
    # only the command line and ``python -m gradwire`` (its entry) reach cli
    assert "cli" not in set().union(*(e for k, e in edges.items() if k not in ("cli", "__main__")))
    assert edges["backend"] <= {"net", "device"}


def _old_names(path: Path) -> list[str]:
    """The deprecated imports in ``path``: ``gradwire.overlap``, and names of the exchange taken from ``gradwire.hooks``."""
    found = []
    for target, names in _imports(path, []):
        if target[:1] == ["overlap"]:
            found.append("gradwire." + ".".join(target))
        elif target[:1] == ["hooks"]:
            found += [f"gradwire.hooks.{n}" for n in (names or [".".join(target[1:])]) if n and n not in HOOK_NAMES]
    return found


def test_nothing_of_ours_uses_the_old_names() -> None:
    shims = {ROOT / "overlap" / "__init__.py", ROOT / "hooks" / "__init__.py", Path(__file__).resolve()}
    paths = [p for p, _ in _sources()] + [p for d in ("tests", "benchmarks", "examples") for p in (REPO / d).rglob("*.py")]
    used = {str(p): names for p in paths if p.resolve() not in shims and (names := _old_names(p))}
    assert used == {}


def test_the_old_names_still_import_with_a_warning() -> None:
    import gradwire.exchange
    import gradwire.hooks
    import gradwire.strategies

    with pytest.warns(DeprecationWarning, match=r"gradwire\.hooks\.CompressionState moved to "
                                                r"gradwire\.exchange\.CompressionState; the old name goes"):
        from gradwire.hooks import CompressionState
    assert CompressionState is gradwire.exchange.CompressionState
    with pytest.warns(DeprecationWarning, match=r"gradwire\.hooks\.scheme_for moved to gradwire\.exchange"):
        assert gradwire.hooks.scheme_for is gradwire.exchange.scheme_for
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from gradwire.hooks import compression_hook, scheme_hook  # the hooks' own names: no warning
    assert compression_hook.__module__ == scheme_hook.__module__ == "gradwire.hooks.hook"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        gradwire.hooks.nothing  # noqa: B018

    sys.modules.pop("gradwire.overlap", None)
    with pytest.warns(DeprecationWarning, match=r"gradwire\.overlap moved to gradwire\.strategies"):
        overlap = importlib.import_module("gradwire.overlap")
    assert overlap.parse_strategy is gradwire.strategies.parse_strategy
    assert overlap.AsyncGradientHandler is gradwire.strategies.AsyncGradientHandler
    assert overlap.STRATEGIES is gradwire.strategies.STRATEGIES
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: a second import is the same module, silent
        from gradwire.overlap import build_strategy
    assert build_strategy is gradwire.strategies.build_strategy


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
