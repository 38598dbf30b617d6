"""The client side of the provider (``python -m provider``): the HTTP client
the step functions use, and the synchronous reads (``fetch_effects``) that
tests, the lab and the CLIs count effects with.

A package of its own, apart from ``provider``, so that the judge of "exactly
once" shares no code with the steps it judges: the client belongs to the
steps' side and speaks their error vocabulary (``steps.errors``). What both
sides must honour is docs/provider-contract.md. The client, its error mapping
and the receipts are in ``providerclient.client``.
"""

from __future__ import annotations

from providerclient.client import (
    AppliedRequest,
    EffectRecord,
    EmailReceipt,
    ProviderClient,
    RefundReceipt,
    TicketReceipt,
    email_body,
    error_from_response,
    error_from_transport,
    fetch_effects,
    parse_retry_after,
    provider_url_from_env,
    refund_body,
    ticket_body,
)

__all__ = [
    "AppliedRequest",
    "EffectRecord",
    "EmailReceipt",
    "ProviderClient",
    "RefundReceipt",
    "TicketReceipt",
    "email_body",
    "error_from_response",
    "error_from_transport",
    "fetch_effects",
    "parse_retry_after",
    "provider_url_from_env",
    "refund_body",
    "ticket_body",
]
