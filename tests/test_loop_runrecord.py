"""The agent loop on the run record (``python -m durable_agents.runrecord loop``), proved with real processes: the
provider (which counts effects and order lookups), the model stand-in (``durable_agents.testing.standin``, reached
through ``LLM_BASE_URL``, which counts every request by run and turn), and ``python -m durable_agents.runrecord``
processes killed by SIGKILL at each crash point of the loop, then resumed without it.

The task names two orders with something left to refund, so the scripted model takes six turns: a lookup,
a refund and its email, the second lookup, its refund and email, the ticket, the final answer (turns 2 and
4 carry two calls). In every kill test: each effect applied once at the provider (2 refunds, 2 emails, 1
ticket), no recorded turn asked again (the stand-in's count), the run completed.

In process (``durable_agents.runrecord.Runner`` with a model of the test's, against the provider process): a bad tool
call answered ``refused`` with nothing applied, a 30-turn run whose every prompt keeps to the window's bounds
while the record holds every turn, and a resume that derives the same window as the process before it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from durable_agents.drafting import OfflineModel, ScriptedModel
from durable_agents.memory import Message, approx_tokens
from durable_agents.providerclient import ProviderClient, fetch_effects, seed_orders
from durable_agents.runrecord import Runner, RunRecord
from durable_agents.runrecord.plans import LoopRunPlan, loop_inputs
from durable_agents.runrecord.status import status_of
from durable_agents.runrecord.store import _SCHEMA_V1, _UPGRADES, SCHEMA_VERSION
from durable_agents.steps import startedline
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.loop import AskedCall, LoopPlan, ModelAnswer, TurnRequest, tool_key, turn_message
from durable_agents.steps.retry import SAME_ERROR_LIMIT
from durable_agents.testing.standin import ModelStandIn, turns_asked
from lab.engines import started_steps
from lab.processes import REPO
from tests.loop_support import (
    BAD_LOOP_INPUT,
    CUSTOMER,
    ORDERS,
    OUTAGES_THAT_CLEAR,
    SAME_ERROR_FAILS,
    TASK,
    TURNS,
    assert_each_effect_once,
    assert_failed_at_the_turn_limit,
    assert_resumed_asking_and_applying_once,
    assert_stopped_by_the_same_error,
    loop_matrix,
    model_env,
)
from tests.support import finished, status_json

# ---------------------------------------------------------------- the parts


@pytest.fixture
def loop_runner(runrecord, provider, standin):
    """``python -m durable_agents.runrecord ...`` on this test's record and provider, its model the stand-in; the task's
    orders seeded at the provider."""
    seed_orders(provider.url, ORDERS)

    def start(*args: str, crash_at: str | None = None):
        env = model_env(standin)
        if crash_at:
            env["CRASH_AT"] = crash_at
        return runrecord(*args, env=env)

    return start


def load(db, run_id: str):
    with RunRecord(db) as record:
        return record.load(run_id), record.intents(run_id)


# ---------------------------------------------------------------- kills at each crash point


# point -> (the step the kill leaves current in the record, the turns asked twice)
CRASHES = {
    "turn:after_answer@1": ("turn-1", {"1"}),
    "tool:issue_refund:after_effect@1": ("turn-2/call-0", set()),
    "runrecord:loop:between_calls@1": ("turn-2/call-1", set()),
    "runrecord:loop:after_turn@1": ("turn-2", set()),
}


def test_a_kill_at_each_crash_point_resumes_with_each_effect_once(kill_matrix, provider):
    """The loop through the kill matrix (``durable_agents.testing``, the one mechanism a user runs too), one
    killed run per point, each resumed by ``resume RUN_ID``: the matrix judges the end, each effect through
    its lookup and the turns at its stand-in; the hooks read what only the record shows at the kill."""
    seen: dict[str, tuple[set[str], dict[str, int], str | None]] = {}

    def at_kill(k) -> None:
        at, _ = CRASHES[k.point]
        db = Path(k.env["RUNRECORD_DB"])
        # At the kill, the record is what the plan says of its own results: every recorded turn's calls and the
        # next turn are rows (recorded in the turn's commit, before any call ran), nothing else is.
        run, intents = load(db, k.run_id)
        results = run.results()
        names = [s.name for s in run.steps]
        assert names == LoopRunPlan(loop_inputs(run)).plan.names(results), names
        assert run.status == "running" and names[run.position] == at, (names, run.position)
        current = run.steps[run.position]
        assert current.attempt_open and current.attempts == 1, current
        replayed = None
        if k.point.startswith("tool:issue_refund:after_effect"):
            # The turn that asked for the refund is recorded with both its calls and the next turn as rows; the
            # refund was applied, its result not recorded: its intent, recorded before the request, in doubt.
            assert names[:5] == ["turn-1", "turn-1/call-0", "turn-2", "turn-2/call-0", "turn-2/call-1"]
            assert names[5:] == ["turn-3"] and run.steps[4].status == "pending" and run.steps[5].status == "pending"
            [intent] = intents
            replayed = tool_key(k.run_id, 2, 0, results["turn-2"]["calls"][0]["id"])
            assert (intent.step, intent.state, intent.idempotency_key) == ("turn-2/call-0", "in_doubt", replayed)
            shown = subprocess.run([sys.executable, "-m", "durable_agents.runrecord", "status", k.run_id], cwd=REPO,
                                   env={**os.environ, **k.env}, capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0, shown.stderr
            assert f"intent turn-2/call-0 attempt 1 key {replayed}: IN DOUBT" in shown.stdout, shown.stdout
            assert "turn 2: asked for issue_refund, send_email" in shown.stdout, shown.stdout
        if k.point.startswith("runrecord:loop:between_calls"):
            # The refund's result is committed, and with it the email's attempt and intent: no email sent yet.
            assert [(i.step, i.state) for i in intents] == [("turn-2/call-0", "answered"),
                                                           ("turn-2/call-1", "in_doubt")]
            assert not [e for e in fetch_effects(provider.url, run_id=k.run_id) if e.kind == "email"]
        if k.point.startswith("runrecord:loop:after_turn"):
            assert k.turns() == {"1": 1}, k.turns()  # turn 2 started in the record, never asked
        seen[k.run_id] = ({n for n in results if "/" not in n}, k.turns(), replayed)

    def at_end(k) -> None:
        at, asked_twice = CRASHES[k.point]
        recorded_turns, before, replayed = seen[k.run_id]
        # Resume starts at the first step with no recorded result; no recorded step runs again.
        ran = startedline.started_steps(k.takeover_output)
        assert ran[0] == at and not recorded_turns & set(ran), ran
        status = status_of(load(Path(k.env["RUNRECORD_DB"]), k.run_id)[0])
        assert len([s for s in status["steps"] if "/" not in s["name"]]) == TURNS
        last = status["steps"][-1]
        assert last["result"]["content"].startswith("Done: I went through the 2 orders you named"), last
        # The stand-in's count: each turn asked once, the one whose answer the kill lost twice; none after it was
        # recorded (the kill's count for the recorded turns is the final one). The provider: each effect once;
        # the refund the kill interrupted was requested twice, replayed once.
        assert_resumed_asking_and_applying_once(k.standin_url, provider.url, k.run_id, before=before,
                                                recorded=recorded_turns, asked_twice=asked_twice, replayed=replayed)

    report = loop_matrix(kill_matrix, provider.url, "runrecord", CRASHES, at_kill=at_kill, at_end=at_end)
    assert {r.status for r in report.rows} == {"completed"}


# ---------------------------------------------------------------- the command's edges


@pytest.mark.process
def test_bad_loop_input_is_refused_with_nothing_recorded(db):
    env = {**os.environ, "RUNRECORD_DB": str(db), "MEMORY_DB": str(db.parent / "memory.db")}
    for extra, expected in BAD_LOOP_INPUT:
        argv = ["loop", "r-1", TASK, "--email", CUSTOMER, *extra]
        done = subprocess.run([sys.executable, "-m", "durable_agents.runrecord", *argv], cwd=REPO, capture_output=True,
                              text=True, timeout=60, env=env)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert expected in done.stderr, (argv, done.stderr)
        assert "started:" not in done.stdout
    assert not db.exists()  # refused before the record was opened: nothing recorded, not even a file


def test_the_turn_limit_fails_the_run_naming_it(loop_runner, standin, provider, run_id):
    run = loop_runner("loop", run_id, TASK, "--email", CUSTOMER, "--max-turns", "3")
    assert finished(run) == 1, run.output()
    status = status_json(loop_runner, run_id)
    assert_failed_at_the_turn_limit(status, provider.url, run_id)
    assert [s["status"] for s in status["steps"]][-1] == "failed"
    refused = loop_runner("resume", run_id)
    assert finished(refused) == 4 and "failed is terminal" in refused.output(), refused.output()
    assert turns_asked(standin, run_id) == {"1": 1, "2": 1, "3": 1}
    # retry is refused, as on Temporal: under the same recorded limit the same turn would stop it again.
    again = loop_runner("retry", run_id)
    assert finished(again) == 2 and "reached its turn limit" in again.output(), again.output()
    assert "Start a new RUN_ID with a higher --max-turns" in again.output()
    assert started_steps(again) == [] and turns_asked(standin, run_id) == {"1": 1, "2": 1, "3": 1}
    assert Counter(e.kind for e in fetch_effects(provider.url, run_id=run_id)) == {"refund": 1, "email": 1}


def test_the_same_model_error_on_every_attempt_stops_the_turn(runrecord, provider, run_id):
    """As on Temporal (tests/test_loop_bounds.py): a model that answers every attempt of turn 1 with the same
    error stops the run within ``SAME_ERROR_LIMIT`` attempts, naming the turn, not after the whole budget."""
    with ModelStandIn(**SAME_ERROR_FAILS) as model:
        run = runrecord("loop", run_id, TASK, "--email", CUSTOMER, env=model_env(model.url))
        assert finished(run) == 1, run.output()
        assert_stopped_by_the_same_error(status_json(runrecord, run_id), turns_asked(model.url, run_id))


@pytest.mark.parametrize("fails", list(OUTAGES_THAT_CLEAR))
def test_an_outage_or_errors_that_differ_are_retried_until_the_model_answers(fails, runrecord, provider, run_id):
    seed_orders(provider.url, ORDERS)
    with ModelStandIn(**OUTAGES_THAT_CLEAR[fails]) as model:
        run = runrecord("loop", run_id, TASK, "--email", CUSTOMER, env=model_env(model.url))
        assert finished(run) == 0, run.output()
        asked = turns_asked(model.url, run_id)
    assert asked == {"1": SAME_ERROR_LIMIT + 2, **{str(t): 1 for t in range(2, TURNS + 1)}}, asked
    assert_each_effect_once(provider.url, run_id)


# ---------------------------------------------------------------- in process: a model of the test's


class RecordingModel:
    """A ``durable_agents.steps.ports.ToolModel`` that answers with ``answer(window)`` and keeps every window it was
    given, by turn. ``die_at``: the turn at which, once it has answered, it raises ``ProcessDied`` (a BaseException,
    as a kill is no error: nothing catches it, the answer is lost, the attempt stays open in the record)."""

    name = "recording"

    def __init__(self, answer, die_at: int | None = None) -> None:
        self.answer = answer
        self.die_at = die_at
        self.windows: list[tuple[int, list[dict]]] = []

    async def turn(self, messages, tools, *, labels=None) -> ModelAnswer:
        turn = int((labels or {})["turn"])
        self.windows.append((turn, json.loads(json.dumps(messages))))
        answer = self.answer(messages)
        if turn == self.die_at:
            self.die_at = None
            raise ProcessDied(f"killed after answering turn {turn}")
        return answer


class ProcessDied(BaseException):
    pass


def _deps(provider, model) -> StepDeps:
    return StepDeps(provider=ProviderClient(provider.url), llm=OfflineModel(), agent=model)


async def _run_in_process(db, provider, model, run_id: str, task: str, **numbers) -> tuple[Any, list[str]]:
    lines: list[str] = []
    deps = _deps(provider, model)
    runner = Runner(db, deps, heartbeat=False, say=lines.append)
    try:
        return await runner.start_loop(run_id, task, CUSTOMER, **numbers), lines
    finally:
        runner.close()
        await deps.provider.aclose()


async def test_a_bad_tool_call_is_answered_refused_and_nothing_is_applied(provider, db, run_id):
    seed_orders(provider.url, ORDERS)
    bad = [
        AskedCall("c1", "issue_refund", json.dumps({"order_id": "A-1001", "amount": 999_999})),  # over the total
        AskedCall("c2", "issue_refund", json.dumps({"order_id": "Z-0000", "amount": 100})),  # no such order
        AskedCall("c3", "send_email", json.dumps({"subject": "Hi", "body": "x", "to": "mallory@example.com"})),
        AskedCall("c4", "delete_everything", "{}"),
        AskedCall("c5", "lookup_order", "{not json"),
    ]

    def answer(window):
        return ModelAnswer("", tuple(bad)) if window[-1]["role"] == "user" else ModelAnswer("I could not do it.")

    model = RecordingModel(answer)
    run, _ = await _run_in_process(db, provider, model, run_id, TASK)
    assert run.status == "completed", run.error
    results = run.results()
    calls = [results[f"turn-1/call-{i}"] for i in range(len(bad))]
    assert [c["status"] for c in calls] == ["refused"] * len(bad), calls
    reasons = [json.loads(c["content"])["error"] for c in calls]
    assert "the provider refused it" in reasons[0] and "the provider refused it" in reasons[1], reasons
    assert "send_email takes subject, body; it has no 'to'" in reasons[2]
    assert reasons[3].startswith("unknown tool 'delete_everything'") and "not JSON" in reasons[4]
    # Nothing applied: the two refunds reached the provider under their keys and were refused there.
    effects = fetch_effects(provider.url, run_id=run_id)
    assert effects and all(e.effects_applied == 0 for e in effects), effects
    assert {e.key for e in effects} == {tool_key(run_id, 1, 0, "c1"), tool_key(run_id, 1, 1, "c2")}
    # The model got each refusal back in its next window, as the results of its calls.
    (_, first), (_, second) = model.windows
    assert [m["content"] for m in second if m["role"] == "tool"] == [c["content"] for c in calls]
    assert LoopPlan.final_answer(results) == "I could not do it."


def _tokens(window: list[dict]) -> int:
    return sum(approx_tokens(Message.from_chat(m, id=str(i))) for i, m in enumerate(window))


async def test_thirty_turns_keep_every_prompt_in_budget_while_the_record_holds_every_turn(provider, db, run_id):
    orders = {f"C-{1000 + i}": 1000 + i for i in range(14)}  # 14 orders to refund: 2 * 14 + 2 = 30 turns
    seed_orders(provider.url, orders)
    task = "Refund these broken orders: " + ", ".join(orders) + "."
    scripted = ScriptedModel()
    model = RecordingModel(scripted.answer)
    bounds = {"window_tokens": 900, "window_messages": 10}
    run, _ = await _run_in_process(db, provider, model, run_id, task, max_turns=30, **bounds)
    assert run.status == "completed", run.error
    turns = [s for s in run.steps if "/" not in s.name]
    assert len(turns) == 30 and all(s.status == "completed" for s in turns)
    assert [t for t, _ in model.windows] == list(range(1, 31))  # each turn asked once
    for turn, window in model.windows:
        assert len(window) <= bounds["window_messages"], (turn, len(window))
        assert _tokens(window) <= bounds["window_tokens"], (turn, _tokens(window))
        assert window[0]["role"] == "system" and window[1]["content"] == task  # pinned, and the task kept
    # The window lost what the record keeps: the last prompt holds a few of the run's 74 messages before it
    # (the system's, the task, 29 turns, 43 tool results: 14 lookups, 14 refunds, 14 emails, 1 ticket).
    last = model.windows[-1][1]
    assert len(LoopRunPlan(loop_inputs(run)).plan.messages(run.results(), upto="turn-30")) == 2 + 29 + 43
    assert turn_message(run.results()["turn-1"])[1] not in last and len(last) < 2 + 29 + 43
    kinds = Counter(e.kind for e in fetch_effects(provider.url, run_id=run_id) if e.effects_applied == 1)
    assert kinds == {"refund": 14, "email": 14, "ticket": 1}


async def test_a_resume_derives_the_same_window_as_the_process_before_it(provider, db, run_id):
    seed_orders(provider.url, ORDERS)
    scripted = ScriptedModel()
    model = RecordingModel(scripted.answer, die_at=3)
    bounds = {"window_tokens": 600, "window_messages": 6}  # small: the window of turn 3 already left some out
    with pytest.raises(ProcessDied):
        await _run_in_process(db, provider, model, run_id, TASK, **bounds)
    deps = _deps(provider, model)
    resumed = Runner(db, deps, heartbeat=False, say=lambda line: None)
    try:
        run = await resumed.resume(run_id)
    finally:
        resumed.close()
        await deps.provider.aclose()
    assert run.status == "completed", run.error
    asked = [t for t, _ in model.windows]
    assert asked == [1, 2, 3, 3, 4, 5, 6], asked  # turn 3's answer was lost: asked again, the others once
    (_, before_kill), (_, after_resume) = [w for w in model.windows if w[0] == 3]
    assert after_resume == before_kill
    # And each turn's window is the record's derivation, whenever it is made: from the finished record.
    plan = LoopRunPlan(loop_inputs(run))
    results = run.results()
    for turn, window in model.windows:
        request = plan.request(f"turn-{turn}", results)
        assert isinstance(request, TurnRequest) and request.window == window, turn
    turn_3 = next(s for s in run.steps if s.name == "turn-3")
    assert (turn_3.attempts, turn_3.crashes) == (2, 1)  # the lost answer: an attempt whose process died


# ---------------------------------------------------------------- the schema


def test_a_version_3_record_is_upgraded_keeping_every_row(tmp_path, run_id):
    """Version 4 adds ``runs.loop`` (NULL: a run of the fixed flow), version 5 a turn's row of the same error,
    version 6 the ``approvals`` table; every row of version 3 stays as it was, and a run of version 3 is read
    as a run of the fixed flow."""
    path = tmp_path / "v3.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in _SCHEMA_V1.split(";"):
        if statement.strip():
            conn.execute(statement)
    _UPGRADES[1](conn)
    _UPGRADES[2](conn)
    conn.execute("PRAGMA user_version=3")
    conn.execute("INSERT INTO runs (run_id, task, email, conversation_id, status, position, created_at, updated_at, "
                 "start_id, params) VALUES (?, 't', ?, ?, 'running', 1, 1.0, 2.0, 's1', '{\"amount\":1}')",
                 (run_id, CUSTOMER, run_id))
    conn.execute("INSERT INTO steps (run_id, position, name, status, attempts, result) VALUES "
                 "(?, 0, 'draft', 'completed', 1, '{\"subject\":\"s\"}'), (?, 1, 'send_confirmation', 'running', 1, "
                 "NULL), (?, 2, 'record_outcome', 'pending', 0, NULL)", (run_id, run_id, run_id))
    conn.execute("INSERT INTO intents VALUES (?, 1, 1, 'send_confirmation', 'k', '{}', 'in_doubt', NULL, 3.0, NULL)",
                 (run_id,))
    tables = ("runs", "steps", "intents")
    before = {t: conn.execute(f"SELECT * FROM {t}").fetchall() for t in tables}
    conn.close()
    with RunRecord(path) as record:
        run = record.load(run_id)
        assert run.loop is None and [s.name for s in run.steps] == ["draft", "send_confirmation", "record_outcome"]
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    after = {t: conn.execute(f"SELECT * FROM {t}").fetchall() for t in tables}
    # Version 6 adds the waits for a person: a table of its own, empty.
    assert conn.execute("SELECT count(*) FROM approvals").fetchone()[0] == 0
    conn.close()
    # Version 5 adds a turn's row of the same error to every step: none yet.
    assert [row[:-2] for row in after["steps"]] == before["steps"] and after["intents"] == before["intents"]
    assert all(row[-2:] == (0, None) for row in after["steps"]), after["steps"]
    assert [row[:-1] for row in after["runs"]] == before["runs"] and after["runs"][0][-1] is None
