"""Workflow-level guarantees that need no provider effects: determinism of the
recorded history under the current code, and that a workflow-task failure
ends the run instead of being retried for ever."""

from __future__ import annotations

from temporalio.client import WorkflowExecutionStatus
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


async def test_input_the_workflow_cannot_decode_fails_the_run(client, workers, run_id, task_queue):
    """A workflow-task failure (here: an input the code cannot take) fails the run, once."""
    workers()
    handle = await client.start_workflow(WORKFLOW_NAME, {"unexpected": 1}, id=run_id, task_queue=task_queue)

    async def closed():
        d = await handle.describe()
        return d if d.status != WorkflowExecutionStatus.RUNNING else None

    described = await poll_until(closed, timeout=30, what="the run to close")
    assert described.status == WorkflowExecutionStatus.FAILED
