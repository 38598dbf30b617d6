"""Files written by the previous main keep working: the run record (with a run
in flight), the provider's store and conversation memory, each created at
their previous schema version and opened by this code, which upgrades them in
place. The workflow histories of the previous main are tests/test_replay_fixtures.py's."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from contextlib import closing

import httpx
import pytest

from durable_agents.memory import Message, SQLiteStore, read_context
from durable_agents.providerclient import fetch_effects
from durable_agents.runrecord.store import _SCHEMA_V1 as RECORD_V1_SCHEMA
from durable_agents.runrecord.store import SCHEMA_VERSION as RECORD_SCHEMA
from durable_agents.steps.keys import idempotency_key
from lab.processes import REPO, Proc
from lab.provider_process import ProviderProcess
from provider.store import _SCHEMA_V1 as PROVIDER_V1_SCHEMA
from provider.store import SCHEMA_VERSION as PROVIDER_SCHEMA
from provider.store import Store
from tests.support import EMAIL, TASK, executions, wait_exit

PROVIDER_V2 = REPO / "tests" / "data" / "provider-schema2.sql"
"""A provider store made by the provider of bae0eb8 (schema 2, emails and tickets only), dumped as SQL: for
run v2-run an email (two requests, one applied), a ticket citing it, and a refused ticket request of run
v2-other (counted, nothing applied). Never made again: it stands for the files in the field."""

PROVIDER_V3 = REPO / "tests" / "data" / "provider-schema3.sql"
"""A provider store made by the provider of 7edebac (schema 3: emails, tickets and refunds, no orders), dumped as
SQL: for run v3-run an email, a refund of 1250 cents of order A-3000 (two requests, one applied), a ticket
citing the email; and a refused refund request of run v3-other (amount 0: counted, nothing applied). Never
made again: it stands for the files in the field."""
PROVIDER_TABLES = ("idempotency_keys", "emails", "tickets", "refunds")

DRAFT = {"subject": "Re: Confirm the refund for order 1234", "body": "Hello", "summary": "Drafted a reply",
         "model": "offline", "context_messages": 0}


def v1_record_in_flight(path, run_id: str) -> None:
    """What the previous runner left after a SIGKILL during send_confirmation:
    the draft recorded, the email's attempt 1 and intent committed, no answer."""
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in RECORD_V1_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("PRAGMA user_version=1")
    now = time.time()
    conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, 'running', 1, NULL, ?, ?, NULL, NULL)",
                 (run_id, TASK, EMAIL, run_id, now, now))
    conn.execute("INSERT INTO steps VALUES (?, 0, 'draft', 'completed', 1, ?, NULL, ?, ?, ?)",
                 (run_id, json.dumps(DRAFT), now, now, now))
    conn.execute("INSERT INTO steps VALUES (?, 1, 'send_confirmation', 'running', 1, NULL, NULL, ?, ?, NULL)",
                 (run_id, now, now))
    conn.execute("INSERT INTO steps VALUES (?, 2, 'record_outcome', 'pending', 0, NULL, NULL, NULL, NULL, NULL)",
                 (run_id,))
    request = {"run_id": run_id, "to": EMAIL, "subject": DRAFT["subject"], "body": DRAFT["body"],
               "idempotency_key": idempotency_key(run_id, "send_confirmation")}
    conn.execute("INSERT INTO intents VALUES (?, 1, 1, 'send_confirmation', ?, ?, 'in_doubt', NULL, ?, NULL)",
                 (run_id, request["idempotency_key"], json.dumps(request), now))
    conn.close()


def test_a_run_in_flight_in_a_version_1_record_is_resumed(provider, tmp_path, run_id):
    db = tmp_path / "runrecord.db"
    v1_record_in_flight(db, run_id)
    env = {"RUNRECORD_DB": str(db), "MEMORY_DB": str(tmp_path / "memory.db"), "PROVIDER_URL": provider.url,
           "PYTHONUNBUFFERED": "1"}
    resumed = Proc("runrecord", [sys.executable, "-m", "durable_agents.runrecord", "resume", run_id], env=env)
    assert wait_exit(resumed, 60) == 0, resumed.output()
    assert executions(resumed, "draft") == 0
    # The attempt the old process died in counts as a crash, not as an error.
    shown = Proc("status", [sys.executable, "-m", "durable_agents.runrecord", "status", run_id, "--json"], env=env)
    wait_exit(shown)
    status = json.loads(shown.output())
    assert status["status"] == "completed"
    assert (status["steps"][1]["attempts"], status["steps"][1]["crashes"]) == (2, 1), status["steps"][1]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == RECORD_SCHEMA
    effects = {e.key: e for e in fetch_effects(provider.url, run_id=run_id)}
    assert all(e.effects_applied == 1 for e in effects.values()) and len(effects) == 2


def test_a_version_1_provider_store_is_upgraded_and_keeps_its_effects(tmp_path):
    db = tmp_path / "provider.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.executescript(PROVIDER_V1_SCHEMA)
    conn.execute("PRAGMA user_version=1")
    conn.execute("INSERT INTO idempotency_keys VALUES ('k1', 1, 'email', 'r1', 1, 200, 'POST', '/v1/emails', 'f', "
                 "?, 't', 't')", (json.dumps({"message_id": "msg_1", "replayed": False}),))
    conn.execute("INSERT INTO emails VALUES ('msg_1', 'k1', 'r1', 'a@example.com', 's', 'b', 't')")
    conn.close()
    store = Store(db)
    found = store.lookup("k1")
    assert found["applied"] and found["request"] == {"run_id": "r1", "to": "a@example.com", "subject": "s", "body": "b"}
    assert found["response"]["message_id"] == "msg_1"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == PROVIDER_SCHEMA


def test_a_version_1_memory_file_is_upgraded_and_its_messages_count_as_old(tmp_path):
    path = tmp_path / "memory.db"
    store = SQLiteStore(str(path))
    store.append("c1", Message(id="m1", role="user", content="written by the previous main"))
    store.close()
    with sqlite3.connect(path) as conn:  # back to what the previous main wrote
        conn.execute("ALTER TABLE messages DROP COLUMN appended_at")
        conn.execute("PRAGMA user_version=1")
    # Read as the previous schema, before any writer upgraded it: nothing is hidden.
    assert [m["content"] for m in read_context(str(path), "c1", as_of=0.0)] == ["written by the previous main"]
    store = SQLiteStore(str(path))
    store.append("c1", Message(id="m2", role="assistant", content="written now"))
    store.close()
    cut = read_context(str(path), "c1", as_of=time.time() - 3600)
    assert [m["content"] for m in cut] == ["written by the previous main"]


@pytest.mark.process
def test_a_schema_2_provider_store_made_by_the_previous_code_gains_refunds_and_keeps_every_row(tmp_path):
    """The bookkeeping's CHECK (kind IN ('email', 'ticket')) is rebuilt from provider.kinds (SQLite cannot
    alter a CHECK): every key keeps its counts, every effect its ids, a replay its stored answer; a refund is
    applied; a kind outside the table is still refused by the store itself."""
    db = tmp_path / "provider.db"
    with closing(sqlite3.connect(db)) as conn:
        conn.executescript(PROVIDER_V2.read_text())
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        before = conn.execute("SELECT key, seq, kind, run_id, requests, status_code, fingerprint, response_json, "
                              "first_seen, last_seen FROM idempotency_keys ORDER BY seq").fetchall()
    with ProviderProcess(db) as provider, httpx.Client(base_url=provider.url) as http:
        effects = {e.key: e for e in fetch_effects(provider.url)}
        assert {k: (e.kind, e.requests, e.effects_applied) for k, e in effects.items()} == {
            "agentlab/v2-run/send_confirmation": ("email", 2, 1),
            "agentlab/v2-run/record_outcome": ("ticket", 1, 1),
            "agentlab/v2-other/record_outcome": ("ticket", 1, 0)}
        [email] = http.get("/v1/emails").json()["emails"]
        [ticket] = http.get("/v1/tickets").json()["tickets"]
        assert ticket["email_message_id"] == email["message_id"]
        body = {"run_id": "v2-run", "to": "ada@example.com", "subject": "Your refund", "body": "Hello Ada,\n\nDone.\n",
                "metadata": {"lab_start_id": "0123abcd"}}
        replay = http.post("/v1/emails", json=body, headers={"Idempotency-Key": "agentlab/v2-run/send_confirmation"})
        assert replay.json()["message_id"] == email["message_id"] and replay.json()["replayed"] is True
        assert http.post("/v1/orders", json={"order_id": "A-1234", "total": 1250}).status_code == 201
        refund = http.post("/v1/refunds", json={"run_id": "v2-run", "order_id": "A-1234", "amount": 1250},
                           headers={"Idempotency-Key": "agentlab/v2-run/issue_refund"})
        assert refund.status_code == 200, refund.text
        looked = http.get("/v1/requests/agentlab%2Fv2-run%2Frecord_outcome").json()
        assert looked["applied"] and looked["response"]["ticket_id"] == ticket["ticket_id"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == PROVIDER_SCHEMA
        after = conn.execute("SELECT key, seq, kind, run_id, requests, status_code, fingerprint, response_json, "
                             "first_seen, last_seen FROM idempotency_keys ORDER BY seq").fetchall()
        assert after[0][:4] == before[0][:4] and after[0][4] == before[0][4] + 1  # the replay counted
        assert after[1:3] == before[1:3] and after[3][2] == "refund"
        try:
            conn.execute("INSERT INTO idempotency_keys (key, seq, kind, requests, first_seen, last_seen) "
                         "VALUES ('x', 99, 'sms', 1, 't', 't')")
        except sqlite3.IntegrityError as refused:
            assert "CHECK constraint failed" in str(refused)
        else:
            raise AssertionError("the rebuilt bookkeeping took a kind provider.kinds does not have")


@pytest.mark.process
def test_a_schema_3_provider_store_gains_orders_and_keeps_every_row(tmp_path):
    """Version 4 adds the orders and their lookups beside the other tables: every key, effect and stored answer
    is kept as it was; a refund applied before orders existed replays before its order is seeded (the key
    comes first) and counts against the order once it is, so the cap holds across the upgrade."""
    db = tmp_path / "provider.db"
    with closing(sqlite3.connect(db)) as conn:
        conn.executescript(PROVIDER_V3.read_text())

    def rows() -> dict[str, list[tuple]]:
        with closing(sqlite3.connect(db)) as conn:
            return {t: conn.execute(f"SELECT * FROM {t} ORDER BY rowid").fetchall() for t in PROVIDER_TABLES}

    def version() -> int:
        with closing(sqlite3.connect(db)) as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    assert version() == 3
    before = rows()
    refund = {"run_id": "v3-run", "order_id": "A-3000", "amount": 1250, "metadata": {"lab_start_id": "0123abcd"}}
    with ProviderProcess(db) as provider, httpx.Client(base_url=provider.url) as http:
        assert version() == PROVIDER_SCHEMA == 4 and rows() == before  # the upgrade itself changed no row
        [old] = before["refunds"]
        replay = http.post("/v1/refunds", json=refund, headers={"Idempotency-Key": "agentlab/v3-run/issue_refund"})
        assert replay.status_code == 200 and replay.json()["refund_id"] == old[0], replay.text
        assert http.get("/v1/orders/A-3000").json()["error"] == "order_not_found"
        assert http.post("/v1/orders", json={"order_id": "A-3000", "total": 2000}).status_code == 201
        order = http.get("/v1/orders/A-3000").json()
        assert (order["total"], order["refunded"], order["lookups"]) == (2000, 1250, 2), order
        other = {"Idempotency-Key": "agentlab/v3-other/issue_refund"}
        over = http.post("/v1/refunds", json={"run_id": "v3-other", "order_id": "A-3000", "amount": 751},
                         headers=other)
        assert (over.status_code, over.json()["error"]) == (422, "refund_exceeds_total"), over.text
        # Refused twice (an amount of 0 by the old code, 751 by the cap), the key still carries one that fits.
        fits = http.post("/v1/refunds", json={"run_id": "v3-other", "order_id": "A-3000", "amount": 750},
                         headers=other)
        assert fits.status_code == 200, fits.text
        effects = {e.key: (e.requests, e.effects_applied) for e in fetch_effects(provider.url)}
        assert effects["agentlab/v3-other/issue_refund"] == (3, 1) and effects["agentlab/v3-run/issue_refund"] == (
            3, 1), effects
    after = rows()
    assert after["emails"] == before["emails"] and after["tickets"] == before["tickets"]
    assert after["refunds"][0] == old and len(after["refunds"]) == 2
