"""Exercise 6, solution: the flow as a Temporal workflow, its effects as activities.

Workflow code decides what runs next and nothing else: it must make the same
decisions every time the history is replayed, so it does no I/O. Each step
runs as an activity (agent_activities.py), with its timeout and retry policy
written next to the call. A worker killed mid-run loses nothing: the history
holds every completed activity's result, a new worker replays it (the
completed steps come back from it, not executed again) and the attempt the
dead worker held is retried when its start-to-close timeout passes, under
the same idempotency key, which the provider recognises.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from durable_agents.steps.models import DraftResult, EmailSent, OutcomeRecorded, to_jsonable
    from durable_agents.steps.requests import RunInputs, draft_request, record_request, send_request

# A dead worker's attempt is noticed when this passes: the provider and the
# model stand-in answer in milliseconds, so 5 s is long for a live attempt.
STEP_TIMEOUT = timedelta(seconds=5)
RETRIES = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=5),
                      maximum_attempts=10, non_retryable_error_types=["PermanentError", "IdempotencyConflict"])


@dataclass
class FlowParams:
    run_id: str
    task: str
    email: str


@workflow.defn(name="ExerciseFlow")
class ExerciseFlow:
    @workflow.run
    async def run(self, params: FlowParams) -> dict:
        inputs = RunInputs(run_id=params.run_id, task=params.task, email=params.email, conversation_id=params.email)
        results: dict = {}
        results["draft"] = await workflow.execute_activity(
            "draft", draft_request(inputs, results), result_type=DraftResult,
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=RETRIES)
        results["send_confirmation"] = await workflow.execute_activity(
            "send_confirmation", send_request(inputs, results), result_type=EmailSent,
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=RETRIES)
        results["record_outcome"] = await workflow.execute_activity(
            "record_outcome", record_request(inputs, results), result_type=OutcomeRecorded,
            start_to_close_timeout=STEP_TIMEOUT, retry_policy=RETRIES)
        return {name: to_jsonable(result) for name, result in results.items()}
