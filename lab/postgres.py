"""PostgreSQL for the lab: Debian's server, started and stopped by the project as it starts the dev server.

``Postgres`` runs one cluster of its own:

- **Its own data directory** (``.state/postgres`` unless told; the tests, the loop's chaos and the power
  cut give their own, throwaway, from ``scratch_dir``: outside the checkout, since the server's user must
  reach it and a checkout may sit under a private folder), made by ``initdb`` on first start and reused
  afterwards. Trust authentication, no locale (C), UTF-8.
- **Its own port**: a free loopback port (``listen_addresses=127.0.0.1``), and its Unix socket in the data
  directory (``socket_dir`` elsewhere: a FUSE mount cannot hold a socket).
- **As the ``postgres`` user when run by root**: ``initdb`` and ``postgres`` refuse root, and development
  machines and CI run as root. The data directory is handed to ``postgres`` (owner, mode 0700), every
  directory above it must let that user through (checked, with what to do when one does not), and the
  server runs under ``setpriv`` (which execs: the process started is the postmaster itself).
- **Stopped afterwards**: ``stop()`` (SIGINT, PostgreSQL's fast shutdown; then ``kill()``), ``kill()``
  (SIGKILL of the postmaster and of every process it forked, backends, checkpointer and WAL writer: a
  crash or, on the power-cut mount, the power going), a context manager, and an ``atexit`` hook for a
  caller that forgets. Nothing is left running. The postmaster's process group is not enough: every child
  of PostgreSQL's starts a session of its own (``setsid`` in ``InitPostmasterChild``), so the postmaster
  is stopped first (SIGSTOP: it forks nothing more), its children are found by parent (/proc), and then
  all of them are killed.

The cluster the Debian package may create on its own (``15/main`` on port 5432, ``pg_lsclusters``) is never
used or touched: this one has its own data directory and port. ``make test`` installs the package when it
is missing and stops the cluster the installation started.

``url(database)`` is the SQLAlchemy URL DBOS is given (``postgresql+psycopg://``: psycopg 3, which dbos
depends on); DBOS creates the database when it launches. Settings (``fsync``, ``synchronous_commit``, ...)
are given to the server as ``-c NAME=VALUE``.

By hand: ``python -m lab.postgres [--data DIR]`` starts it, prints the URL and runs until Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.processes import REPO, Proc, free_port

DEFAULT_DATA = REPO / ".state" / "postgres"
SERVER_USER = "postgres"  # Debian's system user for the server, made by the postgresql-common package
READY_LINE = "database system is ready to accept connections"


class PostgresUnavailable(RuntimeError):
    """PostgreSQL's server cannot be run here; the message says what to install or change."""


def bindir() -> Path:
    """The newest installed server's directory of programs (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if found:
        return found[-1].parent
    on_path = shutil.which("postgres")
    if on_path:
        return Path(on_path).resolve().parent
    raise PostgresUnavailable(
        "PostgreSQL's server is not installed: `make test` installs Debian's postgresql when it is missing, or "
        "run `apt-get install postgresql` (root or sudo)")


def unavailable() -> str | None:
    """Why ``Postgres`` cannot run here, or None (for a test to skip on, with the reason)."""
    try:
        bindir()
    except PostgresUnavailable as err:
        return str(err)
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return (f"running as root and there is no {SERVER_USER!r} user to run the server as (Debian's "
                    "postgresql-common makes it): install postgresql, or run as another user")
        if shutil.which("setpriv") is None:
            return "running as root and setpriv (util-linux) is missing: install util-linux"
    return None


def _as_server_user() -> list[str]:
    """The prefix that runs a program as the server's user: nothing unless this process is root."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={SERVER_USER}", f"--regid={SERVER_USER}", "--init-groups", "--"]


def _server_ids() -> tuple[int, int]:
    if os.geteuid() != 0:
        return os.geteuid(), os.getegid()
    entry = pwd.getpwnam(SERVER_USER)
    return entry.pw_uid, entry.pw_gid


def check_reachable(path: Path) -> None:
    """Every directory above ``path`` lets the server's user through (x for others, or owned by it)."""
    uid, _ = _server_ids()
    for parent in reversed(path.resolve().parents):
        if not parent.exists():  # made later by own(), 0755 under the usual umask
            break
        st = parent.stat()
        if st.st_uid == uid or st.st_mode & stat.S_IXOTH:
            continue
        raise PostgresUnavailable(
            f"the {SERVER_USER} user cannot reach {path}: {parent} is mode {stat.filemode(st.st_mode)} and not "
            f"its own. Give others the right to pass (chmod o+x {parent}), or keep the checkout somewhere "
            "they can")


def own(path: Path) -> None:
    """``path`` made (parents too) and handed to the server's user, mode 0700, as PostgreSQL requires."""
    path.mkdir(parents=True, exist_ok=True)
    uid, gid = _server_ids()
    os.chown(path, uid, gid)
    path.chmod(0o700)


def scratch_dir(prefix: str) -> Path:
    """A new, empty directory for a throwaway cluster (a test's, a chaos session's, the power-cut matrix's),
    which the server's user can reach wherever the checkout is: made in the system's temporary directory
    (``/tmp``, sticky and open to all; ``TMPDIR`` if that lets the user through), mode 0755, owned by the
    caller. A checkout under a private parent (``mktemp -d`` makes 0700 folders; so is root's home on Debian)
    cannot hold one: ``check_reachable`` refuses it. The caller removes it (``shutil.rmtree``) when done."""
    for root in dict.fromkeys((tempfile.gettempdir(), "/tmp", "/var/tmp")):
        try:
            check_reachable(Path(root) / "probe")
        except PostgresUnavailable:
            continue
        made = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        made.chmod(0o755)
        return made
    raise PostgresUnavailable(
        f"no temporary directory lets the {SERVER_USER} user through (tried {tempfile.gettempdir()}, /tmp and "
        "/var/tmp): give others the right to pass (chmod o+x), or set TMPDIR to a directory that does")


def initdb(data: Path, *, sync: bool = False) -> None:
    """A new cluster in ``data`` (empty or missing). ``sync=False`` skips initdb's final fsync of every file
    (seconds on a slow disk): the lab's clusters are scratch, and the power cut's is made on its backing
    directory, which is never cut."""
    check_reachable(data)
    own(data)
    argv = [*_as_server_user(), str(bindir() / "initdb"), "-D", str(data), "-U", SERVER_USER, "--auth=trust",
            "--encoding=UTF8", "--no-locale", *([] if sync else ["--no-sync"])]
    done = subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed (exit {done.returncode}) for {data}:\n{done.stdout}{done.stderr}")


def is_cluster(data: Path) -> bool:
    return (data / "PG_VERSION").exists()


class ServerProc(Proc):
    """The postmaster: ``kill()`` takes it and every process it forked (every backend, the checkpointer, the
    WAL writer) and returns once none of them is left, so a power cut (``lab.powercut``, which calls
    ``kill()`` on each process it names) finds no file of the mount still open."""

    def kill(self) -> None:
        postmaster = self.popen.pid
        if self.popen.poll() is None:
            try:
                os.kill(postmaster, signal.SIGSTOP)  # it forks no new child while its children are found
            except ProcessLookupError:
                pass
        victims = [postmaster, *children_of(postmaster)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.popen.wait(timeout=10)
        _wait_gone(victims, 10.0)


class Postgres:
    """One PostgreSQL server on a free loopback port, its data in ``data`` (``initdb`` when empty).

    ``settings`` are server settings (``-c NAME=VALUE``), e.g. ``{"synchronous_commit": "off"}``;
    ``socket_dir`` holds the Unix socket (the data directory unless told)."""

    def __init__(self, data: Path = DEFAULT_DATA, *, port: int | None = None, socket_dir: Path | None = None,
                 settings: dict[str, str] | None = None, echo: bool = False) -> None:
        self.data = Path(data).absolute()
        self.socket_dir = Path(socket_dir).absolute() if socket_dir is not None else self.data
        self.settings = dict(settings or {})
        self._chosen_port = port is None
        self.port = port or free_port()
        self.echo = echo
        self.proc: ServerProc | None = None

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of ``database`` on this server (TCP on loopback, trust: no password)."""
        return f"postgresql+psycopg://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def conninfo(self, database: str = "postgres") -> str:
        """The libpq URI of ``database`` (psql, psycopg)."""
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        """``CREATE DATABASE name`` (DBOS would on launch: made ahead, its copy of the template is not written
        where a test looks)."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.conninfo(), autocommit=True, connect_timeout=10) as con:
            con.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def __enter__(self) -> Postgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60.0, tries: int = 3) -> Postgres:
        """Start it (``initdb`` first when the data directory holds no cluster) and wait for its ready line.
        A port another process took between being picked and being bound is picked again, as the dev
        server's is."""
        why = unavailable()
        if why:
            raise PostgresUnavailable(why)
        if not is_cluster(self.data):
            initdb(self.data)
        check_reachable(self.data)
        if self.socket_dir != self.data:
            check_reachable(self.socket_dir)
            own(self.socket_dir)
        for attempt in range(1, tries + 1):
            try:
                return self._start(timeout)
            except RuntimeError as err:
                if attempt == tries or "already in use" not in str(err) or not self._chosen_port:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> Postgres:
        argv = [*_as_server_user(), str(bindir() / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-k", str(self.socket_dir), "-c", "listen_addresses=127.0.0.1"]
        for name, value in self.settings.items():
            argv += ["-c", f"{name}={value}"]
        self.proc = ServerProc("postgres", argv, env={"LC_ALL": "C"}, cwd=Path("/"), echo=self.echo)
        atexit.register(self.stop)
        try:
            self.proc.wait_for_line(READY_LINE, timeout=timeout)
        except (RuntimeError, TimeoutError) as err:
            self.kill()
            raise RuntimeError(f"PostgreSQL did not start on port {self.port} with data in {self.data}: {err}") \
                from None
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("PostgreSQL was not started")
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def kill(self) -> None:
        """SIGKILL of the postmaster and every process it forked (every backend, the checkpointer, the WAL
        writer), and return once none of them is left: a crash, or the power going."""
        if self.proc is not None:
            self.proc.kill()

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT: sessions ended, a checkpoint, exit); ``kill()`` past ``timeout``, and in any
        case for a child left behind."""
        if self.proc is None:
            return
        if self.proc.alive():
            self.proc.popen.send_signal(signal.SIGINT)
            try:
                self.proc.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        atexit.unregister(self.stop)

    def output(self) -> str:
        return self.proc.output() if self.proc else ""


def _live_stats() -> dict[int, tuple[str, int]]:
    """(state, parent) of every process, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        found[int(entry.name)] = (fields[0], int(fields[1]))
    return found


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    return [child for child, (state, parent) in _live_stats().items() if parent == pid and state != "Z"]


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie holds no file: it counts as gone)."""
    stats = _live_stats()
    return [pid for pid in pids if pid in stats and stats[pid][0] != "Z"]


def _wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    left = alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = alive(pids)
    if left:
        raise RuntimeError(f"PostgreSQL's processes {left} still running {timeout:g} s after SIGKILL")


_SAFE_NAME = re.compile(r"[^a-z0-9_]")


def database_name(*parts: str) -> str:
    """A database name from ``parts`` (lower case, ``_`` for anything else, at most 63 bytes)."""
    return _SAFE_NAME.sub("_", "_".join(parts).lower())[:63]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.postgres",
                                     description="Run the lab's PostgreSQL until Ctrl-C (initdb on first use).")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="data directory (default .state/postgres)")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    args = parser.parse_args(argv)
    with Postgres(args.data, port=args.port) as server:
        print(f"PostgreSQL ready: {server.conninfo()}\n"
              f"  DBOSFLOW_DB={server.url('dbosflow')} python -m durable_agents.dbosflow start ...", flush=True)
        try:
            server.proc.popen.wait() if server.proc else None
        except KeyboardInterrupt:
            print("stopping PostgreSQL", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
