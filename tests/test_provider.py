"""The provider as a real process: idempotency, validation, faults, persistence,
and the client's mapping of its answers onto TransientError / PermanentError.

Most tests share one provider process (module scope) and keep apart by using a
fresh run id and fresh keys; faults are cleared around every test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_agents.providerclient import (
    EffectRecord,
    ProviderClient,
    fetch_effects,
    parse_retry_after,
    provider_url_from_env,
)
from durable_agents.steps.errors import IdempotencyConflict, PermanentError, TransientError
from lab.processes import REPO
from lab.provider_process import ProviderProcess
from provider.kinds import NAMES
from provider.validation import (
    MAX_BODY_CHARS,
    MAX_JSON_DEPTH,
    MAX_RUN_ID_CHARS,
    MAX_SUBJECT_CHARS,
    MAX_SUMMARY_CHARS,
)
from tests.support import Node, parse_page, poll_until_sync
from tests.tiers import starts

# -- fixtures and helpers --------------------------------------------------------


# One pooled client for raw requests: a new httpx client per call costs ~40 ms.
HTTP = httpx.Client(verify=False, timeout=20)  # plain http to loopback: nothing to verify


@pytest.fixture(scope="module", autouse=True)
def _close_http() -> Iterator[None]:
    yield
    HTTP.close()


@pytest.fixture(scope="module")
@starts("process")
def shared_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderProcess]:
    with ProviderProcess(tmp_path_factory.mktemp("provider") / "provider.db") as proc:
        yield proc


@pytest.fixture
def url(shared_provider: ProviderProcess) -> Iterator[str]:
    HTTP.delete(f"{shared_provider.url}/admin/faults").raise_for_status()
    yield shared_provider.url
    HTTP.delete(f"{shared_provider.url}/admin/faults").raise_for_status()


@pytest.fixture
def run_id() -> str:
    # Shadows conftest's run_id, which is built from the test name (parametrize ids here hold line breaks).
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def provider_client(url: str) -> Any:
    async with ProviderClient(url) as provider_client:
        yield provider_client


def new_key(label: str = "k") -> str:
    return f"{label}-{uuid.uuid4().hex}"


def email_body(run_id: str, /, **overrides: Any) -> dict[str, Any]:
    body = {"run_id": run_id, "to": "ada@example.com", "subject": "Your refund", "body": "Hello Ada,\n\nDone.\n"}
    body.update(overrides)
    return body


def ticket_body(run_id: str, /, **overrides: Any) -> dict[str, Any]:
    body = {"run_id": run_id, "summary": "Refund confirmed", "email_message_id": "msg_0123"}
    body.update(overrides)
    return body


def post(url: str, path: str, body: Any, key: str | bytes | None = None, **kwargs: Any) -> httpx.Response:
    headers = {} if key is None else {"Idempotency-Key": key}
    if isinstance(body, (bytes, str)):
        return HTTP.post(f"{url}{path}", content=body, headers=headers, **kwargs)
    return HTTP.post(f"{url}{path}", json=body, headers=headers, **kwargs)


def effect_for(url: str, key: str) -> EffectRecord:
    records = [r for r in fetch_effects(url) if r.key == key]
    assert len(records) == 1, f"expected one bookkeeping row for {key}, got {records}"
    return records[0]


def emails_for(url: str, run_id: str) -> list[dict[str, Any]]:
    return HTTP.get(f"{url}/v1/emails", params={"run_id": run_id}).json()["emails"]


def tickets_for(url: str, run_id: str) -> list[dict[str, Any]]:
    return HTTP.get(f"{url}/v1/tickets", params={"run_id": run_id}).json()["tickets"]


def assert_invalid(response: httpx.Response, field: str, *words: str) -> None:
    assert response.status_code in (400, 422), response.text
    data = response.json()
    assert data["error"] == "invalid_request", data
    assert data["field"] == field, data
    for word in words:
        assert word in data["message"], data


# -- idempotency -----------------------------------------------------------------


def test_first_request_applies_and_replays_return_the_stored_response(url: str, run_id: str) -> None:
    key = new_key()
    first = post(url, "/v1/emails", email_body(run_id), key)
    assert first.status_code == 200, first.text
    assert first.json()["replayed"] is False
    assert first.json()["message_id"].startswith("msg_")
    assert "Idempotent-Replayed" not in first.headers

    for expected_requests in (2, 3):
        again = post(url, "/v1/emails", email_body(run_id), key)
        assert again.status_code == 200, again.text
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json() == {**first.json(), "replayed": True}
        record = effect_for(url, key)
        assert (record.requests, record.effects_applied, record.status_code) == (expected_requests, 1, 200)

    assert record.kind == "email" and record.run_id == run_id
    assert record.first_seen <= record.last_seen
    [stored] = emails_for(url, run_id)
    assert stored["message_id"] == first.json()["message_id"]
    assert stored["body"] == "Hello Ada,\n\nDone.\n"


def test_fingerprint_ignores_key_order_and_whitespace(url: str, run_id: str) -> None:
    key = new_key()
    assert post(url, "/v1/tickets", ticket_body(run_id), key).status_code == 200
    reordered = f'{{ "email_message_id": "msg_0123",\n "summary": "Refund confirmed", "run_id": "{run_id}" }}'
    again = post(url, "/v1/tickets", reordered.encode(), key)
    assert again.status_code == 200 and again.json()["replayed"] is True, again.text


def test_same_key_with_a_different_body_is_a_conflict(url: str, run_id: str) -> None:
    key = new_key()
    assert post(url, "/v1/emails", email_body(run_id), key).status_code == 200
    conflict = post(url, "/v1/emails", email_body(run_id, subject="Another subject"), key)
    assert conflict.status_code == 409
    assert conflict.json()["error"] == "idempotency_conflict"
    assert "different body" in conflict.json()["message"]
    record = effect_for(url, key)
    assert (record.requests, record.effects_applied, record.status_code) == (2, 1, 409)
    assert [e["subject"] for e in emails_for(url, run_id)] == ["Your refund"]


def test_same_key_on_the_other_endpoint_is_a_conflict(url: str, run_id: str) -> None:
    key = new_key()
    assert post(url, "/v1/emails", email_body(run_id), key).status_code == 200
    conflict = post(url, "/v1/tickets", ticket_body(run_id), key)
    assert conflict.status_code == 409, conflict.text
    assert conflict.json()["error"] == "idempotency_conflict"
    assert "/v1/emails" in conflict.json()["message"] and "/v1/tickets" in conflict.json()["message"]
    assert tickets_for(url, run_id) == []
    assert effect_for(url, key).kind == "email"


def test_twenty_concurrent_requests_with_one_key_apply_once(url: str, run_id: str) -> None:
    key = new_key()
    barrier = threading.Barrier(20)
    results: list[httpx.Response | BaseException] = []
    lock = threading.Lock()

    def send() -> None:
        try:
            barrier.wait(timeout=10)
            response = post(url, "/v1/emails", email_body(run_id), key, timeout=20)
        except BaseException as exc:  # reported below, not lost in the thread
            response = exc
        with lock:
            results.append(response)

    threads = [threading.Thread(target=send) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    seen = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in results]
    assert seen == [200] * 20, seen
    bodies = [r.json() for r in results if isinstance(r, httpx.Response)]
    assert len(bodies) == 20
    assert sorted(b["replayed"] for b in bodies) == [False] + [True] * 19
    assert len({b["message_id"] for b in bodies}) == 1
    record = effect_for(url, key)
    assert (record.requests, record.effects_applied) == (20, 1)
    assert len(emails_for(url, run_id)) == 1


def test_concurrent_different_bodies_with_one_key_one_wins(url: str, run_id: str) -> None:
    key = new_key()
    barrier = threading.Barrier(10)
    statuses: list[int] = []
    lock = threading.Lock()

    def send(n: int) -> None:
        barrier.wait(timeout=10)
        response = post(url, "/v1/emails", email_body(run_id, subject=f"variant {n}"), key, timeout=20)
        with lock:
            statuses.append(response.status_code)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(statuses) == [200] + [409] * 9
    assert effect_for(url, key).effects_applied == 1
    assert len(emails_for(url, run_id)) == 1


# -- idempotency key and validation ------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [None, b"", b"has space", b"tab\there", b"x" * 256, "caf\u00e9".encode("latin-1")],
    ids=["missing", "empty", "space", "tab", "too-long", "non-ascii"],
)
def test_missing_or_bad_idempotency_key_is_400(url: str, run_id: str, key: bytes | None) -> None:
    response = post(url, "/v1/emails", email_body(run_id), key)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == "Idempotency-Key"
    assert "send an Idempotency-Key header" in response.json()["message"]
    assert emails_for(url, run_id) == []


def test_longest_key_is_accepted(url: str, run_id: str) -> None:
    key = "k" * 223 + uuid.uuid4().hex  # 255 characters
    assert post(url, "/v1/emails", email_body(run_id), key).status_code == 200


def test_malformed_email_is_refused_counted_and_fixable_with_the_same_key(url: str, run_id: str) -> None:
    key = new_key()
    refused = post(url, "/v1/emails", email_body(run_id, to="ada@example"), key)
    assert refused.status_code == 422
    assert_invalid(refused, "to", "malformed")
    record = effect_for(url, key)
    assert (record.requests, record.effects_applied, record.status_code, record.run_id) == (1, 0, 422, run_id)
    assert emails_for(url, run_id) == []

    fixed = post(url, "/v1/emails", email_body(run_id), key)
    assert fixed.status_code == 200 and fixed.json()["replayed"] is False, fixed.text
    record = effect_for(url, key)
    assert (record.requests, record.effects_applied, record.status_code) == (2, 1, 200)


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/emails", "subject", "Hi\r\nBcc: everyone@example.com"),
        ("/v1/emails", "subject", "Hi\nthere"),
        ("/v1/emails", "subject", "Hi\u2028there"),
        ("/v1/emails", "to", "ada@example.com\r\nBcc: everyone@example.com"),
        ("/v1/emails", "run_id", "run\n1"),
        ("/v1/tickets", "summary", "Refund\r\nconfirmed"),
        ("/v1/tickets", "email_message_id", "msg_1\nmsg_2"),
    ],
)
def test_line_breaks_in_single_line_fields_are_refused(
    url: str, run_id: str, path: str, field: str, value: str
) -> None:
    body = email_body(run_id) if path == "/v1/emails" else ticket_body(run_id)
    body[field] = value
    response = post(url, path, body, new_key())
    assert response.status_code == 422
    assert_invalid(response, field, "single line")
    assert emails_for(url, run_id) == [] and tickets_for(url, run_id) == []


def test_body_may_hold_line_breaks(url: str, run_id: str) -> None:
    text = "Dear Ada,\r\n\r\nYour refund is on its way.\n\n-- \nSupport\u2028team"
    response = post(url, "/v1/emails", email_body(run_id, body=text), new_key())
    assert response.status_code == 200, response.text
    assert emails_for(url, run_id)[0]["body"] == text


@pytest.mark.parametrize(
    ("path", "field", "limit"),
    [
        ("/v1/emails", "subject", MAX_SUBJECT_CHARS),
        ("/v1/emails", "body", MAX_BODY_CHARS),
        ("/v1/emails", "run_id", MAX_RUN_ID_CHARS),
        ("/v1/tickets", "summary", MAX_SUMMARY_CHARS),
    ],
)
def test_fields_at_the_limit_pass_and_beyond_it_are_refused(
    url: str, run_id: str, path: str, field: str, limit: int
) -> None:
    make = email_body if path == "/v1/emails" else ticket_body
    # Keep the run id (and so the effects filter) usable when the run id is the field under test.
    at_limit = (run_id + "x" * limit)[:limit] if field == "run_id" else "x" * limit
    accepted = post(url, path, make(run_id, **{field: at_limit}), new_key())
    assert accepted.status_code == 200, accepted.text

    refused = post(url, path, make(run_id, **{field: "x" * (limit + 1)}), new_key())
    assert refused.status_code == 422
    assert_invalid(refused, field, f"the limit is {limit}")


@pytest.mark.parametrize(
    ("body", "status", "field", "words"),
    [
        ({"run_id": "r", "to": "ada@example.com", "subject": "s"}, 422, "body", ["missing field 'body'"]),
        ({"run_id": "r", "to": 7, "subject": "s", "body": ""}, 422, "to", ["must be a string", "int"]),
        ({"run_id": "r", "to": "ada@example.com", "subject": "s", "body": "", "cc": "x"}, 422, "cc", ["unknown field"]),
        ({"run_id": "r", "to": "ada@example.com", "subject": "  ", "body": ""}, 422, "subject", ["empty"]),
        ({"run_id": "r", "to": "", "subject": "s", "body": ""}, 422, "to", ["empty"]),
    ],
    ids=["missing", "wrong-type", "unknown", "blank-subject", "empty-to"],
)
def test_missing_unknown_and_wrong_typed_fields_are_refused(
    url: str, body: dict[str, Any], status: int, field: str, words: list[str]
) -> None:
    response = post(url, "/v1/emails", body, new_key())
    assert response.status_code == status
    assert_invalid(response, field, *words)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b'{"run_id": NaN}', b"\xff\xfe"])
def test_invalid_json_is_400(url: str, raw: bytes) -> None:
    key = new_key()
    response = post(url, "/v1/emails", raw, key)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "invalid_request"
    assert "JSON" in response.json()["message"]
    record = effect_for(url, key)
    assert (record.requests, record.effects_applied, record.run_id) == (1, 0, None)


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/emails", b'{"run_id": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
        ("/v1/emails", b"[" * 5000 + b"]" * 5000),
        ("/v1/tickets", b"{" + b'"a": {' * 33 + b"}" * 34),
        # Closing brackets inside a string are text: counted, they would hide the depth that follows.
        ("/v1/emails", b'{"x": "]]]]\\"]]", "metadata": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}"),
        ("/admin/faults", b"[" * 5000),
    ],
    ids=["in-a-field", "bare", "objects", "after-brackets-in-a-string", "admin"],
)
def test_json_nested_past_the_depth_limit_is_400_naming_it(url: str, path: str, raw: bytes) -> None:
    key = new_key()
    response = post(url, path, raw, key if path != "/admin/faults" else None)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["error"] == "invalid_request" and "field" not in error, error
    assert f"more than {MAX_JSON_DEPTH} deep" in error["message"], error
    if path != "/admin/faults":
        assert (effect_for(url, key).requests, effect_for(url, key).effects_applied) == (1, 0)
    assert HTTP.get(f"{url}/healthz").json() == {"ok": True}


def test_json_nested_to_the_depth_limit_is_parsed(url: str, run_id: str) -> None:
    """At the limit the body is parsed, then refused for its field, not for its depth; brackets
    inside strings count for nothing."""
    fields = json.dumps(email_body(run_id, run_id="R")).encode()
    deep = fields.replace(b'"R"', b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1))
    response = post(url, "/v1/emails", deep, new_key())
    assert response.status_code == 422 and response.json()["field"] == "run_id", response.text
    brackets = email_body(run_id, subject="[" * 100, body="{" * 5000)
    assert post(url, "/v1/emails", brackets, new_key()).status_code == 200


def test_unknown_path_and_wrong_method_answer_json(url: str) -> None:
    missing = HTTP.get(f"{url}/v2/emails")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    wrong = HTTP.put(f"{url}/v1/emails", json={})
    assert wrong.status_code == 405 and wrong.json()["error"] == "method_not_allowed"
    assert wrong.headers["Allow"] == "GET, POST"
    assert set(wrong.json()) == {"error", "message"}
    assert HTTP.get(f"{url}/healthz").json() == {"ok": True}


def test_effects_are_filtered_by_run_id(url: str) -> None:
    run_a, run_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    key_a, key_b, key_a2 = new_key("a"), new_key("b"), new_key("a2")
    assert post(url, "/v1/emails", email_body(run_a), key_a).status_code == 200
    assert post(url, "/v1/emails", email_body(run_b), key_b).status_code == 200
    assert post(url, "/v1/tickets", ticket_body(run_a), key_a2).status_code == 200

    assert [(r.key, r.kind) for r in fetch_effects(url, run_a)] == [(key_a, "email"), (key_a2, "ticket")]
    assert [r.key for r in fetch_effects(url, run_b)] == [key_b]
    assert {key_a, key_b, key_a2} <= {r.key for r in fetch_effects(url)}
    assert fetch_effects(url, "no-such-run") == []
    assert len(emails_for(url, run_a)) == 1 and len(tickets_for(url, run_a)) == 1
    assert HTTP.get(f"{url}/v1/effects", params={"run": run_a}).status_code == 400


# -- the customers' inbox ------------------------------------------------------------

HOSTILE_SUBJECT = """<script>document.title="pwned"</script> & 'quotes' "too" """.strip()


def inbox(url: str, **params: str) -> Node:
    page = HTTP.get(f"{url}/inbox", params=params)
    assert page.status_code == 200, page.text
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in page.headers["content-security-policy"]  # no script may run, even by mistake
    return parse_page(page.text)


def test_inbox_lists_applied_emails_newest_first_and_marks_a_run_with_two(url: str) -> None:
    twice, once = f"twice-{uuid.uuid4().hex[:8]}", f"once-{uuid.uuid4().hex[:8]}"
    # The "before": two executions, two fresh keys, two emails for one run.
    assert post(url, "/v1/emails", email_body(twice, subject="First"), new_key("t1")).status_code == 200
    key = new_key("o")
    assert post(url, "/v1/emails", email_body(once), key).status_code == 200
    assert post(url, "/v1/emails", email_body(once), key).status_code == 200  # a replay: no second email
    assert post(url, "/v1/emails", email_body(twice, subject="Second"), new_key("t2")).status_code == 200
    assert post(url, "/v1/tickets", ticket_body(once), new_key()).status_code == 200  # tickets are not mail

    page = inbox(url)
    runs = [a.attrs["data-run-id"] for a in page.all("article", cls="email")]
    assert runs[:3] == [twice, once, twice], runs
    mine = {a.attrs["data-key"]: a for a in page.all("article", cls="email") if a.attrs["data-run-id"] == twice}
    assert all(a.attrs["data-duplicate"] == "yes" and a.all(cls="duplicate") for a in mine.values())
    assert [a.all(cls="subject")[0].text() for a in mine.values()] == ["Second", "First"]
    assert "email 2 of 2 for this run" in page.all("article", cls="email")[0].text()
    [single] = inbox(url, run_id=once).all("article", cls="email")
    assert single.attrs["data-duplicate"] == "no" and not single.all(cls="duplicate")
    assert "2: this email, then 1 more with the same key, none applied again" in single.text()
    assert inbox(url, run_id="no-such-run").all("article") == []


def test_inbox_shows_every_field_as_text(url: str, run_id: str) -> None:
    long_line = "x" * 4000
    body = f'<img src=x onerror="alert(1)"> & "quoted" \'single\'\n{long_line}\n'
    assert post(url, "/v1/emails", email_body(run_id, subject=HOSTILE_SUBJECT, body=body), new_key()).status_code == 200
    page = inbox(url, run_id=run_id)
    [shown] = page.all("article", cls="email")
    assert shown.all(cls="subject")[0].text() == HOSTILE_SUBJECT
    assert shown.all("pre")[0].text().startswith('<img src=x onerror="alert(1)"> & "quoted" \'single\'\nxxx')
    assert "more characters" in shown.text()  # the body is cut, and says so
    assert page.all("script") == [] and page.all("img") == []


@pytest.mark.parametrize(
    ("query", "words"),
    [({"run_id": "r" * (MAX_RUN_ID_CHARS + 1)}, f"the limit is {MAX_RUN_ID_CHARS}"),
     ({"run_id": "[" * 5000}, f"the limit is {MAX_RUN_ID_CHARS}"),
     ({"run": "x"}, "only run_id"),
     ([("run_id", "a"), ("run_id", "b")], "once")],
    ids=["long", "brackets", "unknown", "twice"],
)
def test_inbox_refuses_a_bad_query_naming_what_to_send(url: str, query: Any, words: str) -> None:
    answer = HTTP.get(f"{url}/inbox", params=query)
    assert answer.status_code == 400 and answer.headers["content-type"] == "application/json", answer.text
    assert answer.json()["error"] == "invalid_request" and words in answer.json()["message"], answer.json()
    assert HTTP.post(f"{url}/inbox").status_code == 405


# -- faults ------------------------------------------------------------------------


async def test_fail_next_answers_503_with_retry_after_then_succeeds(
    url: str, run_id: str, provider_client: ProviderClient
) -> None:
    await provider_client.set_faults(fail_next=2, status=503, retry_after=0.25)
    key = new_key()
    for attempt in (1, 2):
        with pytest.raises(TransientError) as failure:
            await provider_client.send_email(idempotency_key=key, run_id=run_id,
                                             to="ada@example.com", subject="s", body="b")
        assert failure.value.retry_after == 0.25, attempt
        assert "503" in failure.value.message
        # The provider may say what it did, but not contradict the client's rule: a 5xx is in doubt.
        assert failure.value.in_doubt, attempt
        assert "this provider applied nothing, but a client cannot know that from a 503" in failure.value.message
        assert "a gateway or proxy may send one after the origin applied the request" in failure.value.message
    receipt = await provider_client.send_email(idempotency_key=key, run_id=run_id,
                                               to="ada@example.com", subject="s", body="b")
    assert receipt.replayed is False
    [record] = await provider_client.effects(run_id)
    assert (record.requests, record.effects_applied, record.status_code) == (3, 1, 200)


async def test_fail_next_with_429_and_no_retry_after(url: str, run_id: str, provider_client: ProviderClient) -> None:
    await provider_client.set_faults(fail_next=1, status=429)
    with pytest.raises(TransientError) as failure:
        await provider_client.create_ticket(idempotency_key=new_key(), run_id=run_id,
                                            summary="s", email_message_id="msg_1")
    assert failure.value.retry_after is None
    assert "429" in failure.value.message
    # A 4xx is the origin's own word (no gateway sends it after applying): nothing applied, plainly.
    assert not failure.value.in_doubt and "nothing was applied" in failure.value.message
    assert "gateway" not in failure.value.message


async def test_faults_can_target_one_kind(url: str, run_id: str, provider_client: ProviderClient) -> None:
    await provider_client.set_faults(fail_next=1, kinds=["ticket"])
    assert (await provider_client.faults())["fail"]["remaining"] == 1
    email = await provider_client.send_email(idempotency_key=new_key(), run_id=run_id,
                                             to="ada@example.com", subject="s", body="b")
    with pytest.raises(TransientError):
        await provider_client.create_ticket(idempotency_key=new_key(), run_id=run_id,
                                            summary="s", email_message_id=email.message_id)
    assert (await provider_client.set_faults(lose_response_next=0))["fail"]["remaining"] == 0


async def test_lost_response_applies_once_and_the_retry_replays(
    url: str, run_id: str, provider_client: ProviderClient
) -> None:
    await provider_client.set_faults(lose_response_next=1)
    key = new_key()
    with pytest.raises(TransientError) as failure:
        await provider_client.send_email(idempotency_key=key, run_id=run_id,
                                         to="ada@example.com", subject="s", body="b")
    assert failure.value.retry_after is None
    [stored] = await provider_client.emails(run_id)  # the effect happened although the caller saw a failure
    [record] = await provider_client.effects(run_id)
    assert (record.requests, record.effects_applied, record.status_code) == (1, 1, 503)

    receipt = await provider_client.send_email(idempotency_key=key, run_id=run_id,
                                               to="ada@example.com", subject="s", body="b")
    assert receipt.replayed is True and receipt.message_id == stored["message_id"]
    [record] = await provider_client.effects(run_id)
    assert (record.requests, record.effects_applied, record.status_code) == (2, 1, 200)


async def test_hang_with_a_client_timeout_is_transient_and_applies_once(
    url: str, run_id: str, provider_client: ProviderClient
) -> None:
    await provider_client.set_faults(hang_next=1, hang_seconds=1.0)
    key = new_key()
    async with ProviderClient(url, timeout=0.2) as impatient:
        with pytest.raises(TransientError) as failure:  # had it waited out the hang, it would have succeeded
            await impatient.send_email(idempotency_key=key, run_id=run_id, to="ada@example.com", subject="s", body="b")
    assert "in time" in failure.value.message

    # The retry overtakes the hung request; whichever comes first applies, the other replays.
    receipt = await provider_client.send_email(idempotency_key=key, run_id=run_id,
                                               to="ada@example.com", subject="s", body="b")
    record = poll_until_sync(
        lambda: next((r for r in fetch_effects(url, run_id) if r.requests == 2), None),
        timeout=10,
        describe=lambda: repr(fetch_effects(url, run_id)),
    )
    assert record.effects_applied == 1
    assert [e["message_id"] for e in await provider_client.emails(run_id)] == [receipt.message_id]


def test_fault_admin_validates_shows_and_clears(url: str) -> None:
    refused = HTTP.post(f"{url}/admin/faults", json={"fail_next": -1})
    assert refused.status_code == 400 and refused.json()["field"] == "fail_next"
    assert HTTP.post(f"{url}/admin/faults", json={"status": 503}).json()["field"] == "status"
    assert HTTP.post(f"{url}/admin/faults", json={"fail_next": 1, "kinds": ["sms"]}).json()["field"] == "kinds"
    assert HTTP.post(f"{url}/admin/faults", json={}).status_code == 400

    HTTP.post(f"{url}/admin/faults",
              json={"fail_next": 3, "status": 502, "hang_next": 1, "hang_seconds": 0.5}).raise_for_status()
    faults = HTTP.get(f"{url}/admin/faults").json()["faults"]
    assert faults["fail"] == {"remaining": 3, "status": 502, "retry_after": None, "kinds": list(NAMES)}
    assert faults["hang"]["remaining"] == 1 and faults["hang"]["hang_seconds"] == 0.5
    cleared = HTTP.delete(f"{url}/admin/faults").json()["faults"]
    assert cleared["fail"]["remaining"] == cleared["hang"]["remaining"] == cleared["lose_response"]["remaining"] == 0


# -- client error mapping ------------------------------------------------------------


async def test_client_maps_400_409_and_422_to_permanent_errors(
    url: str, run_id: str, provider_client: ProviderClient
) -> None:
    with pytest.raises(PermanentError) as bad_key:
        await provider_client.send_email(idempotency_key="has space", run_id=run_id,
                                         to="ada@example.com", subject="s", body="b")
    assert "400" in bad_key.value.message and "Idempotency-Key" in bad_key.value.message

    with pytest.raises(PermanentError) as bad_field:
        await provider_client.send_email(idempotency_key=new_key(), run_id=run_id,
                                         to="not-an-address", subject="s", body="b")
    assert "field 'to'" in bad_field.value.message and "malformed" in bad_field.value.message

    key = new_key()
    await provider_client.send_email(idempotency_key=key, run_id=run_id, to="ada@example.com", subject="s", body="b")
    with pytest.raises(PermanentError) as conflict:
        await provider_client.send_email(idempotency_key=key, run_id=run_id,
                                         to="ada@example.com", subject="other", body="b")
    assert conflict.value.message.startswith("idempotency conflict: ")
    assert "different body" in conflict.value.message
    # Not worth retrying: the same request gets the same answer again.
    assert isinstance(conflict.value, IdempotencyConflict)
    with pytest.raises(IdempotencyConflict) as again:
        await provider_client.send_email(idempotency_key=key, run_id=run_id,
                                         to="ada@example.com", subject="other", body="b")
    assert again.value.message == conflict.value.message


async def test_client_receipts_and_ticket_replay(url: str, run_id: str, provider_client: ProviderClient) -> None:
    email = await provider_client.send_email(idempotency_key=new_key(), run_id=run_id,
                                             to="ada@example.com", subject="s", body="b")
    key = new_key()
    first = await provider_client.create_ticket(idempotency_key=key, run_id=run_id,
                                                summary="s", email_message_id=email.message_id)
    again = await provider_client.create_ticket(idempotency_key=key, run_id=run_id,
                                                summary="s", email_message_id=email.message_id)
    assert first.ticket_id.startswith("tkt_") and (first.replayed, again.replayed) == (False, True)
    assert again.ticket_id == first.ticket_id
    assert [t["email_message_id"] for t in await provider_client.tickets(run_id)] == [email.message_id]
    assert await provider_client.health() is True


async def test_a_refund_is_applied_once_counted_per_key_and_mapped_like_the_others(
    url: str, run_id: str, provider_client: ProviderClient
) -> None:
    """The third kind: ``POST /v1/refunds`` under a key, replayed, refused on another amount (409), a bad
    amount a permanent error naming the field, an injected 5xx in doubt: the client's table, as for the
    email and the ticket; the provider counts it per key under its kind."""
    key = new_key()
    await provider_client.seed_order("A-1234", 5000)  # a refund is taken from an order the provider keeps
    first = await provider_client.issue_refund(idempotency_key=key, run_id=run_id, order_id="A-1234", amount=1250)
    again = await provider_client.issue_refund(idempotency_key=key, run_id=run_id, order_id="A-1234", amount=1250)
    assert first.refund_id.startswith("rfd_") and (first.replayed, again.replayed) == (False, True)
    assert again.refund_id == first.refund_id
    with pytest.raises(IdempotencyConflict):
        await provider_client.issue_refund(idempotency_key=key, run_id=run_id, order_id="A-1234", amount=9999)
    with pytest.raises(PermanentError) as bad:
        await provider_client.issue_refund(idempotency_key=new_key(), run_id=run_id, order_id="A-1234", amount=0)
    assert "field 'amount'" in bad.value.message, bad.value.message
    await provider_client.set_faults(fail_next=1, status=503, kinds=["refund"])
    with pytest.raises(TransientError) as down:
        await provider_client.issue_refund(idempotency_key=new_key(), run_id=run_id, order_id="A-1", amount=5)
    assert down.value.in_doubt, down.value.message
    record = effect_for(url, key)
    assert (record.kind, record.requests, record.effects_applied, record.status_code) == ("refund", 3, 1, 409)
    stored = HTTP.get(f"{url}/v1/refunds", params={"run_id": run_id}).json()["refunds"]
    assert [(r["refund_id"], r["order_id"], r["amount"]) for r in stored] == [(first.refund_id, "A-1234", 1250)]
    applied = await provider_client.lookup(key)
    assert applied is not None and applied.endpoint == "POST /v1/refunds" and applied.kind == "refund"
    assert applied.request == {"run_id": run_id, "order_id": "A-1234", "amount": 1250}
    # One key names one request across every endpoint: a refund's key is no email's.
    conflict = post(url, "/v1/emails", email_body(run_id), key)
    assert conflict.status_code == 409 and "/v1/refunds" in conflict.json()["message"], conflict.text


async def test_client_maps_an_unreachable_provider_to_transient() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with ProviderClient(f"http://127.0.0.1:{port}", timeout=2) as unreachable:
        assert await unreachable.health() is False
        with pytest.raises(TransientError) as failure:
            await unreachable.send_email(idempotency_key="k", run_id="r", to="ada@example.com", subject="s", body="b")
    assert "unreachable" in failure.value.message
    with pytest.raises(TransientError):
        fetch_effects(f"http://127.0.0.1:{port}")


def test_retry_after_parsing() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now=now) == 30.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_provider_url_from_env() -> None:
    assert provider_url_from_env({}) == "http://127.0.0.1:8780"
    assert provider_url_from_env({"PROVIDER_URL": "http://provider:9000/"}) == "http://provider:9000"
    with pytest.raises(ValueError, match="PROVIDER_URL"):
        provider_url_from_env({"PROVIDER_URL": "provider:9000"})


# -- the process -----------------------------------------------------------------------


@pytest.mark.process
def test_effects_and_counts_survive_sigkill_and_restart(tmp_path: Path) -> None:
    with ProviderProcess(tmp_path / "provider.db") as proc:
        url, key = proc.url, new_key()
        first = post(url, "/v1/emails", email_body("persist-1"), key)
        assert first.status_code == 200

        proc.kill()
        assert not proc.alive()
        with pytest.raises(httpx.TransportError):
            HTTP.get(f"{url}/healthz", timeout=1)

        proc.restart()
        assert proc.url == url  # same port, so configured clients keep working
        again = post(url, "/v1/emails", email_body("persist-1"), key)
        assert again.status_code == 200
        assert again.json() == {**first.json(), "replayed": True}
        record = effect_for(url, key)
        assert (record.requests, record.effects_applied, record.first_seen) == (2, 1, first.json()["created_at"])
        assert proc.stop() == 0  # SIGTERM is a clean exit


@pytest.mark.process
def test_sigterm_during_an_injected_hang_exits_promptly(tmp_path: Path) -> None:
    with ProviderProcess(tmp_path / "provider.db") as proc:
        HTTP.post(f"{proc.url}/admin/faults", json={"hang_next": 1, "hang_seconds": 60}).raise_for_status()
        outcome: list[Any] = []
        sender = threading.Thread(
            target=lambda: outcome.append(post(proc.url, "/v1/emails", email_body("hang-1"), new_key(), timeout=30))
        )
        sender.start()
        poll_until_sync(
            lambda: HTTP.get(f"{proc.url}/admin/faults").json()["faults"]["hang"]["remaining"] == 0,
            timeout=10,
            describe=lambda: HTTP.get(f"{proc.url}/admin/faults").text,
        )
        started = time.monotonic()
        assert proc.stop(timeout=10) == 0
        assert time.monotonic() - started < 5
        sender.join(timeout=10)
        assert outcome and outcome[0].status_code == 503 and outcome[0].json()["error"] == "shutting_down"


@pytest.mark.process
def test_non_loopback_host_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "provider.db"
    env = {k: v for k, v in os.environ.items() if k != "PROVIDER_ALLOW_REMOTE"}
    result = subprocess.run(
        [sys.executable, "-m", "provider", "--host", "0.0.0.0", "--port", "0", "--db", str(db)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2, result
    assert "refusing to listen on '0.0.0.0'" in result.stderr
    assert "PROVIDER_ALLOW_REMOTE=1" in result.stderr
    assert result.stdout == "" and not db.exists()


@pytest.mark.process
def test_non_loopback_host_is_allowed_with_the_container_opt_in(tmp_path: Path) -> None:
    with ProviderProcess(tmp_path / "provider.db", host="0.0.0.0", env={"PROVIDER_ALLOW_REMOTE": "1"}) as proc:
        assert HTTP.get(f"{proc.url}/healthz").json() == {"ok": True}


@pytest.mark.process
def test_a_failed_start_reports_the_providers_stderr(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(RuntimeError, match="cannot listen on"):
            with ProviderProcess(tmp_path / "provider.db", port=taken.getsockname()[1]):
                pass


def test_mail_to_the_invalid_tld_is_rejected_like_a_hard_bounce(shared_provider):
    response = httpx.post(
        f"{shared_provider.url}/v1/emails",
        json={"run_id": "r-bounce", "to": "nobody@mailbox.invalid", "subject": "s", "body": "b"},
        headers={"Idempotency-Key": "bounce-1"},
    )
    assert response.status_code == 422
    assert response.json()["error"] == "recipient_rejected"
    assert "cannot receive mail" in response.json()["message"]
