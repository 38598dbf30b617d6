"""The provider's side of the agent loop's tools, on a real provider process: the orders the lab seeds,
their lookups (counted per request, per run, 404s included), the refund cap (an order's refunds never
exceed its total: checked with the insert in one transaction, after the key), the ticket that follows no
email, and the client's ``Refused`` for a request the provider refused and applied nothing of.

One provider process for the module; each test keeps apart with its own order ids, run ids and keys.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from durable_agents.providerclient import OrderInfo, ProviderClient, error_from_response, lookup_counts, seed_orders
from durable_agents.steps import ports
from durable_agents.steps.errors import IdempotencyConflict, PermanentError, Refused, TransientError
from lab.provider_process import ProviderProcess
from provider.validation import MAX_ORDER_TOTAL
from tests.tiers import starts

HTTP = httpx.Client(timeout=20)


@pytest.fixture(scope="module")
@starts("process")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with ProviderProcess(tmp_path_factory.mktemp("orders") / "provider.db") as provider:
        yield provider.url
    HTTP.close()


@pytest.fixture
def order() -> str:
    return f"A-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def run() -> str:
    return f"orders-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def client(url: str) -> Any:
    async with ProviderClient(url) as client:
        yield client


def key() -> str:
    return f"orders-{uuid.uuid4().hex}"


def seed(url: str, order_id: str, total: Any, **more: Any) -> httpx.Response:
    return HTTP.post(f"{url}/v1/orders", json={"order_id": order_id, "total": total, **more})


def refund(url: str, order_id: str, amount: int, *, run: str = "orders-run", with_key: str | None = None
           ) -> httpx.Response:
    return HTTP.post(f"{url}/v1/refunds", json={"run_id": run, "order_id": order_id, "amount": amount},
                     headers={"Idempotency-Key": with_key or key()})


def looked_up(url: str, order_id: str, run: str | None = None) -> httpx.Response:
    return HTTP.get(f"{url}/v1/orders/{order_id}", params={"run_id": run} if run else None)


def refunded(url: str, order_id: str) -> int:
    return int(looked_up(url, order_id).json()["refunded"])


def bookkeeping(url: str, the_key: str) -> tuple[int, int, int]:
    """(requests, effects_applied, status_code) the provider keeps for one key."""
    [row] = [e for e in HTTP.get(f"{url}/v1/effects").json()["effects"] if e["key"] == the_key]
    return row["requests"], row["effects_applied"], row["status_code"]


# -- seeding -------------------------------------------------------------------------------------


def test_an_order_is_seeded_once_again_alike_and_never_changed(url: str, order: str) -> None:
    first = seed(url, order, 5000)
    assert first.status_code == 201 and first.json()["replayed"] is False, first.text
    assert (first.json()["total"], first.json()["currency"]) == (5000, "EUR")
    again = seed(url, order, 5000, currency="EUR")
    assert again.status_code == 200 and again.json()["replayed"] is True, again.text
    assert again.json()["created_at"] == first.json()["created_at"]
    for other, field in (({"total": 5001}, "total"), ({"total": 5000, "currency": "USD"}, "currency")):
        conflict = HTTP.post(f"{url}/v1/orders", json={"order_id": order, **other})
        assert (conflict.status_code, conflict.json()["error"], conflict.json()["field"]) == (
            409, "order_conflict", field), conflict.text
        assert "5000 cents EUR" in conflict.json()["message"]
    for bad in ({"total": 0}, {"total": MAX_ORDER_TOTAL + 1}, {"total": "5000"}, {"total": 50, "currency": "eur"},
                {"total": 50, "note": "x"}):
        refused = HTTP.post(f"{url}/v1/orders", json={"order_id": f"{order}-bad", **bad})
        assert (refused.status_code, refused.json()["error"]) == (422, "invalid_request"), (bad, refused.text)
    assert looked_up(url, f"{order}-bad").status_code == 404  # none of them was kept
    kept = looked_up(url, order).json()
    assert (kept["total"], kept["currency"], kept["refunded"]) == (5000, "EUR", 0)
    usd = seed(url, f"{order}-usd", MAX_ORDER_TOTAL, currency="USD")
    assert usd.status_code == 201 and usd.json()["currency"] == "USD", usd.text


# -- lookups ---------------------------------------------------------------------------------------


def test_every_lookup_is_counted_per_order_and_per_run_404s_included(url: str, order: str, run: str) -> None:
    seed(url, order, 2500).raise_for_status()
    other_run, unknown = f"{run}-b", f"{order}-none"
    answers = [looked_up(url, order, run), looked_up(url, order, run), looked_up(url, unknown, run),
               looked_up(url, order, other_run), looked_up(url, order)]
    assert [a.status_code for a in answers] == [200, 200, 404, 200, 200], [a.text for a in answers]
    # "lookups" counts this order's lookups whatever the run, this one included.
    assert [a.json().get("lookups") for a in answers] == [1, 2, None, 3, 4]
    assert answers[0].json() == {"order_id": order, "total": 2500, "refunded": 0, "currency": "EUR", "lookups": 1}
    assert answers[2].json()["error"] == "order_not_found" and answers[2].json()["field"] == "order_id"
    assert lookup_counts(url, run) == {"run_id": run, "lookups": 3, "by_order": {order: 2, unknown: 1}}
    assert lookup_counts(url, other_run) == {"run_id": other_run, "lookups": 1, "by_order": {order: 1}}
    assert lookup_counts(url, f"{run}-never") == {"run_id": f"{run}-never", "lookups": 0, "by_order": {}}
    everyone = lookup_counts(url)
    assert everyone["run_id"] is None and everyone["by_order"][order] == 4 and everyone["by_order"][unknown] == 1
    # An id no order could have, or a run id no run could have, is refused and names it: not counted.
    for path, params, field in ((f"/v1/orders/{'x' * 65}", {"run_id": run}, "order_id"),
                                ("/v1/orders/A%0A1", {"run_id": run}, "order_id"),
                                (f"/v1/orders/{order}", {"run_id": "r" * 65}, "run_id"),
                                (f"/v1/orders/{order}", {"run_id": ""}, "run_id"),
                                (f"/v1/orders/{order}", {"run": run}, "run")):
        bad = HTTP.get(f"{url}{path}", params=params)
        assert (bad.status_code, bad.json()["field"]) == (400, field), (path, params, bad.text)
    assert lookup_counts(url, run)["lookups"] == 3 and looked_up(url, order).json()["lookups"] == 5
    # An order id is one path segment: "/" in it is percent-encoded.
    assert HTTP.get(f"{url}/v1/orders/{order}%2Fx").json()["error"] == "order_not_found"


async def test_the_client_reads_an_order_and_the_counts(client: ProviderClient, url: str, order: str,
                                                        run: str) -> None:
    first = await client.seed_order(order, 1999, "USD")
    again = await client.seed_order(order, 1999, "USD")
    assert first["replayed"] is False and again == {**first, "replayed": True}, (first, again)
    info = await client.lookup_order(order, run_id=run)
    assert info == OrderInfo(order_id=order, total=1999, refunded=0, currency="USD", lookups=1)
    looked: ports.OrderInfo = info  # what the agent loop's port asks for
    assert looked.total - looked.refunded == info.left == 1999
    assert await client.lookup_order(f"{order}/none", run_id=run) is None
    assert await client.lookups(run) == {"run_id": run, "lookups": 2, "by_order": {order: 1, f"{order}/none": 1}}
    with pytest.raises(Refused) as conflict:
        await client.seed_order(order, 2000, "USD")
    assert conflict.value.code == "order_conflict" and not isinstance(conflict.value, IdempotencyConflict)
    assert seed_orders(url, {order: 1999, f"{order}-2": 10}, currency="USD")[f"{order}-2"]["replayed"] is False
    with pytest.raises(Refused, match="order_conflict"):
        seed_orders(url, {order: 1999})  # kept in USD


# -- the refund cap ----------------------------------------------------------------------------------


def test_the_exact_total_passes_and_one_cent_over_is_refused_with_nothing_applied(url: str, order: str,
                                                                                  run: str) -> None:
    seed(url, order, 5000).raise_for_status()
    over_key = key()
    over = refund(url, order, 5001, run=run, with_key=over_key)
    body = over.json()
    assert (over.status_code, body["error"], body["field"]) == (422, "refund_exceeds_total", "amount"), over.text
    assert "total is 5000 cents EUR, 0 already refunded, 5000 left" in body["message"], body["message"]
    assert "Nothing was applied" in body["message"]
    assert HTTP.get(f"{url}/v1/refunds", params={"run_id": run}).json()["refunds"] == []
    assert refunded(url, order) == 0 and bookkeeping(url, over_key) == (1, 0, 422)
    # The refusal blocks nothing: the whole total under another key, and its own key is free, as after a
    # validation refusal (nothing was stored under it).
    whole = refund(url, order, 5000, run=run)
    assert whole.status_code == 200 and whole.json()["amount"] == 5000, whole.text
    assert refunded(url, order) == 5000
    last = refund(url, order, 1, run=run, with_key=over_key)
    assert (last.status_code, last.json()["error"]) == (422, "refund_exceeds_total"), last.text
    assert "nothing is left to refund" in last.json()["message"] and bookkeeping(url, over_key) == (2, 0, 422)
    assert [r["amount"] for r in HTTP.get(f"{url}/v1/refunds", params={"run_id": run}).json()["refunds"]] == [5000]


def test_refunds_that_sum_past_the_total_are_refused_and_the_key_stays_free(url: str, order: str) -> None:
    seed(url, order, 5000).raise_for_status()
    assert refund(url, order, 3000).status_code == 200
    second_key = key()
    second = refund(url, order, 2001, with_key=second_key)
    assert second.status_code == 422, second.text
    assert "5000 cents EUR, 3000 already refunded, 2000 left" in second.json()["message"]
    assert "refund at most 2000 cents" in second.json()["message"]
    fits = refund(url, order, 2000, with_key=second_key)  # the same key, a request that fits
    assert fits.status_code == 200 and fits.json()["replayed"] is False, fits.text
    assert refunded(url, order) == 5000 and bookkeeping(url, second_key) == (2, 1, 200)


def test_concurrent_refunds_from_threads_never_pass_the_total_together(url: str, order: str, run: str) -> None:
    """Eight refunds of 1,000 cents of a 5,000-cent order, released at once from eight threads, each under
    its own key: each would fit alone; exactly five pass, whatever the interleaving."""
    seed(url, order, 5000).raise_for_status()
    start = threading.Barrier(8)
    statuses: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        with httpx.Client(timeout=30) as http:
            start.wait(timeout=30)
            answer = http.post(f"{url}/v1/refunds", json={"run_id": run, "order_id": order, "amount": 1000},
                               headers={"Idempotency-Key": key()})
        with lock:
            statuses.append(answer.status_code)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(statuses) == [200] * 5 + [422] * 3, statuses
    assert refunded(url, order) == 5000
    assert len(HTTP.get(f"{url}/v1/refunds", params={"run_id": run}).json()["refunds"]) == 5


def test_a_replay_answers_its_receipt_after_the_order_is_fully_refunded(url: str, order: str) -> None:
    """The key first, then the cap: the stored 200 comes back (same id), a new key is refused, and a key
    reused for another body is still the key's 409, not the cap's 422."""
    seed(url, order, 1250).raise_for_status()
    the_key = key()
    first = refund(url, order, 1250, with_key=the_key)
    replay = refund(url, order, 1250, with_key=the_key)
    assert (first.status_code, replay.status_code) == (200, 200), replay.text
    assert replay.json()["refund_id"] == first.json()["refund_id"] and replay.json()["replayed"] is True
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert refund(url, order, 1250).json()["error"] == "refund_exceeds_total"
    assert refund(url, order, 1, with_key=the_key).json()["error"] == "idempotency_conflict"
    assert refunded(url, order) == 1250 and bookkeeping(url, the_key) == (3, 1, 409)


def test_a_refund_of_an_order_the_provider_does_not_keep_is_404_and_applies_nothing(url: str, order: str,
                                                                                    run: str) -> None:
    the_key = key()
    missing = refund(url, order, 100, run=run, with_key=the_key)
    assert (missing.status_code, missing.json()["error"], missing.json()["field"]) == (
        404, "order_not_found", "order_id"), missing.text
    assert "POST /v1/orders" in missing.json()["message"]
    assert HTTP.get(f"{url}/v1/refunds", params={"run_id": run}).json()["refunds"] == []
    assert bookkeeping(url, the_key) == (1, 0, 404)
    applied = HTTP.get(f"{url}/v1/requests/{the_key}").json()
    assert applied["applied"] is False and applied["kind"] == "refund"
    seed(url, order, 100).raise_for_status()
    assert refund(url, order, 100, run=run, with_key=the_key).status_code == 200  # the same key, now it exists


# -- tickets -----------------------------------------------------------------------------------------


def test_a_ticket_may_follow_no_email(url: str, run: str) -> None:
    body = {"run_id": run, "summary": "Refunded order A-1 in full", "email_message_id": ""}
    made = HTTP.post(f"{url}/v1/tickets", json=body, headers={"Idempotency-Key": key()})
    assert made.status_code == 200 and made.json()["email_message_id"] == "", made.text
    assert [t["email_message_id"] for t in HTTP.get(f"{url}/v1/tickets", params={"run_id": run}).json()["tickets"]
            ] == [""]
    for blank in (" ", "\t", "\u3000"):
        refused = HTTP.post(f"{url}/v1/tickets", json={**body, "email_message_id": blank},
                            headers={"Idempotency-Key": key()})
        assert (refused.status_code, refused.json()["field"]) == (422, "email_message_id"), (blank, refused.text)


# -- the client's mapping ----------------------------------------------------------------------------


async def test_the_client_raises_refused_with_the_providers_code(client: ProviderClient, url: str, order: str,
                                                                 run: str) -> None:
    """A refusal that applied nothing is ``Refused`` with the provider's code (still a ``PermanentError``);
    a 409 on a key stays ``IdempotencyConflict``; an injected 5xx stays transient and in doubt."""
    async def issue(amount: int, the_key: str | None = None, order_id: str = order) -> Any:
        return await client.issue_refund(idempotency_key=the_key or key(), run_id=run, order_id=order_id,
                                         amount=amount)

    with pytest.raises(Refused) as unknown:
        await issue(100)
    assert unknown.value.code == "order_not_found" and "field 'order_id'" in unknown.value.message
    await client.seed_order(order, 1000)
    the_key = key()
    receipt = await issue(600, the_key)
    with pytest.raises(Refused) as over:
        await issue(401)
    assert over.value.code == "refund_exceeds_total" and isinstance(over.value, PermanentError)
    assert "600 already refunded, 400 left" in over.value.message and "field 'amount'" in over.value.message
    with pytest.raises(Refused) as invalid:
        await issue(0)
    assert invalid.value.code == "invalid_request"
    # A bounce is the address refusing mail, which no other choice of values mends: PermanentError, not Refused.
    with pytest.raises(PermanentError) as bounced:
        await client.send_email(idempotency_key=key(), run_id=run, to="nobody@mailbox.invalid", subject="s", body="b")
    assert not isinstance(bounced.value, Refused) and "recipient_rejected" in str(bounced.value)
    with pytest.raises(IdempotencyConflict) as conflict:
        await issue(1, the_key)
    assert not isinstance(conflict.value, Refused)
    assert (await issue(600, the_key)).refund_id == receipt.refund_id  # the replay, past the cap's reach
    await client.set_faults(fail_next=1, status=503, kinds=["refund"])
    try:
        with pytest.raises(TransientError) as down:
            await issue(1)
    finally:
        await client.clear_faults()
    assert down.value.in_doubt
    assert (await client.lookup_order(order)) == OrderInfo(order, 1000, 600, "EUR", 1)


def test_only_a_providers_coded_refusal_of_an_effect_is_refused() -> None:
    """``Refused`` says "the provider refused this request and applied nothing": an answer without the
    provider's code (a proxy's page) says nothing of the kind, nor does a read's 404 or a 403."""
    request = httpx.Request("POST", "http://provider/v1/refunds")

    def answer(status: int, **content: Any) -> httpx.Response:
        return httpx.Response(status, request=request, **content)

    coded = answer(422, json={"error": "refund_exceeds_total", "message": "over", "field": "amount"})
    refused = error_from_response(coded, "issue the refund", refusals=frozenset({400, 404, 422}))
    assert isinstance(refused, Refused) and refused.code == "refund_exceeds_total"
    for status, content in ((404, {"text": "<html>Not Found</html>"}), (403, {"json": {"error": "forbidden",
                                                                                      "message": "no"}})):
        plain = error_from_response(answer(status, **content), "issue the refund",
                                    refusals=frozenset({400, 404, 422}))
        assert type(plain) is PermanentError, (status, plain)
    assert type(error_from_response(coded, "read")) is PermanentError  # no refusals asked for: a read
    lost = error_from_response(answer(503, json={"error": "x", "message": "down"}), "look up", read_only=True)
    assert isinstance(lost, TransientError) and not lost.in_doubt
