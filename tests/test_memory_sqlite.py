"""What only the SQLite store promises: persistence across processes, bounded
rows on disk, one transaction per append, WAL, several writers on one file,
and a reader that degrades to an empty context instead of failing."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from durable_agents.memory import (
    InMemoryStore,
    MemoryPolicy,
    MemoryStoreError,
    Message,
    SQLiteStore,
    ToolCall,
    UnknownToolCallError,
    append_or_warn,
    read_window,
)

ROOT = Path(__file__).resolve().parents[1]
CID = "c1"


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (a separate process, as a restarted worker would be)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"subprocess failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.process
def test_window_survives_a_process_restart(tmp_path):
    db = tmp_path / "state" / "memory.db"  # the directory does not exist yet: the writer creates it
    run_python(
        f"""
        from durable_agents.memory import *
        store = SQLiteStore({str(db)!r}, MemoryPolicy(max_messages=5))
        store.pin("c1", Message("sys", "system", "be brief"))
        for i in range(4):
            store.append("c1", Message(f"u{{i}}", "user", f"question {{i}}"))
        store.append("c1", Message("a", "assistant", "", (ToolCall("k1", "lookup", '{{"id": 1}}'),)))
        store.append("c1", Message("t", "tool", "found", tool_call_id="k1"))
        store.append("c1", Message("b", "assistant", "", (ToolCall("k2", "lookup", "{{}}"),)))  # unfinished
        store.close()
        """
    )
    done = run_python(
        f"""
        from durable_agents.memory import *
        print([m.id for m in read_window({str(db)!r}, "c1")])
        store = SQLiteStore({str(db)!r}, MemoryPolicy(max_messages=5))
        print(store.append("c1", Message("t2", "tool", "more", tool_call_id="k2")).added)  # the round resumes
        print(store.append("c1", Message("u3", "user", "question 3")).duplicate)
        print([m.id for m in store.window("c1")])
        """
    )
    lines = done.stdout.splitlines()
    # The writer's window was [sys, u3, a, t] (+ the unfinished round, hidden).
    assert lines[0] == "['sys', 'u3', 'a', 't']"
    assert lines[1] == "True"
    assert lines[2] == "True"
    # Six stored > 5: inside the newest exchange the older round goes, its user turn stays.
    assert lines[3] == "['sys', 'u3', 'b', 't2']"


def test_rows_on_disk_stay_bounded(tmp_path):
    db = tmp_path / "memory.db"
    policy = MemoryPolicy(max_tokens=500, max_messages=12, remember_evicted=50)
    with SQLiteStore(db, policy) as store:
        for i in range(3000):
            store.append(CID, Message(f"u{i}", "user", "x" * (i % 300)))
            if i % 3 == 0:
                store.append(CID, Message(f"a{i}", "assistant", "", (ToolCall(f"k{i}", "f", "{}"),)))
                store.append(CID, Message(f"t{i}", "tool", "ok", tool_call_id=f"k{i}"))
        stats = store.stats(CID)
    conn = sqlite3.connect(db)
    try:
        messages = conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        remembered = conn.execute("SELECT COUNT(*) FROM evicted_ids").fetchone()[0]
        tokens = conn.execute("SELECT SUM(tokens) FROM messages").fetchone()[0]
    finally:
        conn.close()
    assert stats.evicted_messages > 3000
    assert messages == stats.messages <= 12
    assert tokens == stats.tokens <= 500
    assert remembered == 50


def test_each_append_is_one_transaction_in_wal_mode(tmp_path):
    db = tmp_path / "memory.db"
    store = SQLiteStore(db, MemoryPolicy(max_tokens=300, max_messages=6))
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)  # the connection's own statement trace
    try:
        n = 200
        for i in range(n):
            store.append(CID, Message(f"u{i}", "user", "hello " * (i % 20)))
        store.append(CID, Message("u5", "user", "again"))  # a duplicate is one transaction too
        assert store.transactions == n + 1
    finally:
        store._conn.set_trace_callback(None)
        store.close()
    begins = [s for s in statements if s.startswith("BEGIN")]
    commits = [s for s in statements if s == "COMMIT"]
    assert len(begins) == len(commits) == n + 1
    assert not any(s.startswith("SAVEPOINT") or s == "ROLLBACK" for s in statements)
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_two_writers_on_one_file_see_each_other(tmp_path):
    db = tmp_path / "memory.db"
    policy = MemoryPolicy(max_tokens=10_000, max_messages=6)
    one, two = SQLiteStore(db, policy), SQLiteStore(db, policy)
    twin = InMemoryStore(policy)
    try:
        for i in range(40):
            writer = one if i % 3 else two
            m = Message(f"u{i}", "user", f"turn {i}")
            assert writer.append(CID, m) == twin.append(CID, m)
            assert one.window(CID) == two.window(CID) == twin.window(CID)
        assert two.append(CID, Message("u39", "user", "turn 39")).duplicate
        assert one.stats(CID) == two.stats(CID)
    finally:
        one.close()
        two.close()


def test_a_rejected_append_changes_nothing_on_disk(tmp_path):
    db = tmp_path / "memory.db"
    with SQLiteStore(db) as store:
        store.append(CID, Message("u1", "user", "hi"))
        with pytest.raises(UnknownToolCallError):
            store.append(CID, Message("t", "tool", "x", tool_call_id="nobody"))
        assert [m.id for m in store.window(CID)] == ["u1"]
    assert [m.id for m in read_window(db, CID)] == ["u1"]
    with SQLiteStore(db) as store:
        assert store.stats(CID).appended == 1


# ---- degraded stores: empty context and a warning, never an exception ------------------------


def test_corrupt_file_gives_empty_context_and_a_warning(tmp_path, caplog):
    db = tmp_path / "memory.db"
    db.write_bytes(os.urandom(4096))
    with caplog.at_level(logging.WARNING, logger="memory"):
        assert read_window(db, CID) == []
    assert "conversation memory unavailable" in caplog.text
    with pytest.raises(MemoryStoreError, match="move it aside or delete it"):
        SQLiteStore(db)


def test_missing_directory_gives_empty_context_and_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="memory"):
        assert read_window(tmp_path / "no" / "such" / "dir" / "memory.db", CID) == []
    assert "no conversation memory file" in caplog.text
    assert not (tmp_path / "no").exists()  # the reader created nothing


def test_another_programs_database_gives_empty_context(tmp_path, caplog):
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with caplog.at_level(logging.WARNING, logger="memory"):
        assert read_window(db, CID) == []
    assert "no such table" in caplog.text


def test_a_store_that_breaks_after_opening_degrades_too(tmp_path, caplog):
    db = tmp_path / "memory.db"
    store = SQLiteStore(db)
    store.append(CID, Message("u1", "user", "hi"))
    store.close()
    with caplog.at_level(logging.WARNING, logger="memory"):
        assert read_window(store, CID) == []  # a closed store raises MemoryStoreError
        assert append_or_warn(store, CID, Message("u2", "user", "hi")) is None
    assert caplog.text.count("conversation memory unavailable") == 2
    assert [m.id for m in read_window(db, CID)] == ["u1"]


def test_unknown_conversation_reads_as_empty_without_warning(tmp_path, caplog):
    db = tmp_path / "memory.db"
    SQLiteStore(db).close()
    with caplog.at_level(logging.WARNING, logger="memory"):
        assert read_window(db, "never-written") == []
    assert caplog.text == ""


def test_newer_schema_is_refused_with_advice(tmp_path):
    db = tmp_path / "memory.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(MemoryStoreError, match="schema 99"):
        SQLiteStore(db)
