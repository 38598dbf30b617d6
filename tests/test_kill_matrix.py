"""The kill matrix (``durable_agents.testing``) through its pytest plugin, as a user runs it on their own agent:
the example agent passes at every crash point on Temporal and the run record; the mistakes a user can make with
a tool's effect (tests/agents/mistakes.py) each fail at the point where the effect is applied twice, with the
effect named; the plugin reports in pytest's own output and as JSON.

The matrix's own pieces (the points of a trace, the occurrence a crash point kills at) are held by fast tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from durable_agents.steps import crashpoints
from durable_agents.testing.matrix import MatrixError, Report, Row, points_of
from lab.processes import REPO, Proc, free_port
from tests.agents.mistakes import orders

SCHEDULER = "examples.scheduler.agent:AGENT"
BOOK = "Book a room on 2027-01-12 for the planning meeting and invite the attendee."


# ---------------------------------------------------------------- fast: the pieces


def test_a_trace_becomes_each_point_at_each_time_it_was_reached():
    assert points_of(["turn:after_answer", "tool:a:after_effect", "turn:after_answer"]) == [
        "turn:after_answer@1", "tool:a:after_effect@1", "turn:after_answer@2"]


def test_crash_at_names_the_time_a_point_kills_at():
    parsed = crashpoints._parse("turn:after_answer@2, tool:a:after_effect,x@0,turn:after_answer@3")
    assert parsed == {"turn:after_answer": frozenset({2, 3}), "tool:a:after_effect": frozenset({1}),
                      "x@0": frozenset({1})}


def test_a_report_fails_on_a_failed_row_or_on_what_the_unkilled_run_shows():
    passed = Row("runrecord", "turn:after_answer@1", "passed", "r1")
    clean = Report("a:B", "t", [passed], {"runrecord": {"run_id": "ref", "findings": []}}, 1.0)
    assert clean.ok
    clean.assert_ok()
    found = Report("a:B", "t", [passed], {"runrecord": {"run_id": "ref", "findings": ["x: not under its key"]}}, 1.0)
    with pytest.raises(AssertionError, match="unkilled run\\(s\\) already show 1 mistake"):
        found.assert_ok()
    failed = Report("a:B", "t", [Row("temporal", "p@1", "failed", "r2", reasons=["order of tea: applied 2 times"])],
                    {}, 1.0)
    with pytest.raises(AssertionError, match="temporal, killed at p@1 .*\n  - order of tea: applied 2 times"):
        failed.assert_ok()
    assert "p@1" in failed.table() and failed.to_json()["ok"] is False


def test_an_unknown_engine_is_refused_naming_the_engines():
    from durable_agents.testing import KillMatrix

    with pytest.raises(MatrixError, match="choose from temporal, runrecord, dbos"):
        KillMatrix("a:B", "t", engines=("temporal", "airflow"))


# ---------------------------------------------------------------- the example agent: every point passes


@pytest.fixture
def scheduler(tmp_path):
    port = free_port()
    service = Proc("scheduler", [sys.executable, "-m", "examples.scheduler.service", "--db",
                                 str(tmp_path / "scheduler.db"), "--port", str(port)])
    try:
        service.wait_for_line("scheduler listening", timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        service.kill()


@pytest.mark.timeout(600)
def test_the_example_agent_passes_at_every_point_on_temporal_and_the_run_record(kill_matrix, scheduler):
    report = kill_matrix(SCHEDULER, BOOK, params={"attendee": "ana@example.com"},
                         env={"SCHEDULER_URL": scheduler}, cwd=REPO)
    report.assert_ok()
    for engine in ("temporal", "runrecord"):
        points = {r.point for r in report.rows if r.engine == engine}
        # each turn's answer, each tool's call, between calls and between turns: all the run reached
        assert {"turn:after_answer@1", "turn:after_answer@3", "tool:find_slots:after_call@1",
                "tool:book_room:after_effect@1", "tool:send_invite:after_effect@1",
                f"{engine}:loop:between_calls@1", f"{engine}:loop:after_turn@2"} <= points, points
    killed_answer = next(r for r in report.rows if r.point == "turn:after_answer@2" and r.engine == "temporal")
    assert killed_answer.turns == {"1": 1, "2": 2, "3": 1} and "turn 2 asked twice" in killed_answer.reasons[0]
    booked = next(r for r in report.rows if r.point == "tool:book_room:after_effect@1" and r.engine == "runrecord")
    assert [e["state"] for e in booked.effects] == ["applied", "applied"] and booked.turns == {"1": 1, "2": 1, "3": 1}


@pytest.mark.timeout(300)
def test_the_example_agent_passes_on_dbos(kill_matrix, scheduler):
    report = kill_matrix(SCHEDULER, BOOK, params={"attendee": "ana@example.com"}, env={"SCHEDULER_URL": scheduler},
                         cwd=REPO, engines=("dbos",), points=["tool:book_room:after_effect", "dbos:loop:after_turn@1",
                                                             "turn:after_answer@2"])
    report.assert_ok()
    assert [r.point for r in report.rows] == ["dbos:loop:after_turn@1", "turn:after_answer@2",
                                              "tool:book_room:after_effect@1"]


# ---------------------------------------------------------------- a user's mistakes: each caught where it bites


@pytest.fixture
def shop(tmp_path, monkeypatch):
    db = tmp_path / "shop.db"
    monkeypatch.setenv("SHOP_DB", str(db))  # the probe reads it in this process
    return {"SHOP_DB": str(db)}


MISTAKES = {
    # agent: (the point the effect is applied twice at, what the unkilled run already shows)
    "FRESH_ID": ("tool:place_order:after_effect@1", "holds nothing applied under the key"),
    "ATTEMPT_IN_KEY": ("tool:place_order:after_effect@1", "holds nothing applied under the key"),
    "READ_ONLY_WRITER": ("tool:place_order:after_call@1", None),
}


@pytest.mark.parametrize("agent", list(MISTAKES))
def test_a_mistake_fails_at_the_point_it_applies_an_effect_twice_naming_it(agent, kill_matrix, shop):
    twice_at, unkilled = MISTAKES[agent]
    report = kill_matrix(f"tests.agents.mistakes:{agent}", "Order tea.", env=shop, cwd=REPO, engines=("runrecord",),
                         probe=orders)
    failed = {r.point: r for r in report.rows if r.verdict == "failed"}
    assert list(failed) == [twice_at], report.table() + "\n" + report.explain()
    assert "order of tea: applied 2 times, 1 in the unkilled run" in failed[twice_at].reasons[0]
    if unkilled:
        assert len(report.findings) == 1 and unkilled in report.findings[0], report.findings
    with pytest.raises(AssertionError, match=f"killed at {twice_at}"):
        report.assert_ok()


def test_the_honest_shop_passes_and_a_mistake_fails_on_temporal_too(kill_matrix, shop):
    honest = kill_matrix("tests.agents.mistakes:HONEST", "Order tea.", env=shop, cwd=REPO, engines=("temporal",),
                         probe=orders, points=["tool:place_order:after_effect"])
    honest.assert_ok()
    fresh = kill_matrix("tests.agents.mistakes:FRESH_ID", "Order tea.", env=shop, cwd=REPO, engines=("temporal",),
                        probe=orders, points=["tool:place_order:after_effect"])
    (row,) = fresh.rows
    assert row.verdict == "failed" and "order of tea: applied 2 times" in row.reasons[0], fresh.explain()


def test_without_a_probe_a_tool_with_no_lookup_is_not_judged_never_passed(kill_matrix, shop):
    """A tool with an effect and no lookup by key: the matrix cannot ask its service, and says so."""
    report = kill_matrix("tests.agents.notebook:NOTEBOOK", "Go through page 1 of my notebook.",
                         params={"owner": "ana@example.com"}, env={"NOTEBOOK_DB": shop["SHOP_DB"]}, cwd=REPO,
                         engines=("runrecord",), points=["tool:archive:after_effect"])
    (row,) = report.rows
    assert row.verdict == "not judged" and "archive" in row.reasons[0] and "declares no lookup" in row.reasons[0]
    report.assert_ok()  # not judged is not a failure; the table shows it


# ---------------------------------------------------------------- the plugin, as pytest loads it


@pytest.mark.process
def test_the_plugin_reports_in_pytest_s_output_and_as_json(tmp_path):
    """A user's test file, run by pytest in a process of its own: the plugin is loaded from the package's entry
    point, the failing kill is explained in the failure output, the table printed at the end, and
    ``--durability-report`` written."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_my_agent.py").write_text(textwrap.dedent('''
        import os
        from tests.agents.mistakes import orders

        def test_fresh_ids_are_caught(kill_matrix, tmp_path):
            os.environ["SHOP_DB"] = str(tmp_path / "shop.db")
            report = kill_matrix("tests.agents.mistakes:FRESH_ID", "Order tea.", env={"SHOP_DB": os.environ["SHOP_DB"]},
                                 engines=("runrecord",), probe=orders, points=["tool:place_order:after_effect"])
            report.assert_ok()
    '''))
    out = tmp_path / "report.json"
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--rootdir", str(project), "--durability-report", str(out), str(project)],
                          cwd=project, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "runrecord, killed at tool:place_order:after_effect@1" in done.stdout, done.stdout
    assert "order of tea: applied 2 times, 1 in the unkilled run" in done.stdout
    assert "kill matrix" in done.stdout and "tool:place_order:after_effect@1  runrecord  failed" in done.stdout
    (written,) = json.loads(out.read_text())
    assert written["agent"] == "tests.agents.mistakes:FRESH_ID" and written["ok"] is False
    assert [r["verdict"] for r in written["rows"]] == ["failed"]
    assert time.monotonic() - began < 300


@pytest.mark.process
def test_the_plugin_starts_nothing_in_a_session_that_asks_nothing(tmp_path):
    """Loaded in every session (the lab's own too): a session whose tests take none of its fixtures starts no
    dev server and writes no report."""
    project = tmp_path / "plain"
    project.mkdir()
    (project / "test_plain.py").write_text("def test_nothing():\n    assert True\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--rootdir", str(project), "--trace-config", str(project)], cwd=project,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "durable_agents.testing.plugin" in done.stdout and "kill matrix" not in done.stdout

