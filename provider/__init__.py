"""Local stand-in for the external email and ticket APIs: a separate process
(``python -m provider``) that honours ``Idempotency-Key``, and the client the
step functions use to reach it.

The contract (idempotency semantics, counts, faults) is in
``provider.server``'s docstring; the client and its error mapping are in
``provider.client``. The server side uses the standard library only, so
importing this package does not import httpx until a client name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from provider.client import (
        EffectRecord,
        EmailReceipt,
        ProviderClient,
        TicketReceipt,
        fetch_effects,
        provider_url_from_env,
    )

__all__ = [
    "EffectRecord",
    "EmailReceipt",
    "ProviderClient",
    "TicketReceipt",
    "fetch_effects",
    "provider_url_from_env",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from provider import client

        return getattr(client, name)
    raise AttributeError(f"module 'provider' has no attribute {name!r}")
