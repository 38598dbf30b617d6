"""The comparison with DBOS as a third column: the same task on Temporal, the
run record and DBOS (a DBOS process SIGKILLed after the email went out, then
resumed by DBOS's recovery on launch), the provider's counts the judge.
Skipped, saying why, without the dbos extra."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

pytest.importorskip("dbos",
                    reason="DBOS Transact is an optional extra: pip install -e '.[dbos]' (make test installs it)")

from durable_agents.dbosflow.compare import dbos_side  # noqa: E402
from durable_agents.flowclient.runs import start_run  # noqa: E402
from durable_agents.runrecord import RunRecord  # noqa: E402
from lab.processes import REPO  # noqa: E402
from lesson.compare import compare, render  # noqa: E402
from tests.support import EMAIL, TASK, finished, wait_closed, wait_exit  # noqa: E402


async def test_compare_lays_dbos_beside_temporal_and_the_record(client, dev_server, workers, provider, runrecord, db,
                                                                 dbos_procs, run_id, task_queue):
    temporal_id, record_id, dbos_id = f"{run_id}-t", f"{run_id}-r", f"{run_id}-d"
    workers()
    created, _ = await start_run(client, temporal_id, TASK, EMAIL, queue=task_queue)
    assert created
    done = runrecord("start", record_id, TASK, "--email", EMAIL)
    assert finished(done) == 0, done.output()
    crashed = dbos_procs("start", dbos_id, TASK, "--email", EMAIL, crash_at="send_confirmation:after_effect")
    assert wait_exit(crashed, timeout=90) == -9, crashed.output()
    resumed = dbos_procs("resume", dbos_id)
    assert wait_exit(resumed, timeout=90) == 0, resumed.output()
    assert (await wait_closed(client, temporal_id))["status"] == "completed"

    with RunRecord(db) as record:
        report = await compare(record, record_id, client, temporal_id, provider.url,
                               dbos=dbos_side(dbos_procs.db, dbos_id))
    d = report["dbos"]
    assert d["status"] == "completed" and d["steps"][0]["result"] == report["record"]["steps"][0]["result"]
    # DBOS wrote a row per step when it returned; the killed attempt left none, and its repeat was replayed.
    assert [s["rows"] for s in d["steps"]] == [1, 1, 1]
    assert d["steps"][1]["attempts"] == 2 and d["steps"][1]["crashes"] == 1 and d["steps"][1]["result"]["replayed"]
    assert d["totals"]["operation_outputs_rows"] == 3 and d["totals"]["workflow_status_rows"] == 1
    assert d["only_here"]["recovery_attempts"] == 2 and d["only_here"]["application_version"]
    # Bytes by the record's rule, on DBOS's own tables.
    con = sqlite3.connect(dbos_procs.db)
    try:
        stored = con.execute("SELECT sum(length(CAST(output AS BLOB))) FROM operation_outputs WHERE workflow_uuid = ?",
                             (dbos_id,)).fetchone()[0]
    finally:
        con.close()
    assert d["totals"]["operation_outputs_bytes"] > stored > 0
    checks = [c for c in report["checks"] if c["engine"] == "dbos"]
    assert len(checks) == 4 and all(c["ok"] for c in checks), checks

    text = render(report)
    print(text)
    assert "only in DBOS's record" in text and "dbos:" in text and "DIFF" not in text

    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "PROVIDER_URL": provider.url,
           "RUNRECORD_DB": str(db), "DBOSFLOW_DB": str(dbos_procs.db)}
    cli = subprocess.run([sys.executable, "-m", "lesson.compare", record_id, "--temporal", temporal_id,
                          "--dbos", dbos_id, "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["dbos"]["totals"] == dbos_side(dbos_procs.db, dbos_id)["totals"]
    missing = subprocess.run([sys.executable, "-m", "lesson.compare", record_id, "--temporal", temporal_id,
                              "--dbos", "no-such-run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no run 'no-such-run'" in missing.stderr, missing.stderr
