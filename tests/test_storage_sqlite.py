"""The SQLite helper's own contract (durable_agents/storage/sqlite.py), apart from any store:
the settings a connection gets, the schema runner's order and refusals, and a
write transaction's commit, rollback and give-up. The stores' behaviour on top
of it is tested with each store."""

from __future__ import annotations

import sqlite3

import pytest

from durable_agents.storage import sqlite


class Refused(Exception):
    pass


def steps_log(log: list[str]):
    def create(conn: sqlite3.Connection) -> None:
        log.append("create")
        conn.execute("CREATE TABLE t (a)")

    def up(n: int):
        def step(conn: sqlite3.Connection) -> None:
            log.append(f"{n}->{n + 1}")
            conn.execute(f"ALTER TABLE t ADD COLUMN c{n + 1}")
        return step

    return create, {1: up(1), 2: up(2)}


def open_db(path, timeout: float = 5.0) -> sqlite3.Connection:
    conn = sqlite.connect(path, busy_timeout=timeout)
    sqlite.use_wal(conn)
    return conn


def test_connect_creates_the_directory_and_sets_the_wait_and_the_settings(tmp_path):
    path = tmp_path / "new" / "dir" / "x.db"
    conn = sqlite.connect(path, busy_timeout=2.5)
    assert sqlite.use_wal(conn) == "wal"
    sqlite.configure(conn, synchronous="full", foreign_keys=True)
    assert conn.isolation_level is None  # autocommit: only explicit transactions
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    with pytest.raises(ValueError, match="synchronous must be OFF, NORMAL, FULL or EXTRA"):
        sqlite.configure(conn, synchronous="FULL; DROP TABLE t")


def test_an_empty_file_is_created_and_an_old_one_upgraded_step_by_step(tmp_path):
    log: list[str] = []
    create, upgrades = steps_log(log)
    conn = open_db(tmp_path / "x.db")
    assert sqlite.migrate(conn, version=3, create=create, upgrades=upgrades, refuse=Refused) == 0
    assert (log, sqlite.user_version(conn)) == (["create"], 3)
    conn.execute("DROP TABLE t")
    conn.execute("CREATE TABLE t (a)")
    conn.execute("PRAGMA user_version=1")
    log.clear()
    assert sqlite.migrate(conn, version=3, create=create, upgrades=upgrades, refuse=Refused) == 1
    assert log == ["1->2", "2->3"]
    assert [r[1] for r in conn.execute("PRAGMA table_info(t)")] == ["a", "c2", "c3"]


def test_a_current_file_is_not_locked_and_an_unknown_one_is_refused_untouched(tmp_path):
    log: list[str] = []
    create, upgrades = steps_log(log)
    path = tmp_path / "x.db"
    sqlite.migrate(open_db(path), version=3, create=create, upgrades=upgrades, refuse=Refused)
    writer = open_db(path)
    with sqlite.write_transaction(writer):  # another connection holds the write lock
        assert sqlite.migrate(open_db(path, 0.05), version=3, create=create, upgrades=upgrades, refuse=Refused) == 3
    for found in (4, -1):
        writer.execute(f"PRAGMA user_version={found}")
        with pytest.raises(Refused, match=str(found)):
            sqlite.migrate(open_db(path), version=3, create=create, upgrades=upgrades, refuse=Refused)
        assert sqlite.user_version(writer) == found


def test_a_failing_step_leaves_the_old_schema(tmp_path):
    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE t ADD COLUMN c2")
        raise RuntimeError("step 2 failed")

    conn = open_db(tmp_path / "x.db")
    conn.execute("CREATE TABLE t (a)")
    conn.execute("PRAGMA user_version=1")
    with pytest.raises(RuntimeError, match="step 2 failed"):
        sqlite.migrate(conn, version=2, create=lambda c: None, upgrades={1: broken}, refuse=Refused)
    assert sqlite.user_version(conn) == 1
    assert [r[1] for r in conn.execute("PRAGMA table_info(t)")] == ["a"]
    with pytest.raises(ValueError, match="versions 1..2"):
        sqlite.migrate(conn, version=3, create=lambda c: None, upgrades={1: broken}, refuse=Refused)


def test_a_write_commits_or_rolls_back_as_a_whole(tmp_path):
    conn = open_db(tmp_path / "x.db")
    conn.execute("CREATE TABLE t (a)")
    with sqlite.write_transaction(conn) as c:
        c.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(KeyError), sqlite.write_transaction(conn):
        conn.execute("INSERT INTO t VALUES (2)")
        raise KeyError("no")
    # SQLite already rolled back: the helper's ROLLBACK fails, and the body's error still comes out.
    with pytest.raises(KeyError), sqlite.write_transaction(conn):
        conn.execute("ROLLBACK")
        raise KeyError("no")
    assert [r[0] for r in conn.execute("SELECT a FROM t")] == [1]
    assert not conn.in_transaction


def test_a_lock_held_past_the_busy_timeout_gives_the_stores_own_error(tmp_path):
    path = tmp_path / "x.db"
    holder, waiter = open_db(path), open_db(path, 0.05)
    with sqlite.write_transaction(holder):
        with pytest.raises(sqlite3.OperationalError, match="locked"), sqlite.write_transaction(waiter):
            pass
        with pytest.raises(Refused, match="cannot write: database is locked") as caught, \
                sqlite.write_transaction(waiter, lambda exc: Refused(f"cannot write: {exc}")):
            pass
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    with pytest.raises(Refused, match="no such table"), \
            sqlite.write_transaction(waiter, lambda exc: Refused(str(exc))):
        waiter.execute("INSERT INTO nowhere VALUES (1)")
    assert not waiter.in_transaction
