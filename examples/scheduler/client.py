"""The async client an agent's tools use to call the scheduler service (``examples.scheduler.service``).

Errors: an answer of 4xx raises ``SchedulerRefused`` with the service's error text (permanent: retrying the
same request gets the same answer); 409, a key reused for another request, is its subclass ``KeyConflict``.
A 5xx, a timeout or a failed connection raises ``SchedulerUnavailable``: retry with the same key, and the
service applies the effect at most once.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from durable_agents import Applied, ToolOutput


class SchedulerError(Exception):
    """Any failure of a call to the scheduler."""


class SchedulerRefused(SchedulerError):
    """The service refused the request (400, 409, 422 or another 4xx); ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.message, self.status = message, status


class KeyConflict(SchedulerRefused):
    """409: the idempotency key was already used for a different request."""


class SchedulerUnavailable(SchedulerError):
    """The service could not answer (5xx, timeout, connection refused or cut); retryable."""


class SchedulerClient:
    """One ``httpx.AsyncClient`` to the service at ``base_url``; close it with ``aclose()``."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout)

    async def find_slots(self, date: str) -> list[dict[str, Any]]:
        """The free half-hour slots on ``date`` (YYYY-MM-DD): ``[{"room", "start", "minutes"}, ...]``."""
        slots: list[dict[str, Any]] = (await self._call("GET", "/slots", params={"date": date}))["slots"]
        return slots

    async def book_room(self, key: str, room: str, start: str, minutes: int) -> dict[str, Any]:
        """Book ``room`` from ``start`` (YYYY-MM-DDTHH:MM) once under ``key``: the service's response."""
        return await self._call("POST", "/bookings", key=key, body={"room": room, "start": start, "minutes": minutes})

    async def send_invite(self, key: str, to: str, subject: str, body: str) -> dict[str, Any]:
        """Send one invite once under ``key``: the service's response."""
        return await self._call("POST", "/invites", key=key, body={"to": to, "subject": subject, "body": body})

    async def applied(self, key: str) -> dict[str, Any] | None:
        """The effect stored under ``key`` (``{"key", "kind", "response"}``), or None if none was applied."""
        try:
            return await self._call("GET", f"/effects/{quote(key, safe='')}")
        except SchedulerRefused as refused:
            if refused.status == 404:
                return None
            raise

    async def counts(self) -> dict[str, Any]:
        """``{"applied": {key: effects stored}, "requests": {key: requests seen}, "lookups": {key: lookups}}``."""
        return await self._call("GET", "/counts")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, *, key: str | None = None, body: dict[str, Any] | None = None,
                    params: dict[str, str] | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": key} if key is not None else {}
        try:
            answer = await self._http.request(method, path, json=body, params=params, headers=headers)
        except httpx.TransportError as error:
            raise SchedulerUnavailable(f"{method} {path}: {error!r}") from error
        if answer.status_code >= 500:
            raise SchedulerUnavailable(f"{method} {path}: {answer.status_code} {answer.text[:200]}")
        try:
            payload = answer.json()
        except ValueError as error:
            raise SchedulerUnavailable(f"{method} {path}: not JSON: {answer.text[:200]!r}") from error
        if not isinstance(payload, dict):
            raise SchedulerUnavailable(f"{method} {path}: expected a JSON object, got {payload!r:.200}")
        if answer.status_code >= 400:
            kind = KeyConflict if answer.status_code == 409 else SchedulerRefused
            raise kind(str(payload.get("error", payload)), answer.status_code)
        return payload


async def applied(key: str, client: SchedulerClient) -> Applied | None:
    """A tool's lookup by key (``durable_agents.Tool.lookup``): the booking or invite the service applied under
    ``key``, as the tool's handler gives it back, or None. ``settle`` asks it, and so does the retry of a call
    whose answer was lost, which then sends nothing again."""
    found = await client.applied(key)
    if found is None:
        return None
    response = {**found["response"], "replayed": True}  # what the service answers a replay of it
    return Applied(True, ToolOutput(response, response.get("booking_id") or response.get("invite_id"), True))
