"""The bootstrap the grader runs a learner's program under, in the learner's process.

    python -m grader.launch PATH/flow.py ARGS...

It runs ``flow.py`` as ``__main__`` (``runpy``), exactly as ``python
flow.py ARGS...`` would, with one addition: every ``sqlite3`` connection the
program opens counts the commits that wrote something, and with
``GRADER_KILL_AFTER_COMMIT=k`` the process sends itself SIGKILL as soon as
the k-th such commit has returned (saying, on stderr, the committing
connection's ``synchronous`` and ``journal_mode``: a power cut's failure names
them). That is how the grader lands a kill between any two of the learner's
transactions, which the crash points inside
the step functions (``durable_agents.steps.crashpoints``) cannot reach. With
``GRADER_COMMITS_FILE=PATH``, a process that ends by itself writes there how
many commits it made, so the grader knows how many kills to land; it only
schedules the kills, it is never evidence.

A commit is seen when, after a call into the connection (``execute``,
``executemany``, ``executescript``, ``commit``, leaving ``with conn:``) or
one of its cursors, the connection is outside a transaction and its
``total_changes`` moved since the last commit seen: an explicit ``COMMIT``,
``with conn:``, or a write in autocommit mode. Schema statements change no
rows and do not count.

Nothing here judges anything: the grader reads what happened from the
provider, the model stand-in and the record file, never from this process.
"""

from __future__ import annotations

import os
import runpy
import signal
import sqlite3
import sys

_KILL_AFTER = int(os.environ.get("GRADER_KILL_AFTER_COMMIT") or 0)
_commits = 0
_original_connect = sqlite3.connect


def _seen(conn: sqlite3.Connection, state: list[int]) -> None:
    """After a call into ``conn``: count a commit that wrote rows, and die at the chosen one."""
    global _commits
    if conn.in_transaction or conn.total_changes == state[0]:
        return
    state[0] = conn.total_changes
    _commits += 1
    if _commits == _KILL_AFTER:
        sys.stderr.write(f"GRADER_KILL_AFTER_COMMIT={_KILL_AFTER}: killing process {os.getpid()} with SIGKILL "
                         f"({_settings(conn)})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


_LEVELS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def _settings(conn: sqlite3.Connection) -> str:
    """What the committing connection's commits wait for, so a power cut's failure can name the setting
    (``grader.power_cuts``); a hint for the message, never evidence: the cut judges."""
    try:
        level = sqlite3.Connection.execute(conn, "PRAGMA synchronous").fetchone()[0]
        journal = sqlite3.Connection.execute(conn, "PRAGMA journal_mode").fetchone()[0]
    except sqlite3.Error as err:
        return f"settings unreadable: {err}"
    return f"synchronous={_LEVELS.get(level, level)}, journal_mode={journal}"


class _Cursor(sqlite3.Cursor):
    def execute(self, *args, **kwargs):
        result = super().execute(*args, **kwargs)
        _seen(self.connection, self.connection._grader_state)
        return result

    def executemany(self, *args, **kwargs):
        result = super().executemany(*args, **kwargs)
        _seen(self.connection, self.connection._grader_state)
        return result

    def executescript(self, *args, **kwargs):
        result = super().executescript(*args, **kwargs)
        _seen(self.connection, self.connection._grader_state)
        return result


class _Connection(sqlite3.Connection):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._grader_state = [self.total_changes]

    def cursor(self, factory=_Cursor):
        return super().cursor(factory)

    def execute(self, *args, **kwargs):
        result = super().execute(*args, **kwargs)
        _seen(self, self._grader_state)
        return result

    def executemany(self, *args, **kwargs):
        result = super().executemany(*args, **kwargs)
        _seen(self, self._grader_state)
        return result

    def executescript(self, *args, **kwargs):
        result = super().executescript(*args, **kwargs)
        _seen(self, self._grader_state)
        return result

    def commit(self) -> None:
        super().commit()
        _seen(self, self._grader_state)

    def __exit__(self, *exc_info):
        result = super().__exit__(*exc_info)
        _seen(self, self._grader_state)
        return result


def _connect(*args, **kwargs):
    kwargs.setdefault("factory", _Connection)
    return _original_connect(*args, **kwargs)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m grader.launch PATH/flow.py ARGS...")
    path = sys.argv[1]
    sys.argv = [path, *sys.argv[2:]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as `python flow.py` puts its folder first
    sqlite3.connect = _connect
    try:
        runpy.run_path(path, run_name="__main__")
    finally:  # also on sys.exit; a SIGKILL writes nothing
        if os.environ.get("GRADER_COMMITS_FILE"):
            with open(os.environ["GRADER_COMMITS_FILE"], "w") as out:
                out.write(str(_commits))


if __name__ == "__main__":
    main()
