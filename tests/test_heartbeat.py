"""Honest heartbeats: no step blocks the worker's event loop. Another process
holds the memory database's write lock for 3 s while record_outcome writes
the run's exchange; the write waits in a thread, the activity keeps
heartbeating, and nothing times out or runs twice."""

from __future__ import annotations

import sys

from durable_agents.flowclient.runs import start_run
from durable_agents.memory import SQLiteStore
from lab.processes import Proc
from tests.support import executions, poll_until, wait_closed, wait_exit

HOLD = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(3)
conn.execute("COMMIT")
print("released", flush=True)
"""


async def test_a_memory_lock_held_for_3_s_costs_no_heartbeat(client, workers, provider, run_id, task_queue):
    memory = provider.db.parent / "memory.db"
    SQLiteStore(str(memory)).close()  # the file exists, so the lock can be held on it
    worker = workers(extra_env={"LAB_STEP_SECONDS": "0.5"})
    await start_run(client, run_id, "Confirm the refund for order 1234", "ada@example.com", queue=task_queue)
    await poll_until(lambda: executions(worker, "record_outcome"), timeout=30,
                     what="record_outcome to start")
    holder = Proc("lock-holder", [sys.executable, "-c", HOLD, str(memory)])
    try:
        holder.wait_for_line("locked", timeout=10)
        status = await wait_closed(client, run_id)
        assert wait_exit(holder, 10) == 0
    finally:
        holder.kill()
    assert status["status"] == "completed", status
    step = status["steps"][2]
    assert (step["attempts"], step["crashes"]) == (1, 0), step
    assert executions(worker, "record_outcome") == 1
    # The memory write really waited for the lock, inside the step.
    line = next(x for x in worker.output().splitlines() if "step record_outcome completed" in x)
    assert float(line.rsplit(" in ", 1)[1].split()[0]) >= 2.0, line
