"""docs/architecture.md tells the truth: its picture of the layers is the
import graph the code has, the code has no import cycle, and every place its
"to change X, open Y" table names exists."""

from __future__ import annotations

import ast
import re

from lab.import_graph import cycles, edges, units
from lab.processes import REPO

DOC = (REPO / "docs" / "architecture.md").read_text()


def drawn_edges() -> set[tuple[str, str]]:
    block = re.search(r"```mermaid\n(.*?)```", DOC, re.S)
    assert block, "docs/architecture.md has no mermaid block"
    return set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", block.group(1), re.M))


def code_edges() -> set[tuple[str, str]]:
    return {(a, b) for a, b in edges(units()) if a != "bench"}


def test_the_picture_is_the_import_graph():
    drawn, real = drawn_edges(), code_edges()
    assert drawn == real, (f"in the code, not drawn: {sorted(real - drawn)}; "
                           f"drawn, not in the code: {sorted(drawn - real)}")


def test_no_import_cycle_between_packages():
    assert cycles(edges(units(include_tests=True))) == []


def test_the_core_and_the_judge_stay_apart():
    graph = edges(units())
    assert not [b for a, b in graph if a == "steps"], "steps imports nothing outside itself"
    assert [b for a, b in graph if a == "provider"] == ["storage"], "the provider shares no code with its clients"
    assert not [b for a, b in graph if a == "storage"], "storage is neutral"
    assert not [a for a, b in graph if b in ("starter", "worker") and a != "bench"], "nothing imports the scripts"


def _defines(path, dotted: str) -> bool:
    """True if the module at ``path`` defines ``dotted`` (``Name`` or ``Class.method``)."""
    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        found = next((n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                      and n.name == part), None)
        if found is None:
            return False
        scope = found.body
    return True


def test_every_place_the_change_table_names_exists():
    table = DOC.split("## To change X, open Y", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| to change")]
    named = [re.search(r"`([^`]+)`", row.split("|")[2]) for row in rows]
    assert len(rows) >= 10 and all(named), rows
    for match in named:
        assert match is not None
        path, _, name = match.group(1).partition(":")
        assert (REPO / path).exists(), f"docs/architecture.md names {path}, which does not exist"
        if name:
            assert _defines(REPO / path, name), f"{path} defines no {name}"


def _assigned(path, name: str) -> bool:
    """True if the module at ``path`` assigns ``name`` at its top level."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def test_the_worker_shutdown_type_is_written_once_where_a_history_reader_can_import_it():
    """The failure type of an attempt its worker's shutdown cut short: one definition, in ``steps.errors``,
    which imports nothing, so ``flowclient.status`` reads histories without importing the activities;
    ``activities.WORKER_SHUTDOWN_TYPE`` stays importable under that name (``workflows.attempts``)."""
    import subprocess
    import sys

    defined = sorted(str(path.relative_to(REPO)) for files in units(include_tests=True).values() for path in files
                     if _assigned(path, "WORKER_SHUTDOWN_TYPE"))
    assert defined == ["steps/errors.py"], f"WORKER_SHUTDOWN_TYPE is assigned in {defined}"
    imports = [node for node in ast.parse((REPO / "steps" / "errors.py").read_text()).body
               if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "module", None) != "__future__"]
    assert not imports, "steps/errors.py imports nothing: every engine and reader imports it"
    check = ("import sys, flowclient.status\n"
             "assert 'activities' not in sys.modules, 'flowclient.status imported the activities'\n"
             "import activities, steps.errors\n"
             "assert activities.WORKER_SHUTDOWN_TYPE == flowclient.status.WORKER_SHUTDOWN_TYPE == "
             "steps.errors.WORKER_SHUTDOWN_TYPE == 'WorkerShutdown'")
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
