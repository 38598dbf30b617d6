"""Client for the provider (``python -m provider``), used by the step functions:
``send_email``, ``create_ticket`` and ``issue_refund``, one per kind of effect
(docs/provider-contract.md), ``lookup`` by key, and the orders refunds are taken
from: ``lookup_order`` (the agent loop's read-only tool), ``seed_order`` and
``lookups`` (the lab's and the tests'; ``seed_orders`` and ``lookup_counts``
are their synchronous forms).

Workers find the provider through ``PROVIDER_URL`` (see
``provider_url_from_env``). Every effect call takes an ``idempotency_key``:
the caller derives it so that it is stable across retries and restarts of the
same step of the same run; the provider then applies the effect at most once
and replays the stored receipt to every retry.

Errors are mapped onto the engines' vocabulary (``durable_agents.steps.errors``):

===========================================  ==================================
What happened                                 Raised
===========================================  ==================================
connection refused, connect timeout, 408,     ``TransientError``, with
425, 429                                      ``retry_after`` from a Retry-After
                                              header (``durable_agents.steps.retry``)
read timeout, connection broken after the     ``TransientError(in_doubt=True)``:
request was sent, 500-599                     it may have been applied
409 (the key was used for another request)    ``IdempotencyConflict`` (never
                                              retried; see ``lookup``)
400, 404, 422 with a JSON error code, to an   ``Refused`` (a ``PermanentError``)
effect request (an invalid field, an unknown  with the provider's ``code``, e.g.
order, a refund over the order's total): the  ``refund_exceeds_total``, naming
provider applied nothing                      the field
any other 4xx                                 ``PermanentError`` naming the field
2xx to an effect request whose body is not a  ``TransientError(in_doubt=True)``:
JSON object or lacks the receipt's id         it was applied, the answer lost
===========================================  ==================================

``Refused`` lets a caller that chose the request's values tell "this request
is wrong, and nothing happened" from every other permanent failure: the agent
loop (``durable_agents.steps.loop``) hands it back to the model, which chose the arguments; a
fixed flow's step fails on it like on any ``PermanentError``. A read
(``lookup_order``) is never in doubt: it applies nothing, so its timeouts and
5xx are plain ``TransientError``.

A timeout is transient on purpose even though the effect may have been applied:
retrying with the same key is safe, because the provider replays. So is an
unreadable 2xx: the provider applied the request (or replayed what it had
applied), so it is never "nothing happened"; the retry gets the stored answer
back, readable this time or in doubt again. ``lookup``
asks the provider what it applied under a key: how a 409 is understood
(``durable_agents.steps.adoption``) and how a step left in doubt is settled.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from durable_agents.steps.errors import IdempotencyConflict, PermanentError, Refused, StepError, TransientError
from durable_agents.steps.retry import parse_retry_after as _parse_retry_after

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
class OrderInfo:
    """An order as the provider keeps it (``lookup_order``; ``durable_agents.steps.ports.OrderInfo``): amounts in the
    currency's minor units (cents). ``lookups``: the provider's count of lookups of this order, this one
    included."""

    order_id: str
    total: int
    refunded: int  # every applied refund of the order, in all
    currency: str
    lookups: int

    @property
    def left(self) -> int:
        """What may still be refunded of it."""
        return self.total - self.refunded

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OrderInfo:
        return cls(order_id=str(data["order_id"]), total=int(data["total"]), refunded=int(data["refunded"]),
                   currency=str(data["currency"]), lookups=int(data["lookups"]))


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
    """Seconds to wait from a Retry-After value: ``durable_agents.steps.retry.parse_retry_after``,
    the one reading of the header (capped, never raises)."""
    return _parse_retry_after(value, now=None if now is None else now.timestamp())


EFFECT_REFUSALS = frozenset({400, 404, 422})
"""The statuses of an effect request's answer that say the provider refused it and applied nothing, when they
carry the provider's JSON error code (``Refused``). A 409 is the key's (``IdempotencyConflict``)."""
_SEED_REFUSALS = frozenset({400, 409, 422})  # seeding has no key: its 409 is the order's (order_conflict)


# Refusals about something no choice of the request's values can mend: a bounce is the recipient's address
# refusing mail (the run's customer; never the model's choice in the agent loop). They stay PermanentError, as
# they were before ``Refused`` (exercise 6's workers and the logs name that type).
_NOT_THE_CALLERS = frozenset({"recipient_rejected"})


def error_from_response(response: httpx.Response, action: str, *, refusals: frozenset[int] = frozenset(),
                        read_only: bool = False) -> StepError:
    """Map a non-2xx answer onto TransientError / PermanentError.

    ``refusals``: statuses that become ``Refused`` when the body carries the provider's error code (an answer
    without one may come from something else on the way, which says nothing of what was applied).
    ``read_only``: the request applies nothing, so a 5xx is never in doubt."""
    status = response.status_code
    code, message, field = _error_fields(response)
    detail = f"{status} {code or 'error'}" + (f", field {field!r}" if field else "")
    if status in refusals and code is not None and code not in _NOT_THE_CALLERS:
        return Refused(f"the provider refused to {action} ({detail}): {message}", code=code)
    if status == 409:
        return IdempotencyConflict(f"idempotency conflict: {message}")
    if status in (408, 425, 429) or 500 <= status <= 599:
        return TransientError(
            f"the provider could not {action} now ({detail}): {message}",
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
            # A 5xx does not say whether the request was applied: a gateway or proxy may send
            # one after the origin applied it, whatever its body claims (docs/provider-contract.md).
            in_doubt=status >= 500 and not read_only,
        )
    if 400 <= status <= 499:
        return PermanentError(f"the provider refused to {action} ({detail}): {message}")
    return PermanentError(f"the provider gave an unexpected answer to {action} ({detail}): {message}")


# The request never left: nothing can have been applied.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def error_from_transport(exc: httpx.TransportError, action: str, base_url: str, *,
                         read_only: bool = False) -> StepError:
    """Map a failure to get an answer. ``read_only``: the request applies nothing, so none is in doubt."""
    if isinstance(exc, httpx.UnsupportedProtocol):
        return PermanentError(f"could not {action}: {exc}; check PROVIDER_URL")
    if read_only and not isinstance(exc, _NOT_SENT):
        return TransientError(f"could not {action}: no answer from the provider at {base_url} "
                              f"({type(exc).__name__}: {exc}). It is a read, which applies nothing: retrying is safe.")
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


def _error_fields(response: httpx.Response) -> tuple[str | None, str, str | None]:
    """(the provider's error code, None without one; the message; the field to blame)."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        code = data.get("error")
        return (code if isinstance(code, str) and code else None), data["message"], data.get("field")
    text = response.text.strip()[:200] or response.reason_phrase
    return None, text, None


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
        refusals: frozenset[int] = frozenset(),
    ) -> httpx.Response:
        try:
            response = await self._client().request(method, path, json=json, params=params, headers=headers)
        except httpx.TransportError as exc:
            raise error_from_transport(exc, action, self.base_url) from exc
        if not response.is_success:
            raise error_from_response(response, action, refusals=refusals)
        return response

    async def _apply(self, path: str, what: str, *, run_id: str, idempotency_key: str, body: dict[str, Any],
                     id_field: str) -> tuple[str, bool]:
        """POST an effect under its key: (the receipt's id, whether the provider replayed it)."""
        action = f"{what} for run {run_id!r} (Idempotency-Key {idempotency_key!r})"
        response = await self._request("POST", path, action=action, json=body,
                                       headers={"Idempotency-Key": idempotency_key}, refusals=EFFECT_REFUSALS)
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

    async def lookup_order(self, order_id: str, *, run_id: str | None = None) -> OrderInfo | None:
        """The order ``order_id`` as the provider keeps it, None if it keeps no such order. Read-only, no key;
        the provider counts every lookup (under ``run_id`` when given: ``lookups``). Its failures are never in
        doubt: a lookup applies nothing."""
        action = f"look up order {order_id!r}"
        try:
            response = await self._client().get(_order_path(order_id), params=_run_filter(run_id))
        except httpx.TransportError as exc:
            raise error_from_transport(exc, action, self.base_url, read_only=True) from exc
        return _order_answer(response, action)

    async def seed_order(self, order_id: str, total: int, currency: str = "EUR") -> dict[str, Any]:
        """Have the provider keep an order refunds may be taken from (``total`` in cents): its answer, with
        ``"replayed": true`` when the same order was kept already. ``Refused`` (code ``order_conflict``)
        when the id holds another total or currency, or for a field the provider does not accept."""
        action = f"seed order {order_id!r}"
        response = await self._request("POST", "/v1/orders", action=action, refusals=_SEED_REFUSALS,
                                       json=order_body(order_id, total, currency))
        return _json_object(response, action)

    async def lookups(self, run_id: str | None = None) -> dict[str, Any]:
        """The order lookups the provider answered for ``run_id`` (all, without it):
        ``{"run_id", "lookups": n, "by_order": {order_id: n}}``."""
        action = "count order lookups"
        response = await self._request("GET", "/v1/lookups", action=action, params=_run_filter(run_id))
        return _json_object(response, action)

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


def order_body(order_id: str, total: int, currency: str = "EUR") -> dict[str, Any]:
    """The JSON body of ``POST /v1/orders``; ``total`` in the currency's minor units (cents)."""
    return {"order_id": order_id, "total": total, "currency": currency}


def _order_path(order_id: str) -> str:
    return f"/v1/orders/{quote(order_id, safe='')}"


def _order_answer(response: httpx.Response, action: str) -> OrderInfo | None:
    """An answer to ``GET /v1/orders/<id>``: the order, or None for the provider's 404 ``order_not_found``. Any
    other 404 (an endpoint the provider lacks: an older provider) is no "no such order", and raises."""
    if response.status_code == 404 and _error_fields(response)[0] == "order_not_found":
        return None
    if not response.is_success:
        raise error_from_response(response, action, read_only=True)
    data = _json_object(response, action)
    try:
        return OrderInfo.from_json(data)
    except (KeyError, TypeError, ValueError):
        raise PermanentError(f"could not {action}: the provider's answer is no order (order_id, total, refunded, "
                             "currency, lookups); is PROVIDER_URL a provider of this version?") from None


def _sync(base_url: str, method: str, path: str, action: str, *, timeout: float,
          refusals: frozenset[int] = frozenset(), **request: Any) -> httpx.Response:
    """One request of the synchronous helpers, its failures mapped as the async client maps them."""
    try:
        with httpx.Client(timeout=timeout, **_tls_settings(base_url)) as http:
            response = http.request(method, f"{base_url}{path}", **request)
    except httpx.TransportError as exc:
        raise error_from_transport(exc, action, base_url) from exc
    if not response.is_success:
        raise error_from_response(response, action, refusals=refusals)
    return response


def fetch_effects(base_url: str, run_id: str | None = None, *, timeout: float = 5.0) -> list[EffectRecord]:
    """Synchronous ``effects()`` for CLIs and tests; raises the same errors."""
    base_url = _check_base_url(base_url)
    action = "list effects"
    response = _sync(base_url, "GET", "/v1/effects", action, timeout=timeout, params=_run_filter(run_id))
    return [EffectRecord.from_json(item) for item in _field(_json_object(response, action), "effects", action)]


def seed_orders(base_url: str, orders: Mapping[str, int], *, currency: str = "EUR",
                timeout: float = 5.0) -> dict[str, dict[str, Any]]:
    """Synchronous ``seed_order`` of each ``{order_id: total in cents}``, for CLIs and tests: the provider's
    answer per order. Seeding the same orders again is harmless (each answers ``"replayed": true``); an id
    kept with another total raises ``Refused`` (code ``order_conflict``)."""
    base_url = _check_base_url(base_url)
    answers = {}
    for order_id, total in orders.items():
        action = f"seed order {order_id!r}"
        response = _sync(base_url, "POST", "/v1/orders", action, timeout=timeout, refusals=_SEED_REFUSALS,
                         json=order_body(order_id, total, currency))
        answers[order_id] = _json_object(response, action)
    return answers


def lookup_counts(base_url: str, run_id: str | None = None, *, timeout: float = 5.0) -> dict[str, Any]:
    """Synchronous ``lookups()``: ``{"run_id", "lookups": n, "by_order": {order_id: n}}``."""
    base_url = _check_base_url(base_url)
    action = "count order lookups"
    response = _sync(base_url, "GET", "/v1/lookups", action, timeout=timeout, params=_run_filter(run_id))
    return _json_object(response, action)


def seed_given(orders: Mapping[str, int], env: Mapping[str, str] = os.environ) -> None:
    """``seed_orders`` at ``PROVIDER_URL`` for a command's ``--orders``: no provider, or its refusal (an order id
    it keeps with another total), is bad input (``InputError`` saying what to do), as every loop command says."""
    from durable_agents.steps.limits import InputError

    if not orders:
        return
    try:
        seed_orders(provider_url_from_env(env), orders)
    except (StepError, ValueError) as err:  # its words say what to do: start the provider, or seed another id
        raise InputError(f"--orders: {err}") from None
