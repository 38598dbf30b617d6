"""The synchronous levels the lab's file-backed stores run at, as their processes really set them.

What each level keeps under a power cut is shown in tests/test_power_cut.py and
``make powercut`` (docs/powercut.md); here, that the defaults are what those
pages promise: a dev server given a file runs at EXTRA (and one in memory is
given no pragma), every connection of DBOS's SQLite pool at EXTRA with DBOS's
own settings still applied, memory at FULL, each level overridable by its
variable and a wrong one refused with what to use.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from durable_agents.steps.limits import InputError
from durable_agents.wiring.memory import close_memory, memory_from_env
from lab.processes import FILE_PRAGMAS, REPO, DevServer

pytest.importorskip("dbos", reason="the dbos extra: pip install -e '.[dev]'")


@pytest.mark.process
def test_a_dev_server_given_a_file_runs_at_extra_and_one_in_memory_gets_no_pragma(tmp_path):
    assert FILE_PRAGMAS == {"synchronous": "EXTRA"}
    on_file = DevServer(db_file=tmp_path / "temporal.db")
    in_memory = DevServer()
    try:
        argv = on_file.start().proc.argv  # type: ignore[union-attr]
        assert "--sqlite-pragma" in argv and argv[argv.index("--sqlite-pragma") + 1] == "synchronous=EXTRA", argv
        assert "--sqlite-pragma" not in in_memory.start().proc.argv  # type: ignore[union-attr]
    finally:
        on_file.kill()
        in_memory.kill()
    assert DevServer(db_file=tmp_path / "t.db", sqlite_pragmas={"synchronous": "FULL"}).sqlite_pragmas == {
        "synchronous": "FULL"}
    with pytest.raises(ValueError, match="need a database file"):
        DevServer(sqlite_pragmas={"synchronous": "EXTRA"})


# Launches DBOS on a file in a process of its own and reports what one connection of its pool runs with.
PROBE = """
import json, sys
from pathlib import Path
from dbos import DBOS
from dbos._dbos import _get_dbos_instance
from durable_agents.dbosflow import engine
engine.configure(Path(sys.argv[1]))
DBOS.launch()
try:
    with _get_dbos_instance()._sys_db.engine.connect() as c:
        raw = c.connection.dbapi_connection
        print(json.dumps({name: raw.execute(f"PRAGMA {name}").fetchone()[0]
                          for name in ("synchronous", "busy_timeout", "foreign_keys", "journal_mode")}
                         | {"isolation": raw.isolation_level}))
finally:
    DBOS.destroy()
"""


def _dbos_connection(tmp_path, **env: str) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if k != "DBOSFLOW_SYNCHRONOUS"}
    return subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "dbos.db")], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**inherited, "DBOSFLOW_LOG_LEVEL": "ERROR", **env})


@pytest.mark.process
def test_dbos_sqlite_connections_run_at_extra_with_dbos_own_settings_kept(tmp_path):
    done = _dbos_connection(tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # EXTRA = 3; DBOS's connect listener still sets its busy timeout, foreign keys and IMMEDIATE transactions.
    assert seen == {"synchronous": 3, "busy_timeout": 30000, "foreign_keys": 1, "journal_mode": "delete",
                    "isolation": "IMMEDIATE"}, seen

    full = _dbos_connection(tmp_path, DBOSFLOW_SYNCHRONOUS="full")
    assert full.returncode == 0, full.stderr
    assert json.loads(full.stdout.strip().splitlines()[-1])["synchronous"] == 2, full.stdout

    wrong = _dbos_connection(tmp_path, DBOSFLOW_SYNCHRONOUS="sometimes")
    assert wrong.returncode != 0
    assert "DBOSFLOW_SYNCHRONOUS='sometimes' is not a synchronous level: use EXTRA" in wrong.stderr, wrong.stderr


@pytest.mark.parametrize(("value", "level"), [(None, 2), ("NORMAL", 1)])
def test_memory_runs_at_full_unless_told_and_its_writer_closes(tmp_path, value, level):
    env = {"MEMORY_DB": str(tmp_path / "memory.db"), **({"MEMORY_SYNCHRONOUS": value} if value else {})}
    _, remember = memory_from_env(env)
    assert remember("conv-1", [("m1", "user", "hello")]) == 1
    store = remember.store  # type: ignore[attr-defined]
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == level
    close_memory(remember)
    assert remember.store is None and store._conn is None  # type: ignore[attr-defined]
    close_memory(remember)  # twice is harmless
    assert remember("conv-1", [("m2", "assistant", "hi")]) == 1  # opened again when called after a close
    close_memory(remember)


def test_a_wrong_memory_level_is_refused_with_what_to_use(tmp_path):
    with pytest.raises(InputError, match="MEMORY_SYNCHRONOUS='sometimes' is not a synchronous level: use FULL"):
        memory_from_env({"MEMORY_DB": str(tmp_path / "memory.db"), "MEMORY_SYNCHRONOUS": "sometimes"})
