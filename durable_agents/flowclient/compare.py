"""Temporal's side of the comparison (``lesson.compare``, ``python -m durable_agents.runrecord
compare``): what the event history records for one run, read through
``durable_agents.flowclient.status`` as ``starter.py status`` reads it.

``temporal_side(client, run_id)`` returns a ``durable_agents.flowclient.sides.TemporalSide``:

- ``steps``: per step, the activity's events, attempts, scheduled / started /
  closed times and result (the status ``run_status`` reads);
- ``totals``: the history's events and bytes (the serialized ``History``
  protobuf, as the server stores and ships it), by kind of event;
- ``executions`` and ``workflow_tasks``, for the picture (``lesson.lanes``):
  every activity execution (step, times, attempt, outcome, the worker that ran
  it) and every workflow task (times, worker);
- ``only_here``: what the other engines do not record: workflow-task events,
  timer events, worker identities, the count of each event type.

The run record reads its own side (``durable_agents.runrecord.compare.record_side``), DBOS
its own (``durable_agents.dbosflow.compare.dbos_side``); the lesson lays them side by side.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History
from temporalio.client import Client

from durable_agents.flowclient.sides import TemporalSide, TemporalStep, WorkflowTask
from durable_agents.flowclient.status import activity_traces, read_history
from durable_agents.flowclient.status import run_status as temporal_status


def _camel(event_type: EventType.ValueType) -> str:
    name = EventType.Name(event_type).removeprefix("EVENT_TYPE_")
    return "".join(part.capitalize() for part in name.split("_"))


def _dt(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else round((b - a).total_seconds(), 3)


def _identities(history) -> list[str]:
    seen: list[str] = []
    for ev in history.events:
        which = ev.WhichOneof("attributes")
        attrs = getattr(ev, which) if which else None
        if attrs is not None and "identity" in attrs.DESCRIPTOR.fields_by_name and attrs.identity:
            if attrs.identity not in seen:
                seen.append(attrs.identity)
    return seen


def _workers(history) -> tuple[dict[int, str], list[WorkflowTask]]:
    """Who ran what, as history says: the worker that started each activity execution (by its
    scheduled event id; the last attempt's, as history keeps only that one's start), and each
    workflow task's start, close and worker."""
    activity_worker: dict[int, str] = {}
    tasks: dict[int, WorkflowTask] = {}
    for ev in history.events:
        et = ev.event_type
        if et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = ev.activity_task_started_event_attributes
            activity_worker[a.scheduled_event_id] = a.identity
        elif et == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            tasks[ev.event_id] = {"started_at": _dt(ev.event_time.ToDatetime()), "closed_at": None,
                                  "outcome": None, "identity": ev.workflow_task_started_event_attributes.identity}
        elif et in _TASK_CLOSED:
            attrs = getattr(ev, _TASK_CLOSED[et])
            task = tasks.get(attrs.started_event_id)
            if task is not None:
                task["closed_at"] = _dt(ev.event_time.ToDatetime())
                task["outcome"] = _camel(et).removeprefix("WorkflowTask").lower()
    return activity_worker, list(tasks.values())


_TASK_CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "workflow_task_completed_event_attributes",
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "workflow_task_failed_event_attributes",
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "workflow_task_timed_out_event_attributes",
}


async def temporal_side(client: Client, run_id: str) -> TemporalSide:
    """The run as Temporal's history holds it (module docstring), for ``lesson.compare`` and the lanes."""
    _, history = await read_history(client, run_id)
    status = await temporal_status(client, run_id)
    all_traces = await activity_traces(client, history)
    traces = {t.step: t for t in all_traces.values()}
    activity_worker, workflow_tasks = _workers(history)
    counts: dict[str, int] = {}
    for ev in history.events:
        name = _camel(ev.event_type)
        counts[name] = counts.get(name, 0) + 1
    steps: list[TemporalStep] = []
    for s in status["steps"]:
        t = traces.get(s["name"])
        steps.append(
            {
                "name": s["name"],
                "status": s["status"],
                "events": t.events if t else [],
                "attempts": s["attempts"],
                "scheduled_at": _dt(t.scheduled_time) if t else None,
                "started_at": _dt(t.started_time) if t else None,
                "closed_at": _dt(t.closed_time) if t else None,
                "seconds": _seconds(t.scheduled_time, t.closed_time) if t else None,
                "result": s["result"],
            }
        )
    wft = sum(v for k, v in counts.items() if k.startswith("WorkflowTask"))
    timers = sum(v for k, v in counts.items() if k.startswith("Timer"))
    activity = sum(v for k, v in counts.items() if k.startswith("ActivityTask"))
    return {
        "run_id": run_id,
        "status": status["status"],
        "error": status["error"],
        "steps": steps,
        "totals": {
            "events": len(history.events),
            "bytes": History(events=list(history.events)).ByteSize(),
            "activity_events": activity,
            "workflow_task_events": wft,
            "timer_events": timers,
            "other_events": len(history.events) - activity - wft - timers,
        },
        # For the picture (lesson.lanes): every activity execution and workflow task, timed.
        "executions": [
            {"step": t.step, "scheduled_at": _dt(t.scheduled_time), "started_at": _dt(t.started_time),
             "closed_at": _dt(t.closed_time), "attempt": t.attempts, "outcome": t.outcome, "crashed": t.crashed,
             "identity": activity_worker.get(t.scheduled_event_id)}
            for t in all_traces.values()
        ],
        "workflow_tasks": workflow_tasks,
        "only_here": {
            "workflow_task_events": wft,
            "timer_events": timers,
            "worker_identities": _identities(history),
            "event_types": counts,
        },
    }
