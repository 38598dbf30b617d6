"""Open, migrate and write a SQLite store: the conventions every store here follows.

Connections
===========

``connect`` gives an *autocommit* connection (``isolation_level=None``): the
stores write only inside the transactions they open themselves, never in one
the ``sqlite3`` module opens behind their back. ``use_wal`` puts the file in
WAL mode, so readers never block the writer; the mode is a property of the
file, set once when a store opens it. ``configure`` sets what is per
connection: ``synchronous``, which each store chooses (``FULL`` fsyncs the WAL
at every commit, so a commit survives a power cut; ``NORMAL`` fsyncs only at
checkpoints, so the last commits survive a process crash but may not survive
a power cut), and ``foreign_keys``.

Locked files: the one bounded retry
===================================

``busy_timeout`` (seconds, given to ``connect``) is how long a statement waits
for a lock another connection holds: SQLite's busy handler retries taking it,
sleeping between tries, until the timeout, then the statement fails with
``sqlite3.OperationalError`` ("database is locked"). That is the only retry on
a busy file. There is no loop on top of it, because what "locked for too long"
means is the caller's decision (wait and poll, skip a heartbeat, report
memory as unavailable), and a second loop would multiply the wait a store
documents. ``write_transaction`` takes the write lock at ``BEGIN IMMEDIATE``,
so every wait of a write happens there, inside the busy handler: a transaction
never starts as a reader and then fails to become the writer.

Schema versions
===============

A store's schema version lives in ``PRAGMA user_version`` (0: an empty file).
``migrate`` creates the schema on an empty file and upgrades an older one, one
version at a time, all in one write transaction; it refuses a file it does
not know (newer than the code, or a negative version) with the store's own
error, which says what to do, and writes nothing to it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

__all__ = [
    "SYNCHRONOUS_LEVELS",
    "Step",
    "check_synchronous",
    "synchronous_setting",
    "configure",
    "connect",
    "migrate",
    "run_script",
    "use_wal",
    "user_version",
    "write_transaction",
]

SYNCHRONOUS_LEVELS = ("OFF", "NORMAL", "FULL", "EXTRA")

# A schema step: changes the schema inside the transaction ``migrate`` holds.
Step = Callable[[sqlite3.Connection], None]


def check_synchronous(level: str) -> str:
    """``level`` in upper case; ValueError unless it is one of ``SYNCHRONOUS_LEVELS``."""
    if level.upper() not in SYNCHRONOUS_LEVELS:
        raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, got {level!r}")
    return level.upper()


def synchronous_setting(env: Mapping[str, str], name: str, default: str) -> str:
    """The ``synchronous`` level the environment variable ``name`` asks for (``default`` when unset), checked:
    a ValueError saying what to give otherwise, which each caller raises as its own kind of bad setting."""
    raw = env.get(name) or default
    try:
        return check_synchronous(raw)
    except ValueError:
        others = [level for level in ("OFF", "NORMAL", "FULL", "EXTRA") if level != default.upper()]
        raise ValueError(f"{name}={raw!r} is not a synchronous level: use {default.upper()} (the default), or "
                         f"{', '.join(others[:-1])} or {others[-1]} to measure what the level changes") from None


def connect(
    path: str | os.PathLike[str],
    *,
    busy_timeout: float,
    check_same_thread: bool = True,
    create_parent: bool = True,
) -> sqlite3.Connection:
    """An autocommit connection to ``path`` that waits up to ``busy_timeout`` seconds for a lock.

    ``create_parent``: create the file's directory if missing (not for
    ``":memory:"``). Raises ``OSError`` (the directory) or ``sqlite3.Error``
    (the file) as they come; the store words them for its users.
    """
    if create_parent and os.fspath(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    return sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=check_same_thread)


def use_wal(conn: sqlite3.Connection) -> str:
    """Put the file in WAL mode; returns the journal mode SQLite reports.

    That is ``"wal"``, except where WAL is impossible: ``"memory"`` for an
    in-memory database, or the old mode on a file system without the shared
    memory WAL needs. A store that requires WAL checks the answer.
    """
    mode: str = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    return mode


def configure(conn: sqlite3.Connection, *, synchronous: str, foreign_keys: bool = False) -> None:
    """The per-connection settings: ``synchronous`` (see the module docstring) and ``foreign_keys``."""
    conn.execute(f"PRAGMA synchronous={check_synchronous(synchronous)}")
    if foreign_keys:
        conn.execute("PRAGMA foreign_keys=ON")


class write_transaction:  # lower case: used like a function, as contextlib.suppress is
    """``with write_transaction(conn):`` one ``BEGIN IMMEDIATE`` ... ``COMMIT``.

    The write lock is taken at the start (waiting up to the connection's busy
    timeout), so a read-check-write inside cannot interleave with another
    connection's, in this process or another. Any exception in the body, or a
    failed ``COMMIT``, rolls the transaction back and propagates; a failing
    ``ROLLBACK`` (SQLite may already have rolled back, e.g. on a full disk)
    does not hide the error that caused it, and the connection is left
    outside any transaction.

    ``error``: turns a ``sqlite3.Error`` from ``BEGIN``, the body or ``COMMIT``
    (a lock held past the busy timeout, a damaged file, a full disk) into
    the store's own exception; without it the ``sqlite3.Error`` propagates.
    A class rather than a generator: it runs on every durable step.
    """

    __slots__ = ("_conn", "_error")

    def __init__(
        self, conn: sqlite3.Connection, error: Callable[[sqlite3.Error], BaseException] | None = None
    ) -> None:
        self._conn = conn
        self._error = error

    def __enter__(self) -> sqlite3.Connection:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if self._error is None:
                raise
            raise self._error(exc) from exc
        return self._conn

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            try:
                self._conn.execute("COMMIT")
                return
            except sqlite3.Error as failed:
                self._rollback()
                if self._error is None:
                    raise
                raise self._error(failed) from failed
        self._rollback()
        if self._error is not None and isinstance(exc, sqlite3.Error):
            raise self._error(exc) from exc

    def _rollback(self) -> None:
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # already rolled back by SQLite, or the connection is broken: the original error matters


def run_script(conn: sqlite3.Connection, script: str) -> None:
    """Execute the ``;``-separated statements of ``script`` in the open transaction.

    ``executescript`` would COMMIT the transaction first. The statements must
    not contain ``;`` themselves (no triggers, no ``;`` in a literal).
    """
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


def user_version(conn: sqlite3.Connection) -> int:
    found: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return found


def migrate(
    conn: sqlite3.Connection,
    *,
    version: int,
    create: Step,
    upgrades: Mapping[int, Step],
    refuse: Callable[[int], BaseException],
) -> int:
    """Bring the schema to ``version``; returns the version the file had.

    - ``version`` already: nothing is done, and no write lock is taken (a
      reader opening the file never waits for a writer here).
    - 0, an empty file: ``create`` builds the schema at ``version``.
    - 1 to ``version - 1``: ``upgrades[n]`` takes version n to n + 1, for
      each n from the file's version up, in order. Add a step for every new
      version; never edit a released one: files in the field went through it.
    - anything else (newer than this code, or negative: not written by it):
      ``refuse(found)`` is raised, and the file is left as it is.

    The change runs in one ``BEGIN IMMEDIATE`` transaction, the version
    re-read under the lock (another process may have migrated meanwhile), and
    ``user_version`` is set in the same commit: a crash leaves the old schema
    or the new one, never half of it.
    """
    if sorted(upgrades) != list(range(1, version)):
        raise ValueError(f"upgrades must step from each of versions 1..{version - 1}, got {sorted(upgrades)}")
    found = user_version(conn)
    if found == version:
        return found
    if not 0 <= found < version:
        raise refuse(found)
    with write_transaction(conn):
        current = user_version(conn)
        if current == version:
            return found
        if not 0 <= current < version:
            raise refuse(current)
        if current == 0:
            create(conn)
        else:
            for step in range(current, version):
                upgrades[step](conn)
        conn.execute(f"PRAGMA user_version={int(version)}")
    return found
