"""The import graph of the project: between its top-level packages and
scripts, and between its modules.

    python -m lab.import_graph [--lines] [--include-tests] [--json]

Every ``import`` and ``from ... import`` in the project's Python files is read
with ``ast`` (nothing is imported or executed), whether it sits at the top of
a module, inside a function or under ``if TYPE_CHECKING:``, and mapped to the
top-level unit it names (a package such as ``steps``, or a script such as
``worker``). Third-party and standard-library imports are left out. Prints one
line per edge::

    steps -> memory          3 imports (2 inside functions)

then every cycle between units, or "no cycles", then every cycle between
modules, or "no module cycles". ``--lines`` adds the lines of code per unit.
Exit code 1 when there is a cycle of either kind, so a test can hold the
layering in place.

Between modules (``module_edges``), an import names the module it loads:
``from steps import flow`` is an edge to ``durable_agents.steps.flow``, ``from durable_agents.steps.plan
import FLOW`` one to ``durable_agents.steps.plan`` (the package ``durable_agents/steps/__init__.py`` that
Python runs first is not an edge: every module of a package would otherwise
be in a cycle with it). An import under ``TYPE_CHECKING`` is an edge like any
other: a type checker follows it, and so does the reader, who cannot read one
module without the other.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", ".venv-lock", ".state", ".git", "build", "__pycache__", "data", "probe"}


PACKAGE = "durable_agents"
"""The adapter's package: each of its subpackages and modules is a unit of its own (``durable_agents.steps``,
``durable_agents.worker``), and its ``__init__`` the unit ``durable_agents``, so the layers inside the
package are held as the layers outside it are."""


def _package_units(path: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for sub in sorted(path.iterdir()):
        if sub.name in SKIP_DIRS or sub.name.startswith("."):
            continue
        if sub.is_dir() and (sub / "__init__.py").exists():
            found[f"{PACKAGE}.{sub.name}"] = sorted(
                p for p in sub.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(sub).parts))
        elif sub.suffix == ".py":
            found[PACKAGE if sub.stem == "__init__" else f"{PACKAGE}.{sub.stem}"] = [sub]
    return found


def units(repo: Path = REPO, include_tests: bool = False) -> dict[str, list[Path]]:
    """Unit name -> its Python files: a top-level package's, a script's, or one part of the adapter's
    package (``PACKAGE``)."""
    found: dict[str, list[Path]] = {}
    for path in sorted(repo.iterdir()):
        if path.name in SKIP_DIRS or path.name.startswith("."):
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            if path.name == "tests" and not include_tests:
                continue
            if path.name == PACKAGE:
                found.update(_package_units(path))
                continue
            found[path.name] = sorted(p for p in path.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(path).parts))
        elif path.suffix == ".py":
            found[path.stem] = [path]
    if (repo / "bench").is_dir():  # scripts, not a package, but they import the rest
        found["bench"] = sorted((repo / "bench").glob("*.py"))
    return found


def unit_of(dotted: str, found: Mapping[str, object]) -> str | None:
    """The unit a dotted module name belongs to: the longest unit name it starts with."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in found:
            return ".".join(parts[:n])
    return None


def mermaid_id(unit: str) -> str:
    """A unit's node in docs/architecture.md's picture: ``durable_agents.steps`` is ``durable_agents_steps``."""
    return unit.replace(".", "_")


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        # ``from durable_agents import worker`` names the module ``durable_agents.worker``
        return [f"{node.module}.{alias.name}" for alias in node.names]
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
                for target in dict.fromkeys(unit_of(name, found) for name in _imported(node)):
                    if target is not None and target != unit:
                        counts = out[(unit, target)]
                        counts[0] += 1
                        counts[1] += id(node) in nested
    return dict(out)


@dataclass(frozen=True)
class Import:
    """Where one module imports another: the file, the line, and how (at the top of the module, inside a
    function, or under ``if TYPE_CHECKING:``)."""

    path: Path
    line: int
    how: str  # "top", "function" or "TYPE_CHECKING"

    def __str__(self) -> str:
        where = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{where}:{self.line}" + ("" if self.how == "top" else f" ({self.how})")


def module_name(path: Path, repo: Path = REPO) -> str:
    """``durable_agents/steps/plan.py`` -> ``durable_agents.steps.plan``; ``durable_agents/steps/__init__.py`` ->
    ``durable_agents.steps``; ``worker.py`` -> ``worker``."""
    parts = path.relative_to(repo).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_with_how(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a module, with how it is reached (see ``Import.how``)."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def walk(node: ast.AST, how: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, how))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                walk(child, "function")
            elif isinstance(child, ast.If) and _type_checking(child.test) and how == "top":
                for stmt in child.body:
                    walk(ast.Module(body=[stmt], type_ignores=[]), "TYPE_CHECKING")
                for stmt in child.orelse:
                    walk(ast.Module(body=[stmt], type_ignores=[]), how)
            else:
                walk(child, how)

    walk(tree, "top")
    return found


def _longest_known(dotted: str, known: set[str]) -> str | None:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return None


def module_edges(found: dict[str, list[Path]], repo: Path = REPO) -> dict[tuple[str, str], list[Import]]:
    """(importing module, imported module) -> every place the one imports the other (module docstring)."""
    known = {module_name(path, repo) for files in found.values() for path in files}
    out: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for files in found.values():
        for path in files:
            me = module_name(path, repo)
            package = me if path.name == "__init__.py" else me.rpartition(".")[0]
            for node, how in _imports_with_how(ast.parse(path.read_text(), filename=str(path))):
                targets: list[str | None]
                if isinstance(node, ast.Import):
                    targets = [_longest_known(alias.name, known) for alias in node.names]
                else:
                    base = node.module or ""
                    if node.level:  # relative: from the importing module's package, one level up per extra dot
                        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                        base = ".".join([*anchor, *([base] if base else [])])
                    targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known
                               else _longest_known(base, known) for alias in node.names]
                for target in dict.fromkeys(targets):
                    if target is not None and target != me:
                        out[(me, target)].append(Import(path, node.lineno, how))
    return dict(out)


def describe_cycle(component: list[str], graph: dict[tuple[str, str], list[Import]]) -> str:
    """One cycle (a strongly connected component) named with every import inside it, where it is and how."""
    inside = set(component)
    lines = [" <-> ".join(component) + ":"]
    for (a, b), places in sorted(graph.items()):
        if a in inside and b in inside:
            lines.append(f"  {a} -> {b}: " + ", ".join(str(p) for p in places))
    return "\n".join(lines)


def cycles(graph: Mapping[tuple[str, str], object]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan): units, or modules."""
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
    modules = module_edges(found)
    module_loops = cycles(modules)
    if args.json:
        print(json.dumps({"edges": [{"from": a, "to": b, "imports": n, "inside_functions": k}
                                    for (a, b), (n, k) in sorted(graph.items())],
                          "cycles": loops, "module_cycles": [
                              {"modules": loop, "imports": [{"from": a, "to": b, "at": [str(p) for p in places]}
                                                            for (a, b), places in sorted(modules.items())
                                                            if a in loop and b in loop]}
                              for loop in module_loops],
                          "lines": line_counts(found) if args.lines else None}, indent=2))
        return 1 if loops or module_loops else 0
    for (a, b), (n, k) in sorted(graph.items()):
        inside = f" ({k} inside functions)" if k else ""
        print(f"{a:<28} -> {b:<28} {n:>3} import{'s' if n != 1 else ''}{inside}")
    print()
    if loops:
        for loop in loops:
            print("cycle: " + " <-> ".join(loop))
    else:
        print("no cycles")
    for loop in module_loops:
        print("module cycle: " + describe_cycle(loop, modules))
    if not module_loops:
        print("no module cycles")
    if args.lines:
        print()
        counts = line_counts(found)
        for unit, n in sorted(counts.items()):
            print(f"{unit:<28} {n:>6} lines in {len(found[unit])} file(s)")
        print(f"{'total':<14} {sum(counts.values()):>6} lines")
    return 1 if loops or module_loops else 0


if __name__ == "__main__":
    sys.exit(main())
