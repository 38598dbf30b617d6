"""The provider's error vocabulary: every answer other than success is an
``ApiError``, sent as JSON ``{"error": code, "message": text}`` plus ``field``
when one field is to blame (the codes are listed in ``provider.server``'s
docstring and docs/provider-contract.md).

The provider's own, on purpose: it is the far side of an API, so it shares no
error types with its clients (their vocabulary is ``durable_agents.steps.errors``, onto which
``providerclient`` maps these answers).
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An answer other than success; becomes a JSON error response."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message
        self.field = field
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.error, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body

