"""A run's status read back from Temporal's own record: the event history and
the server's description of pending activities.

This needs no worker, so it works while the worker is dead, which is exactly
when you want to see where a run stopped. (The workflow's ``progress`` query
gives the same shape, live from the workflow, but only while a worker runs.)

Why describe as well as history: Temporal writes ActivityTaskStarted only when
an attempt ends, so a running attempt shows in history as merely scheduled;
its attempt count lives in describe's pending activities.

Payloads are decoded with the run's serialization context (its workflow id),
as the worker decodes them: with the payload codec on, a payload bound to
another run is refused here too (``flowclient.codec``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.converter import DataConverter, WorkflowSerializationContext
from temporalio.service import RPCError, RPCStatusCode

from steps.models import STEP_NAMES


class RunNotFound(LookupError):
    pass


_CLOSED_AS_FAILED = {
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.TIMED_OUT: "timed out",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.CANCELED: "canceled",
}


@dataclass
class ActivityTrace:
    """One activity execution (all its attempts) as history recorded it."""

    step: str
    scheduled_event_id: int
    scheduled_time: Any = None
    started_time: Any = None
    closed_time: Any = None
    outcome: str = "running"  # running | completed | failed | timed_out
    attempts: int = 0
    output: Any = None
    failure: str | None = None
    events: list[str] = field(default_factory=list)


def run_converter(client: Client, workflow_id: str | None) -> DataConverter:
    """The client's converter in the context of one run, as the SDK uses it for that run."""
    if not workflow_id:
        return client.data_converter
    return client.data_converter.with_context(
        WorkflowSerializationContext(namespace=client.namespace, workflow_id=workflow_id)
    )


async def _decode(converter: DataConverter, payloads) -> Any:
    if not payloads.payloads:
        return None
    values = await converter.decode(payloads.payloads)
    return values[0] if values else None


async def failure_text(client: Client | DataConverter, failure) -> str:
    """A failure's message, decoded: with the payload codec on, messages are
    encrypted too (``flowclient.codec``) and the raw field reads "Encoded failure".
    Give a client, or the converter of the run (``run_converter``)."""
    converter = client.data_converter if isinstance(client, Client) else client
    copy = type(failure)()
    copy.CopyFrom(failure)  # decoding works in place; leave the history as it was read
    error = await converter.decode_failure(copy)
    return getattr(error, "message", None) or str(error)


async def read_history(client: Client, run_id: str):
    """(description, history) for a run, or RunNotFound with a useful message."""
    handle = client.get_workflow_handle(run_id)
    try:
        description = await handle.describe()
        history = await handle.fetch_history()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFound(
                f"no run with id {run_id!r} in namespace {client.namespace!r}. "
                f"Start one with: python starter.py start {run_id} \"TASK\" --email ADDR"
            ) from err
        raise
    return description, history


async def activity_traces(client: Client, history) -> dict[int, ActivityTrace]:
    converter = run_converter(client, getattr(history, "workflow_id", None))
    traces: dict[int, ActivityTrace] = {}
    for ev in history.events:
        et = ev.event_type
        if et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = ev.activity_task_scheduled_event_attributes.activity_type.name
            traces[ev.event_id] = ActivityTrace(
                step=name, scheduled_event_id=ev.event_id, scheduled_time=ev.event_time.ToDatetime()
            )
            traces[ev.event_id].events.append("ActivityTaskScheduled")
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = ev.activity_task_started_event_attributes
            t = traces[a.scheduled_event_id]
            t.attempts = a.attempt
            t.started_time = ev.event_time.ToDatetime()
            t.events.append("ActivityTaskStarted")
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a = ev.activity_task_completed_event_attributes
            t = traces[a.scheduled_event_id]
            t.outcome = "completed"
            t.closed_time = ev.event_time.ToDatetime()
            t.output = await _decode(converter, a.result)
            t.events.append("ActivityTaskCompleted")
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            a = ev.activity_task_failed_event_attributes
            t = traces[a.scheduled_event_id]
            t.outcome = "failed"
            t.closed_time = ev.event_time.ToDatetime()
            t.failure = await failure_text(converter, a.failure)
            t.events.append("ActivityTaskFailed")
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            a = ev.activity_task_timed_out_event_attributes
            t = traces[a.scheduled_event_id]
            t.outcome = "timed_out"
            t.closed_time = ev.event_time.ToDatetime()
            t.failure = await failure_text(converter, a.failure)
            t.events.append("ActivityTaskTimedOut")
    return traces


async def _close_error(client: Client, history) -> str | None:
    converter = run_converter(client, getattr(history, "workflow_id", None))
    for ev in reversed(history.events):
        et = ev.event_type
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            return await failure_text(converter, ev.workflow_execution_failed_event_attributes.failure)
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
            return "the run timed out (execution timeout reached)"
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            reason = ev.workflow_execution_terminated_event_attributes.reason
            return f"terminated: {reason or 'no reason given'}"
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
            return "canceled"
    return None


async def run_status(client: Client, run_id: str) -> dict:
    """The status JSON shape, from history and describe. See starter.py."""
    description, history = await read_history(client, run_id)
    traces = await activity_traces(client, history)
    pending = {
        p.activity_type.name: p for p in description.raw_description.pending_activities
    }
    latest: dict[str, ActivityTrace] = {}
    for t in traces.values():
        latest[t.step] = t  # events are in order; the last scheduled wins

    steps = []
    for name in STEP_NAMES:
        t = latest.get(name)
        if t is None:
            steps.append({"name": name, "status": "pending", "attempts": 0, "result": None})
            continue
        if t.outcome == "completed":
            out = t.output or {}
            steps.append(
                {
                    "name": name,
                    "status": "completed",
                    "attempts": out.get("attempt", t.attempts),
                    "result": out.get("result"),
                }
            )
        elif t.outcome in ("failed", "timed_out"):
            steps.append({"name": name, "status": "failed", "attempts": t.attempts, "result": None})
        else:
            p = pending.get(name)
            steps.append(
                {"name": name, "status": "running", "attempts": p.attempt if p else 1, "result": None}
            )

    wf_status = description.status
    if wf_status == WorkflowExecutionStatus.COMPLETED:
        status, error = "completed", None
    elif wf_status in _CLOSED_AS_FAILED:
        status, error = "failed", await _close_error(client, history)
        # A step that was in flight when the run was closed did not finish.
        for s in steps:
            if s["status"] == "running":
                s["status"] = "failed"
    else:
        status, error = "running", None
    current = next((s["name"] for s in steps if s["status"] != "completed"), None)
    return {"run_id": run_id, "status": status, "current_step": current, "steps": steps, "error": error}
