"""Find import cycles between the modules of Python packages, from their source (nothing is imported).

Every ``import`` and ``from ... import`` counts, wherever it stands: a function-level import closes a cycle as
surely as a top-level one, only later, and one under ``if TYPE_CHECKING:`` (which never runs) still ties the two
modules together for the type checker and the reader: a type both need belongs in a module below them both.
An import of ``a.b.c`` is an edge to the module ``a.b.c`` alone (not to the packages ``a`` and ``a.b``), and
``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``.

Usage: ``python scripts/check_import_cycles.py [--root DIR] PACKAGE [PACKAGE ...]``. Prints one line per cycle
and exits 1 when there is any, else prints a one-line summary and exits 0.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name (a package is its ``__init__``)."""
    modules: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _base_of(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def import_graph(root: Path, packages: list[str]) -> dict[str, set[str]]:
    """Edges from each module to the modules of ``packages`` that it imports."""
    modules: dict[str, Path] = {}
    for package in packages:
        modules.update(module_files(root, package))
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _base_of(name, is_package, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found, key=lambda c: (-len(c), c))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--root", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    missing = [p for p in args.packages if not (args.root / p / "__init__.py").is_file()]
    if missing:
        print(f"check_import_cycles: error: not a package under {args.root}: {', '.join(missing)}", file=sys.stderr)
        return 2
    graph = import_graph(args.root, args.packages)
    found = cycles(graph)
    for component in found:
        print(f"import cycle ({len(component)} modules): {' <-> '.join(component)}")
    if found:
        return 1
    edges = sum(len(v) for v in graph.values())
    print(f"no import cycles: {len(graph)} modules, {edges} imports in {', '.join(args.packages)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
