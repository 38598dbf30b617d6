"""docs/architecture.md tells the truth: its picture of the layers is the
import graph the code has, the code has no import cycle (between packages, or
between modules, imports under ``TYPE_CHECKING`` and inside functions
included), and every place its "to change X, open Y" table names exists."""

from __future__ import annotations

import ast
import re

import pytest

from lab.import_graph import cycles, describe_cycle, edges, mermaid_id, module_edges, units
from lab.processes import REPO

DOC = (REPO / "docs" / "architecture.md").read_text()


def drawn_edges() -> set[tuple[str, str]]:
    block = re.search(r"```mermaid\n(.*?)```", DOC, re.S)
    assert block, "docs/architecture.md has no mermaid block"
    return set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", block.group(1), re.M))


def code_edges() -> set[tuple[str, str]]:
    return {(mermaid_id(a), mermaid_id(b)) for a, b in edges(units()) if a != "bench"}


def test_the_picture_is_the_import_graph():
    drawn, real = drawn_edges(), code_edges()
    assert drawn == real, (f"in the code, not drawn: {sorted(real - drawn)}; "
                           f"drawn, not in the code: {sorted(drawn - real)}")


def test_no_import_cycle_between_packages():
    assert cycles(edges(units(include_tests=True))) == []


def test_no_import_cycle_between_modules():
    """A cycle between two modules of one package is a cycle too, and so is one closed by an import under
    ``TYPE_CHECKING`` or inside a function: neither module can be read, or changed, without the other.
    Every cycle found is named, with each import in it and where it is."""
    graph = module_edges(units(include_tests=True))
    found = cycles(graph)
    assert not found, "import cycles between modules, each with every import inside it:\n" + "\n".join(
        describe_cycle(loop, graph) for loop in found)


def test_the_module_graph_sees_every_kind_of_import(tmp_path):
    """The check above can fail: a cycle closed only under ``TYPE_CHECKING``, or by a relative import inside a
    function, is found; a package's ``__init__`` run before its modules is not an edge."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from pkg import b\nA = 1\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n")
    (pkg / "c.py").write_text("def f():\n    from . import d\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    graph = module_edges({"pkg": sorted(pkg.glob("*.py"))}, repo=tmp_path)
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    assert [p.how for p in graph[("pkg.b", "pkg.a")]] == ["TYPE_CHECKING"]
    assert [p.how for p in graph[("pkg.c", "pkg.d")]] == ["function"]
    assert "pkg.b -> pkg.a: " in describe_cycle(["pkg.a", "pkg.b"], graph)


TEMPORAL_SIDE = ("temporalio", "durable_agents.flowclient", "durable_agents.workflows", "durable_agents.activities",
                 "durable_agents.worker", "durable_agents.starter", "workflows", "activities")


def _on_temporal_side(module: str) -> bool:
    return any(module == side or module.startswith(side + ".") for side in TEMPORAL_SIDE)


@pytest.mark.process
def test_the_run_record_imports_nothing_of_temporal():
    """The engine that shows life without Temporal: no module of ``durable_agents/runrecord/`` imports the SDK or
    the project's Temporal side, at the top or inside a function, and ``python -m durable_agents.runrecord``
    starts without loading any of it."""
    imports = [(path.relative_to(REPO), node.lineno, name) for path in units()["durable_agents.runrecord"]
               for node in ast.walk(ast.parse(path.read_text()))
               for name in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                            [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
               if _on_temporal_side(name)]
    assert not imports, f"durable_agents/runrecord/ imports Temporal: {imports}"
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "durable_agents.runrecord", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "resume" in done.stdout, done.stdout + done.stderr
    loaded = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not {m for m in loaded if _on_temporal_side(m)}, sorted(m for m in loaded if _on_temporal_side(m))


PACKAGE = "durable_agents"
# Everything of the repository that is not the package: what the package may never import.
LAB_SIDE = ("lab", "lesson", "grader", "bench", "peers", "exercises", "provider", "examples", "timeline", "tests",
            "worker", "starter", "workflows", "activities")


def _in_package(unit: str) -> bool:
    return unit == PACKAGE or unit.startswith(PACKAGE + ".")


def test_the_adapter_imports_nothing_of_the_lab():
    """``durable_agents`` is the distribution a user installs (CONVENTIONS.md, "The adapter"): none of its
    modules imports anything of the repository outside it, at the top or inside a function."""
    graph = edges(units(include_tests=True))
    outside = sorted((a, b) for a, b in graph if _in_package(a) and not _in_package(b))
    assert not outside, outside
    assert not [u for u in units() if not _in_package(u) and u not in LAB_SIDE + ("bench",)], (
        "a top-level unit that is neither the package nor listed as the lab's: add it to LAB_SIDE")


@pytest.mark.process
def test_importing_the_adapter_loads_no_module_of_the_lab():
    """Every module of the package imported, in a process of its own: none of the lab's is loaded."""
    import subprocess
    import sys

    check = ("import pkgutil, importlib, sys, durable_agents\n"
             "for m in pkgutil.walk_packages(durable_agents.__path__, 'durable_agents.'):\n"
             "    m.name.endswith('.__main__') or importlib.import_module(m.name)\n"
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {LAB_SIDE!r}))")
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_core_and_the_judge_stay_apart():
    graph = edges(units())
    declared = ("durable_agents.agent", "durable_agents.tools")
    assert not [b for a, b in graph if a == "durable_agents.steps" and b not in declared], \
        "the core imports nothing outside itself but the declarations (agent.py, tools.py)"
    assert not [b for a, b in graph if a in declared and b not in declared], \
        "the declarations, beneath the core, import nothing of the project"
    assert [b for a, b in graph if a == "provider"] == ["durable_agents.storage"], \
        "the provider shares no code with its clients"
    assert not [b for a, b in graph if a == "durable_agents.storage"], "storage is neutral"
    scripts = ("starter", "worker", "durable_agents.starter", "durable_agents.worker")
    assert not [a for a, b in graph if b in scripts and a not in ("bench", "starter", "worker")], \
        "nothing imports the scripts but the lab's thin ones"


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


def _checklists() -> dict[str, str]:
    """docs/checklists.md's sections by their anchor (``add-a-step``: its text)."""
    page = (REPO / "docs" / "checklists.md").read_text()
    sections = {}
    for part in page.split("\n## ")[1:]:
        title, _, body = part.partition("\n")
        sections[re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")] = body
    return sections


def test_every_file_the_change_table_names_exists():
    """The third column, or the checklist it links (docs/checklists.md), names for adding a step, a kind of
    effect or an engine every file to touch: each exists (a file named with a function, ``path:name``,
    defines it). A placeholder (``<engine>/``) or a dotted module name is not a file. A row stays short."""
    table = DOC.split("## To change X, open Y", 1)[1].split("\n## ", 1)[0]
    rows = {row.split("|")[1].strip(): row.split("|")[3] for row in table.splitlines()
            if row.startswith("| ") and not row.startswith("| to change")}
    checklists = _checklists()
    for change in ("add a step", "add an effect kind", "add an engine"):
        assert change in rows, f"docs/architecture.md has no row {change!r}"
        assert f"checklists.md#{change.replace(' ', '-')}" in rows[change], f"the row {change!r} links no checklist"
    too_long = {change: len(follows.split()) for change, follows in rows.items() if len(follows.split()) > 40}
    assert not too_long, f"rows of docs/architecture.md over 40 words (move the list to docs/checklists.md): {too_long}"
    for change, follows in list(rows.items()):
        for anchor in re.findall(r"checklists\.md#([a-z0-9-]+)", follows):
            assert anchor in checklists, f"the row {change!r} links checklists.md#{anchor}, which is not there"
            rows[change] += checklists[anchor]
    missing = []
    for change, follows in rows.items():
        for named in re.findall(r"`([^`<>\s]+)`", follows):
            path, _, name = named.partition(":")
            if "/" not in path or not re.search(r"\.(py|md|toml|yml|yaml|json)$|/$", path):
                continue
            if not (REPO / path).exists() or (name and path.endswith(".py") and not _defines(REPO / path, name)):
                missing.append(f"{change}: {named}")
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_the_counts_of_files_to_touch_name_existing_files():
    """The closing table counts the files each change takes now, and names them: as many as it says, each
    one there."""
    section = DOC.split("## How many files a change takes", 1)[1].split("\n## ", 1)[0]
    for row in section.splitlines():
        if not row.startswith("| add "):
            continue
        after = row.split("|")[3]
        count = re.match(r"\s*(\d+)(?: more)?:", after)
        if count is None:
            continue
        files = [f for f in re.findall(r"`([^`]+)`", after) if "/" in f]
        assert int(count[1]) == len(files) and all((REPO / f).exists() for f in files), (row, files)


def _assigned(path, name: str) -> bool:
    """True if the module at ``path`` assigns ``name`` at its top level."""
    for node in ast.parse(path.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


@pytest.mark.process
def test_the_worker_shutdown_type_is_written_once_where_a_history_reader_can_import_it():
    """The failure type of an attempt its worker's shutdown cut short: one definition, in
    ``durable_agents.steps.errors``, which imports nothing, so ``durable_agents.flowclient.status`` reads histories
    without importing the activities; ``durable_agents.activities.WORKER_SHUTDOWN_TYPE`` stays importable under that
    name
    (``durable_agents.workflows.attempts``)."""
    import subprocess
    import sys

    defined = sorted(str(path.relative_to(REPO)) for files in units(include_tests=True).values() for path in files
                     if _assigned(path, "WORKER_SHUTDOWN_TYPE"))
    assert defined == ["durable_agents/steps/errors.py"], f"WORKER_SHUTDOWN_TYPE is assigned in {defined}"
    imports = [node for node in ast.parse((REPO / "durable_agents" / "steps" / "errors.py").read_text()).body
               if isinstance(node, ast.Import | ast.ImportFrom) and getattr(node, "module", None) != "__future__"]
    assert not imports, "durable_agents/steps/errors.py imports nothing: every engine and reader imports it"
    check = ("import sys, durable_agents.flowclient.status\n"
             "assert 'durable_agents.activities' not in sys.modules, 'flowclient.status imported the activities'\n"
             "import durable_agents.activities as activities, durable_agents.steps.errors as errors\n"
             "assert activities.WORKER_SHUTDOWN_TYPE == durable_agents.flowclient.status.WORKER_SHUTDOWN_TYPE == "
             "errors.WORKER_SHUTDOWN_TYPE == 'WorkerShutdown'")
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_workflows_schedule_their_attempts_in_one_place():
    # The attempt loop (an activity per attempt, a timer per backoff) is written once,
    # durable_agents.workflows.attempts' StepAttempts, for the flow and the agent loop alike; before_live.py is the
    # frozen path of old runs.
    scheduling = re.compile(r"workflow\.(execute_activity\w*|start_activity\w*|sleep)\(")
    found = {path.name for path in (REPO / "durable_agents" / "workflows").glob("*.py")
             if scheduling.search(path.read_text())}
    assert found == {"attempts.py", "before_live.py"}, found


def _code_words(path) -> list[tuple[int, str]]:
    """What a module's code says, its prose left out: every name it defines, imports or reads, and every string
    it holds that is not a docstring (a string standing as a statement), each with its line."""
    tree = ast.parse(path.read_text())
    prose = {id(node.value) for node in ast.walk(tree)  # docstrings, a constant's too: a string as a statement
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            words.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            words.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            words.append((node.lineno, node.attr))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            words.append((node.lineno, node.name))
        elif isinstance(node, ast.arg):
            words.append((node.lineno, node.arg))
        elif isinstance(node, ast.ImportFrom):
            words += [(node.lineno, node.module or "")] + [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            words += [(node.lineno, a.name) for a in node.names]
    return words


def _engine_words(paths) -> list[str]:
    from lab import registry

    banned = {word.lower() for e in registry.engines() for word in (e.name, e.cli or e.name)}
    return [f"{path.name}:{line}: {word!r}" for path in paths for line, word in _code_words(path)
            if any(b in word.lower() for b in banned)]


def test_the_core_names_no_engine():
    """``durable_agents/steps/`` is engine-agnostic in its code: no name it defines, imports or reads, and no string it
    holds, names a registered engine (``lab.registry``); each engine's shapes and crash points are its package's.
    Docstrings and comments may say which engine does what."""
    found = _engine_words(sorted((REPO / "durable_agents" / "steps").glob("*.py")))
    assert not found, "durable_agents/steps/ names an engine (move it to the engine's package):\n" + "\n".join(found)


def test_the_core_check_can_fail(tmp_path):
    """The check above finds an engine's name in a class name and in a string, not in a docstring."""
    module = tmp_path / "m.py"
    module.write_text('"""Temporal and dbos, in prose."""\nclass DbosRow:\n    """runrecord"""\nX = "temporal:x"\n')
    found = _engine_words([module])
    assert [line.split(": ", 1)[1] for line in found] == ["'DbosRow'", "'temporal:x'"], found
