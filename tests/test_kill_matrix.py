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
from pathlib import Path

import pytest

from durable_agents.steps import crashpoints, startedline
from durable_agents.testing.matrix import MatrixError, Report, Row, points_of
from lab.processes import REPO, Proc, free_port
from tests.agents.mistakes import orders
from tests.loop_support import REFUND, refund_task

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


def test_random_mode_fails_a_recorded_turn_asked_after_a_kill_and_allows_one_lost_answer_per_kill():
    from durable_agents.testing.matrix import _asked_again, _Kill, _recorded_turns

    assert _recorded_turns({"turns": [{"turn": 1, "status": "completed"}, {"turn": 2, "status": "running"}]}) == {"1"}
    assert _recorded_turns({"steps": [{"name": "turn-1", "status": "completed"}, {"name": "turn-1/call-0",
                                                                                  "status": "completed"},
                                      {"name": "turn-2", "status": "pending"}]}) == {"1"}
    kills = [_Kill(1.5, {"1": 1})]
    lost = Row("runrecord", "random #1: 1 kill(s)", "passed", "r", turns={"1": 1, "2": 2, "3": 1})
    assert _asked_again(lost, kills) == [] and "turn 2 asked 2 times" in lost.reasons[-1]
    again = Row("runrecord", "random #1: 1 kill(s)", "passed", "r", turns={"1": 2, "2": 1})
    (failure,) = _asked_again(again, kills)
    assert "turn 1 was recorded when the kill at 1.50 s landed, asked 1 time(s) by then and 2 at the end" in failure
    thrice = Row("temporal", "random #1: 1 kill(s)", "passed", "r", turns={"1": 1, "2": 3})
    assert "turn 2 asked 3 times with 1 kill(s)" in _asked_again(thrice, kills)[0]


def test_random_mode_refuses_nonsense_counts():
    from durable_agents.testing import KillMatrix

    with pytest.raises(MatrixError, match="runs >= 1 and kills >= 0"):
        KillMatrix("a:B", "t", engines=("runrecord",)).run_random(runs=0)


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


def test_a_hook_that_finds_the_record_wrong_fails_its_row_and_the_run_still_ends(kill_matrix, scheduler):
    """``at_kill`` and ``at_end`` see the killed run (its record's path, what the killed process and the one that
    took it over printed); an assertion of theirs fails the point's row with its words, the run still resumed
    and judged as any other."""
    looked = []

    def at_kill(k) -> None:
        looked.append(("kill", k.point, k.killed_output.count("CRASH_AT="), Path(k.env["RUNRECORD_DB"]).exists()))
        assert k.status()["status"] == "completed", "the record says the run is still open"

    def at_end(k) -> None:
        looked.append(("end", k.point, k.status()["status"], startedline.started_steps(k.takeover_output)[:1]))

    report = kill_matrix(SCHEDULER, BOOK, params={"attendee": "ana@example.com"}, env={"SCHEDULER_URL": scheduler},
                         cwd=REPO, engines=("runrecord",), points=["tool:book_room:after_effect@1"], at_kill=at_kill,
                         at_end=at_end)
    assert looked == [("kill", "tool:book_room:after_effect@1", 1, True),
                      ("end", "tool:book_room:after_effect@1", "completed", ["turn-2/call-0"])], looked
    (row,) = report.rows
    assert row.verdict == "failed" and row.status == "completed", row
    assert row.reasons[0].startswith("at_kill: AssertionError: the record says the run is still open"), row.reasons
    assert [e["state"] for e in row.effects] == ["applied", "applied"]  # judged as any other kill
    with pytest.raises(AssertionError, match="at_kill: AssertionError: the record says"):
        report.assert_ok()


@pytest.mark.timeout(300)
def test_random_kills_on_the_example_agent_land_and_pass_on_temporal_and_the_run_record(kill_matrix, scheduler):
    """Random mode: three runs, three kills at seeded random moments, the model's words and call ids varied.
    The runs share the scheduler's one room, so two of them find it booked (refused back to the model): the
    same end, nothing applied, as their engine recorded."""
    report = kill_matrix.random(SCHEDULER, BOOK, runs=3, kills=3, seed=7, params={"attendee": "ana@example.com"},
                                env={"SCHEDULER_URL": scheduler}, cwd=REPO)
    report.assert_ok()
    assert [(r.engine, r.point.split(":")[0]) for r in report.rows] == [
        (e, f"random #{i}") for e in ("temporal", "runrecord") for i in (1, 2, 3)]
    for engine in ("temporal", "runrecord"):
        assert report.reference[engine]["kills_landed"] >= 1, report.table()
    assert any(r.point.endswith(("1 kill(s)", "2 kill(s)", "3 kill(s)")) for r in report.rows), report.table()
    states = sorted(e["state"] for r in report.rows if r.engine == "runrecord" for e in r.effects)
    assert "applied" in states and set(states) <= {"applied", "refused"}, states


def test_random_mode_reports_a_handler_that_drops_its_key(kill_matrix, shop):
    report = kill_matrix.random("tests.agents.mistakes:FRESH_ID", "Order tea.", runs=2, kills=2, seed=3, env=shop,
                                cwd=REPO, engines=("runrecord",), probe=orders)
    assert not report.ok and "holds nothing applied under the key" in report.findings[0], report.explain()


# ---------------------------------------------------------------- the lab's own agent: its first user


@pytest.mark.timeout(900)
def test_the_lab_s_refund_agent_passes_the_matrix_on_temporal_and_the_run_record(kill_matrix, provider):
    """The refund agent as a user's (six turns, five effects), its lookups at the provider judging each effect,
    the stand-in counting its turns: the points of its second order (a lookup, a lost answer, the refund,
    between the refund and its email, the email), the ticket and the last answer. (The loop's own tests,
    tests/test_loop_*.py, take the first order's points through the matrix, on DBOS too; every point on
    every engine, 40 kills, takes about 4 minutes: too long for the suite.)"""
    env, params = {"PROVIDER_URL": provider.url}, {"email": "ada@example.com"}
    second = ["tool:lookup_order:after_call@2", "turn:after_answer@4", "tool:issue_refund:after_effect@2",
              "{engine}:loop:between_calls@2", "tool:send_email:after_effect@2", "tool:create_ticket:after_effect@1",
              "turn:after_answer@6"]
    for engine in ("temporal", "runrecord"):
        points = [p.format(engine=engine) for p in second]
        report = kill_matrix(REFUND, refund_task(provider.url), params=params, env=env, cwd=REPO,
                             count_turns=True, engines=(engine,), points=points)
        report.assert_ok()
        assert sorted(r.point for r in report.rows) == sorted(points), report.table()
        assert all(len(r.effects) == 5 and {e["state"] for e in r.effects} == {"applied"} for r in report.rows)
        lost = next(r for r in report.rows if r.point.startswith("turn:after_answer"))
        turn = lost.point.rpartition("@")[2]
        assert lost.turns == {str(t): 1 + (str(t) == turn) for t in range(1, 7)}, lost.turns


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


def test_without_a_probe_a_handler_that_changes_its_key_is_not_judged_at_the_kill_and_fails_the_report(
        kill_matrix, shop):
    """Its lookup asks by the key it was given, under which the service holds nothing: the kill's row cannot
    count a second application (the probe does, in the test above), so it says not judged, never passed."""
    report = kill_matrix("tests.agents.mistakes:ATTEMPT_IN_KEY", "Order tea.", env=shop, cwd=REPO,
                         engines=("runrecord",), points=["tool:place_order:after_effect"])
    (row,) = report.rows
    assert row.verdict == "not judged" and "give a probe" in row.reasons[0], report.explain()
    assert not report.ok and "(ctx.key)" in report.findings[0], report.findings


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

