"""The provider: a local stand-in for an external email API, ticket API and
refund API (with the orders refunds are taken from) that honours
``Idempotency-Key`` the way Stripe does. Run it with
``python -m provider``.

Exactly-once execution of an external effect is impossible in general. The
engines deliver at-least-once execution; this receiver is idempotent, which
together makes each effect happen exactly once. This process is the judge of
that: its store, not the engines' records, says how many emails were sent.

Contract
========

docs/provider-contract.md is the contract as both sides must honour it, with
the table of limits; what follows is the server's side in detail, and
``provider.validation`` is what it accepts.

Effect endpoints, one per kind of ``provider.kinds``: ``POST /v1/emails``
``{"run_id", "to", "subject", "body"}``, ``POST /v1/tickets`` ``{"run_id",
"summary", "email_message_id"}`` and ``POST /v1/refunds`` ``{"run_id",
"order_id", "amount"}`` (``amount``: a whole number of the currency's minor
units), each with an optional ``"metadata"`` object (as real APIs have: at
most 10 entries, keys 1-40 of ``[A-Za-z0-9_.-]``, values single-line strings
of at most 200 characters), stored with the effect and part of the request.
Each requires an ``Idempotency-Key`` header: 1 to 255 printable ASCII
characters, no whitespace. One key names one request, across every endpoint.
A ticket's ``email_message_id`` is the id of the email it follows, or ``""``
for a ticket that follows no email (the agent loop's).

- The fingerprint of a request is sha256 over its method, path and the
  canonical JSON of its body (sorted keys, no insignificant whitespace).
- The first valid request with a key applies the effect, stores the response
  and the fingerprint, and counts the request, in ONE SQLite ``BEGIN
  IMMEDIATE`` transaction: concurrent requests with the same key are
  serialised, and the effect is applied at most once, ever.
- The same key with the same fingerprint replays the stored response (same
  ids) with ``"replayed": true`` and the header ``Idempotent-Replayed: true``.
- The same key with a different fingerprint (another body, or the other
  endpoint) is refused: 409 ``idempotency_conflict``. Retrying cannot help.
- Mail to the reserved top-level domain ``.invalid`` (RFC 2606) is refused
  with 422 ``recipient_rejected``, like a hard bounce: the lab's permanent,
  non-retryable failure that passes every client-side check.
- Text fields are checked as a real mail API checks them: ``to``, ``subject``
  (email headers), ``run_id``, ``summary``, ``email_message_id`` and metadata
  values are single-line printable text; ``body`` is multi-line text. A C0 or
  C1 control character (in ``body``, newline (LF or CR LF) and tab excepted),
  DEL, or a bidirectional override/isolate character (U+202A-U+202E,
  U+2066-U+2069) is refused with 422 ``invalid_request``, naming the field,
  the character (``U+001B``) and its position counting from 1.
- A body nested more than ``MAX_JSON_DEPTH`` (32) arrays and objects deep is
  400 ``invalid_request`` naming the limit, found by a scan of the bytes
  before the parser (which recurses per level) ever sees it.
- A refund is capped by its order (``provider.store``): an order the provider
  does not keep is 404 ``order_not_found``; an amount that, with the refunds
  of that order already applied, exceeds its total is 422
  ``refund_exceeds_total`` saying the total, what was refunded and what is
  left. Checked in the transaction that would insert it, after the key: a
  replay still answers its stored receipt once the order is fully refunded.
- A request that fails validation (400 bad JSON, 422 bad field) or is refused
  by the refund cap stores nothing under its key, so the client may fix it and
  retry with the same key. It is still counted: the key's bookkeeping row is
  created, with 0 effects, if need be.

Retrieve by key (``GET /v1/requests/<key>``, the key percent-encoded, ``/``
as ``%2F``): 404 ``not_found`` if no request ever carried it; else ``key``,
``kind``, ``run_id``, ``requests``, ``applied`` (false until an effect is
stored), and once applied ``endpoint`` (e.g. ``POST /v1/emails``),
``applied_at``, ``request`` (the applied body, metadata included),
``request_sha256`` (sha256 of that body as canonical JSON: keys sorted, no
whitespace, UTF-8) and ``response`` (the stored answer, with the ids). A
client that got a 409 asks here what was applied instead of its request.

Bookkeeping, per key (``GET /v1/effects[?run_id=]``): ``kind`` and ``run_id``
(those of the request that applied the effect; until then, of the latest
request), ``requests`` (every request that carried the key: first, replays,
conflicts, validation failures and injected failures), ``effects_applied``
(0 or 1, counted from the stored effects of every kind themselves),
``status_code`` (of the latest response for that key, as sent, so 503 after a
lost response), ``first_seen`` and ``last_seen`` (ISO 8601 UTC).

Orders, seeded by the lab and read by the agent loop's ``lookup_order``
(no Idempotency-Key: an order's id is its identity, a lookup applies
nothing): ``POST /v1/orders`` ``{"order_id", "total", "currency"?}`` (total in
cents, 1 to ``MAX_ORDER_TOTAL``; currency three capital letters, default EUR)
keeps one: 201 when new, 200 (``"replayed": true``) when the same order is
seeded again, 409 ``order_conflict`` when its id holds another total or
currency. ``GET /v1/orders/<order_id>[?run_id=]`` answers ``order_id``,
``total``, ``refunded`` (cents of its applied refunds), ``currency`` and
``lookups`` (the GETs of this order answered, this one included), or 404
``order_not_found``; every such GET is counted, 404s included, under the run
it names (an id or run id no order or run could have is 400 and not counted).
``GET /v1/lookups[?run_id=]`` answers ``{"run_id", "lookups", "by_order"}``.

The customers' inbox (``GET /inbox[?run_id=]``, ``provider.inbox``): a
read-only HTML page of the applied emails, newest first, each field escaped; a
run with more than one email is marked. Its errors are the JSON ones below.

Faults (``/admin/faults``, in memory, see ``provider.faults``) act on effect
requests that passed validation, before the key is looked up: ``fail_next``
answers an error and applies nothing (its message says so, and that a client
cannot know it from a 5xx: see docs/provider-contract.md), ``hang_next`` sleeps
then processes normally, ``lose_response_next`` applies and stores, then
answers 503.

Every error body is JSON ``{"error": code, "message": text}``, plus ``field``
for validation errors. Codes: ``invalid_request`` (400/422),
``idempotency_conflict`` (409), ``not_found`` (404), ``order_not_found``
(404), ``refund_exceeds_total`` (422), ``order_conflict`` (409), ``method_not_allowed``
(405), ``length_required`` (411), ``payload_too_large`` (413),
``injected_fault`` and ``response_lost`` (injected), ``shutting_down`` (503),
``not_implemented`` (501, a method HTTP/1.1 servers need not know),
``internal_error`` (500). A request refused before its body is read (411, 413,
a malformed request line) is not counted under its key.

The server refuses to listen beyond loopback (it has no authentication, and
/admin can break it on purpose) unless ``PROVIDER_ALLOW_REMOTE=1``.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import signal
import socket
import socketserver
import sqlite3
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from provider.errors import ApiError
from provider.faults import Faults, FaultSpecError
from provider.inbox import BODY_START_CHARS, CONTENT_SECURITY_POLICY, INBOX_LIMIT, render_inbox
from provider.kinds import KINDS, EffectKind
from provider.store import Store
from provider.validation import (
    MAX_REQUEST_BYTES,
    MAX_RUN_ID_CHARS,
    bookkeeping_run_id,
    check_idempotency_key,
    check_url_text,
    parse_json_object,
    validate_order,
)

DEFAULT_PORT = 8780
DEFAULT_DB = ".state/provider.db"
IDLE_CONNECTION_SECONDS = 60  # bounds how long an idle keep-alive connection holds a thread
SHUTDOWN_DRAIN_SECONDS = 5.0


# -- fingerprints ----------------------------------------------------------------


def canonical_json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(method: str, path: str, payload: dict[str, Any]) -> str:
    return hashlib.sha256(f"{method}\n{path}\n{canonical_json(payload)}".encode()).hexdigest()


def body_sha256(payload: dict[str, Any]) -> str:
    """What ``GET /v1/requests/<key>`` reports as ``request_sha256``."""
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def _format_seconds(seconds: float) -> str:
    # Whole seconds as HTTP says; a fraction is kept so tests need not wait whole seconds.
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


# -- HTTP ----------------------------------------------------------------------


class ProviderServer(ThreadingHTTPServer):
    daemon_threads = True
    # Idle keep-alive connections would make a joining close wait for clients;
    # in-flight requests are drained explicitly instead (see wait_idle).
    block_on_close = False
    # socketserver's default backlog of 5 overflows when a burst of clients
    # connects while the machine is busy, and some see their connection reset.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], family: int, store: Store, faults: Faults, *, verbose: bool) -> None:
        self.address_family = family
        self.store = store
        self.faults = faults
        self.verbose = verbose
        self.stopping = threading.Event()
        self._inflight = 0
        self._idle = threading.Condition()
        super().__init__(address, Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that can
        # stall for seconds where there is no resolver; the name is unused.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return  # the client went away (e.g. it timed out during an injected hang)
        super().handle_error(request, client_address)

    @contextmanager
    def in_flight(self) -> Iterator[None]:
        with self._idle:
            self._inflight += 1
        try:
            yield
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)


class Handler(BaseHTTPRequestHandler):
    server: ProviderServer
    protocol_version = "HTTP/1.1"
    server_version = "provider/1"
    timeout = IDLE_CONNECTION_SECONDS
    # Headers and body leave in two writes; with Nagle on, the body waits for
    # the client's delayed ACK and every answer takes ~40 ms longer.
    disable_nagle_algorithm = True

    # Every method goes through one router so that a wrong method is a JSON 405.
    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        if self.server.verbose:
            super().log_message(format, *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # Used by the stdlib for requests it cannot parse; keep errors JSON.
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        error = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large", 501: "not_implemented"}.get(
            code, "internal_error" if code >= 500 else "invalid_request"
        )
        self._send(code, {"error": error, "message": message or explain or phrase})

    def _send(self, status: int, body: dict[str, Any] | str, headers: dict[str, str] | None = None) -> None:
        """Send ``body``: a dict as JSON, a str (a page) as HTML."""
        if isinstance(body, str):
            data, content_type = body.encode(), "text/html; charset=utf-8"
        else:
            data, content_type = json.dumps(body).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise ApiError(411, "length_required", "chunked bodies are not accepted: send a Content-Length")
        raw_length = self.headers.get("Content-Length", "0") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "invalid_request", f"Content-Length {raw_length!r} is not a number") from None
        if length < 0 or length > MAX_REQUEST_BYTES:
            self.close_connection = True
            raise ApiError(413, "payload_too_large", f"the body is {length} bytes; the limit is {MAX_REQUEST_BYTES}")
        return self.rfile.read(length) if length else b""

    def _dispatch(self) -> None:
        with self.server.in_flight():
            try:
                url = urlsplit(self.path)
                # Read the body first so an error answer leaves the connection in step.
                self.body = self._read_body()
                routes = ROUTES.get(url.path)
                if routes is None:
                    routes = next((found for prefix, found in PREFIX_ROUTES.items()
                                   if url.path.startswith(prefix) and len(url.path) > len(prefix)), None)
                if routes is None:
                    raise ApiError(404, "not_found", f"no such endpoint: {url.path}; see the provider module docstring")
                route = routes.get(self.command)
                if route is None:
                    allowed = ", ".join(sorted(routes))
                    raise ApiError(
                        405,
                        "method_not_allowed",
                        f"{self.command} is not allowed on {url.path}; use {allowed}",
                        headers={"Allow": allowed},
                    )
                query = parse_qs(url.query, keep_blank_values=True)
                status, body, headers = route(self, query)
                self._send(status, body, headers)
            except ApiError as exc:
                self._send(exc.status, exc.body(), exc.headers)
            except (ConnectionError, TimeoutError):
                raise
            except Exception:
                traceback.print_exc(file=sys.stderr)
                self.close_connection = True
                self._send(500, {"error": "internal_error", "message": "the provider failed; see its stderr"})

    # -- routes ----------------------------------------------------------------

    def _run_id_filter(self, query: dict[str, list[str]]) -> str | None:
        unknown = sorted(set(query) - {"run_id"})
        if unknown:
            raise ApiError(400, "invalid_request", f"unknown query parameter {unknown[0]!r}: only run_id is accepted",
                           field=unknown[0])
        values = query.get("run_id")
        if not values:
            return None
        if len(values) > 1:
            raise ApiError(400, "invalid_request", "give run_id once", field="run_id")
        return values[0]

    def _inbox_run_id(self, query: dict[str, list[str]]) -> str | None:
        run_id = self._run_id_filter(query)
        # A filter no applied email can match is refused, and the limit named, rather than shown as empty.
        if run_id is not None and not 1 <= len(run_id) <= MAX_RUN_ID_CHARS:
            raise ApiError(400, "invalid_request",
                           f"run_id is {len(run_id)} characters; the limit is {MAX_RUN_ID_CHARS}: give a run id, "
                           "or no run_id for every run", field="run_id")
        return run_id

    def _no_query(self, query: dict[str, list[str]]) -> None:
        if query:
            raise ApiError(400, "invalid_request", f"{urlsplit(self.path).path} takes no query parameters")

    def get_health(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        return 200, {"ok": True}, {}

    def get_effects(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        return 200, {"effects": self.server.store.effects(self._run_id_filter(query))}, {}

    def get_request(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        self._no_query(query)
        key = unquote(urlsplit(self.path).path[len(REQUESTS_PREFIX):])
        found = self.server.store.lookup(key)
        if found is None:
            raise ApiError(404, "not_found",
                           f"no request ever carried Idempotency-Key {key!r}: nothing was applied under it")
        if found.get("applied"):
            found["request_sha256"] = body_sha256(found["request"])
        return 200, found, {}

    def get_inbox(self, query: dict[str, list[str]]) -> tuple[int, str, dict[str, str]]:
        run_id = self._inbox_run_id(query)
        rows, total = self.server.store.inbox(run_id, INBOX_LIMIT, BODY_START_CHARS)
        return 200, render_inbox(rows, total, run_id), {
            "Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-store"}

    def get_effects_of(self, kind: EffectKind, query: dict[str, list[str]]
                       ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """``GET /v1/emails`` and the like: the applied effects of one kind."""
        return 200, {kind.table: self.server.store.items(kind, self._run_id_filter(query))}, {}

    def post_effect_of(self, kind: EffectKind, query: dict[str, list[str]]
                       ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """``POST /v1/emails`` and the like: apply one effect of ``kind`` under its key."""
        return self._post_effect(kind.name, kind.validate, query)

    def _post_effect(
        self, kind: str, validate: Callable[[dict[str, Any]], dict[str, str]], query: dict[str, list[str]]
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        key = check_idempotency_key(self.headers.get_all("Idempotency-Key") or [])
        store, faults = self.server.store, self.server.faults
        payload: Any = None
        try:
            self._no_query(query)
            payload = parse_json_object(self.body)
            fields = validate(payload)
        except ApiError as exc:
            store.count_request(key=key, kind=kind, run_id=bookkeeping_run_id(payload), status=exc.status)
            raise

        hang = faults.take_hang(kind)
        if hang is not None and self.server.stopping.wait(hang):
            store.count_request(key=key, kind=kind, run_id=fields["run_id"], status=503)
            raise ApiError(503, "shutting_down", "the provider is shutting down; retry with the same Idempotency-Key")
        fail = faults.take_fail(kind)
        if fail is not None:
            store.count_request(key=key, kind=kind, run_id=fields["run_id"], status=fail.status)
            headers = {} if fail.retry_after is None else {"Retry-After": _format_seconds(fail.retry_after)}
            raise ApiError(
                fail.status,
                "injected_fault",
                f"injected fault (POST /admin/faults): answered {fail.status}; "
                + (f"this provider applied nothing, but a client cannot know that from a {fail.status}: a gateway "
                   "or proxy may send one after the origin applied the request. " if fail.status >= 500 else
                   "nothing was applied. ")
                + f"{fail.remaining} more to come. Retry with the same Idempotency-Key.",
                headers=headers,
            )

        path = urlsplit(self.path).path
        outcome = store.apply(
            key=key,
            kind=kind,
            method=self.command,
            path=path,
            fingerprint=fingerprint(self.command, path, payload),
            fields=fields,
            lose_response=lambda: faults.take_lose_response(kind),
        )
        if outcome.response_lost:
            raise ApiError(
                503,
                "response_lost",
                "injected fault (POST /admin/faults): the request was processed and its response stored under "
                "this Idempotency-Key, but this answer stands for one lost on the way back. "
                "Retry with the same key to get the stored response.",
            )
        if outcome.status != 200:
            raise ApiError(outcome.status, outcome.body["error"], outcome.body["message"],
                           field=outcome.body.get("field"))
        return 200, outcome.body, {"Idempotent-Replayed": "true"} if outcome.replayed else {}

    # -- orders: seeded by the lab, looked up by the agent loop, the cap of its refunds ------------

    def post_order(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """``POST /v1/orders``: keep one order. Its id is its identity, so no Idempotency-Key is needed (one
        sent is ignored): the same order again is 200, another total or currency under its id 409."""
        self._no_query(query)
        fields = validate_order(parse_json_object(self.body))
        status, body = self.server.store.seed_order(**fields)
        if status == 409:
            raise ApiError(409, body["error"], body["message"], field=body["field"])
        return status, body, {}

    def get_order(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """``GET /v1/orders/<order_id>[?run_id=]``: the order and what was refunded of it; every answer counted
        (404 included), under the run it names."""
        order_id = check_url_text("order_id", unquote(urlsplit(self.path).path[len(ORDERS_PREFIX):]))
        run_id = self._run_id_filter(query)
        if run_id is not None:
            run_id = check_url_text("run_id", run_id)
        found = self.server.store.lookup_order(order_id, run_id)
        if found is None:
            raise ApiError(404, "order_not_found",
                           f"no order {order_id!r}: the provider keeps only the orders seeded with POST /v1/orders",
                           field="order_id")
        return 200, found, {}

    def get_lookups(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """``GET /v1/lookups[?run_id=]``: how many order lookups the run made, in all and per order."""
        run_id = self._run_id_filter(query)
        return 200, self.server.store.lookups(None if run_id is None else check_url_text("run_id", run_id)), {}

    def get_faults(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        self._no_query(query)
        return 200, {"faults": self.server.faults.snapshot()}, {}

    def post_faults(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        self._no_query(query)
        try:
            self.server.faults.configure(parse_json_object(self.body))
        except FaultSpecError as exc:
            raise ApiError(400, "invalid_request", exc.message, field=exc.field or None) from None
        return self.get_faults(query)

    def delete_faults(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any], dict[str, str]]:
        self._no_query(query)
        self.server.faults.clear()
        return self.get_faults(query)


REQUESTS_PREFIX = "/v1/requests/"
ORDERS_PREFIX = "/v1/orders/"

Route = Callable[..., tuple[int, dict[str, Any] | str, dict[str, str]]]


def _kind_routes(kind: EffectKind) -> dict[str, Route]:
    return {"GET": lambda handler, query: handler.get_effects_of(kind, query),
            "POST": lambda handler, query: handler.post_effect_of(kind, query)}


ROUTES: dict[str, dict[str, Route]] = {
    "/healthz": {"GET": Handler.get_health},
    "/inbox": {"GET": Handler.get_inbox},
    **{kind.path: _kind_routes(kind) for kind in KINDS},
    "/v1/effects": {"GET": Handler.get_effects},
    "/v1/orders": {"POST": Handler.post_order},
    "/v1/lookups": {"GET": Handler.get_lookups},
    "/admin/faults": {"GET": Handler.get_faults, "POST": Handler.post_faults, "DELETE": Handler.delete_faults},
}
# Paths with an id after the prefix (percent-encoded, ``/`` as ``%2F``).
PREFIX_ROUTES: dict[str, dict[str, Route]] = {
    REQUESTS_PREFIX: {"GET": Handler.get_request},
    ORDERS_PREFIX: {"GET": Handler.get_order},
}


# -- process -------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def _address_family(host: str) -> int:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]


def _env_port(env: Mapping[str, str]) -> int | None:
    """PROVIDER_PORT, the default when unset, or None when it is not a number."""
    raw = env.get("PROVIDER_PORT", "").strip()
    if not raw:
        return DEFAULT_PORT
    try:
        return int(raw)
    except ValueError:
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m provider",
        description="Local stand-in for the external email, ticket and refund APIs; honours Idempotency-Key.",
    )
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; loopback only unless PROVIDER_ALLOW_REMOTE=1)")
    parser.add_argument("--port", type=int, default=None,
                        help=f"port (env PROVIDER_PORT, default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--db", default=None, help=f"SQLite file (env PROVIDER_DB, default {DEFAULT_DB})")
    parser.add_argument("--verbose", action="store_true", help="write an access log to stderr")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    port = args.port if args.port is not None else _env_port(os.environ)
    if port is None:
        print(f"provider: PROVIDER_PORT={os.environ['PROVIDER_PORT']!r} is not a port number; give 0 to 65535",
              file=sys.stderr)
        return 2
    if not 0 <= port <= 65535:
        print(f"provider: port {port} is out of range; give 0 to 65535 (0 picks a free port)", file=sys.stderr)
        return 2
    db = Path(args.db or os.environ.get("PROVIDER_DB") or DEFAULT_DB)
    host = args.host
    if not is_loopback(host) and os.environ.get("PROVIDER_ALLOW_REMOTE") != "1":
        print(
            f"provider: refusing to listen on {host!r}: the provider has no authentication and its /admin "
            "endpoints inject faults on demand. Use --host 127.0.0.1, or set PROVIDER_ALLOW_REMOTE=1 "
            "where the network is private (e.g. inside a container).",
            file=sys.stderr,
        )
        return 2

    try:
        store = Store(db)
    except (OSError, RuntimeError, sqlite3.Error) as exc:
        print(f"provider: cannot open the store at {db}: {exc}", file=sys.stderr)
        return 1
    try:
        server = ProviderServer((host, port), _address_family(host), store, Faults(), verbose=args.verbose)
    except OSError as exc:
        print(
            f"provider: cannot listen on {host}:{port}: {exc.strerror or exc}. "
            "Stop the other process on that port, or pass --port 0 to pick a free one.",
            file=sys.stderr,
        )
        return 1

    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="provider-http")
    serving.start()
    bound_host, bound_port = server.socket.getsockname()[:2]
    shown_host = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    print(f"provider listening on http://{shown_host}:{bound_port}", flush=True)
    try:
        stop.wait()  # a signal handler sets it; the wait is interruptible on POSIX
    finally:
        server.stopping.set()  # wakes requests sleeping in an injected hang
        server.shutdown()
        serving.join()
        if not server.wait_idle(SHUTDOWN_DRAIN_SECONDS):
            print("provider: requests still running at exit; SQLite rolls back any unfinished one", file=sys.stderr)
        server.server_close()
    return 0
