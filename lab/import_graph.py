"""The import graph between the project's top-level packages and scripts.

    python -m lab.import_graph [--lines] [--include-tests] [--json]

Every ``import`` and ``from ... import`` in the project's Python files is read
with ``ast`` (nothing is imported or executed), whether it sits at the top of
a module or inside a function, and mapped to the top-level unit it names
(a package such as ``steps``, or a script such as ``worker``). Third-party and
standard-library imports are left out. Prints one line per edge::

    steps -> memory          3 imports (2 inside functions)

then every cycle between units, or "no cycles". ``--lines`` adds the lines
of code per unit. Exit code 1 when there is a cycle, so a test can hold the
layering in place.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", ".venv-lock", ".state", ".git", "build", "__pycache__", "data", "probe"}


def units(repo: Path = REPO, include_tests: bool = False) -> dict[str, list[Path]]:
    """Top-level unit name -> its Python files (a package's, or the one script's)."""
    found: dict[str, list[Path]] = {}
    for path in sorted(repo.iterdir()):
        if path.name in SKIP_DIRS or path.name.startswith("."):
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            if path.name == "tests" and not include_tests:
                continue
            found[path.name] = sorted(p for p in path.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(path).parts))
        elif path.suffix == ".py":
            found[path.stem] = [path]
    if (repo / "bench").is_dir():  # scripts, not a package, but they import the rest
        found["bench"] = sorted((repo / "bench").glob("*.py"))
    return found


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def edges(found: dict[str, list[Path]]) -> dict[tuple[str, str], list[int]]:
    """(importer, imported) -> [imports, of which inside a function]."""
    out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for unit, files in found.items():
        for path in files:
            tree = ast.parse(path.read_text(), filename=str(path))
            nested: set[int] = set()  # ids of the nodes inside a function
            for fn in ast.walk(tree):
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    nested.update(id(n) for n in ast.walk(fn) if n is not fn)
            for node in ast.walk(tree):
                for name in _imported(node):
                    target = name.split(".")[0]
                    if target in found and target != unit:
                        counts = out[(unit, target)]
                        counts[0] += 1
                        counts[1] += id(node) in nested
    return dict(out)


def cycles(graph: dict[tuple[str, str], list[int]]) -> list[list[str]]:
    """The strongly connected components with more than one unit (Tarjan)."""
    succ: dict[str, set[str]] = defaultdict(set)
    for a, b in graph:
        succ[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted({x for edge in graph for x in edge}):
        if v not in index:
            visit(v)
    return found


def line_counts(found: dict[str, list[Path]]) -> dict[str, int]:
    return {unit: sum(len(p.read_text().splitlines()) for p in files) for unit, files in found.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", action="store_true", help="also print the lines of each unit")
    parser.add_argument("--include-tests", action="store_true", help="count tests/ as a unit too")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    found = units(include_tests=args.include_tests)
    graph = edges(found)
    loops = cycles(graph)
    if args.json:
        print(json.dumps({"edges": [{"from": a, "to": b, "imports": n, "inside_functions": k}
                                    for (a, b), (n, k) in sorted(graph.items())],
                          "cycles": loops, "lines": line_counts(found) if args.lines else None}, indent=2))
        return 1 if loops else 0
    for (a, b), (n, k) in sorted(graph.items()):
        inside = f" ({k} inside functions)" if k else ""
        print(f"{a:<14} -> {b:<14} {n:>3} import{'s' if n != 1 else ''}{inside}")
    print()
    if loops:
        for loop in loops:
            print("cycle: " + " <-> ".join(loop))
    else:
        print("no cycles")
    if args.lines:
        print()
        counts = line_counts(found)
        for unit, n in sorted(counts.items()):
            print(f"{unit:<14} {n:>6} lines in {len(found[unit])} file(s)")
        print(f"{'total':<14} {sum(counts.values()):>6} lines")
    return 1 if loops else 0


if __name__ == "__main__":
    sys.exit(main())
