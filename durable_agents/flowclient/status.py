"""A run's status read back from Temporal's own record: the event history and
the server's description of what is pending (activities, the workflow task).

This needs no worker, so it works while the worker is dead, which is exactly
when you want to see where a run stopped. (The workflow's ``progress`` query
gives the same shape, live from the workflow, but only while a worker runs.)
The words and fields are ``durable_agents.steps.runstate``'s, shared with the run record.

How each state is read:

- a step's attempts are its activity executions (``<step>/<n>``; runs recorded
  before the workflow-side retries had one execution retried by the server,
  whose attempt number counts instead); ``crashes`` are executions that ended
  in a heartbeat timeout or a worker shutdown;
- **retrying**: the step's last execution failed and the workflow started a
  timer after it that has not fired; ``next_try_at`` is the timer's due time.
  (Runs recorded before: the server's pending activity in backoff.)
- **running** / **waiting**: describe's pending activity is started / only
  scheduled (no worker has taken it);
- **adopted**: the completed result carries ``adopted`` (``durable_agents.steps.adoption``);
- **in_doubt**: the run closed without completing, the step has an effect
  (``durable_agents.steps.plan.EFFECT_STEPS``) and one of its attempts may have applied it:
  the attempt's failure said the outcome was unknown, it crashed, it was
  cancelled after a worker took it (ActivityTaskCanceled with a start), or it
  was still open when the run closed (terminated, timed out or cancelled:
  history closes no attempt then, and the request may have gone). A step
  without an effect is **failed** in each of these cases;
- **parked**: the last workflow task failed and none has completed since;
  Temporal writes the first failure to history and then retries the task
  without writing, counting attempts in describe's pending workflow task.

Why describe as well as history: Temporal writes ActivityTaskStarted only when
an attempt ends, so a running attempt shows in history as merely scheduled.

Payloads are decoded with the run's serialization context (its workflow id),
as the worker decodes them: with the payload codec on, a payload bound to
another run is refused here too (``payloadcodec``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio.api.enums.v1 import EventType, PendingActivityState, PendingWorkflowTaskState, WorkflowTaskFailedCause
from temporalio.api.enums.v1 import TimeoutType as ApiTimeoutType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.converter import DataConverter, WorkflowSerializationContext
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.steps.errors import WORKER_SHUTDOWN_TYPE
from durable_agents.steps.plan import EFFECT_STEPS, STEP_NAMES
from durable_agents.steps.retry import RULE_VERSION, RetryRule
from durable_agents.steps.runstate import (
    DONE_STEP_STATES,
    RunEntry,
    StepEntry,
    describe_step,
    iso,
    run_entry,
    step_entry,
)

IN_DOUBT_NOTE = ("an attempt's outcome is unknown: the effect may have been applied; "
                 "`python starter.py settle RUN_ID` asks the provider")
"""The note of a step shown ``in_doubt``, whatever made it so."""


class TemporalRunNotFound(LookupError):
    """No workflow with that id in the namespace (``RecordRunNotFound`` and ``DbosRunNotFound`` are the
    other engines' answers)."""




@dataclass
class ActivityTrace:
    """One activity execution (all its server-side attempts) as history recorded it."""

    step: str
    scheduled_event_id: int
    activity_id: str = ""
    scheduled_time: Any = None
    started_time: Any = None
    closed_time: Any = None
    outcome: str = "running"  # running (no closing event yet) | completed | failed | timed_out | canceled
    attempts: int = 0
    output: Any = None
    failure: str | None = None
    crashed: bool = False  # heartbeat timeout, or a worker shutdown under a version 1 rule (durable_agents.steps.retry)
    shutdown: bool = False  # a worker's graceful shutdown cut it short
    in_doubt: bool = False  # the failure said the effect may have been applied, or it was cancelled mid-run
    cancel_requested: bool = False  # the workflow asked for it to be cancelled (it may still run)
    workflow_task_completed_event_id: int = 0  # the task that scheduled it (a reset point)
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


async def _decoded_failure(client: Client | DataConverter, failure) -> BaseException:
    converter = client.data_converter if isinstance(client, Client) else client
    copy = type(failure)()
    copy.CopyFrom(failure)  # decoding works in place; leave the history as it was read
    return await converter.decode_failure(copy)


async def failure_text(client: Client | DataConverter, failure) -> str:
    """A failure's message, decoded: with the payload codec on, messages are
    encrypted too (``payloadcodec``) and the raw field reads "Encoded failure".
    Give a client, or the converter of the run (``run_converter``)."""
    error = await _decoded_failure(client, failure)
    return getattr(error, "message", None) or str(error)


async def read_history(client: Client, run_id: str):
    """(description, history) for a run, or TemporalRunNotFound with a useful message."""
    handle = client.get_workflow_handle(run_id)
    try:
        description = await handle.describe()
        history = await handle.fetch_history()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise TemporalRunNotFound(
                f"no run with id {run_id!r} in namespace {client.namespace!r}. "
                f"Start one with: python starter.py start {run_id} \"TASK\" --email ADDR"
            ) from err
        raise
    return description, history


async def _rule_version(converter: DataConverter, history) -> int:
    """The version of the retry rule the run recorded in its input (``durable_agents.steps.retry``): it
    decides, as it does for the workflow, whether a worker shutdown counts as a death."""
    for ev in history.events[:1]:
        if ev.HasField("workflow_execution_started_event_attributes"):
            try:
                payload = await _decode(converter, ev.workflow_execution_started_event_attributes.input)
            except Exception:  # noqa: BLE001 - an input this reader cannot decode (the codec's refusal of
                # plaintext, say) must not hide the rest of the status: count as runs started today do
                return RULE_VERSION
            retry = payload.get("retry") if isinstance(payload, dict) else None
            try:
                return RetryRule.from_dict(retry if isinstance(retry, dict) else None).version
            except (TypeError, ValueError):
                return 1  # refused at start: no attempt to count
    return 1


async def activity_traces(client: Client, history) -> dict[int, ActivityTrace]:
    converter = run_converter(client, getattr(history, "workflow_id", None))
    shutdown_is_death = await _rule_version(converter, history) < 2
    traces: dict[int, ActivityTrace] = {}
    for ev in history.events:
        et = ev.event_type
        if et == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = ev.activity_task_scheduled_event_attributes
            traces[ev.event_id] = ActivityTrace(
                step=a.activity_type.name, scheduled_event_id=ev.event_id, activity_id=a.activity_id,
                scheduled_time=ev.event_time.ToDatetime(), events=["ActivityTaskScheduled"],
                workflow_task_completed_event_id=a.workflow_task_completed_event_id,
            )
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = ev.activity_task_started_event_attributes
            t = traces[a.scheduled_event_id]
            t.attempts = a.attempt
            t.started_time = ev.event_time.ToDatetime()
            t.events.append("ActivityTaskStarted")
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a = ev.activity_task_completed_event_attributes
            t = _closed(traces[a.scheduled_event_id], ev, "completed", "ActivityTaskCompleted")
            t.output = await _decode(converter, a.result)
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            a = ev.activity_task_failed_event_attributes
            t = _closed(traces[a.scheduled_event_id], ev, "failed", "ActivityTaskFailed")
            error = await _decoded_failure(converter, a.failure)
            t.failure = getattr(error, "message", None) or str(error)
            details = getattr(error, "details", None) or ()
            detail = details[0] if details and isinstance(details[0], dict) else {}
            t.in_doubt = bool(detail.get("in_doubt"))
            t.shutdown = getattr(error, "type", None) == WORKER_SHUTDOWN_TYPE
            t.crashed = t.shutdown and shutdown_is_death
            # Cut short mid-attempt: an effect's request may have gone (only effects are judged so).
            t.in_doubt = t.in_doubt or t.shutdown
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            a = ev.activity_task_timed_out_event_attributes
            t = _closed(traces[a.scheduled_event_id], ev, "timed_out", "ActivityTaskTimedOut")
            t.failure = await failure_text(converter, a.failure)
            kind = a.failure.timeout_failure_info.timeout_type
            t.crashed = kind == ApiTimeoutType.TIMEOUT_TYPE_HEARTBEAT
            t.in_doubt = kind == ApiTimeoutType.TIMEOUT_TYPE_START_TO_CLOSE
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED:
            # Only asked: the attempt runs on until its worker hears of it (at a heartbeat), or ends.
            t = traces[ev.activity_task_cancel_requested_event_attributes.scheduled_event_id]
            t.cancel_requested = True
            t.events.append("ActivityTaskCancelRequested")
        elif et == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            a = ev.activity_task_canceled_event_attributes
            t = _closed(traces[a.scheduled_event_id], ev, "canceled", "ActivityTaskCanceled")
            # Cancelled after a worker took it, the request may have reached the other side first.
            t.in_doubt = bool(a.started_event_id) or t.started_time is not None
            t.failure = ("cancelled while it ran: it may have sent its request" if t.in_doubt
                         else "cancelled before a worker took it")
    return traces


def _closed(trace: ActivityTrace, ev: Any, outcome: str, event_name: str) -> ActivityTrace:
    """``trace`` as the event ``ev`` closed it: its outcome, its time, the event named in its list."""
    trace.outcome = outcome
    trace.closed_time = ev.event_time.ToDatetime()
    trace.events.append(event_name)
    return trace


def _timers(history) -> list[tuple[int, datetime, bool]]:
    """(event id, due time, fired or canceled) for each timer the workflow started."""
    started: dict[str, tuple[int, datetime]] = {}
    closed: set[str] = set()
    for ev in history.events:
        if ev.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            a = ev.timer_started_event_attributes
            due = ev.event_time.ToDatetime() + a.start_to_fire_timeout.ToTimedelta()
            started[a.timer_id] = (ev.event_id, due)
        elif ev.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
            closed.add(ev.timer_fired_event_attributes.timer_id)
        elif ev.event_type == EventType.EVENT_TYPE_TIMER_CANCELED:
            closed.add(ev.timer_canceled_event_attributes.timer_id)
    return [(event_id, due, timer_id in closed) for timer_id, (event_id, due) in started.items()]


def _utc(dt: datetime | None) -> float | None:
    if dt is None:
        return None
    return dt.replace(tzinfo=UTC).timestamp() if dt.tzinfo is None else dt.timestamp()


# Workflow-task failures the server makes itself, followed by a fresh task at
# once: a reset's marker, a task that raced a new event. Not the code's fault.
_ROUTINE_TASK_FAILURES = {
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FAILOVER_CLOSE_COMMAND,
}


_TOO_LARGE = {
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_PAYLOADS_TOO_LARGE,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_GRPC_MESSAGE_TOO_LARGE,
}


async def parked_detail(client: Client, description, history) -> str | None:
    """A one-line account of a workflow task that keeps failing, or None: what failed it, since when, and
    what to do (a run's data over Temporal's limits is mended by no deploy; code that cannot replay is).

    Two signs, both since the last workflow task that completed: a failure the
    worker reported (the first failed attempt is reported and written to
    history), or attempts that only timed out (SDK workers let a task that
    failed before time out instead of reporting it again, temporalio/features
    #219, and a worker that died mid-task does too): parked from the third
    attempt, so that one worker dying mid-task is not called parked.
    """
    failed = None
    first_bad = None
    for ev in history.events:
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            failed, first_bad = None, None
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            if ev.workflow_task_failed_event_attributes.cause in _ROUTINE_TASK_FAILURES:
                continue
            failed = ev
            first_bad = first_bad or ev
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            first_bad = first_bad or ev
    raw = description.raw_description
    attempts = raw.pending_workflow_task.attempt if raw.HasField("pending_workflow_task") else 1
    if first_bad is None or (failed is None and attempts < 3):  # a reported failure is also first_bad
        return None
    since = iso(_utc(first_bad.event_time.ToDatetime()))
    todo = "Deploy code that can replay this run (or roll back); it resumes by itself at the next attempt"
    if failed is not None:
        a = failed.workflow_task_failed_event_attributes
        cause = WorkflowTaskFailedCause.Name(a.cause).removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")
        converter = run_converter(client, getattr(history, "workflow_id", None))
        message = (await failure_text(converter, a.failure)).strip().splitlines()
        why = f"{cause}: {message[0] if message else 'no message'}"
        if a.cause in _TOO_LARGE:
            todo = ("What the run's code sends is over Temporal's size limit: no retry, reset or deploy of the "
                    "same code mends it. Terminate the run (temporal workflow terminate) and start a new one "
                    "with smaller inputs")
    else:
        why = ("every attempt timed out: a worker took the task and never completed it (a worker that "
               "cannot replay this run lets the task time out rather than report it again; its log, or "
               "the Replayer on this history, tells why)")
    return (f"the workflow task has failed since {since} ({attempts} attempt(s), Temporal retries it with a "
            f"growing backoff): {why}. {todo}")


async def _close_error(client: Client, history, current: str | None, timeout) -> str | None:
    converter = run_converter(client, getattr(history, "workflow_id", None))
    for ev in reversed(history.events):
        et = ev.event_type
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            return await failure_text(converter, ev.workflow_execution_failed_event_attributes.failure)
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
            limit = f" of {timeout.total_seconds():g} s" if timeout else ""
            where = f"at step {current}" if current else "before any step"
            return (f"the run timed out {where}: it reached its execution timeout{limit} "
                    "(`python starter.py retry` restarts it at that step)")
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            reason = ev.workflow_execution_terminated_event_attributes.reason
            return f"terminated: {reason or 'no reason given'}"
        if et == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
            return "canceled"
    return None


def _step_from(name: str, runs: list[ActivityTrace], pending, timers, closed: bool) -> StepEntry:
    """The step's entry from its attempts; ``closed``: the run closed without completing."""
    if not runs:
        return step_entry(name)
    last = runs[-1]
    attempts = sum(max(t.attempts, 1) for t in runs[:-1])
    crashes = sum(t.crashed for t in runs)
    errors = [t for t in runs if t.outcome in ("failed", "timed_out", "canceled")]
    last_error = errors[-1].failure if errors else None
    # Only an effect can have been applied; an attempt open when the run closed may have sent its request.
    in_doubt = name in EFFECT_STEPS and (any(t.in_doubt or t.crashed for t in errors)
                                         or (closed and any(t.outcome == "running" for t in runs)))
    if last.outcome == "completed":
        out = last.output or {}
        result = out.get("result")
        adopted = result.get("adopted") if isinstance(result, dict) else None
        attempts = out.get("attempt", attempts + max(last.attempts, 1))
        return step_entry(name, "adopted" if adopted else "completed", attempts, result, crashes=crashes,
                          last_error=last_error, note=adopted.get("reason") if adopted else None)
    if last.outcome == "running":
        p = pending.get(name)
        attempts += p.attempt if p is not None else 1
        if closed:
            return _ended(name, attempts, in_doubt, crashes, last_error)
        if p is not None and p.attempt > 1 and p.HasField("last_failure") and \
                p.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED:
            # A run recorded before the workflow-side retries: the server backs off.
            return step_entry(name, "retrying", attempts, crashes=crashes,
                              last_error=p.last_failure.message or last_error,
                              next_try_at=iso(_utc(p.scheduled_time.ToDatetime())))
        if p is not None and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED:
            since = iso(_utc(p.scheduled_time.ToDatetime())) if p.HasField("scheduled_time") else None
            return step_entry(name, "waiting", attempts, crashes=crashes, last_error=last_error,
                              note=f"no worker has taken attempt {attempts} since {since}")
        beat = None
        if p is not None and p.HasField("last_heartbeat_time"):
            beat = _utc(p.last_heartbeat_time.ToDatetime())
        elif p is not None and p.HasField("last_started_time"):
            beat = _utc(p.last_started_time.ToDatetime())
        notes = ["cancel requested"] if last.cancel_requested else []
        if beat is not None:
            notes.append(f"last heartbeat {max(0.0, time.time() - beat):.1f} s ago")
        return step_entry(name, "running", attempts, crashes=crashes, last_error=last_error,
                          note="; ".join(notes) or None)
    attempts += max(last.attempts, 1)
    if closed:
        return _ended(name, attempts, in_doubt, crashes, last_error)
    due = [d for event_id, d, done in timers if event_id > last.scheduled_event_id and not done]
    if due:
        return step_entry(name, "retrying", attempts, crashes=crashes, last_error=last_error,
                          next_try_at=iso(_utc(due[-1])))
    if last.crashed or last.shutdown:
        # The workflow schedules the next attempt at once, in a workflow task a worker must run.
        what = "died" if last.crashed else "shut down"
        return step_entry(name, "waiting", attempts, crashes=crashes, last_error=last_error,
                          note=f"the worker running attempt {attempts} {what}; the next attempt waits for a worker")
    return step_entry(name, "retrying", attempts, crashes=crashes, last_error=last_error)


def _ended(name: str, attempts: int, in_doubt: bool, crashes: int, last_error: str | None) -> StepEntry:
    """The entry of the step a run closed at without completing it: failed, or in doubt."""
    return step_entry(name, "in_doubt" if in_doubt else "failed", attempts, crashes=crashes, last_error=last_error,
                      note=IN_DOUBT_NOTE if in_doubt else None)


async def run_status(client: Client, run_id: str) -> RunEntry:
    """The status JSON shape (``durable_agents.steps.runstate``), from history and describe."""
    description, history = await read_history(client, run_id)
    traces = await activity_traces(client, history)
    pending = {p.activity_type.name: p for p in description.raw_description.pending_activities}
    by_step: dict[str, list[ActivityTrace]] = {}
    for t in traces.values():  # in event order
        by_step.setdefault(t.step, []).append(t)
    wf_status = description.status
    closed = wf_status != WorkflowExecutionStatus.RUNNING
    timers = _timers(history)
    steps = [_step_from(name, by_step.get(name, []), pending, timers,
                        closed and wf_status != WorkflowExecutionStatus.COMPLETED)
             for name in STEP_NAMES]
    if wf_status == WorkflowExecutionStatus.COMPLETED:
        return run_entry(run_id, "completed", steps)
    current = next((s["name"] for s in steps if s["status"] not in DONE_STEP_STATES), None)
    if closed:
        timeout = description.raw_description.execution_config.workflow_execution_timeout
        error = await _close_error(client, history, current,
                                   timeout.ToTimedelta() if timeout.ToTimedelta().total_seconds() else None)
        return run_entry(run_id, "failed", steps, error=error)
    parked = await parked_detail(client, description, history)
    if parked is not None:
        return run_entry(run_id, "parked", steps, detail=parked)
    active = next((s for s in steps if s["status"] in ("running", "waiting", "retrying")), None)
    detail = describe_step(active) if active is not None else None
    raw = description.raw_description
    if active is None and raw.HasField("pending_workflow_task") and \
            raw.pending_workflow_task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED:
        since = iso(_utc(raw.pending_workflow_task.scheduled_time.ToDatetime()))
        detail = f"waiting for a worker to take its workflow task (scheduled at {since})"
    return run_entry(run_id, "running", steps, detail=detail)
