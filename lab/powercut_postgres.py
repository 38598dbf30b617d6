"""The power cut on DBOS's PostgreSQL: what ``lab.powercut_matrix`` does for its ``dbos-pg`` cases.

A ``dbos-pg`` case is a matrix case (placement, cut point, directory rule) with DBOS's system database on
the project's own PostgreSQL (``lab.postgres``), its data directory on the power-cut mount. ``OnTheCut``
is that server's part of the case:

- ``prepare``: the cluster is made (``initdb``, then DBOS's database) on the mount's backing directory
  before the mount comes up: it is the disk's content from the start, not what a cut may lose, and seconds
  are saved (CREATE DATABASE copies hundreds of files). The mount lets other users in (FUSE's
  ``allow_other``: the matrix mounts it so), since the server runs as the ``postgres`` user, and the case's
  directory must let that user through. The server's socket is beside the mount (a FUSE mount holds no
  socket); DBOS reaches it on its loopback port (``DBOSFLOW_DB`` the server's URL).
- ``driver``: the server started on the mount, and DBOS's CLI driver whose processes include the
  postmaster, so the cut SIGKILLs it and every process it forked (``lab.postgres.ServerProc``: each child
  of PostgreSQL's is a session of its own, so its process group is not enough) with the engine's processes;
  then the mount goes, and everything unsynced with it.
- ``power_back``: the server started again on what is left, on the same port, recovering from its WAL. A
  server that does not start is an outcome ("did not start": every acknowledged write it held is lost),
  not an error of the harness.

Levels (the matrix's "sync" column): ``defaults`` (``fsync=on``, ``synchronous_commit=on``: PostgreSQL's
and the lab's), ``sync_commit=off`` (a commit is acknowledged before its WAL is flushed; the WAL writer
flushes within ``3 * wal_writer_delay``, 600 ms by default) and ``fsync=off`` (nothing is ever forced to
the disk). The lab promises the first: no acknowledged write lost; the other two are measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lab import registry
from lab.engines import DbosDriver
from lab.postgres import Postgres, check_reachable, initdb
from lab.processes import BaseProc

OF = registry.registration_of(DbosDriver)
"""The engine whose variant this is: the one that registered the driver below derives from."""
ENGINE = OF.variant("-pg")
"""The variant's name, derived from its engine's registration: the matrix's cases of DBOS on PostgreSQL."""
LEVELS = {
    "defaults": {"fsync": "on", "synchronous_commit": "on"},
    "sync_commit=off": {"fsync": "on", "synchronous_commit": "off"},
    "fsync=off": {"fsync": "off", "synchronous_commit": "on"},
}
DEFAULT_LEVEL = "defaults"
DATABASE = "dbosflow"


class OnTheCut:
    """One case's PostgreSQL: its data in ``backing`` (the disk) seen at ``data`` (on the mount), its socket
    in ``socket_dir``, run at ``level`` (one of ``LEVELS``)."""

    def __init__(self, backing: Path, data: Path, socket_dir: Path, level: str) -> None:
        if level not in LEVELS:
            raise ValueError(f"no PostgreSQL level {level!r}: choose from {', '.join(LEVELS)}")
        self.backing, self.data, self.socket_dir, self.level = backing, data, socket_dir, level
        self.server: Postgres | None = None
        self.port: int | None = None

    def prepare(self) -> None:
        """The cluster and DBOS's database, on the disk, before the mount comes up."""
        check_reachable(self.backing)  # the server's user walks down to its data directory
        initdb(self.backing)
        with Postgres(self.backing, socket_dir=self.socket_dir) as server:
            server.create_database(DATABASE)

    def start(self) -> Postgres:
        """The server on the mount (on the port it had, once it had one)."""
        self.server = Postgres(self.data, port=self.port, socket_dir=self.socket_dir, settings=LEVELS[self.level])
        self.server.start()
        self.port = self.server.port
        return self.server

    def driver(self, env: Mapping[str, str], *, timeout: float) -> DbosDriver:
        """DBOS's CLI on this server (started here), the server among the processes a cut takes."""
        server = self.start()
        return _DbosOnPostgres(self, {**env, "DBOSFLOW_DB": server.url(DATABASE)}, timeout=timeout)

    def power_back(self) -> str | None:
        """The server again, on what the cut left; why it did not start, or None."""
        try:
            self.start()
        except RuntimeError as err:
            text = str(err).strip()
            return text.splitlines()[-1] if text else "no output"
        return None

    def kill(self) -> None:
        if self.server is not None:
            self.server.kill()


class _DbosOnPostgres(DbosDriver):
    """DBOS's CLI on a PostgreSQL server of the case's machine: whichever server process runs now is one of
    the processes a power cut takes, and is killed with the others when the driver closes."""

    def __init__(self, postgres: OnTheCut, env: Mapping[str, str], *, timeout: float) -> None:
        super().__init__(env, timeout=timeout)
        self.postgres = postgres

    def processes(self) -> list[BaseProc]:
        server = self.postgres.server
        alive = server is not None and server.proc is not None and server.alive()
        extra: list[BaseProc] = [server.proc] if alive and server is not None and server.proc is not None else []
        return [*super().processes(), *extra]

    def close(self) -> None:
        """The engine's processes, then the server: nothing may hold the mount when it goes."""
        super().close()
        self.postgres.kill()
