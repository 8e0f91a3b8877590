"""Rules a newcomer relies on when finding their way in src/: checked by reading the source, not by running it.

- One name per concept: no two classes in the package share a name, so a
  name found in a traceback or a doc leads to one place.
- The network spec is parsed where the user gives it (the CLI's argument
  type, the environment / process-boundary reader, the public constructor)
  and passed on as a :class:`~gradwire.net.spec.NetSpec` everywhere else.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import gradwire

ROOT = Path(gradwire.__file__).parent

#: the most places in src/ that may call ``parse_spec`` (module doc)
MAX_PARSE_SPEC_SITES = 3


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text())) for path in sorted(ROOT.rglob("*.py"))]


def class_names() -> dict[str, list[str]]:
    """Every class defined in the package (nested ones too) -> the files that define one of that name."""
    found: dict[str, list[str]] = defaultdict(list)
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found[node.name].append(str(path.relative_to(ROOT)))
    return found


def parse_spec_sites() -> list[str]:
    """``file:line`` of every call of ``parse_spec`` in the package (by any name it is imported or reached as)."""
    sites = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if name == "parse_spec":
                    sites.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return sites


def test_classes_were_read() -> None:
    names = class_names()
    assert "NetSpec" in names and "GradwireProcessGroup" in names


def test_no_two_classes_share_a_name() -> None:
    shared = {name: files for name, files in class_names().items() if len(files) > 1}
    assert not shared, f"classes that share a name (give each one that says what it is): {shared}"


def test_the_network_spec_is_parsed_at_few_sites() -> None:
    sites = parse_spec_sites()
    assert sites, "no call of parse_spec found: did the parser move?"
    assert len(sites) <= MAX_PARSE_SPEC_SITES, (
        f"parse_spec is called at {len(sites)} sites: {sites}; parse where the user gives the spec and pass the "
        "NetSpec on (a string only at a process boundary)")


def test_parse_spec_is_not_reached_by_another_name() -> None:
    """``from ... import parse_spec as p`` would hide a call site from the count above."""
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    assert not (alias.name == "parse_spec" and alias.asname), f"{path}: parse_spec imported as " \
                                                                               f"{alias.asname}"
