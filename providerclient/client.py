"""Client for the provider (``python -m provider``), used by the step functions:
``send_email``, ``create_ticket`` and ``issue_refund``, one per kind of effect
(docs/provider-contract.md), and ``lookup`` by key.

Workers find the provider through ``PROVIDER_URL`` (see
``provider_url_from_env``). Every effect call takes an ``idempotency_key``:
the caller derives it so that it is stable across retries and restarts of the
same step of the same run; the provider then applies the effect at most once
and replays the stored receipt to every retry.

Errors are mapped onto the engines' vocabulary (``steps.errors``):

===========================================  ==================================
What happened                                 Raised
===========================================  ==================================
connection refused, connect timeout, 408,     ``TransientError``, with
425, 429                                      ``retry_after`` from a Retry-After
                                              header (``steps.retry``)
read timeout, connection broken after the     ``TransientError(in_doubt=True)``:
request was sent, 500-599                     it may have been applied
409 (the key was used for another request)    ``IdempotencyConflict`` (never
                                              retried; see ``lookup``)
any other 4xx (invalid field, missing key)    ``PermanentError`` naming the field
2xx to an effect request whose body is not a  ``TransientError(in_doubt=True)``:
JSON object or lacks the receipt's id         it was applied, the answer lost
===========================================  ==================================

A timeout is transient on purpose even though the effect may have been applied:
retrying with the same key is safe, because the provider replays. So is an
unreadable 2xx: the provider applied the request (or replayed what it had
applied), so it is never "nothing happened"; the retry gets the stored answer
back, readable this time or in doubt again. ``lookup``
asks the provider what it applied under a key: how a 409 is understood
(``steps.adoption``) and how a step left in doubt is settled.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from steps.errors import IdempotencyConflict, PermanentError, StepError, TransientError
from steps.retry import parse_retry_after as _parse_retry_after

DEFAULT_URL = "http://127.0.0.1:8780"


@dataclass(frozen=True)
class EmailReceipt:
    message_id: str
    replayed: bool  # True when the provider answered from its store: the email went out earlier


@dataclass(frozen=True)
class TicketReceipt:
    ticket_id: str
    replayed: bool


@dataclass(frozen=True)
class RefundReceipt:
    refund_id: str
    replayed: bool


@dataclass(frozen=True)
class EffectRecord:
    """The provider's bookkeeping for one idempotency key (see provider.server)."""

    key: str
    kind: str  # the provider's kind: "email", "ticket", "refund" (provider.kinds)
    run_id: str | None  # None only for refused requests whose run_id was unusable
    requests: int  # every request that carried the key, replays and failures included
    effects_applied: int  # 0 or 1
    status_code: int | None  # of the latest response for this key
    first_seen: str
    last_seen: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EffectRecord:
        return cls(
            key=data["key"],
            kind=data["kind"],
            run_id=data["run_id"],
            requests=int(data["requests"]),
            effects_applied=int(data["effects_applied"]),
            status_code=data["status_code"],
            first_seen=data["first_seen"],
            last_seen=data["last_seen"],
        )


@dataclass(frozen=True)
class AppliedRequest:
    """The provider's answer to ``lookup``: what it holds under one key."""

    key: str
    kind: str
    requests: int
    applied: bool
    endpoint: str | None = None  # "POST /v1/emails" once applied
    applied_at: str | None = None
    request: dict[str, Any] | None = None  # the applied body, metadata included
    request_sha256: str | None = None
    response: dict[str, Any] | None = None  # the stored answer, with the effect's id (message_id, ...)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AppliedRequest:
        return cls(
            key=str(data.get("key")), kind=str(data.get("kind")), requests=int(data.get("requests") or 0),
            applied=bool(data.get("applied")), endpoint=data.get("endpoint"), applied_at=data.get("applied_at"),
            request=data.get("request"), request_sha256=data.get("request_sha256"), response=data.get("response"),
        )


def _with_metadata(payload: dict[str, Any], metadata: dict[str, str] | None) -> dict[str, Any]:
    """``payload`` with the request's metadata, only when there is some, so requests
    made before metadata existed keep their exact form."""
    if metadata:
        payload["metadata"] = dict(metadata)
    return payload


def email_body(*, run_id: str, to: str, subject: str, body: str,
               metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON body of ``POST /v1/emails``."""
    return _with_metadata({"run_id": run_id, "to": to, "subject": subject, "body": body}, metadata)


def ticket_body(*, run_id: str, summary: str, email_message_id: str,
                metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON body of ``POST /v1/tickets``."""
    return _with_metadata({"run_id": run_id, "summary": summary, "email_message_id": email_message_id}, metadata)


def refund_body(*, run_id: str, order_id: str, amount: int,
                metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """The JSON body of ``POST /v1/refunds``; ``amount`` in the currency's minor units (cents)."""
    return _with_metadata({"run_id": run_id, "order_id": order_id, "amount": amount}, metadata)


def provider_url_from_env(env: Mapping[str, str] = os.environ) -> str:
    """The provider's base URL from ``PROVIDER_URL``, default ``http://127.0.0.1:8780``."""
    url = (env.get("PROVIDER_URL") or "").strip() or DEFAULT_URL
    return _check_base_url(url, source="PROVIDER_URL")


def _check_base_url(url: str, *, source: str = "base_url") -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{source} {url!r} is not an http(s) URL: give one such as {DEFAULT_URL}")
    return url.rstrip("/")


def _tls_settings(url: str) -> dict[str, Any]:
    # Plain http has no TLS to verify, and loading the CA bundle costs ~40 ms
    # per client; https keeps httpx's default verification.
    return {"verify": False} if url.startswith("http://") else {}


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After value: ``steps.retry.parse_retry_after``,
    the one reading of the header (capped, never raises)."""
    return _parse_retry_after(value, now=None if now is None else now.timestamp())


def error_from_response(response: httpx.Response, action: str) -> StepError:
    """Map a non-2xx answer onto TransientError / PermanentError."""
    status = response.status_code
    code, message, field = _error_fields(response)
    if status == 409:
        return IdempotencyConflict(f"idempotency conflict: {message}")
    detail = f"{status} {code}" + (f", field {field!r}" if field else "")
    if status in (408, 425, 429) or 500 <= status <= 599:
        return TransientError(
            f"the provider could not {action} now ({detail}): {message}",
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
            # A 5xx does not say whether the request was applied: a gateway or proxy may send
            # one after the origin applied it, whatever its body claims (docs/provider-contract.md).
            in_doubt=status >= 500,
        )
    if 400 <= status <= 499:
        return PermanentError(f"the provider refused to {action} ({detail}): {message}")
    return PermanentError(f"the provider gave an unexpected answer to {action} ({detail}): {message}")


# The request never left: nothing can have been applied.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def error_from_transport(exc: httpx.TransportError, action: str, base_url: str) -> StepError:
    if isinstance(exc, httpx.UnsupportedProtocol):
        return PermanentError(f"could not {action}: {exc}; check PROVIDER_URL")
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, _NOT_SENT):
        return TransientError(
            f"could not {action}: no answer from the provider at {base_url} in time ({type(exc).__name__}). "
            "It may have applied the request; retrying with the same Idempotency-Key is safe.",
            in_doubt=True,
        )
    if isinstance(exc, _NOT_SENT):
        return TransientError(
            f"could not {action}: the provider at {base_url} is unreachable ({type(exc).__name__}: {exc}). "
            "Is `python -m provider` running, and does PROVIDER_URL point at it?"
        )
    return TransientError(
        f"could not {action}: the connection to the provider at {base_url} broke after the request was sent "
        f"({type(exc).__name__}: {exc}). It may have applied the request; retrying with the same "
        "Idempotency-Key is safe.",
        in_doubt=True,
    )


def _error_fields(response: httpx.Response) -> tuple[str, str, str | None]:
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data.get("error") or "error"), data["message"], data.get("field")
    text = response.text.strip()[:200] or response.reason_phrase
    return "error", text, None


def _json_object(response: httpx.Response, action: str) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        # Possibly a mangled answer to an applied request: a retry with the same key replays it.
        raise TransientError(f"could not {action}: the provider answered {response.status_code} without a JSON object")
    return data


def _field(data: dict[str, Any], name: str, action: str) -> Any:
    if name not in data:
        raise PermanentError(f"could not {action}: the provider's answer has no {name!r}; is PROVIDER_URL a provider?")
    return data[name]


def _receipt(response: httpx.Response, action: str, id_field: str) -> tuple[str, bool]:
    """(id, replayed) from a 2xx answer to an effect request.

    The 2xx says the provider applied the request (or replayed what it had
    applied), so an answer that cannot be read is in doubt, never a permanent
    "nothing happened": the run must not go on as if nothing was sent, and a
    retry with the same key gets the stored answer back."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get(id_field), str) and data[id_field]:
        return data[id_field], bool(data.get("replayed"))
    unread = "is not a JSON object" if not isinstance(data, dict) else f"has no {id_field!r}"
    kind = (response.headers.get("content-type") or "no content-type")[:60]
    raise TransientError(
        f"could not {action}: the provider answered {response.status_code}, so it applied the request, but its "
        f"answer {unread} ({kind}, {len(response.content)} bytes). Retrying with the same Idempotency-Key gets "
        "its stored answer back; if this keeps happening, check that PROVIDER_URL points at the provider.",
        in_doubt=True,
    )


class ProviderClient:
    """Async client for one provider. Create it anywhere; the HTTP connection
    pool is made on first use, in the running event loop.

    ``timeout`` (seconds) bounds connecting, sending and waiting for the
    answer, each. Use ``async with ProviderClient(url) as provider:`` or call
    ``aclose()``.
    """

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = _check_base_url(base_url)
        self.timeout = timeout
        self._http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> ProviderClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout, **_tls_settings(self.base_url))
        return self._http

    async def _request(
        self,
        method: str,
        path: str,
        *,
        action: str,
        json: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        try:
            response = await self._client().request(method, path, json=json, params=params, headers=headers)
        except httpx.TransportError as exc:
            raise error_from_transport(exc, action, self.base_url) from exc
        if not response.is_success:
            raise error_from_response(response, action)
        return response

    async def _apply(self, path: str, what: str, *, run_id: str, idempotency_key: str, body: dict[str, Any],
                     id_field: str) -> tuple[str, bool]:
        """POST an effect under its key: (the receipt's id, whether the provider replayed it)."""
        action = f"{what} for run {run_id!r} (Idempotency-Key {idempotency_key!r})"
        response = await self._request("POST", path, action=action, json=body,
                                       headers={"Idempotency-Key": idempotency_key})
        return _receipt(response, action, id_field)

    async def send_email(self, *, idempotency_key: str, run_id: str, to: str, subject: str, body: str,
                         metadata: dict[str, str] | None = None) -> EmailReceipt:
        message_id, replayed = await self._apply(
            "/v1/emails", "send the email", run_id=run_id, idempotency_key=idempotency_key, id_field="message_id",
            body=email_body(run_id=run_id, to=to, subject=subject, body=body, metadata=metadata))
        return EmailReceipt(message_id=message_id, replayed=replayed)

    async def create_ticket(
        self, *, idempotency_key: str, run_id: str, summary: str, email_message_id: str,
        metadata: dict[str, str] | None = None,
    ) -> TicketReceipt:
        ticket_id, replayed = await self._apply(
            "/v1/tickets", "create the ticket", run_id=run_id, idempotency_key=idempotency_key, id_field="ticket_id",
            body=ticket_body(run_id=run_id, summary=summary, email_message_id=email_message_id, metadata=metadata))
        return TicketReceipt(ticket_id=ticket_id, replayed=replayed)

    async def issue_refund(self, *, idempotency_key: str, run_id: str, order_id: str, amount: int,
                           metadata: dict[str, str] | None = None) -> RefundReceipt:
        refund_id, replayed = await self._apply(
            "/v1/refunds", "issue the refund", run_id=run_id, idempotency_key=idempotency_key, id_field="refund_id",
            body=refund_body(run_id=run_id, order_id=order_id, amount=amount, metadata=metadata))
        return RefundReceipt(refund_id=refund_id, replayed=replayed)

    async def lookup(self, idempotency_key: str) -> AppliedRequest | None:
        """What the provider holds under ``idempotency_key``: None if no request
        ever carried it, else its bookkeeping and, once applied, the request
        that was applied and its answer."""
        action = f"look up Idempotency-Key {idempotency_key!r}"
        try:
            response = await self._client().get(f"/v1/requests/{quote(idempotency_key, safe='')}")
        except httpx.TransportError as exc:
            raise error_from_transport(exc, action, self.base_url) from exc
        if response.status_code == 404:
            return None
        if not response.is_success:
            raise error_from_response(response, action)
        return AppliedRequest.from_json(_json_object(response, action))

    async def effects(self, run_id: str | None = None) -> list[EffectRecord]:
        action = "list effects"
        response = await self._request("GET", "/v1/effects", action=action, params=_run_filter(run_id))
        return [EffectRecord.from_json(item) for item in _field(_json_object(response, action), "effects", action)]

    async def emails(self, run_id: str | None = None) -> list[dict[str, Any]]:
        """The emails the provider holds (each with message_id, to, subject, body, ...)."""
        response = await self._request("GET", "/v1/emails", action="list emails", params=_run_filter(run_id))
        return list(_field(_json_object(response, "list emails"), "emails", "list emails"))

    async def tickets(self, run_id: str | None = None) -> list[dict[str, Any]]:
        response = await self._request("GET", "/v1/tickets", action="list tickets", params=_run_filter(run_id))
        return list(_field(_json_object(response, "list tickets"), "tickets", "list tickets"))

    async def faults(self) -> dict[str, Any]:
        """The provider's current faults: what each still has to do (``remaining``). See ``provider.faults``."""
        response = await self._request("GET", "/admin/faults", action="read faults")
        return dict(_json_object(response, "read faults").get("faults", {}))

    async def set_faults(self, **fields: Any) -> dict[str, Any]:
        """Inject faults, e.g. ``set_faults(fail_next=2, status=503, retry_after=0.2)``.

        Returns the provider's current faults. See ``provider.faults``.
        """
        response = await self._request("POST", "/admin/faults", action="set faults", json=fields)
        return dict(_json_object(response, "set faults").get("faults", {}))

    async def clear_faults(self) -> None:
        await self._request("DELETE", "/admin/faults", action="clear faults")

    async def health(self) -> bool:
        """True if the provider answers /healthz; never raises."""
        try:
            response = await self._client().get("/healthz")
        except httpx.HTTPError:
            return False
        return response.status_code == 200


def _run_filter(run_id: str | None) -> dict[str, str] | None:
    return None if run_id is None else {"run_id": run_id}


def fetch_effects(base_url: str, run_id: str | None = None, *, timeout: float = 5.0) -> list[EffectRecord]:
    """Synchronous ``effects()`` for CLIs and tests; raises the same errors."""
    base_url = _check_base_url(base_url)
    action = "list effects"
    try:
        with httpx.Client(timeout=timeout, **_tls_settings(base_url)) as http:
            response = http.get(f"{base_url}/v1/effects", params=_run_filter(run_id))
    except httpx.TransportError as exc:
        raise error_from_transport(exc, action, base_url) from exc
    if not response.is_success:
        raise error_from_response(response, action)
    return [EffectRecord.from_json(item) for item in _field(_json_object(response, action), "effects", action)]
