"""Workflow-level guarantees that need no provider effects: determinism of the
recorded history under the current code, and that a workflow-task failure
parks the run (visibly, within its execution timeout) instead of failing it."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

from temporalio.client import WorkflowExecutionStatus, WorkflowHistory
from temporalio.worker import Replayer

from durable_agents.flowclient.runs import start_run
from durable_agents.flowclient.status import run_status
from durable_agents.steps.plan import STEP_NAMES
from durable_agents.workflows.agent_flow import WORKFLOW_NAME, AgentFlow
from durable_agents.workflows.attempts import COUNTED_PATCH, LIVE_PATCH
from durable_agents.workflows.before_live import MEMORY_IN_RECORD_PATCH
from lab.processes import REPO
from tests.support import poll_until


async def test_recorded_history_replays_under_current_code(client, workers, provider, run_id, task_queue):
    """What a resumed worker does: replay. A non-deterministic change would fail here first."""
    workers(crash_at="record_outcome:before")
    await start_run(client, run_id, "Confirm the refund", "ada@example.com", queue=task_queue)
    workers()
    handle = client.get_workflow_handle(run_id)
    await handle.result()
    history = await handle.fetch_history()
    await Replayer(workflows=[AgentFlow]).replay_workflow(history)


def test_the_workflow_calls_the_plans_steps_in_the_plans_order():
    """durable_agents.steps.plan is the flow's one definition. The workflow spells its calls out
    (each run's history records them), so the spelling is checked against the
    plan here, without a server: run() attempts each step of the plan once, in
    the plan's order, through the activity method named as the step."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(AgentFlow.run)))
    calls = sorted((node for node in ast.walk(tree) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute) and node.func.attr == "_attempts"),
                   key=lambda node: (node.lineno, node.col_offset))
    called = [ast.unparse(call.args[0]) for call in calls]
    assert called == [f"FlowActivities.{name}" for name in STEP_NAMES], (
        f"durable_agents/workflows/agent_flow.py runs {called}; durable_agents/steps/plan.py has {list(STEP_NAMES)}: "
        "a step added to the plan "
        "needs its call in AgentFlow.run, behind workflow.patched (docs/architecture.md, 'add a step')")


def test_patch_ids_keep_their_recorded_values():
    """Histories carry the patch ids; a changed value would strand the runs that recorded it.
    (The committed fixtures replay them all; the retired third is pinned here too, since
    ``old_counted_markers`` finds it by its pattern.)"""
    assert LIVE_PATCH == "live-and-honest"
    assert MEMORY_IN_RECORD_PATCH == "memory-in-record-outcome"
    assert COUNTED_PATCH.format(run_id="r-1", step="draft", attempt=2) == "counted-r-1-draft-2"


def test_the_input_rules_the_workflow_checks_again_on_replay_are_pinned():
    """The workflow checks a run's input in its first task, on every replay too: a
    tightened limit or pattern would refuse, on replay, a run it accepted when it
    started, and a refusal where history shows a scheduled draft is a
    non-determinism error that parks the run. So these values are pinned: to
    tighten one, check the new value behind ``workflow.patched`` (runs that started
    before keep the old one), and only then change the pin. Loosening one is safe
    for runs in flight; a run it refused has closed."""
    import durable_agents.steps.limits as limits
    assert (limits.MAX_TASK_CHARS, limits.MAX_EMAIL_CHARS, limits.MAX_RUN_ID_CHARS,
            limits.MAX_CONVERSATION_ID_CHARS) == (4000, 254, 64, 128)
    assert limits._RUN_ID.pattern == r"[A-Za-z0-9][A-Za-z0-9._-]*"
    assert limits._EMAIL.pattern == (r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                                     r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+")


def scheduled_activities(history: WorkflowHistory) -> list[str]:
    return [e.activity_task_scheduled_event_attributes.activity_type.name
            for e in history.events if e.HasField("activity_task_scheduled_event_attributes")]


async def test_runs_recorded_before_the_memory_patch_still_replay():
    """A history recorded by the earlier flow (memory written by a 4th activity,
    remember_exchange) replays under the current code: the patch keeps old runs
    on the path they took, so a worker upgrade does not fail them mid-run."""
    fixture = Path(__file__).parent / "data" / "agentflow-v1-memory-activity.json"
    history = WorkflowHistory.from_json("history-v1", fixture.read_text())
    scheduled = scheduled_activities(history)
    assert scheduled == ["draft", "send_confirmation", "record_outcome", "remember_exchange"]
    await Replayer(workflows=[AgentFlow]).replay_workflow(history)


async def test_new_runs_write_memory_inside_record_outcome(client, workers, provider, run_id, task_queue):
    """Three activities and the patch marker: no 4th round trip for memory."""
    workers()
    await start_run(client, run_id, "Confirm the refund", "ada@example.com", queue=task_queue)
    handle = client.get_workflow_handle(run_id)
    await handle.result()
    history = await handle.fetch_history()
    scheduled = scheduled_activities(history)
    assert scheduled == list(STEP_NAMES), "a run schedules the plan's steps (durable_agents.steps.plan), in its order"
    markers = [e.marker_recorded_event_attributes for e in history.events
               if e.HasField("marker_recorded_event_attributes")]
    assert len(markers) == 1 and markers[0].marker_name == "core_patch"


async def test_input_the_workflow_cannot_decode_parks_the_run(client, workers, run_id, task_queue):
    """An exception in workflow code that is not an ApplicationError (here: an
    input the code cannot decode, as after a deploy that changed FlowInput)
    fails the workflow *task*, not the run: the run is parked, and status says
    which task fails, why and since when (exit code 3). Bounded by the run's
    execution timeout; here the test ends it."""
    workers()
    handle = await client.start_workflow(WORKFLOW_NAME, {"unexpected": 1}, id=run_id, task_queue=task_queue,
                                         execution_timeout=timedelta(minutes=5))

    async def parked():
        status = await run_status(client, run_id)
        return status if status["status"] == "parked" else None

    status = await poll_until(parked, timeout=30, what="the run to be parked")
    assert "the workflow task has failed since" in status["detail"]
    assert "Failed decoding arguments" in status["detail"], status["detail"]
    done = subprocess.run([sys.executable, "starter.py", "status", run_id], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host})
    assert done.returncode == 3, done
    assert "parked" in done.stdout
    described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.RUNNING
    await handle.terminate("test: parked on purpose")
