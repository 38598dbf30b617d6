"""``make example``: the scheduler agent (``examples.scheduler.agent``), an agent from outside the lab, killed
right after it booked a room and resumed, on Temporal and on the run record; each effect once at its own
service.

It starts everything itself, in a temporary directory: a Temporal dev server, the scheduler's service
(``examples.scheduler.service``: real HTTP, its own SQLite, one booking per ``Idempotency-Key``), and the
engines' processes, each given the agent by import string only (``worker.py --agent``, ``python -m
durable_agents.runrecord loop --agent``): nothing of the lab names it. On each engine, the process running the run is
armed with ``CRASH_AT=tool:book_room:after_effect`` and dies by SIGKILL after the service applied the booking and before
the call's result was recorded; a fresh process (a standby worker; ``runrecord resume RUN_ID``) finishes
the run; the booking's retry asks the service by its key first (the tool's lookup), finds it applied and
takes its answer, sending nothing again. Then the service's counts per key: each key applied once and
requested once, the booking's looked up once. Prints PASS lines;
exit code 0 only if every check passes.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.loop import start_loop
from examples.scheduler.agent import AGENT
from examples.scheduler.client import SchedulerClient
from lab.processes import REPO, DevServer, Proc, free_port, start_worker

SPEC = "examples.scheduler.agent:AGENT"
POINT = "tool:book_room:after_effect"
TASK = "Book a room on 2027-01-12 for the planning meeting and invite the attendee."
ATTENDEE = "ana@example.com"


def check(ok: bool, what: str, failures: list[str]) -> None:
    print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        failures.append(what)


async def judge(url: str, run_id: str, engine: str, failures: list[str]) -> None:
    """The service's counts for this run's keys: each applied once and sent once; the killed booking's looked up
    once by its retry (the tool's lookup), which took its answer instead of sending it again."""
    client = SchedulerClient(url)
    try:
        counts = await client.counts()
    finally:
        await client.aclose()
    keys = [k for k in counts["applied"] if f"/{run_id}/" in k]
    looked = counts["lookups"]
    for key in keys:
        print(f"  {engine}: {key}: applied {counts['applied'][key]}, requests {counts['requests'][key]}, "
              f"lookups {looked.get(key, 0)}")
    check(len(keys) == 2 and all(counts["applied"][k] == 1 and counts["requests"][k] == 1 for k in keys),
          f"{engine}: the booking and the invite sent and applied once each under their keys", failures)
    check(sorted(looked.get(k, 0) for k in keys) == [0, 1],
          f"{engine}: the booking, whose answer died with its process, was looked up by its key and not sent "
          "again", failures)


async def on_temporal(server: DevServer, env: dict[str, str], url: str, failures: list[str],
                      started: list[Proc]) -> None:
    queue, run_id = "scheduler-example", f"scheduler-{int(time.time())}"
    first = start_worker(server.address, "http://127.0.0.1:9", queue, {**env, "CRASH_AT": POINT},
                         ["--agent", SPEC], name="worker1")
    started.append(first)
    client = await connect({"TEMPORAL_ADDRESS": server.address, "TEMPORAL_NAMESPACE": "default"})
    await start_loop(client, run_id, TASK, task_queue=queue, agent=AGENT, params={"attendee": ATTENDEE})
    check(first.wait(60) == -9, f"temporal: the worker died by SIGKILL at {POINT}", failures)
    started.append(start_worker(server.address, "http://127.0.0.1:9", queue, env, ["--agent", SPEC],
                                name="worker2"))
    result: dict[str, Any] = await asyncio.wait_for(client.get_workflow_handle(run_id).result(), 60)
    check(result["status"] == "completed", f"temporal: the standby worker finished the run: {result['answer']!r}",
          failures)
    await judge(url, run_id, "temporal", failures)


async def on_the_run_record(state: Path, env: dict[str, str], url: str, failures: list[str],
                            started: list[Proc]) -> None:
    run_id = f"scheduler-record-{int(time.time())}"
    full = {**env, "RUNRECORD_DB": str(state / "runrecord.db"), "PROVIDER_URL": "http://127.0.0.1:9"}
    first = Proc("runrecord1", [sys.executable, "-m", "durable_agents.runrecord", "loop", run_id, TASK, "--agent", SPEC,
                                "--param", f"attendee={ATTENDEE}"], env={**full, "CRASH_AT": POINT}, cwd=REPO)
    started.append(first)
    check(first.wait(60) == -9, f"run record: the process died by SIGKILL at {POINT}", failures)
    second = Proc("runrecord2", [sys.executable, "-m", "durable_agents.runrecord", "resume", run_id], env=full,
                  cwd=REPO)
    started.append(second)
    check(second.wait(60) == 0, "run record: resume RUN_ID finished the run (the agent read from the record)",
          failures)
    await judge(url, run_id, "run record", failures)


async def main() -> int:
    failures: list[str] = []
    started: list[Proc] = []  # every process this demo starts: killed at the end, whatever failed
    with tempfile.TemporaryDirectory(prefix="scheduler-example-") as tmp:
        state = Path(tmp)
        port = free_port()
        service = Proc("scheduler", [sys.executable, "-m", "examples.scheduler.service", "--db",
                                     str(state / "scheduler.db"), "--port", str(port)], cwd=REPO)
        started.append(service)
        try:
            server = DevServer().start()
        except BaseException:
            service.kill()
            raise
        try:
            service.wait_for_line("scheduler listening", timeout=30)
            url = f"http://127.0.0.1:{port}"
            env = {"SCHEDULER_URL": url, "MEMORY_DB": str(state / "memory.db")}
            await on_temporal(server, env, url, failures, started)
            await on_the_run_record(state, env, url, failures, started)
        finally:
            for proc in started:
                proc.kill()
            server.stop()
    print("all checks passed" if not failures else f"{len(failures)} check(s) failed", flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
