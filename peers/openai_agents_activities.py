"""The four tools as Temporal activities, for the Agents SDK lane's ``activity_as_tool`` variants.

The form the integration's README shows for a tool with I/O: an ``@activity.defn`` function, made a tool in
the workflow by ``temporalio.openai_agents.workflow.activity_as_tool`` and registered on the worker. The
tool's name and its JSON schema are the function's (``agents.function_schema``): the parameters the model
fills, so the same names as the lab's loop (``durable_agents.steps.refund_agent.REFUND_TOOLS``). ``activity_as_tool``
gives the model ``str()`` of what the activity returns: each returns the JSON text of ``peers.tools``' answer, which is
what the scripted model reads.

The idempotency key of an effect, by the run's variant (``CustomerRun.keyed``):

- ``activity_as_tool``: ``peers.tools.fresh_key()``, a new key per attempt: what an activity written as the docs
  show one (no key in mind) sends;
- ``activity_as_tool_keyed``: ``peers.tools.call_key`` of ``activity.info()``'s workflow id and activity id.
  Temporal gives an activity the same id on every attempt and again when a new worker replays the history and
  schedules it (the workflow's n-th command); so a retry after a kill sends the same key. Caveat: the id is a
  sequence number within one workflow *run*: a reset or a continue-as-new starts a new run whose activities are
  numbered from 1 again, under the same workflow id, so a call there can share a key with a different call of
  the old run (the provider then answers the old effect, or refuses a different body as a conflict).

The customer's address is not a parameter (the model never chooses it): the activity takes it from the run's
context, the ``RunContextWrapper`` that ``activity_as_tool`` passes a copy of to an activity whose first
parameter takes one. That copy is the activity's input in the history: the context, the usage, the turn's input
and the run's ledger of tool invocations, so it grows with the calls made so far (measured, one order's run: 805
bytes for the lookup, 1,611 for the ticket, the fourth call).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from agents import RunContextWrapper
from temporalio import activity

from peers import tools


@dataclass
class CustomerRun:
    """The Agents SDK run's context (``Runner.run(context=...)``): what a tool may know that the model does not
    choose. ``keyed``: the variant ``activity_as_tool_keyed``."""

    run_id: str
    email: str
    keyed: bool = False


def _key(run: CustomerRun, tool: str) -> str:
    if not run.keyed:
        return tools.fresh_key()
    info = activity.info()
    return tools.call_key(run.run_id, tool, f"{info.workflow_id}/{info.activity_id}")


def _text(answer: tools.JsonDict) -> str:
    return json.dumps(answer, ensure_ascii=False)


@activity.defn(name="lookup_order")
async def lookup_order(ctx: RunContextWrapper[CustomerRun], order_id: str) -> str:
    """Look up an order: its total and how much of it was already refunded, in cents."""
    async with tools.provider() as client:
        return _text(await tools.lookup_order(client, run_id=ctx.context.run_id, order_id=order_id))


@activity.defn(name="issue_refund")
async def issue_refund(ctx: RunContextWrapper[CustomerRun], order_id: str, amount: int) -> str:
    """Refund part or all of an order, in cents. Never more than the order's total in all."""
    run = ctx.context
    async with tools.provider() as client:
        return _text(await tools.issue_refund(client, run_id=run.run_id, order_id=order_id, amount=amount,
                                              idempotency_key=_key(run, "issue_refund")))


@activity.defn(name="send_email")
async def send_email(ctx: RunContextWrapper[CustomerRun], subject: str, body: str) -> str:
    """Send an email to the customer of this conversation."""
    run = ctx.context
    async with tools.provider() as client:
        return _text(await tools.send_email(client, run_id=run.run_id, to=run.email, subject=subject, body=body,
                                            idempotency_key=_key(run, "send_email")))


@activity.defn(name="create_ticket")
async def create_ticket(ctx: RunContextWrapper[CustomerRun], summary: str) -> str:
    """Record the outcome in the ticket system, in one line."""
    run = ctx.context
    async with tools.provider() as client:
        return _text(await tools.create_ticket(client, run_id=run.run_id, summary=summary,
                                               idempotency_key=_key(run, "create_ticket")))


ACTIVITIES = [lookup_order, issue_refund, send_email, create_ticket]
