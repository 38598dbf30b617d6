"""The provider's durable store: the effects (a table per kind: emails,
tickets, refunds; ``provider.kinds``), the idempotency bookkeeping, and the
orders the lab seeds (with every lookup of one counted), in one SQLite file.

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

Refunds are capped by their order (``apply``): a refund is applied only if
its order is kept here and its amount, with every refund of that order already
applied, stays within the order's total. The check and the insert are in the
same transaction as the key's lookup, so two refunds of one order that each
fit alone cannot both pass; and the key comes first, so a replay answers its
stored receipt even once the order is fully refunded. A refused refund is
treated as a request that fails validation: counted under its key, nothing
stored, the key free to carry a request that passes.

Schema versions (``PRAGMA user_version``; ``durable_agents.storage.sqlite.migrate``): 1, the
emails, tickets and bookkeeping; 2, the optional request metadata of each
effect; 3, the kinds of ``provider.kinds`` (a refunds table, and the
bookkeeping's ``CHECK (kind IN (...))`` rebuilt from the table, every row
kept); 4, the orders and their lookups (new tables only: every row kept). A
new file runs version 1's statements and then every upgrade, the very
statements an old file gets.
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

from durable_agents.storage import sqlite
from provider.kinds import BY_NAME, KINDS, NAMES, EffectKind

SCHEMA_VERSION = 4

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


# Version 4: the orders the lab seeds (POST /v1/orders), every lookup of one (GET /v1/orders/<id>, counted
# per request, found or not), and the index the refund cap sums an order's refunds by.
_SCHEMA_V4_ORDERS = """
CREATE TABLE IF NOT EXISTS orders (
    order_id   TEXT PRIMARY KEY,
    total      INTEGER NOT NULL CHECK (total > 0),   -- in the currency's minor units (cents)
    currency   TEXT NOT NULL DEFAULT 'EUR',
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS order_lookups (
    order_id TEXT NOT NULL,                          -- as asked for: an order the provider may not keep
    run_id   TEXT,                                   -- NULL when the lookup named no run
    at       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS order_lookups_order ON order_lookups (order_id);
CREATE INDEX IF NOT EXISTS order_lookups_run ON order_lookups (run_id, order_id);
CREATE INDEX IF NOT EXISTS refunds_order ON refunds (order_id);
"""


def _orders_schema(conn: sqlite3.Connection) -> None:
    """Version 4's tables and indexes, added beside the others: no existing row is touched."""
    sqlite.run_script(conn, _SCHEMA_V4_ORDERS)


# Key = the version a step upgrades *from*. Add a step for each new version; never edit a released one.
_UPGRADES: dict[int, sqlite.Step] = {1: _v1_to_v2, 2: _kinds_schema, 3: _orders_schema}


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

    status: int  # 200 (applied or replayed), 409 (key used for another request), 404/422 (refused: the refund cap)
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
            # The key first: a replay answers its stored receipt whatever has happened since (an order
            # refunded in full meanwhile included); only a request new to its key meets the refund cap.
            if row is not None and row["fingerprint"] is not None:
                if row["fingerprint"] == fingerprint:
                    body = json.loads(row["response_json"])
                    body["replayed"] = True
                    outcome = Outcome(200, body, replayed=True, response_lost=False)
                else:
                    outcome = Outcome(409, _conflict_body(key, row["method"], row["path"], method, path), False, False)
            else:
                refused = _refund_refusal(conn, fields) if kind == "refund" else None
                if refused is not None:
                    outcome = Outcome(refused[0], refused[1], replayed=False, response_lost=False)
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

    def seed_order(self, *, order_id: str, total: int, currency: str) -> tuple[int, dict[str, Any]]:
        """Keep an order (``POST /v1/orders``): 201 and the order when it is new, 200 when the same order was
        seeded before (``"replayed": true``), 409 ``order_conflict`` when the id holds another total or
        currency (the order is left as it was)."""
        with self._write() as conn:
            row = conn.execute("SELECT order_id, total, currency, created_at FROM orders WHERE order_id = ?",
                               (order_id,)).fetchone()
            if row is None:
                now = utc_now()
                conn.execute("INSERT INTO orders (order_id, total, currency, created_at) VALUES (?, ?, ?, ?)",
                             (order_id, total, currency, now))
                return 201, {"order_id": order_id, "total": total, "currency": currency, "created_at": now,
                             "replayed": False}
            if (row["total"], row["currency"]) == (total, currency):
                return 200, {**dict(row), "replayed": True}
            return 409, {"error": "order_conflict", "field": "total" if row["total"] != total else "currency",
                         "message": f"order {order_id!r} is already kept with a total of {_cents(row['total'])} "
                         f"{row['currency']}; this request seeds {_cents(total)} {currency}. An order's id names "
                         "one order: seed it again unchanged, or seed another order under a new id."}

    def lookup_order(self, order_id: str, run_id: str | None) -> dict[str, Any] | None:
        """The order (``GET /v1/orders/<id>``), None if it is not kept; the lookup counted either way, in the same
        transaction, so ``lookups`` includes this one and two lookups never report the same count."""
        with self._write() as conn:
            conn.execute("INSERT INTO order_lookups (order_id, run_id, at) VALUES (?, ?, ?)",
                         (order_id, run_id, utc_now()))
            row = conn.execute("SELECT order_id, total, currency FROM orders WHERE order_id = ?",
                               (order_id,)).fetchone()
            if row is None:
                return None
            lookups = conn.execute("SELECT count(*) FROM order_lookups WHERE order_id = ?", (order_id,)).fetchone()[0]
            return {"order_id": row["order_id"], "total": row["total"], "refunded": _refunded(conn, order_id),
                    "currency": row["currency"], "lookups": lookups}

    # -- reads -----------------------------------------------------------------

    def lookups(self, run_id: str | None = None) -> dict[str, Any]:
        """The order lookups of ``run_id`` (every one when None; lookups that named no run count only
        there): ``{"run_id", "lookups", "by_order": {order_id: n}}``."""
        where, params = ("WHERE run_id = ?", (run_id,)) if run_id is not None else ("", ())
        with self._connect() as conn:
            by_order = {r[0]: r[1] for r in conn.execute(
                f"SELECT order_id, count(*) FROM order_lookups {where} GROUP BY order_id ORDER BY order_id", params)}
        return {"run_id": run_id, "lookups": sum(by_order.values()), "by_order": by_order}

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


def _refunded(conn: sqlite3.Connection, order_id: str) -> int:
    """Cents refunded of ``order_id``: every applied refund of it (the refunds table holds only applied ones)."""
    return int(conn.execute("SELECT coalesce(sum(amount), 0) FROM refunds WHERE order_id = ?",
                            (order_id,)).fetchone()[0])


def _refund_refusal(conn: sqlite3.Connection, fields: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """Why this refund may not be applied, as (status, error body); None when it may. Read inside ``apply``'s
    write transaction, so the sum it checks is the sum the insert will add to."""
    order_id, amount = fields["order_id"], fields["amount"]
    order = conn.execute("SELECT total, currency FROM orders WHERE order_id = ?", (order_id,)).fetchone()
    if order is None:
        return 404, {"error": "order_not_found", "field": "order_id",
                     "message": f"no order {order_id!r}: the provider refunds only the orders it keeps (seeded with "
                     "POST /v1/orders; GET /v1/orders/<order_id> shows one). Nothing was applied: refund an order "
                     "it keeps, or seed this one first."}
    total, currency = order["total"], order["currency"]
    refunded = _refunded(conn, order_id)
    left = total - refunded
    if amount <= left:
        return None
    advice = f"refund at most {_cents(left)}" if left else "nothing is left to refund: the order is fully refunded"
    return 422, {"error": "refund_exceeds_total", "field": "amount",
                 "message": f"a refund of {_cents(amount)} would take order {order_id!r} past its total: the total "
                 f"is {_cents(total)} {currency}, {refunded} already refunded, {left} left. Nothing was applied; "
                 f"{advice}."}


def _cents(n: int) -> str:
    return f"{n} cent" if n == 1 else f"{n} cents"


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
