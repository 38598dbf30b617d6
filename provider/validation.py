"""What the provider accepts: its limits, its text rule and the checks of
every effect request, of an order the lab seeds and of the ids a lookup's URL
carries, each refusal an ``ApiError`` (400 or 422) that names the field and
says what to send instead. (The refund cap is the store's: it depends on what
was refunded, which only a transaction can read safely.)

The provider's own, on purpose: it is the far side of an API and trusts no
client to have checked anything, so it shares no code with its clients (they
apply the same limits in their own code, ``durable_agents.steps.limits`` and
``durable_agents.steps.controls``). docs/provider-contract.md holds the table of limits both
sides must honour; a test on each side reads it and checks that side's
constants and behaviour against it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from provider.errors import ApiError

MAX_KEY_CHARS = 255
MAX_RUN_ID_CHARS = 64
MAX_EMAIL_CHARS = 254  # RFC 5321's limit on a forward path, less the angle brackets
MAX_SUBJECT_CHARS = 200
MAX_BODY_CHARS = 20000
MAX_SUMMARY_CHARS = 500
MAX_MESSAGE_ID_CHARS = 128
MAX_ORDER_ID_CHARS = 64
MAX_REFUND_AMOUNT = 1_000_000  # in the currency's minor units (cents): 10,000.00 at most
MAX_ORDER_TOTAL = MAX_REFUND_AMOUNT  # one refund may take a whole order, so an order is no bigger than a refund
DEFAULT_CURRENCY = "EUR"
MAX_REQUEST_BYTES = 1 << 20  # a 20,000-character body is at most ~80 KB of UTF-8
MAX_JSON_DEPTH = 32  # arrays and objects inside one another; the effect bodies need 2 (the body, its metadata)

EMAIL_FIELDS = ("run_id", "to", "subject", "body")
TICKET_FIELDS = ("run_id", "summary", "email_message_id")
REFUND_FIELDS = ("run_id", "order_id", "amount")
ORDER_FIELDS = ("order_id", "total")
OPTIONAL_FIELDS = ("metadata",)
ORDER_OPTIONAL_FIELDS = ("currency",)
MAX_METADATA_ENTRIES = 10
MAX_METADATA_KEY_CHARS = 40
MAX_METADATA_VALUE_CHARS = 200

# Deliberately simple: one @, a dot in the domain, no spaces, no quotes or
# angle brackets. It refuses some exotic valid addresses; it never lets through
# something that could break a header.
_EMAIL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+")


def has_line_break(value: str) -> bool:
    """True if ``value`` holds a character that ends a header line: CR and LF,
    and the Unicode line separators some mail libraries fold into line breaks."""
    return any(ch in value for ch in "\r\n\x0b\x0c\x85\u2028\u2029")


def _one_line(name: str, value: str, max_chars: int, *, field: str) -> str:
    """422 unless ``value`` is one line, without NUL, of at most ``max_chars``."""
    if has_line_break(value):
        message = f"{name} must be a single line: remove the line breaks (CR/LF) from it"
    elif "\x00" in value:
        message = f"{name} must not contain NUL characters"
    elif len(value) > max_chars:
        message = f"{name} is {len(value)} characters; the limit is {max_chars}"
    else:
        return value
    raise ApiError(422, "invalid_request", message, field=field)


def check_idempotency_key(values: list[str]) -> str:
    hint = "send an Idempotency-Key header that names this request, e.g. Idempotency-Key: run-1234-send-email"
    if not values:
        raise ApiError(400, "invalid_request", f"missing Idempotency-Key header: {hint}", field="Idempotency-Key")
    if len(values) > 1:
        raise ApiError(400, "invalid_request", f"more than one Idempotency-Key header: {hint}", field="Idempotency-Key")
    key = values[0]
    if not 1 <= len(key) <= MAX_KEY_CHARS or not all("\x21" <= ch <= "\x7e" for ch in key):
        raise ApiError(
            400,
            "invalid_request",
            f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} printable ASCII characters without whitespace: {hint}",
            field="Idempotency-Key",
        )
    return key


# One JSON string (escapes included) or one bracket. A string is matched whole, so a bracket
# inside one counts for nothing. Scanning bytes is safe: in UTF-8 the bytes of '"' and '\\'
# never occur inside a multi-byte character.
_JSON_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|([\[{])|[\]}]', re.S)


def check_json_depth(raw: bytes) -> None:
    """400 if ``raw`` nests arrays and objects more than ``MAX_JSON_DEPTH`` deep.

    Checked on the bytes, before parsing, in one pass and without recursion:
    Python's JSON parser recurses once per level, so a body of a few thousand
    brackets (a few kilobytes, far inside ``MAX_REQUEST_BYTES``) would exhaust
    the interpreter's stack and become a 500. Malformed JSON is left to the
    parser, which refuses it."""
    depth = 0
    for token in _JSON_STRING_OR_BRACKET.finditer(raw):
        if token.group(1):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ApiError(400, "invalid_request",
                               f"the request body nests arrays and objects more than {MAX_JSON_DEPTH} deep; "
                               f"the limit is {MAX_JSON_DEPTH} levels: send a flat JSON object")
        elif token.group() in (b"]", b"}"):
            depth -= 1


def parse_json_object(raw: bytes) -> dict[str, Any]:
    def refuse_constant(name: str) -> None:
        raise ValueError(f"{name} is not valid JSON")

    check_json_depth(raw)
    try:
        payload = json.loads(raw, parse_constant=refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_request",
                       f"the request body is not valid UTF-8 JSON ({exc}): send a JSON object") from None
    if not isinstance(payload, dict):
        raise ApiError(400, "invalid_request", f"the request body must be a JSON object, got {type(payload).__name__}")
    _refuse_lone_surrogates(payload)
    return payload


_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_lone_surrogates(payload: dict[str, Any]) -> None:
    """422 if any string in ``payload`` holds a lone surrogate.

    JSON's ``\\udcff`` escape decodes to a code point that is no Unicode
    character and has no UTF-8 form: such text could be neither stored nor
    sent. The field named is the top-level one that holds it (its key, for a
    nested key or value)."""

    def first(value: Any) -> re.Match[str] | None:
        if isinstance(value, str):
            return _SURROGATE.search(value)
        if isinstance(value, dict):
            return next((m for item in value.items() for m in map(first, item) if m), None)
        if isinstance(value, list):
            return next((m for m in map(first, value) if m), None)
        return None

    for name, value in payload.items():
        in_name = first(name)
        found = in_name or first(value)
        if found is not None:
            field = "the field names" if in_name else name
            raise ApiError(
                422, "invalid_request",
                f"{field} contains U+{ord(found.group()):04X} at position {found.start() + 1}, a lone surrogate "
                "(no Unicode character, it has no UTF-8 form): send the text as valid UTF-8",
                field=name.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"),
            )


def _check_field_names(payload: dict[str, Any], expected: tuple[str, ...],
                       numbers: tuple[str, ...] = (), optional: tuple[str, ...] = OPTIONAL_FIELDS) -> None:
    """Every field of ``expected`` present, no other (but ``optional``), each a string but ``numbers``."""
    for name in expected:
        if name not in payload:
            raise ApiError(422, "invalid_request",
                           f"missing field {name!r}: this endpoint needs {', '.join(expected)}", field=name)
    for name in payload:
        if name not in expected and name not in optional:
            accepted = ", ".join(expected + optional)
            raise ApiError(422, "invalid_request",
                           f"unknown field {name!r}: this endpoint accepts only {accepted}", field=name)
    for name in expected:
        if name not in numbers and not isinstance(payload[name], str):
            raise ApiError(422, "invalid_request",
                           f"{name} must be a string, got {type(payload[name]).__name__}", field=name)


# The provider's own text rule, written here on purpose: it is the far side of
# an API and trusts no client to have checked (the lab's clients apply the
# same rule in their own code, durable_agents/steps/controls.py; nothing is shared).
_CONTROLS = "\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
_NOT_SINGLE_LINE_TEXT = re.compile(f"[{_CONTROLS}]")
_NOT_MULTILINE_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]|\r(?!\n)")


def refuse_control_characters(name: str, value: str, *, multiline: bool = False, field: str | None = None) -> None:
    """422 if ``value`` holds a character the provider's text rule refuses."""
    found = (_NOT_MULTILINE_TEXT if multiline else _NOT_SINGLE_LINE_TEXT).search(value)
    if found is None:
        return
    rule = ("it is multi-line text: newline (LF or CR LF) and tab are allowed; no other control character, "
            "no DEL, no bidirectional override or isolate character" if multiline else
            "it must be a single line of printable text: no control character (tab and line breaks included), "
            "no DEL, no bidirectional override or isolate character")
    raise ApiError(
        422, "invalid_request",
        f"{name} contains U+{ord(found.group()):04X} at position {found.start() + 1}: {rule}. Send it without",
        field=field or name,
    )


def _single_line(payload: dict[str, Any], name: str, max_chars: int, *, empty_hint: str = "") -> str:
    value = payload[name]
    refuse_control_characters(name, value)
    if not value.strip():
        raise ApiError(422, "invalid_request", f"{name} is empty: give a value" + (empty_hint and f", {empty_hint}"),
                       field=name)
    return _one_line(name, value, max_chars, field=name)


def _metadata(payload: dict[str, Any]) -> dict[str, str] | None:
    if "metadata" not in payload:
        return None
    meta = payload["metadata"]
    hint = (f"metadata is an object of at most {MAX_METADATA_ENTRIES} entries: keys 1-{MAX_METADATA_KEY_CHARS} "
            f"of letters, digits, '_', '.', '-'; values single-line strings of at most "
            f"{MAX_METADATA_VALUE_CHARS} characters")
    if not isinstance(meta, dict) or len(meta) > MAX_METADATA_ENTRIES:
        raise ApiError(422, "invalid_request", hint, field="metadata")
    for key, value in meta.items():
        if not (1 <= len(key) <= MAX_METADATA_KEY_CHARS
                and all(c.isascii() and (c.isalnum() or c in "_.-") for c in key)):
            raise ApiError(422, "invalid_request", f"metadata key {key!r} is not allowed: {hint}", field="metadata")
        if isinstance(value, str):
            refuse_control_characters(f"metadata value of {key!r}", value, field="metadata")
        if (not isinstance(value, str) or len(value) > MAX_METADATA_VALUE_CHARS or has_line_break(value)
                or "\x00" in value):
            raise ApiError(422, "invalid_request", f"metadata value of {key!r} is not allowed: {hint}",
                           field="metadata")
    return dict(meta)


UNDELIVERABLE_TLD = ".invalid"


def validate_email(payload: dict[str, Any]) -> dict[str, Any]:
    _check_field_names(payload, EMAIL_FIELDS)
    run_id = _single_line(payload, "run_id", MAX_RUN_ID_CHARS)
    to = payload["to"]
    if not to:
        raise ApiError(422, "invalid_request", "to is empty: give the recipient's address, e.g. ada@example.com",
                       field="to")
    refuse_control_characters("to", to)
    _one_line("email address", to, MAX_EMAIL_CHARS, field="to")
    if not _EMAIL.fullmatch(to):
        raise ApiError(422, "invalid_request",
                       f"email address {to!r} is malformed: expected something like ada@example.com", field="to")
    if to.lower().endswith(UNDELIVERABLE_TLD):
        # Like a hard bounce: well-formed, yet no mail can ever reach it, so
        # the sender must not retry. RFC 2606 reserves .invalid for this.
        raise ApiError(
            422, "recipient_rejected",
            f"recipient {to!r} rejected: the domain {UNDELIVERABLE_TLD} cannot receive mail (RFC 2606); "
            "use a deliverable address",
            field="to",
        )
    subject = _single_line(payload, "subject", MAX_SUBJECT_CHARS)
    body = payload["body"]
    if len(body) > MAX_BODY_CHARS:
        raise ApiError(
            422, "invalid_request", f"body is {len(body)} characters; the limit is {MAX_BODY_CHARS}", field="body"
        )
    refuse_control_characters("body", body, multiline=True)
    return {"run_id": run_id, "to": to, "subject": subject, "body": body, "metadata": _metadata(payload)}


def validate_ticket(payload: dict[str, Any]) -> dict[str, Any]:
    _check_field_names(payload, TICKET_FIELDS)
    # "" is a ticket that follows no email (the agent loop's create_ticket); any other value is an email's id.
    # Whitespace alone is neither, and stays refused.
    message_id = "" if payload["email_message_id"] == "" else _single_line(
        payload, "email_message_id", MAX_MESSAGE_ID_CHARS, empty_hint='or "" for a ticket that follows no email')
    return {
        "run_id": _single_line(payload, "run_id", MAX_RUN_ID_CHARS),
        "summary": _single_line(payload, "summary", MAX_SUMMARY_CHARS),
        "email_message_id": message_id,
        "metadata": _metadata(payload),
    }


def _cents(payload: dict[str, Any], name: str, limit: int) -> int:
    value = payload[name]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ApiError(422, "invalid_request",
                       f"{name} must be a whole number of the currency's minor units (cents) from 1 to "
                       f"{limit}, got {value!r}", field=name)
    return value


def validate_refund(payload: dict[str, Any]) -> dict[str, Any]:
    _check_field_names(payload, REFUND_FIELDS, numbers=("amount",))
    amount = _cents(payload, "amount", MAX_REFUND_AMOUNT)
    return {
        "run_id": _single_line(payload, "run_id", MAX_RUN_ID_CHARS),
        "order_id": _single_line(payload, "order_id", MAX_ORDER_ID_CHARS),
        "amount": amount,
        "metadata": _metadata(payload),
    }


_CURRENCY = re.compile("[A-Z]{3}")


def validate_order(payload: dict[str, Any]) -> dict[str, Any]:
    """The body of ``POST /v1/orders``: an order the lab seeds (its id, its total in cents, its currency)."""
    _check_field_names(payload, ORDER_FIELDS, numbers=("total",), optional=ORDER_OPTIONAL_FIELDS)
    total = _cents(payload, "total", MAX_ORDER_TOTAL)
    currency = payload.get("currency", DEFAULT_CURRENCY)
    if not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
        raise ApiError(422, "invalid_request",
                       f"currency must be three capital letters A-Z, an ISO 4217 code such as EUR or USD, got "
                       f"{currency!r:.40}; leave it out for {DEFAULT_CURRENCY}", field="currency")
    return {"order_id": _single_line(payload, "order_id", MAX_ORDER_ID_CHARS), "total": total, "currency": currency}


def check_url_text(name: str, value: str) -> str:
    """``order_id`` or ``run_id`` from a URL (``GET /v1/orders/<order_id>?run_id=``): 400 unless it is one an
    order or a run could have (the rule and limit of the same field in a body)."""
    limit = {"order_id": MAX_ORDER_ID_CHARS, "run_id": MAX_RUN_ID_CHARS}[name]
    try:
        return _single_line({name: value}, name, limit)
    except ApiError as exc:  # 400, not 422: the URL is wrong, there is no body
        raise ApiError(400, exc.error, exc.message, field=exc.field) from None


def bookkeeping_run_id(payload: Any) -> str | None:
    """The run id to file a refused request under, when it is usable at all."""
    if isinstance(payload, dict):
        run_id = payload.get("run_id")
        if (isinstance(run_id, str) and run_id and len(run_id) <= MAX_RUN_ID_CHARS and not has_line_break(run_id)
                and not _NOT_SINGLE_LINE_TEXT.search(run_id)):
            return run_id
    return None
