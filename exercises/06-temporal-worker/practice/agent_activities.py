"""Exercise 6, practice: the flow's steps as Temporal activities.

Only the draft is an activity so far. An activity may run more than once (a
retry, a worker killed mid-attempt): an effect must send the idempotency key
its request carries, the same on every attempt (TODO 14).
"""

from __future__ import annotations

from temporalio import activity

from durable_agents.steps import flow
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.models import (  # noqa: F401
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

    # TODO 14 (exercise 6): the worker offers the two effects under the names the workflow asks
    #   for, each doing its step with the request it is given. That request carries the key the
    #   workflow built, the same on every attempt: send that one, never one of its own.
    # END TODO 14
