"""The agent flow's path for runs recorded before the workflow-side retries
(no ``live-and-honest`` patch marker in their history), unchanged: server-side
retry policies (draft 4 attempts, effects 6), no start id, no adoption,
memory written by record_outcome (or, before the memory patch, by a 4th
activity). Do not edit: it must replay as it ran. Retire it with
``workflow.deprecate_patch`` once no such run is open or queried.

Functions of the ``AgentFlow`` instance (``self``), kept out of the workflow
module: passed through the sandbox, so the frozen code is not compiled and
executed again each time a worker builds the run afresh. It holds no state of its own.

Everything the lab keeps for these runs is here, in durable_agents/workflows/state.py's
compatibility field and in durable_agents/flowclient/status.py's reading of server-side
retries, with one exception: the ``remember_exchange`` activity, which the
oldest of them schedule, is registered by ``activities`` (an activity cannot
live in workflow code). durable_agents/steps/ knows nothing of them. Why the path is kept
rather than retired: docs/architecture.md, "Two generations of runs".
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from durable_agents.activities import FlowActivities
from durable_agents.steps.crashpoints import crash_point
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.models import DraftRequest, RecordRequest, RememberRequest, SendRequest, to_jsonable
from durable_agents.workflows.state import FlowInput, RunStatus


async def run_recorded_before_live(self, inp: FlowInput) -> RunStatus:
    # Checked as the input was then: without the text rule, which came with the live path.
    task, email, conversation_id, _ = self.checked_input(inp, text_rule=False)
    options = _BEFORE_LIVE_TUNED if inp.timeouts == "tuned" else _BEFORE_LIVE_DEFAULTS
    drafted = await _step_before_live(
        self,
        0,
        FlowActivities.draft,
        DraftRequest(run_id=inp.run_id, task=task, conversation_id=conversation_id),
        options["draft"],
    )
    sent = await _step_before_live(
        self,
        1,
        FlowActivities.send_confirmation,
        SendRequest(
            run_id=inp.run_id,
            to=email,
            subject=drafted.subject,
            body=drafted.body,
            idempotency_key=idempotency_key(inp.run_id, "send_confirmation"),
        ),
        options["effect"],
    )
    remember = RememberRequest(
        run_id=inp.run_id, conversation_id=conversation_id, task=task, reply=drafted.body
    )
    memory_in_record = workflow.patched(MEMORY_IN_RECORD_PATCH)
    await _step_before_live(
        self,
        2,
        FlowActivities.record_outcome,
        RecordRequest(
            run_id=inp.run_id,
            summary=drafted.summary,
            email_message_id=sent.message_id,
            idempotency_key=idempotency_key(inp.run_id, "record_outcome"),
            remember=remember if memory_in_record else None,
        ),
        options["effect"],
    )
    if not memory_in_record:
        try:
            await workflow.execute_activity_method(  # the same command as execute_activity, typed for methods
                FlowActivities.remember_exchange, remember,
                start_to_close_timeout=_BEFORE_LIVE_REMEMBER_TIMEOUT, retry_policy=_BEFORE_LIVE_REMEMBER_RETRIES,
            )
        except ActivityError as err:
            workflow.logger.warning("run %s: exchange not remembered: %s", inp.run_id, _reason_before_live(err))
    self._status = "completed"
    return self._snapshot()

async def _step_before_live(self, index: int, activity: Any, request: Any, options: dict) -> Any:
    state = self._steps[index]
    state.status = "running"
    try:
        output = await workflow.execute_activity(activity, request, **options)
    except ActivityError as err:
        state.status = "failed"
        state.attempts = _attempts_before_live(err, options["retry_policy"].maximum_attempts)
        self._status = "failed"
        self._error = (
            f"step {state.name} failed after {state.attempts} attempt(s): {_reason_before_live(err)}"
        )
        raise ApplicationError(
            self._error, to_jsonable(self._snapshot()), type="StepFailed", non_retryable=True
        ) from err
    state.status = "completed"
    state.attempts = output.attempt
    state.result = to_jsonable(output.result)
    if not workflow.unsafe.is_replaying():
        with workflow.unsafe.sandbox_unrestricted():
            crash_point(f"temporal:{state.name}:after_record")
    return output.result



# The previous rules, for this path only.
MEMORY_IN_RECORD_PATCH = "memory-in-record-outcome"
# The error types these runs' server-side retry policies do not retry (the activity
# wrapper raises them under these type names; IdempotencyConflict is a PermanentError).
NON_RETRYABLE_TYPES = ["PermanentError", "InputError", "IdempotencyConflict"]
_BEFORE_LIVE_DRAFT = dict(
    start_to_close_timeout=timedelta(seconds=60),
    heartbeat_timeout=timedelta(seconds=1),
    retry_policy=RetryPolicy(
        initial_interval=timedelta(milliseconds=200), backoff_coefficient=2.0, maximum_interval=timedelta(seconds=10),
        maximum_attempts=4, non_retryable_error_types=NON_RETRYABLE_TYPES,
    ),
)
_BEFORE_LIVE_EFFECT = dict(
    start_to_close_timeout=timedelta(seconds=15),
    heartbeat_timeout=timedelta(seconds=1),
    retry_policy=RetryPolicy(
        initial_interval=timedelta(milliseconds=200), backoff_coefficient=2.0, maximum_interval=timedelta(seconds=3),
        maximum_attempts=6, non_retryable_error_types=NON_RETRYABLE_TYPES,
    ),
)
_BEFORE_LIVE_TUNED = {"draft": _BEFORE_LIVE_DRAFT, "effect": _BEFORE_LIVE_EFFECT}
_BEFORE_LIVE_DEFAULTS = {
    "draft": dict(_BEFORE_LIVE_DRAFT, heartbeat_timeout=None, start_to_close_timeout=timedelta(seconds=10)),
    "effect": dict(_BEFORE_LIVE_EFFECT, heartbeat_timeout=None, start_to_close_timeout=timedelta(seconds=10)),
}
_BEFORE_LIVE_REMEMBER_TIMEOUT = timedelta(seconds=10)
_BEFORE_LIVE_REMEMBER_RETRIES = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3)


def _attempts_before_live(err: ActivityError, maximum: int) -> int:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.details:
        detail = cause.details[0]
        if isinstance(detail, dict) and isinstance(detail.get("attempt"), int):
            return detail["attempt"]
    return maximum


def _reason_before_live(err: ActivityError) -> str:
    cause = err.cause
    if isinstance(cause, TemporalTimeoutError):
        return f"timed out ({cause.type.name.lower() if cause.type else 'timeout'})"
    if cause is not None:
        return str(cause)
    return str(err)
