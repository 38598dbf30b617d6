"""What an operator does to a run, against a real dev server: retry it twice,
cancel it during an attempt and during a backoff. Each of these failed on
the code before issue 35 (a second retry parked the run; a cancel during an
attempt was taken for an error and the run completed), and the effects are
counted at the provider."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from durable_agents.activities import DraftOutput, RecordOutput, SendOutput
from durable_agents.flowclient.runs import restart_failed_run, start_run
from durable_agents.flowclient.status import run_status
from durable_agents.flowclient.worker_options import worker_options
from durable_agents.providerclient import ProviderClient, fetch_effects
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.models import (
    DraftRequest,
    DraftResult,
    EmailSent,
    OutcomeRecorded,
    RecordRequest,
    SendRequest,
)
from durable_agents.steps.retry import RetryRule
from durable_agents.workflows.agent_flow import AgentFlow
from tests.support import EMAIL, TASK, poll_until, wait_closed


def applied(provider, run_id: str) -> dict[str, int]:
    """Effects applied at the provider for each step of ``run_id``."""
    by_key = {e.key: e.effects_applied for e in fetch_effects(provider.url, run_id=run_id)}
    return {step: by_key.get(idempotency_key(run_id, step), 0) for step in ("send_confirmation", "record_outcome")}


async def newer_run_closed(client, run_id: str, than: str) -> dict:
    """The status of the run a reset made (a Temporal run id other than ``than``), once closed."""
    async def check():
        if (await client.get_workflow_handle(run_id).describe()).run_id == than:
            return None
        status = await run_status(client, run_id)
        return status if status["status"] != "running" else None

    return await poll_until(check, timeout=90, what=f"the reset run of {run_id} to close")


async def test_a_second_retry_finishes_the_run(client, workers, provider, run_id, task_queue):
    """The sequence that parked a run: the email refused for good; retry; in the new run
    three 503s then the email goes, and the ticket is refused for good; retry again.
    Before issue 35 the third run failed to replay the second run's patch markers
    (TMPRL1100) and stayed parked; now it completes, each effect applied once."""
    workers()
    handle = client.get_workflow_handle(run_id)
    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(fail_next=1, status=400, kinds=["email"])
        await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
        first = await wait_closed(client, run_id)
        assert first["status"] == "failed" and first["current_step"] == "send_confirmation", first
        first_run = (await handle.describe()).run_id

        # Three 503s with a 2 s Retry-After: the backoff after the third leaves time to
        # arm the ticket's refusal before the fourth email attempt goes out.
        await pc.set_faults(fail_next=3, status=503, retry_after=2, kinds=["email"])
        step, _, second_run = await restart_failed_run(client, run_id)
        assert step == "send_confirmation"

        async def three_503s_spent():
            return (await pc.faults())["fail"]["remaining"] == 0 or None

        await poll_until(three_503s_spent, timeout=60, what="the three 503s to be spent")
        await pc.set_faults(fail_next=1, status=400, kinds=["ticket"])
        second = await newer_run_closed(client, run_id, than=first_run)
        steps = {s["name"]: s for s in second["steps"]}
        assert second["status"] == "failed" and second["current_step"] == "record_outcome", second
        assert steps["send_confirmation"]["status"] == "completed", steps

        await pc.clear_faults()
        step, _, third_run = await restart_failed_run(client, run_id)
        assert step == "record_outcome"
        third = await newer_run_closed(client, run_id, than=second_run)
    assert third["status"] == "completed", third
    assert (await handle.describe()).run_id == third_run
    assert applied(provider, run_id) == {"send_confirmation": 1, "record_outcome": 1}


async def test_a_cancel_during_an_effect_ends_the_run_canceled_and_says_in_doubt(
        client, workers, provider, run_id, task_queue):
    """The email hangs at the provider; the run is cancelled while the attempt runs.
    Before issue 35 the cancelled attempt counted as an error: the loop tried again
    and the run completed. Now the run ends CANCELED, the ticket is never asked for,
    and the email step is in doubt (the provider applies it after its hang)."""
    workers()
    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(hang_next=1, hang_seconds=4, kinds=["email"])
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    handle = client.get_workflow_handle(run_id)

    async def email_attempt_started():
        pending = (await handle.describe()).raw_description.pending_activities
        return any(p.activity_type.name == "send_confirmation" and p.HasField("last_started_time")
                   for p in pending) or None

    await poll_until(email_attempt_started, timeout=60, what="the email attempt to start")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    history = await handle.fetch_history()
    scheduled = [e.activity_task_scheduled_event_attributes.activity_id for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert scheduled == ["draft/1", "send_confirmation/1"], scheduled
    status = await run_status(client, run_id)
    steps = {s["name"]: s for s in status["steps"]}
    assert status["status"] == "failed" and "cancel" in (status["error"] or ""), status
    assert steps["send_confirmation"]["status"] == "in_doubt" and "settle" in steps["send_confirmation"]["note"]
    assert steps["record_outcome"]["status"] == "pending", steps


async def test_a_cancel_during_a_backoff_ends_the_run_canceled(client, workers, provider, run_id, task_queue):
    workers()
    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(fail_next=1, status=503, retry_after=60, kinds=["email"])
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)

    async def retrying():
        status = await run_status(client, run_id)
        return status if status["steps"][1]["status"] == "retrying" and status["steps"][1]["next_try_at"] else None

    await poll_until(retrying, timeout=60, what="the email step to wait out its backoff")
    handle = client.get_workflow_handle(run_id)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert applied(provider, run_id) == {"send_confirmation": 0, "record_outcome": 0}


# ------------------------------------------------------------- the workflow alone, stand-in activities


class NoDurationFailure:
    """Stand-in activities: the draft's first attempt fails with an error that says
    nothing of how long it took (as a failure the SDK raises itself does)."""

    def __init__(self) -> None:
        self.drafts = 0

    @activity.defn(name="draft")
    async def draft(self, req: DraftRequest) -> DraftOutput:
        self.drafts += 1
        if self.drafts == 1:
            raise ApplicationError("no duration in these details")
        return DraftOutput(DraftResult(subject="Re: refund", body="Done.", summary="refund", model="stand-in"), 2)

    @activity.defn(name="send_confirmation")
    async def send_confirmation(self, req: SendRequest) -> SendOutput:
        return SendOutput(EmailSent(message_id="msg_1", to=req.to, idempotency_key=req.idempotency_key), 1)

    @activity.defn(name="record_outcome")
    async def record_outcome(self, req: RecordRequest) -> RecordOutput:
        return RecordOutput(OutcomeRecorded(ticket_id="tkt_1", idempotency_key=req.idempotency_key), 1)


async def test_time_spent_waiting_for_a_worker_is_not_charged_to_the_budget(client):
    """The draft's first attempt waits 3 s for a worker, with a 2 s budget, then fails
    with no duration of its own. Before issue 35 that failure was charged the time since
    the attempt was scheduled, queue wait included, and the run failed with its budget
    spent; now it is charged nothing but its backoff, and the next attempt completes."""
    queue = f"tq-{uuid.uuid4().hex[:12]}"
    run_id = f"queue-wait-{uuid.uuid4().hex[:8]}"
    stand_in = NoDurationFailure()
    handle = client.get_workflow_handle(run_id)
    # Workflow tasks only: the draft's attempt is scheduled and no worker takes it.
    async with Worker(client, task_queue=queue, workflows=[AgentFlow], **worker_options(cache=0)):
        await start_run(client, run_id, TASK, EMAIL, queue=queue, rule=RetryRule(budget_seconds=2))

        async def draft_scheduled():
            pending = (await handle.describe()).raw_description.pending_activities
            return any(p.activity_type.name == "draft" for p in pending) or None

        await poll_until(draft_scheduled, timeout=30, what="the draft's attempt to be scheduled")
        # The wait is the scenario, not a wait for state: 3 s in the queue, past the 2 s budget.
        await asyncio.sleep(3)
        activities = [stand_in.draft, stand_in.send_confirmation, stand_in.record_outcome]
        async with Worker(client, task_queue=queue, activities=activities):
            result = await handle.result()
    assert result["status"] == "completed", result
    assert stand_in.drafts == 2
