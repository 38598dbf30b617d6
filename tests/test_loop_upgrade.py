"""Loop runs in flight across the upgrade of issue 43 (aa53186..: a run names its agent, its parameters and
its version; a worker serves the agents it is given, ``durable_agents.steps.served``), with the code of both sides
running as real processes, as tests/test_upgrade.py does for the flow: the main before the change (``OLD_COMMIT``,
checked out as a git worktree) starts loop runs and its processes take them part of the way, then processes
of this checkout finish them.

The task names two orders (tests/loop_support.py: six turns, 2 refunds, 2 emails, 1 ticket), on the model
stand-in. On Temporal, an old worker dies at a crash point and a worker of this checkout takes the run over:

- ``tool:issue_refund:after_effect``: the refund applied at the provider, its attempt still open in the old
  history; the new worker's attempt asks the provider by the call's key first (the tool's lookup) and takes the
  applied refund's answer (replayed): not applied again, nor sent again.
- ``temporal:loop:after_turn``: turn 1 and its lookup recorded by the old code; the new code replays them
  and asks the model for turn 2 on, never for turn 1 again.
- the refund's kill again, under the least history bound (the run continues as new after every turn): the
  run the new worker takes over was started from a state the old code carried.

On the run record and DBOS the old ``loop`` command is killed after the refund and the new ``resume``
finishes the run from the old record. Each run completes; the provider, the judge of "exactly once", has
each effect applied once; this checkout's ``status`` shows the run completed, turn by turn.

tests/test_replay_fixtures.py replays the histories the old code recorded (tests/data/histories/6cf34ba04e8f/);
this is the rest of what a user upgrading lives through. Skipped, saying why, where git or the old commit is
not available (a shallow clone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, TimeoutType

from durable_agents.flowclient.loop import loop_status, wait_for_loop
from durable_agents.providerclient import fetch_effects
from durable_agents.steps.loop import tool_key
from durable_agents.testing.standin import turns_asked
from lab.engines import started_steps
from lab.processes import REPO, Proc, start_worker
from tests.loop_support import (
    CUSTOMER,
    ORDERS,
    TASK,
    TURNS,
    assert_resumed_asking_and_applying_once,
    model_env,
)
from tests.support import activity_ids, started_by, wait_exit, worktree_of

pytestmark = pytest.mark.process

OLD_COMMIT = "6cf34ba04e8f7a53c6cb294c8e6bc320b94569c8"
"""Main before issue 43's change to the loop's workflow code (aa53186), pinned, not derived (``HEAD~n`` or a
tag would move): the code whose loop runs that change promised to finish, the code of the fixtures in
tests/data/histories/6cf34ba04e8f/. A later change to the loop pins its own predecessor in a test of its own."""

ORDER_ARGS = [f"{order}={cents}" for order, cents in ORDERS.items()]
ANSWER = "Done: I went through the 2 orders you named"


def _old_env(checkout: Path, **extra: str) -> dict[str, str]:
    # PYTHONPATH too, so that nothing of this checkout leaks in (the venv's editable install is looked up
    # after the path, and only for what the path lacks).
    return {**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def old_checkout(tmp_path_factory):
    """A worktree of ``OLD_COMMIT``, removed after the module's tests (pass or fail)."""
    where = tmp_path_factory.mktemp("loop-upgrade") / f"old-{OLD_COMMIT[:12]}"
    with worktree_of(OLD_COMMIT, where, "the code before issue 43's agents") as checkout:
        probe = subprocess.run(
            [sys.executable, "-c", "import importlib\n"
             "for name in ('worker', 'starter', 'workflows.agent_loop', 'activities.loop', 'steps.loop', "
             "'flowclient.loop', 'runrecord.cli', 'dbosflow.loop'): print(importlib.import_module(name).__file__)"],
            cwd=checkout, env=_old_env(checkout), capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr
        files = probe.stdout.split()
        assert files and all(Path(f).is_relative_to(checkout) for f in files), (
            f"the old processes would import modules from outside {checkout}: {files}")
        # And that is the code before the change: no served agents.
        assert not (checkout / "steps" / "served.py").exists()
        yield checkout


def _run(argv: list[str], cwd: Path, env: dict[str, str], what: str) -> str:
    done = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{what} {' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _temporal_env(dev_server, provider, queue: str) -> dict[str, str]:
    return {"TEMPORAL_ADDRESS": dev_server.address, "TEMPORAL_NAMESPACE": "default", "TASK_QUEUE": queue,
            "PROVIDER_URL": provider.url}


def _new_status(dev_server, provider, queue: str, run_id: str) -> dict:
    """``starter.py status RUN_ID`` of this checkout: its table says completed; its JSON is returned."""
    env = {**os.environ, **_temporal_env(dev_server, provider, queue)}
    table = _run(["starter.py", "status", run_id], REPO, env, "this checkout's")
    assert table.startswith(f"loop run {run_id}: completed, turn {TURNS} of at most"), table
    assert "turn 2: completed: asked for issue_refund, send_email" in table, table
    return json.loads(_run(["starter.py", "status", run_id, "--json"], REPO, env, "this checkout's"))


# ---------------------------------------------------------------- Temporal: old workers, then a new one

SCENARIOS = {
    # id: (the old worker's crash point, the history bound, the turns recorded by the old code at the kill,
    #      the step the new worker begins first)
    "refund-applied-attempt-open": ("tool:issue_refund:after_effect", 1000, {"turn-1", "turn-2"}, "turn-2/call-0"),
    "turn-recorded": ("temporal:loop:after_turn", 1000, {"turn-1"}, "turn-2"),
    "carried-by-the-old-code": ("tool:issue_refund:after_effect", 10, {"turn-1", "turn-2"}, "turn-2/call-0"),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_a_loop_run_the_old_code_started_and_died_in_is_finished_by_the_new(
        scenario, old_checkout, dev_server, client, provider, task_queue, run_id, standin):
    point, bound, recorded, resumed_at = SCENARIOS[scenario]
    env = _temporal_env(dev_server, provider, task_queue)
    procs: list[Proc] = []
    try:
        old = start_worker(dev_server.address, provider.url, task_queue,
                           {"MEMORY_DB": str(provider.db.parent / "memory.db"), "PYTHONPATH": str(old_checkout),
                            "CRASH_AT": point, **model_env(standin)},
                           args=["--identity", "old-worker"], name="old-worker", repo=old_checkout)
        procs.append(old)
        _run(["starter.py", "loop", run_id, TASK, "--email", CUSTOMER, "--orders", *ORDER_ARGS,
              "--history-bound", str(bound), "--no-wait"], old_checkout, _old_env(old_checkout, **env),
             "the old")
        assert wait_exit(old, 90) == -9, old.output()
        assert f"CRASH_AT={point}" in old.output()

        # What the old history holds at the kill, read by this checkout's client (no worker needed).
        handle = client.get_workflow_handle(run_id)
        first_event = (await handle.fetch_history()).events[0]
        started = json.loads(first_event.workflow_execution_started_event_attributes.input.payloads[0].data)
        assert "agent" not in started, f"the old starter recorded an agent: {started}"
        before = await loop_status(client, run_id)
        asked_before = turns_asked(standin, run_id)
        assert before["status"] == "running", before
        assert {f"turn-{t['turn']}" for t in before["turns"] if t["status"] == "completed"} == recorded, before
        refund = None
        if point == "tool:issue_refund:after_effect":
            # Applied at the provider, not recorded: the call's attempt died with its worker.
            turn2 = before["turns"][1]
            assert turn2["calls"][0]["name"] == "issue_refund" and turn2["calls"][0]["status"] != "completed", turn2
            refund = turn2["calls"][0]["key"]
            applied = [(e.kind, e.key, e.effects_applied) for e in fetch_effects(provider.url, run_id=run_id)]
            assert applied == [("refund", refund, 1)], (applied, refund)
        if bound == 10:
            assert len(before["runs"]) == 2, before["runs"]  # turn 2 runs in a run the old code continued as

        new = start_worker(dev_server.address, provider.url, task_queue,
                           {"MEMORY_DB": str(provider.db.parent / "memory.db"), **model_env(standin)},
                           args=["--identity", "new-worker"], name="new-worker")
        procs.append(new)
        # Completed, failed or parked (a new worker that cannot replay the old history parks the run): no wait
        # past that for a result that would not come.
        final = await wait_for_loop(client, run_id, timeout=90)
        assert final["status"] == "completed", (f"{final['status']}: {final['detail'] or final['error']}\n"
                                                f"the new worker's last lines:\n{new.last_lines()}")
        result = await handle.result()
        events = list((await client.get_workflow_handle(run_id, run_id=before["runs"][-1]).fetch_history()).events)
    finally:
        for proc in procs:
            proc.kill()
    assert result["status"] == "completed" and result["answer"].startswith(ANSWER), result
    # The new worker began no step the old code recorded; it began the one the kill interrupted.
    ran = started_steps(new)
    assert ran and ran[0] == resumed_at and not recorded & set(ran), ran
    by = started_by(events)
    assert "old-worker" in by.values() and "new-worker" in by.values(), by
    # The old worker's open attempt ended by its heartbeat's timeout, the one way Temporal learns of the death;
    # a worker killed in workflow code left no attempt open.
    ids = activity_ids(events)
    timed_out = [(ids[a.scheduled_event_id], a.failure.timeout_failure_info.timeout_type) for a in
                 (e.activity_task_timed_out_event_attributes for e in events
                  if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT)]
    if refund:
        assert timed_out == [("turn-2/call-0/1", TimeoutType.TIMEOUT_TYPE_HEARTBEAT)], timed_out
        assert by["turn-2/call-0/1"] == "old-worker" and by["turn-2/call-0/2"] == "new-worker", by
    else:
        assert not timed_out, timed_out
    assert_resumed_asking_and_applying_once(standin, provider.url, run_id, before=asked_before, recorded=recorded,
                                            asked_twice=set(), replayed=refund)
    shown = _new_status(dev_server, provider, task_queue, run_id)
    assert shown["status"] == "completed" and shown["answer"].startswith(ANSWER), shown
    assert shown["counts"] == {"turns": TURNS, "tool_calls": 7, "effects": 5, "refused": 0}, shown["counts"]
    calls = [c for t in shown["turns"] for c in t["calls"]]
    assert all(c["status"] == "completed" and c["outcome"] == "ok" for c in calls), calls
    assert [c["key"] for c in calls if c["replayed"]] == ([refund] if refund else []), calls
    if bound == 10:
        assert len(shown["runs"]) >= 3, shown["runs"]


# ---------------------------------------------------------------- the run record and DBOS


ENGINES = {
    # engine: (its package in the old checkout, the same package now, the variable naming its database)
    "runrecord": ("runrecord", "durable_agents.runrecord", "RUNRECORD_DB"),
    "dbos": ("dbosflow", "durable_agents.dbosflow", "DBOSFLOW_DB"),
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_loop_run_the_old_command_was_killed_in_is_resumed_by_the_new(
        engine, old_checkout, provider, tmp_path, run_id, standin):
    """The old ``python -m <engine> loop`` dies after the refund is applied (its result not recorded); this
    checkout's ``resume`` finishes the run from the old record, the refund's retry answered by its lookup at the
    provider."""
    package, now, db_var = ENGINES[engine]
    env = {db_var: str(tmp_path / f"{package}.db"), "MEMORY_DB": str(tmp_path / "memory.db"),
           "PROVIDER_URL": provider.url, "PYTHONUNBUFFERED": "1", **model_env(standin)}
    procs: list[Proc] = []
    try:
        old = Proc(f"old-{package}", [sys.executable, "-m", package, "loop", run_id, TASK, "--email", CUSTOMER,
                                      "--orders", *ORDER_ARGS],
                   env={**env, "PYTHONPATH": str(old_checkout), "CRASH_AT": "tool:issue_refund:after_effect"},
                   cwd=old_checkout)
        procs.append(old)
        assert wait_exit(old, 90) == -9, old.output()
        asked_before = turns_asked(standin, run_id)
        assert asked_before == {"1": 1, "2": 1}, asked_before

        new = Proc(f"new-{package}", [sys.executable, "-m", now, "resume", run_id], env={**env, "CRASH_AT": ""})
        procs.append(new)
        assert wait_exit(new, 90) == 0, new.output()
        ran = started_steps(new)
        assert ran and ran[0] == "turn-2/call-0" and not {"turn-1", "turn-1/call-0", "turn-2"} & set(ran), ran
        shown = subprocess.run([sys.executable, "-m", now, "status", run_id, "--json"], cwd=REPO,
                               env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    finally:
        for proc in procs:
            proc.kill()
    assert shown.returncode == 0, shown.stdout + shown.stderr
    status = json.loads(shown.stdout)
    assert status["status"] == "completed", status
    assert len([s for s in status["steps"] if "/" not in s["name"]]) == TURNS, status["steps"]
    assert status["steps"][-1]["result"]["content"].startswith(ANSWER), status["steps"][-1]
    refund_turn = next(s for s in status["steps"] if s["name"] == "turn-2")["result"]
    assert_resumed_asking_and_applying_once(
        standin, provider.url, run_id, before=asked_before, recorded={"turn-1", "turn-2"}, asked_twice=set(),
        replayed=tool_key(run_id, 2, 0, refund_turn["calls"][0]["id"]))
