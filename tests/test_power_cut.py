"""A power cut that is a power cut: writes never synced are lost (lab/powercut.py).

One cut per engine here, each through ``lab.powercut_matrix.run_case`` (the
table behind ``make powercut`` runs every engine, placement, cut point,
directory rule and sync level; docs/crashpoints.md has it):

- the run record at its default ``synchronous=FULL``, everything on one
  laptop, strict directory rule, cut once the run is done and memory has
  committed its exchange: the run is complete, each effect applied once,
  nothing the record or the provider acknowledged is lost; memory, at its
  default ``NORMAL``, loses that last exchange, and the run does not care;
- the Temporal dev server (history in SQLite on the cut) and DBOS (its SQLite
  system database on the cut), cut after the provider applied the email:
  engines we do not own, so what is asserted is the lab's side: the
  provider's store (on the cut too) keeps every effect it answered 200 for,
  and the run, once complete, has each effect once.

And what the record's sync level changes, with the checkpoints controlled:
at ``NORMAL`` the WAL reaches the disk only at a checkpoint, so everything
after the last one is lost (a step whose completion was acknowledged runs
again, the next step's intent vanishes); at ``FULL`` nothing is.
"""

from __future__ import annotations

import sys
import uuid

import pytest

from lab.powercut_matrix import Case, run_case
from lab.processes import Proc
from runrecord import RunRecord
from tests.support import EMAIL, TASK, counts, executions, finished

pytest.importorskip("dbos", reason="the dbos extra: pip install -e '.[dev]'")


async def test_run_record_loses_nothing_it_acknowledged_and_memory_may_lose_its_last_exchange(powercut_dir):
    outcome = await run_case(Case("runrecord", "laptop", "memory", "strict", "FULL"), powercut_dir)
    assert outcome.error is None, outcome.error
    assert outcome.completed and outcome.effects_once(), outcome
    # The record (FULL) and the provider (FULL) kept everything; memory (NORMAL) lost its last,
    # unsynced commit: the cut dropped real writes, and the run completed exactly once regardless.
    assert outcome.lost == ["memory's last exchange"], outcome
    assert outcome.executed_again == [], outcome
    assert outcome.cut is not None and outcome.cut.lost_files >= 1, outcome.cut


@pytest.mark.parametrize("engine", ["temporal", "dbos"])
async def test_engines_we_do_not_own_through_a_cut_after_the_email(powercut_dir, engine):
    sync = "FULL" if engine == "temporal" else "default"
    outcome = await run_case(Case(engine, "laptop", "email", "lenient", sync), powercut_dir)
    assert outcome.error is None, outcome.error
    assert not [x for x in outcome.lost if x.startswith("the provider's")], outcome
    assert all(n <= 1 for n in outcome.applied.values()), outcome  # never twice, whatever the engine kept
    if outcome.completed:
        assert outcome.effects_once(), outcome
    print(outcome.row())  # measured, not asserted: docs/crashpoints.md has the table


@pytest.mark.parametrize("level", ["FULL", "NORMAL"])
def test_what_the_record_loses_after_its_last_checkpoint(power_cut, provider, level):
    disk = power_cut("lenient")
    db = disk.path / "runrecord.db"
    run_id = f"sync-{level.lower()}-{uuid.uuid4().hex[:8]}"
    procs: list[Proc] = []

    def runner(*args: str, crash: str = "") -> Proc:
        env = {"RUNRECORD_DB": str(db), "MEMORY_DB": str(disk.path / "memory.db"), "PROVIDER_URL": provider.url,
               "PYTHONUNBUFFERED": "1", "RUNRECORD_SYNCHRONOUS": level, "CRASH_AT": crash}
        proc = Proc(f"runner{len(procs) + 1}", [sys.executable, "-m", "runrecord", *args], env=env)
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
