"""Exercise 6, practice: the flow on Temporal, the worker killed mid-run.

The draft runs as an activity; the email and the ticket are still called
from workflow code, as a plain engine would call them. Start a run and see
what Temporal makes of it (README.md), then move both effects into
activities (TODO 13 here, TODO 14 in agent_activities.py).

Check: ``python -m grader.grade 6`` (exercises/06-temporal-worker/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from durable_agents.steps import flow
    from durable_agents.steps.models import DraftResult, EmailSent, OutcomeRecorded, to_jsonable  # noqa: F401 (TODO 13)
    from durable_agents.steps.requests import RunInputs, draft_request, record_request, send_request
    from durable_agents.wiring import deps_from_env

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
        # TODO 13 (exercise 6): workflow code must not reach the world: replay runs it again and
        #   again, and Temporal's sandbox refuses what is not deterministic. Each effect must run as an
        #   activity, bounded as the draft is (a timeout, a retry policy), so that its result lands in
        #   the history and a replay reads it there instead of sending again.
        deps = deps_from_env()
        results["send_confirmation"] = await flow.send_confirmation(send_request(inputs, results), deps)
        results["record_outcome"] = await flow.record_outcome(record_request(inputs, results), deps)
        # END TODO 13
        return {name: to_jsonable(result) for name, result in results.items()}
