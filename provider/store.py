"""The provider's durable store: the effects (emails, tickets) and the
idempotency bookkeeping, in one SQLite file.

The guarantee that matters lives here: the effect, the stored response and the
key's bookkeeping are written in ONE ``BEGIN IMMEDIATE`` transaction. SQLite
takes its write lock before the key is looked up, so two requests with the same
key (from two threads, or even two provider processes on the same file) are
serialised, and the second one finds the first one's stored response. A UNIQUE
constraint on ``idempotency_key`` in each effect table backs this up: if the
logic above were ever wrong, the second insert would fail instead of sending a
second email.

``effects_applied`` is not a stored counter: it is counted from the effect
tables themselves, so it reports what really happened, never what the
bookkeeping believes happened.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from storage import sqlite

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key           TEXT PRIMARY KEY,
    seq           INTEGER NOT NULL,            -- arrival order, for stable listings
    kind          TEXT NOT NULL CHECK (kind IN ('email', 'ticket')),
    run_id        TEXT,
    requests      INTEGER NOT NULL,
    status_code   INTEGER,                     -- status of the latest response for this key
    method        TEXT,                        -- set, with the rest, once the effect is applied
    path          TEXT,
    fingerprint   TEXT,
    response_json TEXT,
    first_seen    TEXT NOT NULL,
    last_seen     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_keys_run ON idempotency_keys (run_id, seq);
CREATE TABLE IF NOT EXISTS emails (
    message_id      TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    run_id          TEXT NOT NULL,
    to_address      TEXT NOT NULL,
    subject         TEXT NOT NULL,
    body            TEXT NOT NULL,
    created_at      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS emails_run ON emails (run_id);
CREATE TABLE IF NOT EXISTS tickets (
    ticket_id        TEXT PRIMARY KEY,
    idempotency_key  TEXT NOT NULL UNIQUE,
    run_id           TEXT NOT NULL,
    summary          TEXT NOT NULL,
    email_message_id TEXT NOT NULL,
    created_at       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tickets_run ON tickets (run_id);
"""

# Version 2: the optional request metadata, stored with the effect (JSON, NULL when none).
_ADDED_COLUMNS = (("emails", "metadata", "TEXT"), ("tickets", "metadata", "TEXT"))


def _ensure_schema(conn: sqlite3.Connection) -> None:
    """Whatever of the current schema is missing, added: creates it on an empty file, upgrades a
    version 1 file, and completes one that an older provider stopped in the middle of creating
    or upgrading (it did so outside a transaction)."""
    sqlite.run_script(conn, _SCHEMA)
    for table, column, kind in _ADDED_COLUMNS:
        if column not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


# Bookkeeping for a request with a key. Until an effect is applied, kind and
# run_id follow the latest request (the client may be fixing a bad request);
# once applied they are fixed to the request that applied it.
_COUNT_REQUEST = """
INSERT INTO idempotency_keys (key, seq, kind, run_id, requests, status_code, first_seen, last_seen)
VALUES (:key, (SELECT coalesce(max(seq), 0) + 1 FROM idempotency_keys), :kind, :run_id, 1, :status, :now, :now)
ON CONFLICT (key) DO UPDATE SET
    requests    = requests + 1,
    status_code = excluded.status_code,
    last_seen   = excluded.last_seen,
    kind        = CASE WHEN fingerprint IS NULL THEN excluded.kind ELSE kind END,
    run_id      = CASE WHEN fingerprint IS NULL THEN coalesce(excluded.run_id, run_id) ELSE run_id END
"""

_EFFECTS_APPLIED = """
    (SELECT count(*) FROM emails e WHERE e.idempotency_key = k.key)
  + (SELECT count(*) FROM tickets t WHERE t.idempotency_key = k.key)
"""


def utc_now() -> str:
    """ISO 8601 UTC with milliseconds, e.g. 2025-01-31T12:00:00.123Z."""
    now = datetime.fromtimestamp(time.time(), tz=UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class Outcome:
    """What an effect request came to, before any injected fault rewrites it."""

    status: int  # 200 (applied or replayed) or 409 (key used for another request)
    body: dict[str, Any]
    replayed: bool
    response_lost: bool  # the effect is stored, but this answer is to be "lost"


class Store:
    """The SQLite file behind the provider. Safe to share between threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # Threads of this process queue here rather than in SQLite's busy
        # handler, which sleeps in growing steps; BEGIN IMMEDIATE still does
        # the real exclusion, including against another process.
        self._write_lock = threading.Lock()
        with self._connect(create_parent=True) as conn:
            sqlite.use_wal(conn)
            sqlite.migrate(conn, version=SCHEMA_VERSION, create=_ensure_schema, upgrades={1: _ensure_schema},
                           refuse=self._newer)

    def _newer(self, version: int) -> RuntimeError:
        return RuntimeError(
            f"{self.path} was written by a newer provider (schema {version}, "
            f"this one knows {SCHEMA_VERSION}): use another --db"
        )

    # -- connections -----------------------------------------------------------

    @contextmanager
    def _connect(self, create_parent: bool = False) -> Iterator[sqlite3.Connection]:
        # One connection per operation: no connection is ever shared between
        # threads, and nothing is cached that a crash could leave half-done.
        conn = sqlite.connect(self.path, busy_timeout=30.0, create_parent=create_parent)
        try:
            conn.row_factory = sqlite3.Row
            # FULL: an applied effect and its stored answer are on disk before the answer is sent.
            sqlite.configure(conn, synchronous="FULL")
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._write_lock, self._connect() as conn, sqlite.write_transaction(conn):
            yield conn

    # -- writes ----------------------------------------------------------------

    def count_request(self, *, key: str, kind: str, run_id: str | None, status: int) -> None:
        """Count a request that applied nothing (invalid, or failed by a fault)."""
        with self._write() as conn:
            conn.execute(_COUNT_REQUEST,
                         {"key": key, "kind": kind, "run_id": run_id, "status": status, "now": utc_now()})

    def apply(
        self,
        *,
        key: str,
        kind: str,
        method: str,
        path: str,
        fingerprint: str,
        fields: dict[str, Any],
        lose_response: Callable[[], bool],
    ) -> Outcome:
        """Apply the effect for ``key`` once, or replay / refuse; one transaction.

        ``lose_response`` is asked only when the outcome is a success, so an
        injected "lost response" fault is spent only on a request it affects.
        """
        now = utc_now()
        with self._write() as conn:
            row = conn.execute(
                "SELECT method, path, fingerprint, response_json FROM idempotency_keys WHERE key = ?", (key,)
            ).fetchone()
            if row is not None and row["fingerprint"] is not None:
                if row["fingerprint"] == fingerprint:
                    body = json.loads(row["response_json"])
                    body["replayed"] = True
                    outcome = Outcome(200, body, replayed=True, response_lost=False)
                else:
                    outcome = Outcome(409, _conflict_body(key, row["method"], row["path"], method, path), False, False)
            else:
                body = _insert_effect(conn, key=key, kind=kind, fields=fields, now=now)
                outcome = Outcome(200, body, replayed=False, response_lost=False)
            if outcome.status == 200 and lose_response():
                outcome = replace(outcome, response_lost=True)
            status_sent = 503 if outcome.response_lost else outcome.status
            conn.execute(_COUNT_REQUEST,
                         {"key": key, "kind": kind, "run_id": fields["run_id"], "status": status_sent, "now": now})
            if outcome.status == 200 and not outcome.replayed:
                # Stored with "replayed": false; a replay sets it true on the way out.
                conn.execute(
                    "UPDATE idempotency_keys SET method = ?, path = ?, fingerprint = ?, response_json = ?"
                    " WHERE key = ? AND fingerprint IS NULL",
                    (method, path, fingerprint, json.dumps(outcome.body), key),
                )
            return outcome

    # -- reads -----------------------------------------------------------------

    def effects(self, run_id: str | None = None) -> list[dict[str, Any]]:
        sql = (
            "SELECT key, kind, run_id, requests, " + _EFFECTS_APPLIED + " AS effects_applied,"
            " status_code, first_seen, last_seen FROM idempotency_keys k"
        )
        params: tuple[Any, ...] = ()
        if run_id is not None:
            sql += " WHERE run_id = ?"
            params = (run_id,)
        with self._connect() as conn:
            return [dict(r) for r in conn.execute(sql + " ORDER BY seq", params)]

    def emails(self, run_id: str | None = None) -> list[dict[str, Any]]:
        sql = (
            "SELECT message_id, idempotency_key, run_id, to_address AS \"to\", subject, body, created_at"
            " FROM emails"
        )
        return self._items(sql, run_id)

    def tickets(self, run_id: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT ticket_id, idempotency_key, run_id, summary, email_message_id, created_at FROM tickets"
        return self._items(sql, run_id)

    def inbox(self, run_id: str | None, limit: int, body_chars: int) -> tuple[list[dict[str, Any]], int]:
        """The newest ``limit`` applied emails (of ``run_id``, if given), newest first, and how many
        there are in all. Each row: the email, the start of its body, its key's request count, and
        where it stands among its run's emails (``nth`` of ``run_emails``)."""
        where, params = ("WHERE e.run_id = :run_id", {"run_id": run_id}) if run_id is not None else ("", {})
        sql = (
            "SELECT e.message_id, e.idempotency_key, e.run_id, e.to_address AS \"to\", e.subject,"
            " substr(e.body, 1, :chars) AS body_start, length(e.body) AS body_chars, e.created_at,"
            " k.requests, row_number() OVER (PARTITION BY e.run_id ORDER BY e.rowid) AS nth,"
            " count(*) OVER (PARTITION BY e.run_id) AS run_emails"
            f" FROM emails e JOIN idempotency_keys k ON k.key = e.idempotency_key {where}"
            " ORDER BY e.rowid DESC LIMIT :limit"
        )
        with self._connect() as conn:
            rows = [dict(r) for r in conn.execute(sql, {**params, "chars": body_chars, "limit": limit})]
            total = conn.execute(f"SELECT count(*) FROM emails e {where}", params).fetchone()[0]
        return rows, total

    def lookup(self, key: str) -> dict[str, Any] | None:
        """Everything known under ``key``: bookkeeping, and the applied request and answer."""
        with self._connect() as conn:
            row = conn.execute(
                "SELECT key, kind, run_id, requests, status_code, method, path, response_json, first_seen, last_seen"
                " FROM idempotency_keys WHERE key = ?", (key,),
            ).fetchone()
            if row is None:
                return None
            found: dict[str, Any] = {
                "key": row["key"], "kind": row["kind"], "run_id": row["run_id"], "requests": row["requests"],
                "status_code": row["status_code"], "first_seen": row["first_seen"], "last_seen": row["last_seen"],
                "applied": False,
            }
            if row["response_json"] is None:
                return found
            if row["kind"] == "email":
                effect = conn.execute(
                    "SELECT run_id, to_address, subject, body, metadata, created_at FROM emails "
                    "WHERE idempotency_key = ?",
                    (key,),
                ).fetchone()
                request = {"run_id": effect["run_id"], "to": effect["to_address"], "subject": effect["subject"],
                           "body": effect["body"]}
            else:
                effect = conn.execute(
                    "SELECT run_id, summary, email_message_id, metadata, created_at FROM tickets "
                    "WHERE idempotency_key = ?",
                    (key,),
                ).fetchone()
                request = {"run_id": effect["run_id"], "summary": effect["summary"],
                           "email_message_id": effect["email_message_id"]}
            if effect["metadata"] is not None:
                request["metadata"] = json.loads(effect["metadata"])
            found.update(
                applied=True, endpoint=f"{row['method']} {row['path']}", applied_at=effect["created_at"],
                request=request, response=json.loads(row["response_json"]),
            )
            return found

    def _items(self, sql: str, run_id: str | None) -> list[dict[str, Any]]:
        params: tuple[Any, ...] = ()
        if run_id is not None:
            sql += " WHERE run_id = ?"
            params = (run_id,)
        with self._connect() as conn:
            return [dict(r) for r in conn.execute(sql + " ORDER BY rowid", params)]


def _insert_effect(conn: sqlite3.Connection, *, key: str, kind: str, fields: dict[str, Any],
                   now: str) -> dict[str, Any]:
    metadata = None if fields.get("metadata") is None else json.dumps(fields["metadata"], sort_keys=True)
    if kind == "email":
        message_id = "msg_" + secrets.token_hex(12)
        conn.execute(
            "INSERT INTO emails (message_id, idempotency_key, run_id, to_address, subject, body, metadata, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (message_id, key, fields["run_id"], fields["to"], fields["subject"], fields["body"], metadata, now),
        )
        return {
            "message_id": message_id,
            "run_id": fields["run_id"],
            "to": fields["to"],
            "subject": fields["subject"],
            "idempotency_key": key,
            "created_at": now,
            "replayed": False,
        }
    if kind == "ticket":
        ticket_id = "tkt_" + secrets.token_hex(12)
        conn.execute(
            "INSERT INTO tickets (ticket_id, idempotency_key, run_id, summary, email_message_id, metadata, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ticket_id, key, fields["run_id"], fields["summary"], fields["email_message_id"], metadata, now),
        )
        return {
            "ticket_id": ticket_id,
            "run_id": fields["run_id"],
            "summary": fields["summary"],
            "email_message_id": fields["email_message_id"],
            "idempotency_key": key,
            "created_at": now,
            "replayed": False,
        }
    raise ValueError(f"unknown effect kind {kind!r}")


def _conflict_body(key: str, first_method: str, first_path: str, method: str, path: str) -> dict[str, Any]:
    if (first_method, first_path) != (method, path):
        detail = (
            f"Idempotency-Key {key!r} was already used for {first_method} {first_path}; "
            f"this request is {method} {path}."
        )
    else:
        detail = f"Idempotency-Key {key!r} was already used for {method} {path} with a different body."
    return {
        "error": "idempotency_conflict",
        "message": detail + " A key names one request: resend that request unchanged to get its stored "
        "response, or use a new key for a new request.",
    }
