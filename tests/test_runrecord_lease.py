"""The run record's lease against real processes: a dead holder on this host
is taken over at once (``durable_agents.runrecord.lease``), any other holder is refused
(exit 5) or waited out with ``resume --wait``, and a resume that races a
completion leaves no lease behind. Effects are counted at the provider."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from durable_agents.runrecord import DEFAULT_FLOW, Runner, RunRecord
from durable_agents.runrecord.lease import check_holder, new_holder_id, parse_holder, parse_stat, process_start_time
from durable_agents.runrecord.store import NextAttempt, RunEnded
from durable_agents.steps.flow import StepDeps
from lab.processes import Proc
from tests.support import (
    EMAIL,
    TASK,
    counts,
    create_unleased,
    executions,
    finished,
    status_json,
)

HOST = socket.gethostname()
STEPS = ("draft", "send_confirmation", "record_outcome")


def lease_of(db, run_id: str) -> tuple[str | None, float | None]:
    with RunRecord(db) as record:
        run = record.load(run_id)
    return run.lease_holder, run.lease_expires_at


def create_held(db, run_id: str, holder: str, lease_seconds: float) -> None:
    """A run recorded as started (draft attempt 1) whose lease ``holder`` holds for ``lease_seconds``."""
    with RunRecord(db) as record:
        record.create_run(run_id, TASK, EMAIL, run_id, [s.name for s in DEFAULT_FLOW], holder, lease_seconds,
                          NextAttempt(0, 1, None))


def reaped_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


# ------------------------------------------------------------------ the liveness check itself


def test_stat_line_is_parsed_from_the_last_parenthesis():
    # The command name may hold spaces and parentheses; field 22 is the start time.
    fields = " ".join(["S", *map(str, range(4, 22)), "424242", "0", "0"])
    assert parse_stat(f"17 (a) (b c) d) {fields}".encode()) == ("S", 424242)
    assert parse_stat(b"17 (x) S 1 2") is None  # too short
    assert parse_stat(b"garbage") is None


@pytest.mark.process
def test_start_time_is_read_for_a_process_whose_name_has_spaces_and_parentheses():
    # The child reads its own start time while its name is plain, renames itself, and waits.
    script = ("import sys; t = open('/proc/self/stat').read().split()[21]; "
              "open('/proc/self/comm', 'w').write(') x (y) z'); print(t, flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        start = int(child.stdout.readline())
        with open(f"/proc/{child.pid}/stat", "rb") as f:
            assert b"() x (y) z)" in f.read()
        assert process_start_time(child.pid) == start
        holder = f"{HOST}:{child.pid}:{start}:0badc0de"
        assert not check_holder(holder).dead
        assert check_holder(f"{HOST}:{child.pid}:{start + 1}:0badc0de").dead  # same pid, another process
    finally:
        child.kill()
        child.wait(timeout=10)
    assert check_holder(holder).dead  # exited and reaped


@pytest.mark.process
def test_who_counts_as_dead():
    me = new_holder_id()
    host, pid, start, _ = me.split(":")
    assert (host, int(pid), int(start)) == (HOST, os.getpid(), process_start_time(os.getpid()))
    assert parse_holder(me) is not None and not check_holder(me).dead

    gone = reaped_pid()
    assert check_holder(f"{HOST}:{gone}:{start}:0badc0de").dead
    assert "is gone" in check_holder(f"{HOST}:{gone}:{start}:0badc0de").reason
    # Never presumed dead: another host, the old three-part form, an unrecorded start time, junk.
    for holder in (f"elsewhere.example:{gone}:{start}:0badc0de", f"{HOST}:{gone}:0badc0de",
                   f"{HOST}:{gone}:?:0badc0de", f"{HOST}:x{gone}:{start}:0badc0de", "test:0:setup"):
        assert not check_holder(holder).dead, holder

    # A zombie (exited, not yet reaped by its parent) is dead.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        child_start = None

        def zombie() -> bool:
            nonlocal child_start
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                state, child_start = parse_stat(f.read())
            return state == "Z"

        deadline = time.monotonic() + 30
        while not zombie():
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.02)
        verdict = check_holder(f"{HOST}:{child.pid}:{child_start}:0badc0de")
        assert verdict.dead and "exited" in verdict.reason
    finally:
        child.wait(timeout=10)


# ------------------------------------------------------------------ resume after SIGKILL, at once


async def test_sigkilled_runner_is_resumed_at_once(runrecord, provider, db, run_id):
    first = runrecord("start", run_id, TASK, "--email", EMAIL,
                      env={"CRASH_AT": "send_confirmation:after_effect", "RUNRECORD_LEASE_SECONDS": "10"})
    assert finished(first) == -9, first.output()
    holder, expires = lease_of(db, run_id)
    assert parse_holder(holder).pid == first.pid
    assert expires - time.time() > 5, "the premise: the dead holder's lease is far from expiry"

    second = runrecord("resume", run_id, env={"RUNRECORD_LEASE_SECONDS": "10"})
    assert finished(second) == 0, second.output()
    assert f"took over the lease of {holder} before its expiry: its process (pid {first.pid}) is gone" \
        in second.output()
    assert executions(second, "draft") == 0
    assert executions(second, "send_confirmation") == 1 and executions(second, "record_outcome") == 1
    assert status_json(runrecord, run_id)["status"] == "completed"
    assert lease_of(db, run_id) == (None, None)
    assert counts(provider.url, run_id, "send_confirmation") == (2, 1)  # repeated with its key, applied once
    assert counts(provider.url, run_id, "record_outcome") == (1, 1)


async def test_holder_whose_pid_now_runs_another_process_is_taken_over(runrecord, provider, db, run_id):
    # This test's own process plays the pid's new owner: alive, with a start time other than the holder's.
    pid, start = os.getpid(), process_start_time(os.getpid())
    alive = f"{HOST}:{pid}:{start}:0badc0de"
    create_held(db, run_id, alive, 60)
    refused = runrecord("resume", run_id)
    assert finished(refused) == 5, refused.output()
    assert f"is being run by {alive} (its process (pid {pid} on this host) is alive)" in refused.output()
    assert lease_of(db, run_id)[0] == alive

    reused = f"{HOST}:{pid}:{start + 1}:0badc0de"
    with RunRecord(db) as record:
        record.conn.execute("UPDATE runs SET lease_holder = ? WHERE run_id = ?", (reused, run_id))
    resumed = runrecord("resume", run_id)
    assert finished(resumed) == 0, resumed.output()
    assert f"took over the lease of {reused} before its expiry: pid {pid} now belongs to another process" \
        in resumed.output()
    assert all(executions(resumed, s) == 1 for s in STEPS)
    assert lease_of(db, run_id) == (None, None)
    assert counts(provider.url, run_id, "send_confirmation") == (1, 1)
    assert counts(provider.url, run_id, "record_outcome") == (1, 1)


@pytest.mark.parametrize("form", ["another host", "old three-part id", "no start time"])
async def test_holder_that_cannot_be_checked_is_waited_out_until_expiry(form, runrecord, provider, db, run_id):
    gone = reaped_pid()  # dead: a check of its pid would wrongly allow taking over at once
    start = process_start_time(os.getpid())
    holder = {"another host": f"elsewhere.example:{gone}:{start}:0badc0de",
              "old three-part id": f"{HOST}:{gone}:0badc0de",
              "no start time": f"{HOST}:{gone}:?:0badc0de"}[form]
    create_held(db, run_id, holder, 60)
    refused = runrecord("resume", run_id)
    assert finished(refused) == 5, refused.output()
    assert f"is being run by {holder}" in refused.output() and "cannot be checked" in refused.output()
    assert f"resume {run_id} --wait" in refused.output()
    assert lease_of(db, run_id)[0] == holder
    # The wait is bounded.
    bounded = runrecord("resume", run_id, "--wait", "--wait-limit", "0.5")
    assert finished(bounded) == 5, bounded.output()
    assert "gave up after waiting" in bounded.output() and f"still held by {holder}" in bounded.output()
    assert lease_of(db, run_id)[0] == holder

    # The same holder, now 1.5 s from expiry: --wait takes over then, not before.
    expires = time.time() + 1.5
    with RunRecord(db) as record:
        record.conn.execute("UPDATE runs SET lease_expires_at = ? WHERE run_id = ?", (expires, run_id))
    waiter = runrecord("resume", run_id, "--wait")
    assert finished(waiter) == 0, waiter.output()
    out = waiter.output()
    if "waiting:" in out:  # it was still held when the waiter looked (not on a slow start)
        assert f"waiting: run {run_id} is held by {holder}" in out and "cannot be checked" in out
        assert f"the lease of {holder} was released or expired" in out
    assert "took over" not in out
    with RunRecord(db) as record:
        first_write = record.load(run_id).steps[0].attempt_started_at  # draft attempt 2: the waiter's first commit
    assert first_write >= expires, (first_write, expires)
    assert all(executions(waiter, s) == 1 for s in STEPS)
    assert lease_of(db, run_id) == (None, None)
    assert counts(provider.url, run_id, "send_confirmation") == (1, 1)


# ------------------------------------------------------------------ a live holder, and --wait


def stop_outside_a_transaction(proc: Proc, db) -> None:
    """SIGSTOP ``proc`` at a moment it holds no write lock (else every writer would wait on it)."""
    probe = sqlite3.connect(db, timeout=0.05, isolation_level=None)
    try:
        for _ in range(100):
            os.kill(proc.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 10
            while _state(proc.pid) != "T":
                assert time.monotonic() < deadline, f"{proc.name} did not stop"
                time.sleep(0.01)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                return
            except sqlite3.OperationalError:  # it (or a waiter's poll) holds the lock: let it go on
                os.kill(proc.pid, signal.SIGCONT)
                time.sleep(0.01)
        raise AssertionError(f"could not stop {proc.name} outside a transaction")
    finally:
        probe.close()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return parse_stat(f.read())[0]


async def test_live_holder_is_refused_without_wait_and_waited_out_with_it(runrecord, provider, db, run_id):
    create_unleased(db, run_id)
    # A slow holder with a short lease: alive and renewing every third of a second.
    holder = runrecord("resume", run_id, env={"LAB_STEP_SECONDS": "4", "RUNRECORD_LEASE_SECONDS": "1"})
    holder.wait_for_line("resuming run", timeout=60)
    held_by = lease_of(db, run_id)[0]
    assert parse_holder(held_by).pid == holder.pid

    refused = runrecord("resume", run_id)
    assert finished(refused) == 5, refused.output()
    assert f"is being run by {held_by} (its process (pid {holder.pid} on this host) is alive)" in refused.output()
    assert f"python -m durable_agents.runrecord resume {run_id} --wait" in refused.output()
    assert sum(executions(refused, s) for s in STEPS) == 0

    waiter = runrecord("resume", run_id, "--wait")
    waiter.wait_for_line(f"waiting: run {run_id} is held by {held_by}", timeout=60)
    # While the holder renews, the waiter says so and keeps waiting.
    waiter.wait_for_line(f"{held_by} renewed its lease", timeout=30)
    assert waiter.alive() and holder.alive()
    assert sum(executions(waiter, s) for s in STEPS) == 0

    # Paused, the holder is alive but stops renewing: the waiter takes over once its lease expires.
    stop_outside_a_transaction(holder, db)
    try:
        assert finished(waiter) == 0, waiter.output()
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    assert f"the lease of {held_by} was released or expired" in waiter.output()
    assert "took over" not in waiter.output()
    assert status_json(runrecord, run_id)["status"] == "completed"
    assert lease_of(db, run_id) == (None, None)

    # Woken, the stale holder may repeat a request (same key) but writes nothing: it stops (exit 7).
    assert finished(holder) == 7, holder.output()
    assert "lost the lease" in holder.output()
    for step in ("send_confirmation", "record_outcome"):
        requests, applied = counts(provider.url, run_id, step)
        assert applied == 1 and requests in (1, 2), (step, requests, applied)
    ran = {s: executions(holder, s) + executions(waiter, s) for s in STEPS}
    assert all(n >= 1 for n in ran.values()), ran


async def test_waiting_resume_sees_the_holder_complete_the_run(runrecord, provider, db, run_id):
    create_unleased(db, run_id)
    holder = runrecord("resume", run_id, env={"LAB_STEP_SECONDS": "1"})
    holder.wait_for_line("resuming run", timeout=60)
    waiter = runrecord("resume", run_id, "--wait")
    assert finished(holder) == 0, holder.output()
    assert finished(waiter) == 0, waiter.output()
    out = waiter.output()
    assert sum(executions(waiter, s) for s in STEPS) == 0, out
    if "waiting:" in out:  # the usual case; a slow start may find the run completed already
        assert f"run {run_id} became completed before this resume could take its lease" in out
    assert "ticket_id=tkt_" in out  # the result, as for any completed run
    assert lease_of(db, run_id) == (None, None)
    assert counts(provider.url, run_id, "send_confirmation") == (1, 1)
    assert counts(provider.url, run_id, "record_outcome") == (1, 1)


# ------------------------------------------------------------------ a resume that races a completion


async def test_resume_racing_a_completion_takes_no_lease(db, run_id, monkeypatch):
    create_unleased(db, run_id)
    lines: list[str] = []
    runner = Runner(db, StepDeps(provider=None, llm=None), heartbeat=False, say=lines.append)
    real_load = runner.record.load
    completed = []

    def load_then_complete_elsewhere(rid: str):
        # The run as resume reads it (running); then, before resume takes the lease,
        # another process completes it.
        run = real_load(rid)
        if not completed:
            with RunRecord(db) as other:
                other.conn.execute("UPDATE steps SET status = 'completed', result = '{}' WHERE run_id = ?", (rid,))
                other.conn.execute("UPDATE runs SET status = 'completed', position = 3 WHERE run_id = ?", (rid,))
            completed.append(rid)
        return run

    monkeypatch.setattr(runner.record, "load", load_then_complete_elsewhere)
    try:
        run = await runner.resume(run_id)
    finally:
        runner.close()
    assert completed and run.status == "completed"
    assert any("became completed before this resume could take its lease" in line for line in lines), lines
    assert not any("resuming run" in line for line in lines), lines
    assert lease_of(db, run_id) == (None, None)
    with RunRecord(db) as record, pytest.raises(RunEnded, match="completed"):
        record.acquire_lease(run_id, "someone:1:else", 10)
    assert lease_of(db, run_id) == (None, None)
