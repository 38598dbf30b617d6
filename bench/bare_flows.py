"""Baselines for bench_overhead.py: bare Temporal workflows with nothing of the lab's adapter.

- ``BareN``: N sequential no-op activities: the floor, Temporal's own cost.
- ``BareSteps``: the same three step functions the flow runs (``durable_agents.steps.flow``,
  with the same dependencies: offline model, memory read, provider over HTTP),
  each in a plain activity: no heartbeats, no error mapping, no input checks,
  no status bookkeeping, no memory write. The flow against this is the
  adapter's overhead; against ``BareN`` it is the adapter plus the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from durable_agents.steps import flow
    from durable_agents.steps.keys import idempotency_key
    from durable_agents.steps.models import (
        DraftRequest,
        DraftResult,
        EmailSent,
        OutcomeRecorded,
        RecordRequest,
        SendRequest,
    )

TIMEOUT = timedelta(seconds=10)


@activity.defn(name="noop")
async def noop(i: int) -> int:
    return i


@workflow.defn(name="BareN")
class BareN:
    @workflow.run
    async def run(self, n: int) -> int:
        total = 0
        for i in range(n):
            total += await workflow.execute_activity(noop, i, start_to_close_timeout=TIMEOUT)
        return total


@dataclass
class BareInput:
    run_id: str
    task: str
    email: str


class BareStepActivities:
    def __init__(self, deps: flow.StepDeps) -> None:
        self.deps = deps

    @activity.defn(name="bare_draft")
    async def draft(self, req: DraftRequest) -> DraftResult:
        return await flow.draft(req, self.deps)

    @activity.defn(name="bare_send")
    async def send(self, req: SendRequest) -> EmailSent:
        return await flow.send_confirmation(req, self.deps)

    @activity.defn(name="bare_record")
    async def record(self, req: RecordRequest) -> OutcomeRecorded:
        return await flow.record_outcome(req, self.deps)

    def all(self) -> list:
        return [self.draft, self.send, self.record]


@workflow.defn(name="BareSteps")
class BareSteps:
    @workflow.run
    async def run(self, inp: BareInput) -> str:
        drafted = await workflow.execute_activity(
            BareStepActivities.draft, DraftRequest(inp.run_id, inp.task, inp.run_id), start_to_close_timeout=TIMEOUT)
        sent = await workflow.execute_activity(
            BareStepActivities.send,
            SendRequest(inp.run_id, inp.email, drafted.subject, drafted.body,
                        idempotency_key(inp.run_id, "send_confirmation")),
            start_to_close_timeout=TIMEOUT)
        recorded = await workflow.execute_activity(
            BareStepActivities.record,
            RecordRequest(inp.run_id, drafted.summary, sent.message_id, idempotency_key(inp.run_id, "record_outcome")),
            start_to_close_timeout=TIMEOUT)
        return recorded.ticket_id
