"""A second flow that exists only in the tests: four steps, one of them a refund.

    draft -> issue_refund (a refund, POST /v1/refunds) -> send_confirmation (an email) -> record_outcome (a ticket)

It is built from the plan alone (``durable_agents.steps.plan.FlowStep``): the lab's three steps
as ``durable_agents.steps.plan.FLOW`` has them, and one step of its own, whose function and
request builder are here, whose effect is the provider's ``refund`` kind, and
whose amount and order id are the run's parameters (``durable_agents.steps.params``). No
engine, tool or page names it: the commands run it when ``LAB_FLOW`` names it,

    LAB_FLOW=tests.refund_flow:REFUND_FLOW python -m durable_agents.runrecord start RUN_ID "TASK" --email ADDR \\
        --param order_id=A-1234 --param amount=1250

and the same with ``python -m durable_agents.dbosflow``, once the provider keeps the order
(``durable_agents.providerclient.seed_orders``, or ``POST /v1/orders``): it refunds only the
orders it keeps, up to their total, and refuses any other refund, which fails
this step (``durable_agents.steps.errors.Refused``, a permanent error).
``tests/test_second_flow.py`` runs it, kills it and resumes it on the run
record and on DBOS through the lab's engine driver, draws it with the timeline
and counts it with the effects table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from durable_agents.steps.adoption import start_metadata
from durable_agents.steps.crashpoints import crash_point
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.plan import FLOW, FlowStep
from durable_agents.steps.requests import RunInputs

STEP = "issue_refund"


@dataclass(frozen=True)
class RefundRequest:
    run_id: str
    order_id: str
    amount: int  # in the currency's minor units (cents)
    idempotency_key: str
    start_id: str = ""


@dataclass(frozen=True)
class RefundIssued:
    refund_id: str
    idempotency_key: str
    replayed: bool = False


def refund_request(inputs: RunInputs, results: Mapping[str, Any]) -> RefundRequest:
    """From the run's parameters, like every request from the run's inputs: the same on every attempt."""
    return RefundRequest(run_id=inputs.run_id, order_id=str(inputs.params["order_id"]),
                         amount=int(inputs.params["amount"]), idempotency_key=idempotency_key(inputs.run_id, STEP),
                         start_id=inputs.start_id)


async def issue_refund(req: RefundRequest, deps: StepDeps) -> RefundIssued:
    """The refund, once, under the step's key."""
    crash_point(f"{STEP}:before")
    receipt = await deps.provider.issue_refund(idempotency_key=req.idempotency_key, run_id=req.run_id,
                                               order_id=req.order_id, amount=req.amount,
                                               metadata=start_metadata(req.start_id))
    crash_point(f"{STEP}:after_effect")
    return RefundIssued(refund_id=receipt.refund_id, idempotency_key=req.idempotency_key, replayed=receipt.replayed)


DRAFT, SEND, RECORD = FLOW

REFUND_FLOW: tuple[FlowStep, ...] = (
    DRAFT,
    FlowStep(STEP, issue_refund, refund_request, kind="refund", crash_points=("before", "after_effect"),
             params=("order_id", "amount")),
    SEND,
    RECORD,
)

SPEC = f"{__name__}:REFUND_FLOW"
"""What ``LAB_FLOW`` is given to run it."""
