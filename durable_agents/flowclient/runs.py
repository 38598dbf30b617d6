"""Runs of the agent flow on Temporal, from the client side: starting (or
attaching to) a run, waiting for it, asking the workflow itself, restarting a
failed run at its failed step (``starter.py retry``). ``starter.py`` is the command line over these;
the demo, the lessons, the benches and the tests call them directly.

- ``start_run``: one run per RUN_ID, ever (the idempotency keys derive from
  it): the server decides atomically, REJECT_DUPLICATE refusing an id whose
  run has closed and FAIL one whose run is open, and either refusal means
  "attach". The retry rule (``durable_agents.steps.retry``) goes into the run's input, so
  the numbers a run runs under are in its history. The workflow task timeout
  is 2 s (a worker that dies mid workflow task is noticed then, not after
  Temporal's 10 s; ``LAB_WORKFLOW_TASK_TIMEOUT_SECONDS``); the execution
  timeout is ``execution_timeout``: the budgets plus a 24-hour parking window
  (``LAB_PARKING_WINDOW_SECONDS``). Both are the starter's to choose and are
  recorded in the run; docs/operations.md gives the lab's values against a
  production deployment's.
- ``restart_failed_run``: a Temporal reset to the workflow task that first scheduled
  the failed step, so the completed steps are not run again and the step gets
  a fresh retry budget. The run id, and so every idempotency key, stays the
  same: what was applied is replayed or adopted, never applied twice.
- ``live_status``: the workflow's ``progress`` query (needs a worker);
  ``durable_agents.flowclient.status.run_status`` reads the history instead (needs none).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from durable_agents.flowclient.connect import task_queue
from durable_agents.flowclient.settings import env_seconds
from durable_agents.flowclient.status import activity_traces, read_history, run_status
from durable_agents.steps.limits import InputError
from durable_agents.steps.plan import STEP_NAMES
from durable_agents.steps.retry import RetryRule, rule_from_env, run_timeout_floor
from durable_agents.steps.runstate import RunEntry
from durable_agents.workflows.agent_flow import WORKFLOW_NAME
from durable_agents.workflows.state import FlowInput

# A worker that dies mid workflow task is noticed after this, not the 10 s default.
# Tuned for a worker beside its server: a replay of a long history after a cache
# miss, or a round trip over a network, must fit in it too (docs/operations.md).
WORKFLOW_TASK_TIMEOUT = timedelta(seconds=2)
TASK_TIMEOUT_ENV = "LAB_WORKFLOW_TASK_TIMEOUT_SECONDS"
MOST_TASK_TIMEOUT_SECONDS = 120.0  # the server silently caps a longer one here
PARKING_WINDOW = timedelta(hours=24)
"""How long a run may wait beyond its retry budgets (parked by a bad deploy, or
with no worker running) before Temporal closes it as timed out. The lab's: a
production deployment gives a weekend's bad deploy time to be fixed (docs/operations.md)."""
PARKING_WINDOW_ENV = "LAB_PARKING_WINDOW_SECONDS"
MOST_PARKING_SECONDS = 30 * 86400.0


def workflow_task_timeout(env: Mapping[str, str] | None = None) -> timedelta:
    """``WORKFLOW_TASK_TIMEOUT``, or ``LAB_WORKFLOW_TASK_TIMEOUT_SECONDS`` (at most 120 s) when set."""
    env = os.environ if env is None else env
    return env_seconds(env, TASK_TIMEOUT_ENV, WORKFLOW_TASK_TIMEOUT, low=0, high=MOST_TASK_TIMEOUT_SECONDS)


def parking_window(env: Mapping[str, str] | None = None) -> timedelta:
    """``PARKING_WINDOW``, or ``LAB_PARKING_WINDOW_SECONDS`` (0 to 30 days) when set."""
    env = os.environ if env is None else env
    return env_seconds(env, PARKING_WINDOW_ENV, PARKING_WINDOW, low=0, high=MOST_PARKING_SECONDS, allow_zero=True)


def execution_timeout(rule: RetryRule | None = None, env: Mapping[str, str] | None = None) -> timedelta:
    """The run's execution timeout: ``RUN_TIMEOUT_SECONDS``, or by default every
    step's retry budget plus the parking window (``parking_window``). Never
    below the budgets: a timeout that could cut a retrying step short is refused."""
    env = os.environ if env is None else env
    rule = rule or rule_from_env(env)
    floor = run_timeout_floor(rule, len(STEP_NAMES))
    raw = (env.get("RUN_TIMEOUT_SECONDS") or "").strip()
    if not raw:
        return timedelta(seconds=floor) + parking_window(env)
    try:
        seconds = float(raw)
        if not seconds > 0:
            raise ValueError
    except ValueError:
        raise InputError(f"RUN_TIMEOUT_SECONDS={raw!r} must be a positive number of seconds") from None
    if seconds < floor:
        raise InputError(
            f"RUN_TIMEOUT_SECONDS={raw} would cut a retrying step short: it must be at least {floor:g} s, "
            f"the {len(STEP_NAMES)} steps' retry budgets ({rule.budget_seconds:g} s each, LAB_RETRY_BUDGET_SECONDS) "
            "plus a minute each. Raise it, or lower the budget."
        )
    return timedelta(seconds=seconds)


async def start_run(
    client: Client, run_id: str, task: str, email: str, conversation_id: str | None = None,
    queue: str | None = None, rule: RetryRule | None = None, *,
    task_timeout: timedelta | None = None,
) -> tuple[bool, RunEntry | None]:
    """Start the run, or attach to the existing one. Returns (created, existing status).

    See the module docstring for the id policies and the timeouts; the retry
    rule and the workflow task timeout come from the environment unless given
    (``task_timeout`` is there for a benchmark that compares with Temporal's
    default, 10 s).
    """
    rule = rule or rule_from_env()
    task_timeout = task_timeout or workflow_task_timeout()
    try:
        await client.start_workflow(
            WORKFLOW_NAME,
            FlowInput(run_id=run_id, task=task, email=email,
                      conversation_id=conversation_id or run_id, retry=rule.to_dict()),
            id=run_id,
            task_queue=queue or task_queue(),
            task_timeout=task_timeout,
            execution_timeout=execution_timeout(rule),
            # One run per RUN_ID, ever: the idempotency keys derive from it.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        )
    except WorkflowAlreadyStartedError:
        return False, await run_status(client, run_id)
    return True, None


async def wait_for_status(client: Client, run_id: str, until: Callable[[RunEntry], bool],
                          on_change: Callable[[RunEntry], Any] | None = None, poll: float = 0.25,
                          timeout: float | None = None) -> RunEntry:
    """Poll the run's status until ``until(status)``; ``on_change`` sees each new status."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    while True:
        status = await run_status(client, run_id)
        if on_change and status != last:
            on_change(status)
        last = status
        if until(status):
            return status
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} did not get there in {timeout:.0f} s; last status: {status}")
        await asyncio.sleep(poll)


async def wait_for_close(client: Client, run_id: str, on_change: Callable[[RunEntry], Any] | None = None,
                         poll: float = 0.25) -> RunEntry:
    """Until the run completes, fails or is parked (which needs an operator)."""
    return await wait_for_status(client, run_id, lambda s: s["status"] != "running", on_change, poll)


class NoWorker(RuntimeError):
    """``live_status`` asks the workflow itself, which needs a worker; none answered."""


LIVE_TIMEOUT = timedelta(seconds=5)


async def live_status(client: Client, run_id: str) -> RunEntry:
    try:
        return await client.get_workflow_handle(run_id).query("progress", rpc_timeout=LIVE_TIMEOUT)
    except RPCError as err:
        if err.status in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED) or "imeout" in str(err):
            raise NoWorker(
                f"no worker answered the query for run {run_id} in {LIVE_TIMEOUT.total_seconds():g} s: start one "
                f"(python worker.py), or drop --live to read Temporal's history, which needs none"
            ) from None
        raise


class RestartRefused(ValueError):
    """A run that cannot be restarted at its failed step; the message says why and what to do."""


def retry_refusal(run_id: str, state: str, error: str | None, *, input_refused: bool | None = None) -> str | None:
    """Why ``starter.py retry`` refuses a run whose status (``durable_agents.steps.runstate``'s word) is ``state`` and
    whose error is ``error``, or None: it restarts the run at its failed step. What ``restart_failed_run`` refuses
    with, and what ``starter.py settle`` tells of a retry before one is tried. ``input_refused``: whether the
    run failed on its input (None: ``error`` starts so, as the flow's does; ``durable_agents.flowclient.loop`` decides
    its own)."""
    if state == "completed":
        return f"run {run_id} completed; a completed run cannot be retried. Start a new RUN_ID to do the task again."
    if state in ("running", "parked"):
        return f"run {run_id} is still open ({state}); retry is for a run that failed or timed out"
    if (error or "").startswith("input refused") if input_refused is None else input_refused:
        return (f"run {run_id} failed on its input ({error}); the same input would fail again. "
                "Start a new RUN_ID with corrected input.")
    return None


async def restart_failed_run(client: Client, run_id: str) -> tuple[str, int, str]:
    """Reset a failed or timed-out run to the workflow task that first scheduled
    its failed step. Returns (step, reset event id, new Temporal run id)."""
    description, history = await read_history(client, run_id)
    if description.status == WorkflowExecutionStatus.COMPLETED:
        raise RestartRefused(retry_refusal(run_id, "completed", None) or "")
    status = await run_status(client, run_id)
    refused = retry_refusal(run_id, status["status"], status.get("error"))
    if refused is not None:
        raise RestartRefused(refused)
    step = status["current_step"]
    traces = [t for t in (await activity_traces(client, history)).values() if t.step == step]
    if traces:
        point = traces[0].workflow_task_completed_event_id
    else:  # closed before the step was ever scheduled (e.g. timed out while parked)
        completed = [e.event_id for e in history.events
                     if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
        if not completed:
            raise RestartRefused(f"run {run_id} never completed a workflow task; start a new RUN_ID")
        point = completed[-1]
    new_run = await reset_to(client, run_id, description.run_id, point,
                             f"starter.py retry: restart at step {step} ({status.get('error') or 'closed'})")
    return step or "?", point, new_run


async def reset_to(client: Client, run_id: str, temporal_run_id: str, point: int, reason: str) -> str:
    """Reset Temporal run ``temporal_run_id`` of ``run_id`` to the workflow task completed at event ``point``;
    the new Temporal run's id. The workflow id, and so every key, stays."""
    response = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=run_id, run_id=temporal_run_id),
            reason=reason[:1000],
            workflow_task_finish_event_id=point,
            request_id=str(uuid.uuid4()),
        )
    )
    return response.run_id


