"""A power cut that is a power cut: writes never synced are lost (lab/powercut.py).

One cut per engine here, each at the lab's defaults, everything on one laptop
and under the strict directory rule, through ``lab.powercut_matrix.run_case``
(the table behind ``make powercut`` runs every engine, placement, cut point,
directory rule and sync level; docs/powercut.md has it):

- the run record (``synchronous=FULL``), cut once the run is done and memory
  (``FULL``) has committed its exchange: the run is complete, each effect
  applied once, and nothing the record, memory or the provider acknowledged
  is lost;
- the Temporal dev server (history in SQLite on the cut, at the lab's
  ``EXTRA``) and DBOS (its SQLite system database on the cut, at the lab's
  ``EXTRA``), cut right after the acknowledged start, where SQLite's default
  (``FULL``) lost the run: nothing acknowledged is lost, and the run completes
  with each effect once.

Memory after ``python -m durable_agents.runrecord start``: the command runs to its end, and
then the power goes; the exchange it committed is there, at FULL (synced at
the commit) and at NORMAL (synced by the checkpoint when the command closes
memory on its way out). At NORMAL, a command killed once memory has committed
(no close, no checkpoint) loses that exchange: the loss memory's promise
names at that level.

And what the record's sync level changes, with the checkpoints controlled:
at ``NORMAL`` the WAL reaches the disk only at a checkpoint, so everything
after the last one is lost (a step whose completion was acknowledged runs
again, the next step's intent vanishes); at ``FULL`` nothing is.
"""

from __future__ import annotations

import sys
import uuid

import pytest

from durable_agents.memory import open_store
from durable_agents.runrecord import RunRecord
from durable_agents.steps.flow import exchange_message_ids
from lab.powercut_matrix import Case, default_sync, run_case
from lab.processes import Proc
from tests.support import EMAIL, TASK, counts, executions, finished

pytest.importorskip("dbos", reason="the dbos extra: pip install -e '.[dev]'")


async def test_run_record_and_memory_lose_nothing_they_acknowledged(powercut_dir):
    outcome = await run_case(Case("runrecord", "laptop", "memory", "strict", "FULL"), powercut_dir)
    assert outcome.error is None, outcome.error
    assert outcome.completed and outcome.effects_once(), outcome
    # The record, memory and the provider (all FULL) kept everything, though the cut dropped real
    # writes (unsynced pages of some file); the run completed exactly once.
    assert outcome.lost == [], outcome
    assert outcome.executed_again == [], outcome
    assert outcome.broken() == [], outcome.broken()
    assert outcome.cut is not None and outcome.cut.lost_files >= 1, outcome.cut


@pytest.mark.parametrize("engine", ["temporal", "dbos"])
async def test_the_engines_we_start_keep_an_acknowledged_start_through_a_cut(powercut_dir, engine):
    # At SQLite's default (FULL) the start is the server's (DBOS's) last transaction and is lost here:
    # the rollback journal's deletion was never synced to its directory (docs/powercut.md).
    case = Case(engine, "laptop", "start", "strict", default_sync(engine))
    assert case.sync == "EXTRA" and case.own_default
    outcome = await run_case(case, powercut_dir)
    assert outcome.error is None, outcome.error
    assert outcome.lost == [], outcome
    assert outcome.completed and outcome.effects_once(), outcome
    assert outcome.broken() == [], outcome.broken()


@pytest.mark.parametrize(("level", "ending"), [("FULL", "clean"), ("NORMAL", "clean"), ("NORMAL", "killed")])
def test_memory_after_a_runrecord_start_and_a_cut(power_cut, provider, level, ending):
    disk = power_cut("strict")
    memory_db = disk.path / "memory.db"
    run_id = f"mem-{level.lower()}-{ending}-{uuid.uuid4().hex[:8]}"
    env = {"RUNRECORD_DB": str(disk.path / "runrecord.db"), "MEMORY_DB": str(memory_db),
           "MEMORY_SYNCHRONOUS": level, "PROVIDER_URL": provider.url, "PYTHONUNBUFFERED": "1",
           "CRASH_AT": "memory:after_append" if ending == "killed" else ""}
    proc = Proc("runner", [sys.executable, "-m", "durable_agents.runrecord",
                           "start", run_id, TASK, "--email", EMAIL], env=env)
    try:
        assert finished(proc) == (0 if ending == "clean" else -9), proc.output()
    finally:
        proc.kill()
    report = disk.cut()  # the command has exited: nothing holds the mount
    # The cut dropped what was never synced, or undid an unsynced directory entry (the -wal's deletion).
    assert report.lost_files + report.entries >= 1, report
    store = open_store(memory_db)
    try:
        kept = {m.id for m in store.window(run_id)}
    finally:
        store.close()
    wanted = set(exchange_message_ids(run_id))
    if ending == "clean" or level == "FULL":
        assert wanted <= kept, (level, ending, kept)
    else:  # committed at NORMAL, never checkpointed: the power cut takes it
        assert not wanted & kept, (level, ending, kept)


@pytest.mark.parametrize("level", ["FULL", "NORMAL"])
def test_what_the_record_loses_after_its_last_checkpoint(power_cut, provider, level):
    disk = power_cut("lenient")
    db = disk.path / "runrecord.db"
    run_id = f"sync-{level.lower()}-{uuid.uuid4().hex[:8]}"
    procs: list[Proc] = []

    def runner(*args: str, crash: str = "") -> Proc:
        env = {"RUNRECORD_DB": str(db), "MEMORY_DB": str(disk.path / "memory.db"), "PROVIDER_URL": provider.url,
               "PYTHONUNBUFFERED": "1", "RUNRECORD_SYNCHRONOUS": level, "CRASH_AT": crash}
        proc = Proc(f"runner{len(procs) + 1}", [sys.executable, "-m", "durable_agents.runrecord", *args], env=env)
        procs.append(proc)
        return proc

    try:
        RunRecord(db, synchronous=level).close()  # the schema, checkpointed on close
        disk.sync_tree()
        # A process crash (not a power cut) after draft is recorded: its commit stays in the WAL.
        first = runner("start", run_id, TASK, "--email", EMAIL, crash="runrecord:draft:after_record")
        assert finished(first) == -9, first.output()
        # The controlled checkpoint: `status` closes the file's last connection, and SQLite then
        # copies the WAL into the database and syncs both, whatever the level.
        assert finished(runner("status", run_id)) == 0
        second = runner("resume", run_id, crash="runrecord:send_confirmation:after_record")
        assert finished(second) == -9
        assert "send_confirmation: completed (attempt 2)" in second.output(), second.output()
        disk.cut()  # both runners are dead already; nothing else holds the mount

        with RunRecord(db, synchronous=level) as record:
            run = record.load(run_id)
            intents = {(i.step, i.attempt) for i in record.intents(run_id)}
        steps = {s.name: s.status for s in run.steps}
        assert steps["draft"] == "completed"  # checkpointed before the cut, at either level
        if level == "FULL":
            assert steps["send_confirmation"] == "completed" and ("record_outcome", 1) in intents, (steps, intents)
        else:
            # Lost: send_confirmation's acknowledged completion and record_outcome's intent, which
            # were committed together after the checkpoint.
            assert steps["send_confirmation"] == "running" and run.position == 1, steps
            assert ("record_outcome", 1) not in intents, intents

        third = runner("resume", run_id)
        assert finished(third) == 0, third.output()
        assert executions(third, "draft") == 0
        # At NORMAL the step whose completion was lost runs again; its key makes the repeat a replay.
        assert executions(third, "send_confirmation") == (0 if level == "FULL" else 1), third.output()
        assert counts(provider.url, run_id, "send_confirmation") == ((1 if level == "FULL" else 2), 1)
        assert counts(provider.url, run_id, "record_outcome") == (1, 1)
    finally:
        for proc in procs:
            proc.kill()
