"""The agent's four tools as plain functions against the lab's provider, shared by every peer lane.

The bodies are the lab's own declaration (``durable_agents.steps.refund_agent.REFUND_TOOLS``: the arguments' check and
the handlers), called here with the key the lane chose; these functions give each the signature a framework
reads as the tool's.

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
  the lab's loop (``durable_agents.steps.loop``), so ``CRASH_AT`` kills a worker at the same place in every lane.
- Each returns a JSON-able dict of the same fields the lab's loop gives the model
  (``durable_agents.steps.loop.run_tool``), which is what the scripted model (``durable_agents.drafting.scripted``)
  reads from a tool result: ``total`` and ``refunded`` of a lookup, ``order_id`` of a refund, ``ticket_id`` of a ticket.
  Arguments the lab's loop would refuse, an unknown order and a refund the provider refuses come back as ``{"error":
  reason}`` (nothing applied), the loop's refused result; any other failure raises, and the framework's retry takes
  over.
- The email goes to the run's customer (``to``, which the lane takes from the run's inputs), never to an address
  the model wrote.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from durable_agents import ToolContext, ToolRefused
from durable_agents.providerclient import ProviderClient, provider_url_from_env
from durable_agents.steps.crashpoints import crash_point
from durable_agents.steps.flow import StepDeps
from durable_agents.steps.keys import KEY_PREFIX
from durable_agents.steps.loop import call_id_digest
from durable_agents.steps.refund_agent import REFUND_TOOLS

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


async def _declared(client: ProviderClient, tool: str, run_id: str, args: JsonDict, *, key: str | None = None,
                    to: str = "") -> JsonDict:
    """The lab's tool as it declares it (``durable_agents.steps.refund_agent.REFUND_TOOLS``): its arguments checked, its
    handler run against ``client`` under ``key``, the email to ``to``; a refusal as ``{"error": reason}``. A lane calls
    a tool outside any turn of the lab's loop: its place is given as turn 0, call 0."""
    context = ToolContext(run_id, 0, 0, idempotency_key=key, params={"email": to},
                          services=StepDeps(provider=client, llm=None))
    try:
        out = await REFUND_TOOLS.call(tool, json.dumps(args, ensure_ascii=False), context)
    except ToolRefused as err:
        return {"error": err.reason}
    if tool in REFUND_TOOLS.effects:
        crash_point(f"tool:{tool}:after_effect")
    return dict(out.content)


async def lookup_order(client: ProviderClient, *, run_id: str, order_id: str) -> JsonDict:
    """The order's total and what of it was refunded already, in cents."""
    return await _declared(client, "lookup_order", run_id, {"order_id": order_id})


async def issue_refund(client: ProviderClient, *, run_id: str, order_id: str, amount: int,
                       idempotency_key: str) -> JsonDict:
    """Refund ``amount`` cents of the order; the provider refuses a refund past the order's total."""
    return await _declared(client, "issue_refund", run_id, {"order_id": order_id, "amount": amount},
                           key=idempotency_key)


async def send_email(client: ProviderClient, *, run_id: str, to: str, subject: str, body: str,
                     idempotency_key: str) -> JsonDict:
    """Email the run's customer (``to``: the lane's, from the run's inputs)."""
    return await _declared(client, "send_email", run_id, {"subject": subject, "body": body}, key=idempotency_key,
                           to=to)


async def create_ticket(client: ProviderClient, *, run_id: str, summary: str, idempotency_key: str) -> JsonDict:
    """Record the outcome in the ticket system, in one line."""
    return await _declared(client, "create_ticket", run_id, {"summary": summary}, key=idempotency_key)
