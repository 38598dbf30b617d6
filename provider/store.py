"""The provider's durable store: the effects (a table per kind: emails,
tickets, refunds; ``provider.kinds``) and the idempotency bookkeeping, in one
SQLite file.

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

Schema versions (``PRAGMA user_version``; ``storage.sqlite.migrate``): 1, the
emails, tickets and bookkeeping; 2, the optional request metadata of each
effect; 3, the kinds of ``provider.kinds`` (a refunds table, and the
bookkeeping's ``CHECK (kind IN (...))`` rebuilt from the table, every row
kept). A new file runs version 1's statements and then every upgrade, the
very statements an old file gets.
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

from provider.kinds import BY_NAME, KINDS, NAMES, EffectKind
from storage import sqlite

SCHEMA_VERSION = 3

# Version 1, as released: never edited (files in the field were made by it, and a new file starts with it).
_SCHEMA_V1 = """
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

# The bookkeeping, as every version from 3 builds it: its CHECK from the kinds' table.
_KEYS_TABLE = """
CREATE TABLE {name} (
    key           TEXT PRIMARY KEY,
    seq           INTEGER NOT NULL,            -- arrival order, for stable listings
    kind          TEXT NOT NULL CHECK (kind IN ({kinds})),
    run_id        TEXT,
    requests      INTEGER NOT NULL,
    status_code   INTEGER,                     -- status of the latest response for this key
    method        TEXT,                        -- set, with the rest, once the effect is applied
    path          TEXT,
    fingerprint   TEXT,
    response_json TEXT,
    first_seen    TEXT NOT NULL,
    last_seen     TEXT NOT NULL
)"""
_KEY_COLUMNS = ("key, seq, kind, run_id, requests, status_code, method, path, fingerprint, response_json, "
                "first_seen, last_seen")


def _v1_to_v2(conn: sqlite3.Connection) -> None:
    """Version 1's schema completed (an older provider created and upgraded it outside a transaction, and may
    have stopped in the middle), then the metadata columns added where missing."""
    sqlite.run_script(conn, _SCHEMA_V1)
    for table, column, kind in _ADDED_COLUMNS:
        if column not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _kinds_schema(conn: sqlite3.Connection) -> None:
    """The schema of ``provider.kinds``' table: each kind's table where it is missing, and the bookkeeping
    rebuilt with the table's ``CHECK`` (SQLite cannot alter a CHECK): a new table, every row copied, the old
    one dropped, the new one renamed, its index made again; inside ``migrate``'s transaction, so a crash
    leaves the file as it was. The upgrade of every version that adds a kind."""
    for kind in KINDS:
        sqlite.run_script(conn, kind.create_table())
    allowed = ", ".join(f"'{name}'" for name in NAMES)
    conn.execute(_KEYS_TABLE.format(name="idempotency_keys_rebuilt", kinds=allowed))
    conn.execute(f"INSERT INTO idempotency_keys_rebuilt ({_KEY_COLUMNS}) "
                 f"SELECT {_KEY_COLUMNS} FROM idempotency_keys")
    conn.execute("DROP TABLE idempotency_keys")
    conn.execute("ALTER TABLE idempotency_keys_rebuilt RENAME TO idempotency_keys")
    conn.execute("CREATE INDEX idempotency_keys_run ON idempotency_keys (run_id, seq)")


# Key = the version a step upgrades *from*. Add a step for each new version; never edit a released one.
_UPGRADES: dict[int, sqlite.Step] = {1: _v1_to_v2, 2: _kinds_schema}


def _create(conn: sqlite3.Connection) -> None:
    """An empty file (or one an older provider stopped creating): version 1's schema, then every upgrade."""
    sqlite.run_script(conn, _SCHEMA_V1)
    for version in sorted(_UPGRADES):
        _UPGRADES[version](conn)


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

# Counted from the effects themselves: every kind's table.
_EFFECTS_APPLIED = "(" + " + ".join(
    f"(SELECT count(*) FROM {kind.table} x WHERE x.idempotency_key = k.key)" for kind in KINDS) + ")"


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
            sqlite.migrate(conn, version=SCHEMA_VERSION, create=_create, upgrades=_UPGRADES, refuse=self._newer)

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

    def items(self, kind: EffectKind, run_id: str | None = None) -> list[dict[str, Any]]:
        """The applied effects of ``kind`` (of ``run_id``, if given), oldest first: the id, the key, the
        request's fields and when."""
        fields = ", ".join(column if column == name else f'{column} AS "{name}"' for name, column, _ in kind.columns)
        return self._items(f"SELECT {kind.id_field}, idempotency_key, {fields}, created_at FROM {kind.table}", run_id)

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
            kind = BY_NAME[row["kind"]]
            columns = ", ".join(column for _, column, _ in kind.columns)
            effect = conn.execute(
                f"SELECT {columns}, metadata, created_at FROM {kind.table} WHERE idempotency_key = ?", (key,),
            ).fetchone()
            request = {name: effect[column] for name, column, _ in kind.columns}
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
    """The effect of ``kind`` applied: its row in the kind's table; the answer the provider stores and sends."""
    effect = BY_NAME.get(kind)
    if effect is None:
        raise ValueError(f"unknown effect kind {kind!r}: provider.kinds lists {', '.join(NAMES)}")
    metadata = None if fields.get("metadata") is None else json.dumps(fields["metadata"], sort_keys=True)
    effect_id = effect.id_prefix + secrets.token_hex(12)
    columns = ", ".join(column for _, column, _ in effect.columns)
    conn.execute(
        f"INSERT INTO {effect.table} ({effect.id_field}, idempotency_key, {columns}, metadata, created_at)"
        f" VALUES (?, ?, {', '.join('?' for _ in effect.columns)}, ?, ?)",
        (effect_id, key, *(fields[name] for name, _, _ in effect.columns), metadata, now),
    )
    return {effect.id_field: effect_id, **{name: fields[name] for name in effect.answer}, "idempotency_key": key,
            "created_at": now, "replayed": False}


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
