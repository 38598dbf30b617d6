"""Exercise 6, solution: the flow's steps as Temporal activities.

An activity may run more than once (a retry, a worker killed mid-attempt),
so each effect sends the idempotency key its request carries: the request
builders in workflow code derive it from the run id and the step name
(``durable_agents.steps.keys``), the same on every attempt, and the provider applies the
effect once.
"""

from __future__ import annotations

from temporalio import activity

from durable_agents.steps import flow
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.models import (
    DraftRequest,
    DraftResult,
    EmailSent,
    OutcomeRecorded,
    RecordRequest,
    SendRequest,
)


class FlowActivities:
    """The three steps as activities, with what they need from the world (the worker builds it)."""

    def __init__(self, deps: StepDeps) -> None:
        self.deps = deps

    @activity.defn(name="draft")
    async def draft(self, request: DraftRequest) -> DraftResult:
        return await flow.draft(request, self.deps)

    @activity.defn(name="send_confirmation")
    async def send_confirmation(self, request: SendRequest) -> EmailSent:
        return await flow.send_confirmation(request, self.deps)

    @activity.defn(name="record_outcome")
    async def record_outcome(self, request: RecordRequest) -> OutcomeRecorded:
        return await flow.record_outcome(request, self.deps)
