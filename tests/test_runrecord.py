"""The hand-rolled run record, end to end, against real processes: the
provider (which counts effects) and runner processes (``python -m durable_agents.runrecord``)
killed with SIGKILL, at crash points or by the lease tests."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import pytest

from durable_agents.memory import read_window
from durable_agents.providerclient import ProviderClient
from durable_agents.runrecord import DEFAULT_FLOW, FlowChanged, Runner, RunRecord
from durable_agents.runrecord.store import SCHEMA_VERSION, Intent, NextAttempt, SchemaError
from durable_agents.steps.flow import exchange_message_ids
from durable_agents.steps.keys import idempotency_key
from lab.processes import REPO
from tests.support import (
    BAD_INPUT_CASES,
    EMAIL,
    TASK,
    counts,
    create_unleased,
    effects_by_key,
    executions,
    finished,
    status_json,
    wait_lease_expired,
)

SHAPE = {"run_id", "status", "current_step", "steps", "error", "detail"}
STEP_SHAPE = {"name", "status", "attempts", "result", "crashes", "last_error", "next_try_at", "note"}


# ------------------------------------------------------------------ happy path and CLI


def test_happy_path_status_shape_and_start_twice(runrecord, provider, db, run_id):
    run = runrecord("start", run_id, TASK, "--email", EMAIL)
    assert finished(run) == 0, run.output()
    assert all(executions(run, s) == 1 for s in ("draft", "send_confirmation", "record_outcome"))
    assert "send_confirmation: completed (attempt 1)" in run.output()

    status = status_json(runrecord, run_id)
    assert set(status) == SHAPE
    assert all(set(s) == STEP_SHAPE for s in status["steps"])
    assert status["status"] == "completed" and status["current_step"] is None and status["error"] is None
    assert [s["attempts"] for s in status["steps"]] == [1, 1, 1]
    assert status["steps"][1]["result"]["message_id"].startswith("msg_")
    assert status["steps"][1]["result"]["idempotency_key"] == idempotency_key(run_id, "send_confirmation")
    assert status["steps"][2]["result"]["ticket_id"].startswith("tkt_")
    assert counts(provider.url, run_id, "send_confirmation") == (1, 1)
    assert counts(provider.url, run_id, "record_outcome") == (1, 1)

    again = runrecord("start", run_id, "another task", "--email", EMAIL)
    assert finished(again) == 3
    assert "already exists (completed)" in again.output() and executions(again, "draft") == 0

    resumed = runrecord("resume", run_id)
    assert finished(resumed) == 0
    assert "already completed; no step to run" in resumed.output() and "ticket_id=tkt_" in resumed.output()
    assert executions(resumed, "draft") == 0

    listed = runrecord("list")
    assert finished(listed) == 0 and run_id in listed.output()
    with RunRecord(db) as record:
        assert len(record.list_runs()) == 1  # one run, however often it was started
    assert counts(provider.url, run_id, "send_confirmation") == (1, 1)


@pytest.mark.process
def test_bad_input_is_refused_with_the_starters_words(db):
    cases = [
        *BAD_INPUT_CASES,
        (["resume", "no-such-run-anywhere"], "no run with id"),
        (["start", "r-1", TASK, "--email", EMAIL, "--lease-seconds", "0"], "lease-seconds"),
    ]
    env = {**os.environ, "RUNRECORD_DB": str(db), "MEMORY_DB": str(db.parent / "memory.db")}
    for argv, expected in cases:
        done = subprocess.run([sys.executable, "-m", "durable_agents.runrecord", *argv], cwd=REPO, capture_output=True,
                              text=True, timeout=60, env=env)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert expected in done.stderr, (argv, done.stderr)
        assert "started:" not in done.stdout


# ------------------------------------------------------------------ crashes


async def test_kill_between_step_2_and_3_resumes_at_step_3(runrecord, provider, db, run_id):
    first = runrecord("start", run_id, TASK, "--email", EMAIL,
                      env={"CRASH_AT": "runrecord:send_confirmation:after_record", "RUNRECORD_LEASE_SECONDS": "30"})
    assert finished(first) == -9, first.output()
    assert executions(first, "draft") == 1 and executions(first, "send_confirmation") == 1
    assert executions(first, "record_outcome") == 0

    stopped = status_json(runrecord, run_id)
    assert stopped["status"] == "running" and stopped["current_step"] == "record_outcome"
    # Its 30 s lease has not expired, but its holder is provably gone: waiting, not running.
    assert [s["status"] for s in stopped["steps"]] == ["completed", "completed", "waiting"]
    shown = runrecord("status", run_id)
    assert finished(shown) == 0 and "held by a process that is gone" in shown.output(), shown.output()
    # Step 3's intent came with step 2's commit: in doubt, and status says how it got there.
    assert (f"intent record_outcome attempt 1 key {idempotency_key(run_id, 'record_outcome')}: IN DOUBT: recorded "
            "ahead with step 2 (send_confirmation)'s commit; not sent yet, or sent and unanswered") \
        in shown.output(), shown.output()
    assert counts(provider.url, run_id, "record_outcome") is None

    second = runrecord("resume", run_id)  # a 30 s lease, still held by the dead process: taken over at once
    assert finished(second) == 0, second.output()
    assert "resuming run" in second.output() and "at step record_outcome" in second.output()
    assert "intent in doubt: record_outcome attempt 1" in second.output() and \
        "recorded ahead with step 2 (send_confirmation)'s commit" in second.output(), second.output()
    assert executions(second, "draft") == 0
    assert executions(second, "send_confirmation") == 0
    assert executions(second, "record_outcome") == 1
    status = status_json(runrecord, run_id)
    assert status["status"] == "completed"
    assert status["steps"][:2] == stopped["steps"][:2]  # the recorded results are the truth
    assert counts(provider.url, run_id, "send_confirmation") == (1, 1)
    assert counts(provider.url, run_id, "record_outcome") == (1, 1)


async def test_kill_after_email_accepted_leaves_intent_in_doubt_then_settled(runrecord, provider, db, run_id):
    first = runrecord("start", run_id, TASK, "--email", EMAIL,
                      env={"CRASH_AT": "send_confirmation:after_effect", "RUNRECORD_LEASE_SECONDS": "0.5"})
    assert finished(first) == -9, first.output()
    assert counts(provider.url, run_id, "send_confirmation") == (1, 1)

    shown = runrecord("status", run_id)
    assert finished(shown) == 0
    assert f"intent send_confirmation attempt 1 key {idempotency_key(run_id, 'send_confirmation')}: IN DOUBT" \
        in shown.output(), shown.output()
    with RunRecord(db) as record:
        assert [(i.step, i.attempt, i.state) for i in record.intents(run_id)] == [("send_confirmation", 1, "in_doubt")]

    await wait_lease_expired(db, run_id)
    second = runrecord("resume", run_id)
    assert finished(second) == 0, second.output()
    assert "intent in doubt: send_confirmation attempt 1" in second.output()
    assert executions(second, "draft") == 0 and executions(second, "send_confirmation") == 1
    # At least once (the request went twice), the receiver idempotent (one email).
    assert counts(provider.url, run_id, "send_confirmation") == (2, 1)
    assert counts(provider.url, run_id, "record_outcome") == (1, 1)
    status = status_json(runrecord, run_id)
    assert status["status"] == "completed"
    assert status["steps"][1]["attempts"] == 2 and status["steps"][1]["result"]["replayed"] is True
    with RunRecord(db) as record:
        states = [(i.step, i.attempt, i.state) for i in record.intents(run_id)]
    assert states == [("send_confirmation", 1, "settled"), ("send_confirmation", 2, "answered"),
                      ("record_outcome", 1, "answered")]


# ------------------------------------------------------------------ bounded failure


async def test_transient_errors_are_retried_then_bounded_and_failed_is_terminal(runrecord, provider, run_id):
    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(fail_next=2, status=503, retry_after=0.05, kinds=["email"])
        run = runrecord("start", run_id, TASK, "--email", EMAIL)
        assert finished(run) == 0, run.output()
    assert counts(provider.url, run_id, "send_confirmation") == (3, 1)
    assert status_json(runrecord, run_id)["steps"][1]["attempts"] == 3

    # A 1 s budget (the default is 900 s): retried until it is spent, then failed.
    other = run_id + "-down"
    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(fail_next=1000, status=503, retry_after=0.05, kinds=["ticket"])
    run = runrecord("start", other, TASK, "--email", EMAIL, env={"LAB_RETRY_BUDGET_SECONDS": "1"})
    assert finished(run) == 1, run.output()
    status = status_json(runrecord, other)
    attempts = status["steps"][2]["attempts"]
    assert executions(run, "record_outcome") == attempts >= 3
    assert status["status"] == "failed" and status["current_step"] == "record_outcome"
    # 503s do not say whether the ticket was made: the step ends in doubt, not "failed, nothing happened".
    assert [s["status"] for s in status["steps"]] == ["completed", "completed", "in_doubt"]
    assert status["error"].startswith(f"step record_outcome failed after {attempts} attempt(s): "
                                      "retry budget of 1 s spent")
    assert counts(provider.url, other, "record_outcome") == (attempts, 0)
    # The provider's 503 says it applied nothing; the record says why it still does not take that as an answer.
    shown = runrecord("status", other)
    assert finished(shown) == 1
    assert "IN DOUBT: ended in an error that does not say whether it was applied (a 5xx may come from a " \
           "gateway or proxy after the provider applied the request" in shown.output(), shown.output()

    refused = runrecord("resume", other)
    assert finished(refused) == 4
    assert "failed is terminal" in refused.output() and "runrecord retry" in refused.output()
    assert executions(refused, "record_outcome") == 0

    # The cause fixed, retry restarts it at the failed step: completed, each effect once.
    async with ProviderClient(provider.url) as pc:
        await pc.clear_faults()
    again = runrecord("retry", other)
    assert finished(again) == 0, again.output()
    assert executions(again, "draft") == executions(again, "send_confirmation") == 0
    assert executions(again, "record_outcome") == 1
    status = status_json(runrecord, other)
    assert status["status"] == "completed" and status["steps"][2]["attempts"] == attempts + 1
    assert counts(provider.url, other, "record_outcome") == (attempts + 1, 1)
    assert counts(provider.url, other, "send_confirmation") == (1, 1)
    twice = runrecord("retry", other)
    assert finished(twice) == 2 and "a completed run cannot be retried" in twice.output()


async def test_permanent_error_fails_at_once_and_resume_is_refused(runrecord, provider, run_id):
    # A 4xx is permanent. (The provider does not refuse .invalid domains at the time of
    # writing, so the 4xx is injected; fail_next answers before the key is used.)
    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(fail_next=1, status=422, kinds=["email"])
    run = runrecord("start", run_id, TASK, "--email", EMAIL)
    assert finished(run) == 1, run.output()
    status = status_json(runrecord, run_id)
    assert status["status"] == "failed" and status["current_step"] == "send_confirmation"
    assert [s["status"] for s in status["steps"]] == ["completed", "failed", "pending"]
    assert status["steps"][1]["attempts"] == 1  # non-retryable: no second attempt
    assert status["error"].startswith("step send_confirmation failed after 1 attempt(s): the provider refused")
    refused = runrecord("resume", run_id)
    assert finished(refused) == 4
    assert "failed is terminal" in refused.output() and "the provider refused" in refused.output()
    assert "runrecord retry" in refused.output()
    assert executions(refused, "send_confirmation") == 0
    effects = effects_by_key(provider.url, run_id)
    assert idempotency_key(run_id, "record_outcome") not in effects
    assert all(e.effects_applied == 0 for e in effects.values())


def test_settle_writes_only_on_a_failed_run_with_no_attempt_since_it_asked(db, run_id):
    """``settle`` records the provider's answer only where nothing else writes: a failed run (no
    process holds it) whose step had no attempt after the question (the answer would not cover it)."""
    holder, key = "test:1:a", idempotency_key(run_id, "send_confirmation")
    answer = {"step": "send_confirmation", "key": key, "state": "not applied", "requests": 1,
              "applied_at": None, "ids": None, "request_sha256": None}
    with RunRecord(db) as record:
        record.create_run(run_id, TASK, EMAIL, run_id, [s.name for s in DEFAULT_FLOW], holder, 60,
                          NextAttempt(0, 1, None))
        record.complete_step(run_id, 0, 1, {"subject": "s"}, holder, 60, effect=False,
                             next_name="send_confirmation", nxt=NextAttempt(1, 1, Intent(key, {"to": EMAIL})))
        assert record.settle_intents(run_id, {1: (1, answer)}) == {}  # running: its next attempt settles it
        record.fail_run(run_id, 1, 1, "step send_confirmation failed", "503", holder, 60,
                        answered=False, doubtful=True, in_doubt=True)
        assert record.settle_intents(run_id, {1: (0, answer)}) == {}  # asked before attempt 1 was made
        assert record.load(run_id).steps[1].in_doubt
        assert [i.state for i in record.intents(run_id)] == ["in_doubt"]

        assert record.settle_intents(run_id, {1: (1, answer)}) == {1: [1]}
        assert not record.load(run_id).steps[1].in_doubt
        [intent] = record.intents(run_id)
        assert intent.state == "settled" and intent.outcome == {"settled_by_provider": answer}
        assert record.settle_intents(run_id, {1: (1, answer)}) == {}  # nothing left in doubt


def test_both_engines_retry_by_the_one_rule():
    """One definition (durable_agents.steps.retry), not two kept equal by a test: the workflow
    and the runner both decide with StepLedger, on the rule the run recorded."""
    import durable_agents.runrecord.runner as runner
    import durable_agents.workflows.agent_flow as workflow
    from durable_agents.steps import retry

    assert workflow.StepLedger is retry.StepLedger is runner.StepLedger
    assert workflow.RetryRule is retry.RetryRule is runner.RetryRule


# ------------------------------------------------------------------ the lease


async def test_concurrent_resume_only_one_proceeds(runrecord, provider, db, run_id):
    create_unleased(db, run_id)
    slow = {"LAB_STEP_SECONDS": "1", "RUNRECORD_LEASE_SECONDS": "10"}
    a, b = runrecord("resume", run_id, env=slow), runrecord("resume", run_id, env=slow)
    codes = {p.name: finished(p) for p in (a, b)}
    winner, loser = (a, b) if codes[a.name] == 0 else (b, a)
    assert sorted(codes.values()) == [0, 5], {p.name: p.output() for p in (a, b)}
    assert "is being run by " in loser.output() and f":{winner.pid}:" in loser.output(), loser.output()
    assert "lease expires at" in loser.output()
    assert sum(executions(loser, s) for s in ("draft", "send_confirmation", "record_outcome")) == 0
    assert all(executions(winner, s) == 1 for s in ("draft", "send_confirmation", "record_outcome"))
    assert counts(provider.url, run_id, "send_confirmation") == (1, 1)
    assert counts(provider.url, run_id, "record_outcome") == (1, 1)


def test_lease_lost_stops_a_stale_writer(db, run_id):
    create_unleased(db, run_id)
    with RunRecord(db) as record:
        record.acquire_lease(run_id, "old:1:a", 0.2)
        time.sleep(0.25)  # not waiting for state: making the lease stale is the point of the test
        record.acquire_lease(run_id, "new:2:b", 10)
        from durable_agents.runrecord.store import LeaseLost

        with pytest.raises(LeaseLost):
            record.begin_attempt(run_id, "draft", NextAttempt(0, 2, None), "old:1:a", 10)
        assert record.load(run_id).steps[0].attempts == 1  # nothing written
        assert not record.renew_lease(run_id, "old:1:a", 10)


# ------------------------------------------------------------------ flow definition and schema


async def test_changed_step_list_is_detected_on_resume(db, run_id):
    create_unleased(db, run_id)
    swapped = (DEFAULT_FLOW[0], DEFAULT_FLOW[2], DEFAULT_FLOW[1])
    runner = Runner(db, deps=None, flow=swapped, heartbeat=False, say=lambda line: None)
    try:
        with pytest.raises(FlowChanged, match="position 2 is 'send_confirmation' in the record but 'record_outcome'"):
            await runner.resume(run_id)
        with pytest.raises(FlowChanged, match="position 4 is 'absent'"):
            await Runner(db, deps=None, flow=(*DEFAULT_FLOW, DEFAULT_FLOW[2]), heartbeat=False).resume(run_id)
        run = runner.record.load(run_id)
        assert run.lease_holder is None and run.steps[0].attempts == 1  # refused before touching anything
    finally:
        runner.close()


def test_schema_settings_and_version(db):
    with RunRecord(db) as record:
        c = record.conn
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    raw = sqlite3.connect(db)
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(SchemaError, match="newer"):
        RunRecord(db)


async def test_crash_after_the_last_commit_resume_only_remembers_the_exchange(runrecord, provider, db, run_id):
    first = runrecord("start", run_id, TASK, "--email", EMAIL,
                      env={"CRASH_AT": "runrecord:record_outcome:after_record"})
    assert finished(first) == -9, first.output()
    assert not (db.parent / "memory.db").exists() or read_window(str(db.parent / "memory.db"), run_id) == []
    second = runrecord("resume", run_id)
    assert finished(second) == 0, second.output()
    assert all(executions(second, s) == 0 for s in ("draft", "send_confirmation", "record_outcome"))
    assert [m.id for m in read_window(str(db.parent / "memory.db"), run_id)] == list(exchange_message_ids(run_id))
    assert counts(provider.url, run_id, "record_outcome") == (1, 1)


@pytest.mark.process
def test_the_sync_level_is_full_unless_set_and_a_wrong_one_is_refused(tmp_path, monkeypatch):
    """RUNRECORD_SYNCHRONOUS (for tests and benchmarks) sets the connection's level; FULL when unset."""
    def level() -> int:
        with RunRecord(tmp_path / "r.db") as record:
            return record.conn.execute("PRAGMA synchronous").fetchone()[0]

    monkeypatch.delenv("RUNRECORD_SYNCHRONOUS", raising=False)
    assert level() == 2  # SQLite's number for FULL
    monkeypatch.setenv("RUNRECORD_SYNCHRONOUS", "normal")
    assert level() == 1  # NORMAL
    monkeypatch.setenv("RUNRECORD_SYNCHRONOUS", "sometimes")
    done = subprocess.run([sys.executable, "-m", "durable_agents.runrecord",
                           "status", "r-1", "--db", str(tmp_path / "r.db")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "RUNRECORD_SYNCHRONOUS='sometimes' is not a synchronous level: use FULL" in done.stderr, done.stderr
