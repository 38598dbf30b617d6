"""Workflow-level guarantees that need no provider effects: determinism of the
recorded history under the current code, and that a workflow-task failure
ends the run instead of being retried for ever."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowExecutionStatus, WorkflowHistory
from temporalio.worker import Replayer

from starter import start_run
from tests.conftest import poll_until
from workflows.agent_flow import WORKFLOW_NAME, AgentFlow


async def test_recorded_history_replays_under_current_code(client, workers, provider, run_id, task_queue):
    """What a resumed worker does: replay. A non-deterministic change would fail here first."""
    workers(crash_at="record_outcome:before")
    await start_run(client, run_id, "Confirm the refund", "ada@example.com", queue=task_queue)
    workers()
    handle = client.get_workflow_handle(run_id)
    await handle.result()
    history = await handle.fetch_history()
    await Replayer(workflows=[AgentFlow]).replay_workflow(history)


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
    assert scheduled == ["draft", "send_confirmation", "record_outcome"]
    markers = [e.marker_recorded_event_attributes for e in history.events
               if e.HasField("marker_recorded_event_attributes")]
    assert len(markers) == 1 and markers[0].marker_name == "core_patch"


async def test_input_the_workflow_cannot_decode_fails_the_run(client, workers, run_id, task_queue):
    """A workflow-task failure (here: an input the code cannot take) fails the run, once."""
    workers()
    handle = await client.start_workflow(WORKFLOW_NAME, {"unexpected": 1}, id=run_id, task_queue=task_queue)

    async def closed():
        d = await handle.describe()
        return d if d.status != WorkflowExecutionStatus.RUNNING else None

    described = await poll_until(closed, timeout=30, what="the run to close")
    assert described.status == WorkflowExecutionStatus.FAILED
