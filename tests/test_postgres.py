"""PostgreSQL as the project runs it (``lab.postgres``), and DBOS's system database on it under a power cut.

- The server the project starts runs as the ``postgres`` user from a data directory of its own (from
  ``lab.postgres.scratch_dir``, outside the checkout, which may sit under a private folder: owned by that
  user, mode 0700), on its own port with its socket in the data directory; ``kill()`` (what a power cut
  does) leaves none of its processes running, backends included, though each is a session of its own, and
  so does ``stop()``; a start on the same directory keeps what was committed.
- DBOS on PostgreSQL, cut by ``lab.powercut_matrix`` at the lab's defaults (``fsync=on``,
  ``synchronous_commit=on``), everything on one laptop, strict directory rule, right after step 2's output
  was recorded: nothing acknowledged is lost, and the run completes with each effect once. (The crash
  matrix runs DBOS's cases on PostgreSQL under SIGKILL: tests/test_crash_matrix.py.)
"""

from __future__ import annotations

import os
import shutil

import pytest

from lab.postgres import (
    SERVER_USER,
    Postgres,
    PostgresUnavailable,
    alive,
    check_reachable,
    children_of,
    scratch_dir,
    unavailable,
)
from lab.powercut import unmount_all_under
from lab.processes import REPO
from tests.tiers import starts

pytest.importorskip("dbos", reason="the dbos extra: pip install -e '.[dev]'")


@pytest.fixture
@starts("postgres", "process")
def state_dir():
    """A directory the ``postgres`` user can reach wherever the checkout is (``lab.postgres.scratch_dir``:
    pytest's own temporary directory is private to root, and so may the checkout's parent be), unmounted and
    removed after the test."""
    why = unavailable()
    if why:
        pytest.fail(f"the PostgreSQL tests need Debian's postgresql: {why}")
    work = scratch_dir("pytest-pg-")
    try:
        yield work
    finally:
        unmount_all_under(work)
        shutil.rmtree(work, ignore_errors=True)


def test_the_projects_postgres_runs_as_its_user_and_leaves_nothing(state_dir):
    import psycopg

    data = state_dir / "data"
    server = Postgres(data).start()
    try:
        st = data.stat()
        expected_user = SERVER_USER if os.geteuid() == 0 else None
        if expected_user:
            import pwd

            assert pwd.getpwuid(st.st_uid).pw_name == expected_user
        assert st.st_mode & 0o777 == 0o700
        assert (data / f".s.PGSQL.{server.port}").exists(), "its socket, in its data directory"
        con = psycopg.connect(server.conninfo(), autocommit=True)  # a backend, held open through the kill
        assert con.execute("SELECT current_user").fetchone() == (SERVER_USER,)
        con.execute("CREATE TABLE kept (n int)")
        con.execute("INSERT INTO kept VALUES (42)")
        backend = con.info.backend_pid
        forked = children_of(server.pid)
        assert backend in forked and len(forked) >= 4, forked  # checkpointer, writers, launchers, the backend
        assert all(os.getsid(pid) == pid for pid in forked)  # each its own session: a killpg would miss them
        server.kill()
        assert alive([server.pid, *forked]) == [], "kill() left some of the server's processes running"
        con.close()
    finally:
        server.stop()

    again = Postgres(data).start()  # the same data directory after the crash: no initdb, the commit recovered
    try:
        forked = children_of(again.pid)
        with psycopg.connect(again.conninfo()) as con:
            assert con.execute("SELECT n FROM kept").fetchall() == [(42,)]
    finally:
        again.stop()
    assert alive([again.pid, *forked]) == [], "stop() left some of the server's processes running"


async def test_dbos_on_postgres_keeps_what_it_acknowledged_through_a_cut(state_dir):
    from lab.powercut_matrix import Case, default_sync, run_case

    case = Case("dbos-pg", "laptop", "between", "strict", default_sync("dbos-pg"))
    assert case.sync == "defaults" and case.own_default
    outcome = await run_case(case, state_dir / "cut")
    assert outcome.error is None, outcome.error
    assert outcome.cut is not None and outcome.cut.lost_files >= 1, outcome.cut  # the cut dropped real writes
    assert outcome.lost == [], outcome
    assert outcome.executed_again == [], outcome
    assert outcome.completed and outcome.effects_once(), outcome
    assert outcome.broken() == [], outcome.broken()


def test_a_throwaway_cluster_is_made_where_the_server_user_can_reach_it(tmp_path):
    """A checkout under a private folder (``mktemp -d`` makes 0700 ones, as root's home is) cannot hold the
    tests' clusters: ``check_reachable`` refuses a path below it, and ``scratch_dir`` puts them elsewhere."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    if os.geteuid() == 0:  # as another user the server runs as that user, who owns the folder
        with pytest.raises(PostgresUnavailable, match=r"chmod o\+x"):
            check_reachable(private / "checkout" / ".state" / "data")
    made = scratch_dir("pytest-pg-probe-")
    try:
        assert not made.is_relative_to(REPO) and not made.is_relative_to(tmp_path), made
        assert made.stat().st_mode & 0o777 == 0o755 and list(made.iterdir()) == []
        check_reachable(made / "data")
    finally:
        shutil.rmtree(made)
