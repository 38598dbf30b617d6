"""The agent's four tools as plain functions against the lab's provider, shared by every peer lane.

Each lane wraps these bodies the way its framework's documentation shows a tool (pydantic-ai's
``@agent.tool``, the Agents SDK's ``function_tool`` or ``activity_as_tool``); the bodies are the same in every
lane, so what differs between lanes is only what the framework does around them. No framework is imported
here.

The contract:

- ``lookup_order`` reads an order (no effect, no key); ``issue_refund``, ``send_email`` and ``create_ticket``
  each apply one effect at the provider under the ``idempotency_key`` the caller passes. The lane decides it:
  ``fresh_key()`` (a new uuid per call: what a tool written without a key in mind amounts to at a receiver
  that dedups by key) for ``documented``; something derived from the framework's identity of the call for
  ``keyed`` (``call_key``).
- Right after the provider's 200 for an effect, ``crash_point(f"tool:{name}:after_effect")``: the same names as
  the lab's loop (``steps.loop``), so ``CRASH_AT`` kills a worker at the same place in every lane.
- Each returns a JSON-able dict of the same fields the lab's loop gives the model (``steps.loop.run_tool``),
  which is what the scripted model (``drafting.scripted``) reads from a tool result: ``total`` and
  ``refunded`` of a lookup, ``order_id`` of a refund, ``ticket_id`` of a ticket. Arguments the lab's loop would
  refuse, an unknown order and a refund the provider refuses come back as ``{"error": reason}`` (nothing
  applied), the loop's refused result; any other failure raises, and the framework's retry takes over.
- The email goes to the run's customer (``to``, which the lane takes from the run's inputs), never to an address
  the model wrote.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from providerclient import ProviderClient, provider_url_from_env
from steps.crashpoints import crash_point
from steps.errors import Refused
from steps.keys import KEY_PREFIX
from steps.loop import AskedCall, call_id_digest, checked_arguments

__all__ = ["call_key", "create_ticket", "fresh_key", "issue_refund", "lookup_order", "provider", "send_email"]

JsonDict = dict[str, Any]


def provider() -> ProviderClient:
    """A client for the provider at ``PROVIDER_URL`` (the lab's default when unset). The caller closes it."""
    return ProviderClient(provider_url_from_env())


def fresh_key() -> str:
    """A new key per call (``documented``): a retried call is a new request to the provider."""
    return f"peer-fresh/{uuid.uuid4()}"


def call_key(run_id: str, tool: str, identity: str) -> str:
    """A key from what the framework gives a tool to identify its call (``keyed``)::

        agentlab/<run id>/peer/<tool>-<first 16 hex of sha256(identity)>

    ``identity`` is the framework's (a model's tool call id, an activity id): untrusted text, so it enters the
    key only as a digest, and the key stays within the provider's rule (printable ASCII, at most 255)."""
    if not run_id or not identity:
        raise ValueError("call_key needs a run id and the framework's identity of the call")
    return f"{KEY_PREFIX}/{run_id[:160]}/peer/{tool}-{call_id_digest(identity)}"


def _checked(tool: str, args: JsonDict) -> JsonDict | str:
    """The arguments held to the lab's rule for the tool (``steps.loop.TOOL_FIELDS``), or why they are refused."""
    return checked_arguments(AskedCall("peer", tool, json.dumps(args, ensure_ascii=False)))


async def lookup_order(client: ProviderClient, *, run_id: str, order_id: str) -> JsonDict:
    """The order's total and what of it was refunded already, in cents."""
    args = _checked("lookup_order", {"order_id": order_id})
    if isinstance(args, str):
        return {"error": args}
    order = await client.lookup_order(order_id, run_id=run_id)
    if order is None:
        return {"error": f"no order {order_id!r}"}
    return {"order_id": order.order_id, "total": order.total, "refunded": order.refunded, "currency": order.currency}


async def issue_refund(client: ProviderClient, *, run_id: str, order_id: str, amount: int,
                       idempotency_key: str) -> JsonDict:
    """Refund ``amount`` cents of the order; the provider refuses a refund past the order's total."""
    args = _checked("issue_refund", {"order_id": order_id, "amount": amount})
    if isinstance(args, str):
        return {"error": args}
    try:
        refund = await client.issue_refund(idempotency_key=idempotency_key, run_id=run_id, order_id=order_id,
                                           amount=amount)
    except Refused as err:
        return {"error": f"the provider refused it: {err.message}"}
    crash_point("tool:issue_refund:after_effect")
    return {"refund_id": refund.refund_id, "order_id": order_id, "amount": amount}


async def send_email(client: ProviderClient, *, run_id: str, to: str, subject: str, body: str,
                     idempotency_key: str) -> JsonDict:
    """Email the run's customer (``to``: the lane's, from the run's inputs)."""
    args = _checked("send_email", {"subject": subject, "body": body})
    if isinstance(args, str):
        return {"error": args}
    try:
        email = await client.send_email(idempotency_key=idempotency_key, run_id=run_id, to=to, subject=subject,
                                        body=body)
    except Refused as err:
        return {"error": f"the provider refused it: {err.message}"}
    crash_point("tool:send_email:after_effect")
    return {"message_id": email.message_id, "to": to}


async def create_ticket(client: ProviderClient, *, run_id: str, summary: str, idempotency_key: str) -> JsonDict:
    """Record the outcome in the ticket system, in one line."""
    args = _checked("create_ticket", {"summary": summary})
    if isinstance(args, str):
        return {"error": args}
    try:
        ticket = await client.create_ticket(idempotency_key=idempotency_key, run_id=run_id, summary=summary,
                                            email_message_id="")
    except Refused as err:
        return {"error": f"the provider refused it: {err.message}"}
    crash_point("tool:create_ticket:after_effect")
    return {"ticket_id": ticket.ticket_id}
