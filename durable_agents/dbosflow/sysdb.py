"""Where DBOS's system database is: a SQLite file (the default) or a PostgreSQL database, named by one value.

``DBOSFLOW_DB`` and every command's ``--db`` take either:

- a **path** (``.state/dbosflow.db``, the default): SQLite, no server; or
- a **database URL**: ``postgresql://`` or ``postgresql+psycopg://`` (psycopg 3, which dbos depends on;
  ``postgresql://`` is given to DBOS as ``postgresql+psycopg://``), or ``sqlite:///PATH``. DBOS creates
  a PostgreSQL database that does not exist yet when it launches (the user needs CREATEDB); its tables are
  in the ``dbos`` schema. ``python -m lab.postgres`` runs a server for it.

DBOS 3.4 itself reads ``DBOS_SYSTEM_DATABASE_URL`` only in its own CLI and on DBOS Cloud: an application
passes ``system_database_url`` in its config, as this engine does from ``DBOSFLOW_DB``, so one name
selects the database for every command, SQLite or PostgreSQL.

The lab reads a few of DBOS's rows directly, outside DBOS (``durable_agents.dbosflow.engine.dispatch_of``,
``durable_agents.dbosflow.compare``): ``connect`` opens either kind read-only with the tables unqualified (PostgreSQL's
``search_path`` is ``dbos``) and ``?`` placeholders on both, and ``Reader`` says how to list a table's
columns and measure a stored value's bytes on each.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DBOS_SCHEMA = "dbos"  # DBOS's default ``dbos_system_schema`` on PostgreSQL
_POSTGRES_SCHEMES = ("postgresql://", "postgresql+psycopg://", "postgres://")


@dataclass(frozen=True)
class SystemDb:
    """DBOS's system database: ``url`` as DBOS is given it; ``path`` the SQLite file, None on PostgreSQL."""

    url: str
    path: Path | None = None

    @property
    def is_sqlite(self) -> bool:
        return self.path is not None

    def __str__(self) -> str:
        """The file's path, or the URL without its password: what a message shows."""
        if self.path is not None:
            return str(self.path)
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)

    def exists(self) -> bool:
        """SQLite: the file exists. PostgreSQL: the server has the database, and DBOS's tables in it (a
        server that does not answer raises ``DatabaseUnreachable``, which says what to do)."""
        if self.path is not None:
            return self.path.exists()
        import psycopg

        try:
            with psycopg.connect(_conninfo(self.url), connect_timeout=10) as con:
                row = con.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{DBOS_SCHEMA}.workflow_status",)).fetchone()
        except psycopg.OperationalError as err:
            if "does not exist" in str(err):
                return False
            raise DatabaseUnreachable(f"DBOS's system database {self} does not answer ({err}). Start the server "
                                      "(python -m lab.postgres runs one) or fix DBOSFLOW_DB / --db") from None
        return bool(row and row[0])

    def prepare(self) -> None:
        """Before DBOS launches on it: the SQLite file's directory exists (PostgreSQL: DBOS creates the
        database itself)."""
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)


class DatabaseUnreachable(RuntimeError):
    """The PostgreSQL server of ``DBOSFLOW_DB`` does not answer."""


def system_db(where: str | Path | SystemDb) -> SystemDb:
    """``where`` (a path, a URL, or already a ``SystemDb``) as a ``SystemDb``."""
    if isinstance(where, SystemDb):
        return where
    text = str(where)
    if isinstance(where, str) and text.startswith(_POSTGRES_SCHEMES):
        scheme, rest = text.split("://", 1)
        return SystemDb(f"postgresql+psycopg://{rest}" if scheme != "postgresql+psycopg" else text)
    if isinstance(where, str) and text.startswith("sqlite:///"):
        return system_db(Path(text[len("sqlite:///"):]))
    if isinstance(where, str) and "://" in text:
        raise ValueError(f"DBOS's system database {text!r}: a path (SQLite) or a postgresql:// URL")
    path = Path(where)
    return SystemDb(f"sqlite:///{path.resolve()}", path)


def _conninfo(url: str) -> str:
    """The libpq URI of a SQLAlchemy ``postgresql+psycopg://`` URL."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Reader:
    """A read-only connection to the system database, the same queries on both kinds: ``?`` placeholders,
    DBOS's tables unqualified."""

    def __init__(self, db: SystemDb) -> None:
        self.db = db
        if db.path is not None:
            self._sqlite: sqlite3.Connection | None = sqlite3.connect(f"file:{db.path}?mode=ro", uri=True, timeout=5)
            self._pg = None
        else:
            import psycopg

            self._sqlite = None
            self._pg = psycopg.connect(_conninfo(db.url), autocommit=True, connect_timeout=10,
                                       options=f"-c search_path={DBOS_SCHEMA} -c default_transaction_read_only=on")

    def rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        if self._sqlite is not None:
            return list(self._sqlite.execute(sql, tuple(params)).fetchall())
        assert self._pg is not None
        return list(self._pg.execute(sql.replace("?", "%s"), tuple(params)).fetchall())

    def columns(self, table: str) -> list[str]:
        """The columns of one of DBOS's tables, in order."""
        if self._sqlite is not None:
            return [str(r[1]) for r in self._sqlite.execute(f"PRAGMA table_info({table})")]
        return [str(r[0]) for r in self.rows(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ? "
            "ORDER BY ordinal_position", (DBOS_SCHEMA, table))]

    def size(self, column: str) -> str:
        """SQL for the bytes of ``column``'s stored value as text (0 for NULL): SQLite's ``length`` of the
        value as a blob, PostgreSQL's ``octet_length`` of its text form: the same for text and numbers."""
        if self._sqlite is not None:
            return f"coalesce(length(CAST({column} AS BLOB)), 0)"
        return f"coalesce(octet_length({column}::text), 0)"

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            self._pg.close()


@contextmanager
def connect(db: str | Path | SystemDb) -> Iterator[Reader]:
    """A ``Reader`` on ``db``, closed when the block ends."""
    reader = Reader(system_db(db))
    try:
        yield reader
    finally:
        reader.close()
