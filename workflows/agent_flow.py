"""The agent flow as a Temporal workflow: deterministic, no I/O.

Three steps, each an activity whose completion Temporal records in the run's
event history before the next is scheduled. After a crash, a new worker
replays that history: completed activities return their recorded results
without running again, and the flow continues at the first unfinished step.

Bounded on purpose:

- every activity has a retry policy with ``maximum_attempts`` and lists the
  non-retryable error types; exhausting it, or a non-retryable error, ends the
  run FAILED with ``StepFailed`` naming the step, attempts and reason, and no
  later step runs;
- workflow-task failures: ``failure_exception_types=[Exception]`` makes any
  exception raised by this code (a bug, a non-determinism error, a result the
  converter cannot handle) fail the *workflow* instead of failing the task,
  which Temporal would otherwise retry for ever. The cost: a bad deploy fails
  runs instead of parking them until a fix ships; for this lab a visible
  terminal failure is the better default. The starter also sets an
  execution timeout as a backstop for anything that still hangs.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from activities import NON_RETRYABLE_TYPES, FlowActivities
    from steps.crashpoints import crash_point
    from steps.keys import idempotency_key
    from steps.limits import InputError, check_conversation_id, check_email, check_run_id, check_task
    from steps.models import STEP_NAMES, DraftRequest, RecordRequest, RememberRequest, SendRequest, to_jsonable
    # The run's input and status types live in their own module: without a
    # workflow cache this module is executed afresh for every workflow task,
    # and building three dataclasses was ~60% of that (bench/bench_overhead.py).
    from workflows.state import FlowInput, RunStatus, StepState

WORKFLOW_NAME = "AgentFlow"

# Timeouts and retries, per step. Heartbeat timeouts are short so a killed
# worker's activity is retried within about a second (the activity wrapper
# heartbeats every 0.3 s); start-to-close bounds a single attempt.
DRAFT_OPTIONS = dict(
    start_to_close_timeout=timedelta(seconds=60),
    heartbeat_timeout=timedelta(seconds=1),
    retry_policy=RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=4,
        non_retryable_error_types=NON_RETRYABLE_TYPES,
    ),
)
EFFECT_OPTIONS = dict(
    start_to_close_timeout=timedelta(seconds=15),
    heartbeat_timeout=timedelta(seconds=1),
    retry_policy=RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=3),
        maximum_attempts=6,
        non_retryable_error_types=NON_RETRYABLE_TYPES,
    ),
)

# Temporal's defaults, kept only so bench/bench_resume.py can measure what the
# tuning above buys: no heartbeat timeout, so a killed worker's activity is
# retried only after start-to-close (10 s, the figure the brief measured).
DEFAULT_TIMEOUTS = {
    "draft": dict(DRAFT_OPTIONS, heartbeat_timeout=None, start_to_close_timeout=timedelta(seconds=10)),
    "effect": dict(EFFECT_OPTIONS, heartbeat_timeout=None, start_to_close_timeout=timedelta(seconds=10)),
}
TUNED_TIMEOUTS = {"draft": DRAFT_OPTIONS, "effect": EFFECT_OPTIONS}

# Patch id (workflow.patched): runs that carry its marker write memory inside
# record_outcome; runs recorded before it ran a 4th activity, remember_exchange.
MEMORY_IN_RECORD_PATCH = "memory-in-record-outcome"

# Only for runs recorded before the patch. Remembering the exchange is best
# effort: memory informs later prompts and must never stop (or fail) a run.
REMEMBER_OPTIONS = dict(
    start_to_close_timeout=timedelta(seconds=10),
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=3),
)


def _attempts_from(err: ActivityError, maximum: int) -> int:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.details:
        detail = cause.details[0]
        if isinstance(detail, dict) and isinstance(detail.get("attempt"), int):
            return detail["attempt"]
    # Timeouts carry no details; the policy ran out, so it used them all.
    return maximum


def _reason(err: ActivityError) -> str:
    cause = err.cause
    if isinstance(cause, TemporalTimeoutError):
        return f"timed out ({cause.type.name.lower() if cause.type else 'timeout'})"
    if cause is not None:
        return str(cause)
    return str(err)


@workflow.defn(name=WORKFLOW_NAME, failure_exception_types=[Exception])
class AgentFlow:
    @workflow.init
    def __init__(self, inp: FlowInput) -> None:
        self._run_id = inp.run_id
        self._steps = [StepState(name) for name in STEP_NAMES]
        self._status = "running"
        self._error: str | None = None

    @workflow.query(name="progress")
    def progress(self) -> RunStatus:
        return self._snapshot()

    def _snapshot(self) -> RunStatus:
        current = next((s.name for s in self._steps if s.status != "completed"), None)
        return RunStatus(
            run_id=self._run_id,
            status=self._status,
            current_step=current,
            steps=[StepState(s.name, s.status, s.attempts, s.result) for s in self._steps],
            error=self._error,
        )

    async def _step(self, index: int, activity: Any, request: Any, options: dict) -> Any:
        state = self._steps[index]
        state.status = "running"
        try:
            output = await workflow.execute_activity(activity, request, **options)
        except ActivityError as err:
            state.status = "failed"
            state.attempts = _attempts_from(err, options["retry_policy"].maximum_attempts)
            self._status = "failed"
            self._error = (
                f"step {state.name} failed after {state.attempts} attempt(s): {_reason(err)}"
            )
            raise ApplicationError(
                self._error, to_jsonable(self._snapshot()), type="StepFailed", non_retryable=True
            ) from err
        state.status = "completed"
        state.attempts = output.attempt
        state.result = to_jsonable(output.result)
        # Crash point (tests only, docs/crashpoints.md): the completion is in history, the next
        # activity not yet scheduled. Never on replay, so a resuming worker passes through.
        if not workflow.unsafe.is_replaying():
            with workflow.unsafe.sandbox_unrestricted():
                crash_point(f"temporal:{state.name}:after_record")
        return output.result

    @workflow.run
    async def run(self, inp: FlowInput) -> RunStatus:
        try:
            check_run_id(inp.run_id)
            if inp.run_id != workflow.info().workflow_id:
                # Keys derive from the run id; it must be the workflow id, the
                # one identity that survives resets and continue-as-new.
                raise InputError(
                    f"run id {inp.run_id!r} differs from the workflow id "
                    f"{workflow.info().workflow_id!r}; start runs with starter.py"
                )
            task = check_task(inp.task)
            email = check_email(inp.email)
            conversation_id = check_conversation_id(inp.conversation_id or inp.run_id)
            if inp.timeouts not in ("tuned", "defaults"):
                raise InputError(f"timeouts must be 'tuned' or 'defaults', not {inp.timeouts!r}")
        except InputError as err:
            self._status = "failed"
            self._error = f"input refused: {err}"
            raise ApplicationError(self._error, type="InputError", non_retryable=True) from err

        options = TUNED_TIMEOUTS if inp.timeouts == "tuned" else DEFAULT_TIMEOUTS
        drafted = await self._step(
            0,
            FlowActivities.draft,
            DraftRequest(run_id=inp.run_id, task=task, conversation_id=conversation_id),
            options["draft"],
        )
        sent = await self._step(
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
        # Conversation memory is written after the last effect and never read
        # here: what happened is the history above, not memory. The
        # record_outcome activity writes it once the ticket is recorded (best
        # effort), which saves a round trip. Runs recorded before that change
        # scheduled a separate activity; the patch replays them as they ran.
        memory_in_record = workflow.patched(MEMORY_IN_RECORD_PATCH)
        await self._step(
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
                await workflow.execute_activity(
                    FlowActivities.remember_exchange, remember, **REMEMBER_OPTIONS
                )
            except ActivityError as err:
                workflow.logger.warning("run %s: exchange not remembered: %s", inp.run_id, _reason(err))
        self._status = "completed"
        return self._snapshot()
