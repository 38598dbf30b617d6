"""Adoption (durable_agents/steps/adoption.py), against a real provider process: the step
that gets a 409 reads back what was applied under its key and adopts it only
when it is its own run's (same start, same endpoint, same recipient); every
other conflict is permanent and says which check failed. End to end: a run
id started again (after retention) fails on the conflict instead of adopting
another run's email."""

from __future__ import annotations

import pytest

from durable_agents.flowclient.runs import start_run
from durable_agents.providerclient import ProviderClient, fetch_effects
from durable_agents.steps.adoption import START_ID_METADATA, adopt
from durable_agents.steps.errors import IdempotencyConflict, PermanentError
from durable_agents.steps.flow import StepDeps, record_outcome, send_confirmation
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.models import RecordRequest, SendRequest
from tests.support import EMAIL, wait_closed


def send(run_id: str, body: str, start_id: str, to: str = EMAIL) -> SendRequest:
    return SendRequest(run_id=run_id, to=to, subject="Re: refund", body=body,
                       idempotency_key=idempotency_key(run_id, "send_confirmation"), start_id=start_id)


async def test_a_different_email_of_the_same_run_is_adopted_and_nothing_is_sent_twice(provider, run_id):
    async with ProviderClient(provider.url) as pc:
        deps = StepDeps(provider=pc, llm=None)
        first = await send_confirmation(send(run_id, "the first draft", "start-A"), deps)
        again = await send_confirmation(send(run_id, "the first draft", "start-A"), deps)
        assert again.replayed and again.adopted is None  # the same request: a replay
        other = await send_confirmation(send(run_id, "a second, different draft", "start-A"), deps)
    assert other.message_id == first.message_id
    assert other.adopted["body"] == "the first draft"  # the content that was really sent
    assert ("applied sha256" in other.adopted["reason"]
            and other.adopted["applied_sha256"] != other.adopted["attempted_sha256"])
    [effect] = fetch_effects(provider.url, run_id=run_id)
    assert (effect.requests, effect.effects_applied) == (3, 1)


@pytest.mark.parametrize("case, words", [
    ("another start", "belongs to another start of run id"),
    ("another recipient", "went to another recipient"),
    ("another endpoint", "was used for POST /v1/tickets"),
])
async def test_conflicts_that_are_not_this_runs_own_are_permanent(provider, run_id, case, words):
    async with ProviderClient(provider.url) as pc:
        deps = StepDeps(provider=pc, llm=None)
        if case == "another endpoint":
            # A ticket request carried the email step's key first.
            await record_outcome(RecordRequest(run_id=run_id, summary="s", email_message_id="msg_x",
                                               idempotency_key=idempotency_key(run_id, "send_confirmation"),
                                               start_id="start-A"), deps)
        else:
            await send_confirmation(send(run_id, "the first draft", "start-A"), deps)
        attempt = {"another start": send(run_id, "another draft", "start-B"),
                   "another recipient": send(run_id, "another draft", "start-A", to="grace@example.com"),
                   "another endpoint": send(run_id, "a draft", "start-A")}[case]
        with pytest.raises(PermanentError, match=words):
            await send_confirmation(attempt, deps)
    effects = fetch_effects(provider.url, run_id=run_id)
    assert sum(e.effects_applied for e in effects) == 1


def test_a_conflict_with_nothing_applied_is_not_adoption():
    with pytest.raises(PermanentError, match="applied nothing"):
        adopt(IdempotencyConflict("idempotency conflict: ..."), None, kind="email", endpoint="POST /v1/emails",
              ours={"run_id": "r", "to": EMAIL}, start_id="s", key="agentlab/r/send_confirmation")


async def test_a_run_id_started_again_does_not_adopt_the_old_runs_email(client, workers, provider, run_id,
                                                                         task_queue):
    """What a run id reused after the history's retention looks like: the provider
    still holds that id's email, from another start. The new run fails at once."""
    async with ProviderClient(provider.url) as pc:
        await pc.send_email(idempotency_key=idempotency_key(run_id, "send_confirmation"), run_id=run_id, to=EMAIL,
                            subject="Re: an older task", body="sent by the first run with this id",
                            metadata={START_ID_METADATA: "an-earlier-start"})
    workers()
    await start_run(client, run_id, "Confirm the refund for order 1234", EMAIL, queue=task_queue)
    status = await wait_closed(client, run_id)
    assert status["status"] == "failed", status
    assert status["steps"][1]["attempts"] == 1  # a 409 is never retried
    assert "belongs to another start of run id" in status["error"], status["error"]
    assert sum(e.effects_applied for e in fetch_effects(provider.url, run_id=run_id)) == 1
