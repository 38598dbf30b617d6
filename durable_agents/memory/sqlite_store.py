"""The SQLite store: the same rule as the in-memory store, bounded on disk.

Layout (schema version 2, in ``PRAGMA user_version``; a version 1 file is
upgraded in place when a store opens it):

- ``messages``: the window, one row per stored message, with ``appended_at``
  (Unix seconds, this process's clock; NULL for rows written before version 2)
  for the ``as_of`` cut-off. Evicted rows are DELETEd in the transaction that
  evicts them, so a conversation never holds more than ``max_messages`` rows.
- ``evicted_ids``: the ids (and content digests) of the last
  ``remember_evicted`` evicted messages per conversation, so that a retried
  append of an evicted message is still recognised as a duplicate. Trimmed in
  the same transaction.
- ``conversations``: one row per conversation: a version number, the counters
  behind ``stats()``, and the little state needed to resume (next sequence
  number, current exchange number, calls of an evicted unfinished round).

Every append is exactly one transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``):
the insert, the deletes of whatever it evicts, the ledger and the counters.
A crash leaves either all of it or none of it. The database runs in WAL mode
with ``synchronous=FULL`` by default: every commit fsyncs the WAL, so a
committed append survives a power cut as well as a process crash (two fsyncs
per exchange of two messages: docs/benchmarks.md). At ``NORMAL`` the WAL
is synced only at checkpoints, and a power cut may lose the last appends
(docs/powercut.md shows it), which an idempotent retry re-appends when there is
one.

The store keeps a copy of recently used conversations in process and trusts it
only while the version in the database matches, so several processes (workers)
may share one file: a writer that finds the version moved reloads first.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from durable_agents.memory.errors import MemoryStoreError
from durable_agents.memory.messages import Message, ToolCall, stable_digest
from durable_agents.memory.policy import MemoryPolicy
from durable_agents.memory.stores import EvictionHook, StoreBase, check_conversation_id, check_message
from durable_agents.memory.window import COUNTER_FIELDS, AppendResult, Conversation, MemoryStats, Outcome
from durable_agents.storage import sqlite

__all__ = ["SCHEMA_VERSION", "SQLiteStore", "load_conversation"]

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    next_seq INTEGER NOT NULL,
    exchange INTEGER NOT NULL,
    orphaned_calls TEXT NOT NULL,
    ledger_n INTEGER NOT NULL,
    appended INTEGER NOT NULL,
    duplicates INTEGER NOT NULL,
    conflicts INTEGER NOT NULL,
    truncated INTEGER NOT NULL,
    evicted_messages INTEGER NOT NULL,
    evicted_tokens INTEGER NOT NULL,
    evictions INTEGER NOT NULL,
    abandoned_messages INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    tool_calls TEXT NOT NULL,
    tool_call_id TEXT,
    pinned INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    digest TEXT NOT NULL,
    exchange INTEGER NOT NULL,
    block INTEGER NOT NULL,
    appended_at REAL,
    PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS messages_by_id ON messages (conversation_id, message_id);
CREATE TABLE IF NOT EXISTS evicted_ids (
    conversation_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    digest TEXT NOT NULL,
    PRIMARY KEY (conversation_id, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS evicted_ids_by_n ON evicted_ids (conversation_id, n);
"""


def _create(conn: sqlite3.Connection) -> None:
    """An empty file gets the current schema directly."""
    sqlite.run_script(conn, _SCHEMA)


def _add_appended_at(conn: sqlite3.Connection) -> None:
    """Version 1 to 2: ``messages.appended_at``, for ``as_of``; the rows already there keep NULL."""
    conn.execute("ALTER TABLE messages ADD COLUMN appended_at REAL")


_UPGRADES = {1: _add_appended_at}

_CONV_COLUMNS = ("version", "next_seq", "exchange", "orphaned_calls", "ledger_n", *COUNTER_FIELDS)
_SELECT_CONV = f"SELECT {', '.join(_CONV_COLUMNS)} FROM conversations WHERE conversation_id = ?"
_SAVE_CONV = (
    f"INSERT OR REPLACE INTO conversations (conversation_id, {', '.join(_CONV_COLUMNS)}) "
    f"VALUES ({', '.join('?' * (len(_CONV_COLUMNS) + 1))})"
)
_SELECT_ROWS = (
    "SELECT seq, message_id, role, content, tool_calls, tool_call_id, pinned, tokens, digest, exchange, block "
    "FROM messages WHERE conversation_id = ? ORDER BY seq"
)
_INSERT_ROW = (
    "INSERT INTO messages (conversation_id, seq, message_id, role, content, tool_calls, tool_call_id, "
    "pinned, tokens, digest, exchange, block, appended_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_APPENDED_AFTER = "SELECT message_id FROM messages WHERE conversation_id = ? AND appended_at > ?"


def appended_after(conn: sqlite3.Connection, conversation_id: str, as_of: float | None) -> set[str]:
    """Ids of the conversation's stored messages appended after ``as_of`` (none if None).

    A file still at schema version 1 has no times: nothing is hidden."""
    if as_of is None:
        return set()
    try:
        return {r[0] for r in conn.execute(_APPENDED_AFTER, (conversation_id, float(as_of)))}
    except sqlite3.OperationalError as exc:
        if "appended_at" in str(exc):
            return set()
        raise
_DELETE_ROW = "DELETE FROM messages WHERE conversation_id = ? AND seq = ?"
_LEDGER_GET = "SELECT digest FROM evicted_ids WHERE conversation_id = ? AND message_id = ?"
_LEDGER_PUT = "INSERT OR REPLACE INTO evicted_ids (conversation_id, message_id, n, digest) VALUES (?, ?, ?, ?)"
_LEDGER_TRIM = "DELETE FROM evicted_ids WHERE conversation_id = ? AND n <= ?"

_CACHE_SIZE = 64


def _encode_calls(message: Message) -> str:
    if not message.tool_calls:
        return ""
    return json.dumps([[c.id, c.name, c.arguments] for c in message.tool_calls], ensure_ascii=False)


def _decode_row(row: tuple) -> tuple[int, Message, int, str, int, int]:
    seq, message_id, role, content, calls, tool_call_id, pinned, tokens, digest, exchange, block = row
    tool_calls = tuple(ToolCall(i, n, a) for i, n, a in json.loads(calls)) if calls else ()
    message = Message(message_id, role, content, tool_calls, tool_call_id, bool(pinned))
    return seq, message, tokens, digest, exchange, block


def load_conversation(conn: sqlite3.Connection, conversation_id: str, policy: MemoryPolicy) -> Conversation:
    """Read one conversation's state; the caller holds a transaction for a consistent snapshot."""
    head = conn.execute(_SELECT_CONV, (conversation_id,)).fetchone()
    rows = [_decode_row(r) for r in conn.execute(_SELECT_ROWS, (conversation_id,))]
    if head is None:
        conv = Conversation.restore(conversation_id, policy, rows)
        return conv
    version, next_seq, exchange, orphaned, ledger_n, *counters = head
    conv = Conversation.restore(
        conversation_id,
        policy,
        rows,
        next_seq=next_seq,
        exchange_number=exchange,
        orphaned_calls=json.loads(orphaned),
        counters=counters,
    )
    conv.version = version
    conv.ledger_n = ledger_n
    return conv


class SQLiteStore(StoreBase):
    """Conversation memory in a SQLite file, shared safely by several processes.

    ``path`` may be ``":memory:"`` (tests). The parent directory is created if
    missing. ``synchronous``: FULL keeps every committed append through a power
    cut; NORMAL may lose the last ones (see the module docstring). Raises
    :class:`durable_agents.memory.MemoryStoreError` when the file cannot be opened as a store
    (not a SQLite database, newer schema, unwritable).
    ``transactions`` counts the write transactions committed by this object.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        policy: MemoryPolicy | None = None,
        *,
        on_evict: EvictionHook | None = None,
        synchronous: str = "FULL",
        busy_timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(policy, on_evict)
        self._clock = clock
        synchronous = sqlite.check_synchronous(synchronous)
        self.path = os.fspath(path)
        self.transactions = 0
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Conversation] = OrderedDict()
        self._conn: sqlite3.Connection | None = None
        try:
            conn = sqlite.connect(self.path, busy_timeout=busy_timeout, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise MemoryStoreError(f"cannot open conversation memory at {self.path}: {exc}") from exc
        try:
            sqlite.use_wal(conn)
            sqlite.configure(conn, synchronous=synchronous)
            sqlite.migrate(conn, version=SCHEMA_VERSION, create=_create, upgrades=_UPGRADES, refuse=self._unknown)
        except sqlite3.Error as exc:
            conn.close()
            raise MemoryStoreError(
                f"cannot use {self.path} as conversation memory ({exc}). If the file is damaged, move it "
                "aside or delete it: memory will start empty."
            ) from exc
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _unknown(self, version: int) -> MemoryStoreError:
        return MemoryStoreError(
            f"{self.path} holds conversation memory schema {version}; this code reads "
            f"schema {SCHEMA_VERSION}. Use a matching version or a new file."
        )

    # ---- plumbing --------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise MemoryStoreError(f"the SQLiteStore for {self.path} is closed")
        return self._conn

    def _load(self, conn: sqlite3.Connection, conversation_id: str) -> Conversation:
        """The conversation as committed; the cached copy when its version is current."""
        row = conn.execute("SELECT version FROM conversations WHERE conversation_id = ?", (conversation_id,)).fetchone()
        cache = self._cache
        cached = cache.get(conversation_id)
        if row is None:
            conv = Conversation(conversation_id, self.policy)
        elif cached is not None and cached.version == row[0]:
            cache.move_to_end(conversation_id)
            return cached
        else:
            conv = load_conversation(conn, conversation_id, self.policy)
        cache[conversation_id] = conv
        if len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
        return conv

    def _save(self, conn: sqlite3.Connection, conv: Conversation) -> None:
        conv.version += 1
        conn.execute(
            _SAVE_CONV,
            (
                conv.conversation_id,
                conv.version,
                conv.next_seq,
                conv.exchange_number,
                json.dumps(sorted(conv.orphaned_calls)),
                conv.ledger_n,
                *conv.counters(),
            ),
        )

    def _write(self, conversation_id: str, work) -> Any:
        """Run ``work(conn, conv)`` inside one write transaction."""
        check_conversation_id(conversation_id)
        with self._lock:
            conn = self._connection()
            try:
                with sqlite.write_transaction(conn, self._write_error):
                    conv = self._load(conn, conversation_id)
                    result = work(conn, conv)
            except BaseException:
                # The cached copy may hold changes that were rolled back.
                self._cache.pop(conversation_id, None)
                raise
            self.transactions += 1
            return result

    def _write_error(self, exc: sqlite3.Error) -> MemoryStoreError:
        return MemoryStoreError(f"cannot write conversation memory at {self.path}: {exc}")

    def _read(self, conversation_id: str) -> Conversation:
        check_conversation_id(conversation_id)
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN")
                try:
                    return self._load(conn, conversation_id)
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._cache.pop(conversation_id, None)
                raise MemoryStoreError(f"cannot read conversation memory at {self.path}: {exc}") from exc

    # ---- the Store interface ------------------------------------------------------

    def append(self, conversation_id: str, message: Message) -> AppendResult:
        """Store ``message`` (pinned if ``message.pinned``) and evict down to the bounds, in one transaction."""
        check_message(message)
        digest = stable_digest(message)

        def work(conn: sqlite3.Connection, conv: Conversation):
            stored = conv.index.get(message.id)
            if stored is None and self.policy.remember_evicted:
                row = conn.execute(_LEDGER_GET, (conv.conversation_id, message.id)).fetchone()
                old = row[0] if row is not None else None
            else:
                old = stored.digest if stored is not None else None
            if old is not None:
                result = self._duplicate(conv, message, old, digest)
                self._save(conn, conv)
                return result
            outcome = conv.pin(message, digest) if message.pinned else conv.append(message, digest)
            self._persist(conn, conv, outcome)
            self._save(conn, conv)
            return outcome

        done = self._write(conversation_id, work)
        if isinstance(done, AppendResult):
            return done
        return self._finish(conversation_id, done)

    def _persist(self, conn: sqlite3.Connection, conv: Conversation, outcome: Outcome) -> None:
        cid = conv.conversation_id
        entry = outcome.entry
        if entry is not None:
            m = entry.message
            block = entry.block
            conn.execute(
                _INSERT_ROW,
                (
                    cid,
                    entry.seq,
                    m.id,
                    m.role,
                    m.content,
                    _encode_calls(m),
                    m.tool_call_id,
                    int(m.pinned),
                    entry.tokens,
                    entry.digest,
                    block.exchange if block is not None else 0,
                    block.first_seq if block is not None else 0,
                    self._clock(),
                ),
            )
        removed = [*outcome.abandoned, *outcome.evicted]
        if removed:
            conn.executemany(_DELETE_ROW, [(cid, e.seq) for e in removed])
        if outcome.dropped is not None:
            removed.append(outcome.dropped)
        keep = self.policy.remember_evicted
        if removed and keep:
            first = conv.ledger_n + 1
            conv.ledger_n += len(removed)
            conn.executemany(
                _LEDGER_PUT,
                [(cid, e.message.id, first + i, e.digest) for i, e in enumerate(removed)],
            )
            if conv.ledger_n > keep:
                conn.execute(_LEDGER_TRIM, (cid, conv.ledger_n - keep))

    def pin(self, conversation_id: str, message: Message) -> AppendResult:
        """Store ``message`` as pinned: never evicted, shown first, counted against the budget."""
        check_message(message)
        return self.append(conversation_id, message if message.pinned else replace(message, pinned=True))

    def unpin(self, conversation_id: str, message_id: str) -> bool:
        """Remove a pinned message (e.g. replaced instructions). False if it was not pinned."""

        def work(conn: sqlite3.Connection, conv: Conversation) -> bool:
            entry = conv.unpin(message_id)
            if entry is None:
                return False
            conn.execute(_DELETE_ROW, (conv.conversation_id, entry.seq))
            self._save(conn, conv)
            return True

        return self._write(conversation_id, work)

    def window(self, conversation_id: str, *, include_pinned: bool = True, as_of: float | None = None) -> list[Message]:
        """Pinned messages first, then the rest in order; never an unanswered tool call.

        ``as_of`` (Unix seconds): leave out what was appended later, by whole
        blocks (see ``Conversation.window``)."""
        conv = self._read(conversation_id)
        if as_of is None:
            return conv.window(include_pinned)
        with self._lock:
            hide = appended_after(self._connection(), conversation_id, as_of)
        return conv.window(include_pinned, hide)

    def stats(self, conversation_id: str) -> MemoryStats:
        return self._read(conversation_id).stats()

    def clear(self, conversation_id: str) -> None:
        """Forget the conversation: its rows, remembered ids and counters are deleted."""

        def work(conn: sqlite3.Connection, conv: Conversation) -> None:
            conn.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            conn.execute("DELETE FROM evicted_ids WHERE conversation_id = ?", (conversation_id,))
            fresh = Conversation(conversation_id, self.policy)
            # Keep the version moving forward so no other process mistakes its cache for current.
            fresh.version = conv.version
            self._save(conn, fresh)
            self._cache[conversation_id] = fresh

        self._write(conversation_id, work)

    def conversations(self) -> list[str]:
        with self._lock:
            conn = self._connection()
            try:
                return [r[0] for r in conn.execute(
                    "SELECT conversation_id FROM conversations ORDER BY conversation_id"
                )]
            except sqlite3.Error as exc:
                raise MemoryStoreError(f"cannot read conversation memory at {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._cache.clear()
