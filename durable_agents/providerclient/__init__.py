"""The client side of the provider (``python -m provider``): the HTTP client
the step functions use, and the synchronous helpers that tests, the lab and the
CLIs count effects with (``fetch_effects``), seed the orders refunds are taken
from (``seed_orders``) and count the agent loop's order lookups with
(``lookup_counts``).

A package of its own, apart from ``provider``, so that the judge of "exactly
once" shares no code with the steps it judges: the client belongs to the
steps' side and speaks their error vocabulary (``durable_agents.steps.errors``). What both
sides must honour is docs/provider-contract.md. The client, its error mapping
and the receipts are in ``durable_agents.providerclient.client``.
"""

from __future__ import annotations

from durable_agents.providerclient.client import (
    AppliedRequest,
    EffectRecord,
    EmailReceipt,
    OrderInfo,
    ProviderClient,
    RefundReceipt,
    TicketReceipt,
    email_body,
    error_from_response,
    error_from_transport,
    fetch_effects,
    lookup_counts,
    order_body,
    parse_retry_after,
    provider_url_from_env,
    refund_body,
    seed_given,
    seed_orders,
    ticket_body,
)

__all__ = [
    "AppliedRequest",
    "EffectRecord",
    "EmailReceipt",
    "OrderInfo",
    "ProviderClient",
    "RefundReceipt",
    "TicketReceipt",
    "email_body",
    "error_from_response",
    "error_from_transport",
    "fetch_effects",
    "lookup_counts",
    "order_body",
    "parse_retry_after",
    "provider_url_from_env",
    "refund_body",
    "seed_given",
    "seed_orders",
    "ticket_body",
]
