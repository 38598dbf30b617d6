"""The run record's lease against real processes: a dead holder on this host
is taken over at once (``runrecord.lease``), any other holder is refused
(exit 5), and a resume that races a completion leaves no lease behind.
Effects are counted at the provider."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from runrecord import DEFAULT_FLOW, Runner, RunRecord
from runrecord.lease import check_holder, new_holder_id, parse_holder, parse_stat, process_start_time
from runrecord.store import NextAttempt, RunEnded
from steps.flow import StepDeps
from tests.test_runrecord import (  # noqa: F401  (db and runrecord are fixtures)
    EMAIL,
    TASK,
    counts,
    create_unleased,
    db,
    executions,
    finished,
    runrecord,
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
