"""The provider against docs/provider-contract.md: for every row of the table
of limits, the provider's constant equals the table's, a request at the limit
is accepted and one past it gets the documented answer. The numbers sent come
from the table, not from the provider, so a provider that drifts from the page
fails here. (The client's side: tests/test_providerclient_contract.py.)
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from lab.provider_process import ProviderProcess
from provider import validation
from tests.support import (
    ADDRESSES_MALFORMED,
    ADDRESSES_OK,
    MULTILINE_OK,
    NOT_MULTILINE,
    NOT_SINGLE_LINE,
    TEXT_OK,
    Limit,
    contract_limits,
)
from tests.tiers import starts

LIMITS = contract_limits()
HTTP = httpx.Client(verify=False, timeout=20)  # plain http to loopback: nothing to verify


@pytest.fixture(scope="module")
@starts("process")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with ProviderProcess(tmp_path_factory.mktemp("contract") / "provider.db") as provider:
        yield provider.url
    HTTP.close()


@dataclass
class Send:
    """One effect request; ``names`` is the field a refusal must name (None: no field). A refund's order is
    seeded first with ``order_total`` (None: not seeded), so that a row is judged on its own field, not on
    the refund cap."""

    path: str
    body: dict[str, Any] | bytes
    names: str | None = None
    key: str = field(default_factory=lambda: fresh_key())
    order_total: int | None = validation.MAX_ORDER_TOTAL

    def __repr__(self) -> str:  # a megabyte of body is no help in a failure message
        body = self.body if len(repr(self.body)) < 300 else f"<{len(self.body)} bytes>"
        return f"Send({self.path} {body!r}, names={self.names!r}, key={self.key[:60]!r})"


def fresh_key(size: int = 0) -> str:
    """A key no other request used; ``size`` pads or cuts it to that many characters."""
    key = f"contract-{uuid.uuid4().hex}"
    return (key + "k" * size)[:size] if size else key


def email(run: str, **fields: Any) -> dict[str, Any]:
    return {"run_id": run, "to": "ada@example.com", "subject": "Your refund", "body": "Hello Ada,\n\nDone.\n",
            **fields}


def ticket(run: str, **fields: Any) -> dict[str, Any]:
    return {"run_id": run, "summary": "Refund confirmed", "email_message_id": "msg_0123", **fields}


def refund(run: str, **fields: Any) -> dict[str, Any]:
    # An order of its own: no row's refunds add up against another's.
    return {"run_id": run, "order_id": f"A-{uuid.uuid4().hex[:12]}", "amount": 1250, **fields}


def refunds(run: str, name: str, *values: Any) -> list[Send]:
    return [Send("/v1/refunds", refund(run, **{name: v}), name) for v in values]


def capped(run: str, total: int | None, *amounts: int, names: str) -> list[Send]:
    """Refunds of one new order of ``total`` (None: an order the provider does not keep), in turn."""
    order = f"A-{uuid.uuid4().hex[:12]}"
    return [Send("/v1/refunds", refund(run, order_id=order, amount=a), names, order_total=total) for a in amounts]


def over_the_total(run: str) -> tuple[list[Send], list[Send]]:
    """Refunds of an order that add up to exactly its total pass; one cent more does not: alone, added to what
    was refunded, or once the order is fully refunded."""
    whole, part = capped(run, 5000, 1250, 3750, 1, names="amount"), capped(run, 5000, 3000, 2001, names="amount")
    return [*whole[:2], part[0]], [*capped(run, 5000, 5001, names="amount"), part[1], whole[2]]


def orders(run: str, name: str, *values: Any) -> list[Send]:
    """Seeds of new orders (``POST /v1/orders``: no key needed; the one sent is ignored)."""
    return [Send("/v1/orders", {"order_id": f"O-{uuid.uuid4().hex[:12]}", "total": 5000, name: v}, name)
            for v in values]


def emails(run: str, name: str, *values: Any) -> list[Send]:
    return [Send("/v1/emails", email(run, **{name: v}), name) for v in values]


def tickets(run: str, name: str, *values: Any) -> list[Send]:
    return [Send("/v1/tickets", ticket(run, **{name: v}), name) for v in values]


def metadata(run: str, *values: Any) -> list[Send]:
    return emails(run, "metadata", *values)


def padded(run: str, size: int) -> bytes:
    """A valid email request of exactly ``size`` bytes: JSON allows trailing whitespace."""
    raw = json.dumps(email(run)).encode()
    return raw + b" " * (size - len(raw))


def text_rule(sends: Callable[..., list[Send]], run: str, name: str, ok: str) -> tuple[list[Send], list[Send]]:
    return sends(run, name, ok, ok + TEXT_OK), sends(run, name, *(ok + v for v in NOT_SINGLE_LINE))


Case = Callable[[int | None, str], tuple[list[Send], list[Send]]]
"""(the row's limit, a run id) -> (requests at the limit, requests past it)."""

CASES: dict[str, Case] = {
    "key-length": lambda n, run: (
        [Send("/v1/emails", email(run), key=fresh_key(n)), Send("/v1/emails", email(run), key="!~" + fresh_key())],
        [Send("/v1/emails", email(run), "Idempotency-Key", key=fresh_key(n + 1)),
         Send("/v1/emails", email(run), "Idempotency-Key", key="has space" + fresh_key()),
         Send("/v1/emails", email(run), "Idempotency-Key", key="has\ttab" + fresh_key())],
    ),
    "request-bytes": lambda n, run: ([Send("/v1/emails", padded(run, n))], [Send("/v1/emails", padded(run, n + 1))]),
    # No effect body can be valid at 32 levels (its fields are strings): the deepest valid one is sent, and
    # test_provider.py checks that 32 levels are parsed (then refused for a field) and 33 are not.
    "json-depth": lambda n, run: (
        metadata(run, {"k": "v"}),
        [Send("/v1/emails", b'{"run_id": ' + b"[" * n + b"]" * n + b"}"), Send("/v1/emails", b"[" * (n + 1)),
         Send("/v1/tickets", b"[" * 5000 + b"]" * 5000)],
    ),
    "required": lambda n, run: (
        [*emails(run, "body", ""), *tickets(run, "email_message_id", "")],  # "": a ticket that follows no email
        [*emails(run, "run_id", "", "  "), *emails(run, "to", ""), *emails(run, "subject", "", " "),
         *tickets(run, "summary", "", "\u3000"), *tickets(run, "email_message_id", " ", "\u3000"),
         *refunds(run, "order_id", "", " "), *orders(run, "order_id", "", " ")],
    ),
    "run-id-length": lambda n, run: (emails(run, "run_id", (run + "x" * n)[:n]), emails(run, "run_id", "x" * (n + 1))),
    "run-id-text": lambda n, run: text_rule(emails, run, "run_id", run),
    "run-id-format": lambda n, run: (emails(run, "run_id", run), emails(run, "run_id", "has space", "-x", "a/b")),
    "to-length": lambda n, run: (
        emails(run, "to", "a" * (n - len("@example.com")) + "@example.com"),
        emails(run, "to", "a" * (n + 1 - len("@example.com")) + "@example.com"),
    ),
    "to-format": lambda n, run: (
        emails(run, "to", *ADDRESSES_OK),
        emails(run, "to", *ADDRESSES_MALFORMED),
    ),
    "to-text": lambda n, run: (
        emails(run, "to", "ada@example.com"),
        emails(run, "to", *(f"ada{v}@example.com" for v in NOT_SINGLE_LINE)),
    ),
    "to-undeliverable": lambda n, run: (
        emails(run, "to", "ada@invalid.example.com"),
        emails(run, "to", "nobody@mailbox.invalid", "NOBODY@MAILBOX.INVALID"),
    ),
    "subject-length": lambda n, run: (emails(run, "subject", "s" * n), emails(run, "subject", "s" * (n + 1))),
    "subject-text": lambda n, run: text_rule(emails, run, "subject", "Your refund"),
    "body-length": lambda n, run: (emails(run, "body", "b" * n), emails(run, "body", "b" * (n + 1))),
    "body-text": lambda n, run: (
        emails(run, "body", *MULTILINE_OK),
        emails(run, "body", *NOT_MULTILINE),
    ),
    "summary-length": lambda n, run: (tickets(run, "summary", "s" * n), tickets(run, "summary", "s" * (n + 1))),
    "summary-text": lambda n, run: text_rule(tickets, run, "summary", "Refund confirmed"),
    "message-id-length": lambda n, run: (
        tickets(run, "email_message_id", "m" * n), tickets(run, "email_message_id", "m" * (n + 1)),
    ),
    "message-id-text": lambda n, run: text_rule(tickets, run, "email_message_id", "msg_0123"),
    "order-id-length": lambda n, run: (
        [*refunds(run, "order_id", "o" * n), *orders(run, "order_id", (run + "o" * n)[:n])],
        [*refunds(run, "order_id", "o" * (n + 1)), *orders(run, "order_id", "o" * (n + 1))],
    ),
    "order-id-text": lambda n, run: (
        [*refunds(run, "order_id", run + TEXT_OK), *orders(run, "order_id", "O-" + run + TEXT_OK)],
        [*refunds(run, "order_id", *(run + v for v in NOT_SINGLE_LINE)),
         *orders(run, "order_id", *(run + v for v in NOT_SINGLE_LINE))],
    ),
    "refund-amount": lambda n, run: (
        refunds(run, "amount", 1, n),
        refunds(run, "amount", 0, -1, n + 1, 12.5, "1250", True, None),
    ),
    "refund-order": lambda n, run: (capped(run, 1250, 1250, names=None), capped(run, None, 1, names="order_id")),
    "refund-total": lambda n, run: over_the_total(run),
    "order-total": lambda n, run: (
        orders(run, "total", 1, n),
        orders(run, "total", 0, -1, n + 1, 12.5, "50", True, None),
    ),
    "order-currency": lambda n, run: (orders(run, "currency", "EUR", "USD", "JPY"),
                                      orders(run, "currency", "eur", "EURO", "E1R", "", 978, None)),
    "metadata-entries": lambda n, run: (
        metadata(run, {f"k{i}": "v" for i in range(n)}, {}),
        metadata(run, {f"k{i}": "v" for i in range(n + 1)}, ["k", "v"], "k=v"),
    ),
    "metadata-key": lambda n, run: (
        metadata(run, {"k" * n: "v"}, {"lab_start_id.A-9": "v"}),
        metadata(run, {"k" * (n + 1): "v"}, {"": "v"}, {"a/b": "v"}, {"a b": "v"}, {"caf\u00e9": "v"}),
    ),
    "metadata-value": lambda n, run: (
        metadata(run, {"k": "v" * n}, {"k": "caf\u00e9 \u4e2d"}),
        metadata(run, {"k": "v" * (n + 1)}, {"k": 5}, {"k": None}, *({"k": "a" + v} for v in NOT_SINGLE_LINE)),
    ),
}


def send(url: str, request: Send) -> httpx.Response:
    if request.path == "/v1/refunds" and isinstance(request.body, dict) and request.order_total is not None:
        # Seeded as the lab seeds orders; an id the provider refuses is refused again, with the field, on the refund.
        HTTP.post(f"{url}/v1/orders", json={"order_id": request.body["order_id"], "total": request.order_total})
    headers = {"Idempotency-Key": request.key}
    if isinstance(request.body, bytes):
        return HTTP.post(f"{url}{request.path}", content=request.body,
                         headers={**headers, "Content-Type": "application/json"})
    return HTTP.post(f"{url}{request.path}", json=request.body, headers=headers)


def declare_too_large(url: str, request: Send) -> tuple[int, dict[str, Any]]:
    """Announce a body past the limit and send none: the provider refuses on the
    Content-Length alone, and a client still writing a megabyte to a connection
    the provider has closed would see a reset instead of the answer."""
    assert isinstance(request.body, bytes)
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    try:
        conn.putrequest("POST", request.path)
        conn.putheader("Content-Length", str(len(request.body)))
        conn.putheader("Idempotency-Key", request.key)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_every_row_of_the_table_has_a_case_here() -> None:
    assert sorted(CASES) == sorted(LIMITS), "docs/provider-contract.md and this test name different rows"


@pytest.mark.parametrize("row", [r for r, limit in LIMITS.items() if limit.provider not in ("rule", "no")])
def test_the_providers_constant_is_the_tables(row: str) -> None:
    limit = LIMITS[row]
    assert getattr(validation, limit.provider) == limit.limit, (row, limit)


@pytest.mark.parametrize("row", sorted(LIMITS))
def test_at_the_limit_accepted_past_it_refused_as_documented(url: str, row: str) -> None:
    limit: Limit = LIMITS[row]
    run = f"contract-{uuid.uuid4().hex[:12]}"
    at, past = CASES[row](limit.limit, run)
    for request in at:
        answer = send(url, request)
        assert answer.status_code == (201 if request.path == "/v1/orders" else 200), (row, request, answer.text)
    for request in past:
        if row == "request-bytes":
            status, body = declare_too_large(url, request)
        else:
            answer = send(url, request)
            status, body = answer.status_code, answer.json()
        if limit.status is None:
            assert status == 200, (row, request, body)
        else:
            assert (status, body.get("error"), body.get("field")) == (limit.status, limit.error, request.names), (
                row, request, body)
