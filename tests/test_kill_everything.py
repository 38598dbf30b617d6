"""Every process of a run killed at once: all are SIGKILLed together, mid-run,
and restarted on the same files and ports; the run completes and each effect
is applied exactly once.

This is not a power cut. A SIGKILL leaves the kernel's page cache alone, so
every write the processes made reaches the disk, synced or not; it shows that
the engines recover from losing every process, not what a machine that loses
power keeps. tests/test_power_cut.py cuts the power (lab/powercut.py: writes
never synced are lost).

Temporal: the dev server (history in a SQLite file, not the session's
in-memory server), the worker and the provider die together; the server comes
back on the same database file and port, the provider on the same store and
port (so PROVIDER_URL stays valid), then a fresh worker. The hand-rolled
engine: the runner and the provider die together and come back on the same
record and store.
"""

from __future__ import annotations

import sys
import uuid

import pytest

from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.runs import start_run
from durable_agents.runrecord import RunRecord
from durable_agents.runrecord.status import run_status as record_status
from durable_agents.steps.keys import idempotency_key
from lab.processes import DevServer, Proc, start_worker
from lab.provider_process import start_provider
from tests.support import (
    EMAIL,
    TASK,
    effects_by_key,
    executions,
    poll_until,
    wait_closed,
    wait_exit,
    wait_lease_expired,
)

pytestmark = pytest.mark.process

# Slow enough that "mid-run" lasts: the kill lands after the email, before the ticket.
PACE = {"LAB_STEP_SECONDS": "1.0"}


def email_applied(url: str, run_id: str) -> bool:
    e = effects_by_key(url, run_id).get(idempotency_key(run_id, "send_confirmation"))
    return bool(e and e.effects_applied == 1)


def assert_once_each(url: str, run_id: str) -> None:
    found = effects_by_key(url, run_id)
    assert set(found) == {idempotency_key(run_id, s) for s in ("send_confirmation", "record_outcome")}, found
    for effect in found.values():
        assert effect.effects_applied == 1, effect
        assert 1 <= effect.requests <= 2, effect  # a repeat after the kill is replayed, not applied


def assert_resumed_mid_run(status: dict, second: Proc, url: str, run_id: str) -> None:
    """The run completed; the process that resumed it did not run draft again and created the ticket once."""
    assert status["status"] == "completed", (status, second.output())
    assert executions(second, "draft") == 0, second.output()
    assert executions(second, "record_outcome") == 1, second.output()
    assert_once_each(url, run_id)


async def test_every_process_killed_at_once_temporal(tmp_path):
    run_id = f"kill-all-temporal-{uuid.uuid4().hex[:8]}"
    queue = f"tq-{uuid.uuid4().hex[:12]}"
    env = {"MEMORY_DB": str(tmp_path / "memory.db")}
    db = tmp_path / "temporal.db"
    procs: list[Proc] = []
    try:
        server = DevServer(db_file=db).start()
        procs.append(server.proc)
        provider = start_provider(tmp_path / "provider.db")
        url = provider.url
        procs.append(provider.proc)
        first = start_worker(server.address, url, queue, {**env, **PACE}, name="worker1")
        procs.append(first)
        client = await connect({"TEMPORAL_ADDRESS": server.address, "TEMPORAL_NAMESPACE": "default"})
        created, _ = await start_run(client, run_id, TASK, EMAIL, queue=queue)
        assert created

        await poll_until(lambda: email_applied(url, run_id), timeout=60, interval=0.05,
                         what="the provider to apply the email")
        mid_run = idempotency_key(run_id, "record_outcome") not in effects_by_key(url, run_id)
        # All three at once, no cleanup anywhere.
        for proc in (first, server.proc, provider.proc):
            proc.kill()
        assert mid_run, "the ticket was created before the kill: it did not land mid-run"

        # Back: same database file and port for the server, same store and port for the provider.
        server = DevServer(db_file=db, port=server.port).start()
        procs.append(server.proc)
        provider.restart()
        procs.append(provider.proc)
        assert provider.url == url
        second = start_worker(server.address, url, queue, env, name="worker2")
        procs.append(second)
        client = await connect({"TEMPORAL_ADDRESS": server.address, "TEMPORAL_NAMESPACE": "default"})

        status = await wait_closed(client, run_id, timeout=120)
        # The history survived the kill.
        assert_resumed_mid_run(status, second, url, run_id)
    finally:
        for proc in procs:
            proc.kill()


async def test_every_process_killed_at_once_runrecord(tmp_path):
    run_id = f"kill-all-record-{uuid.uuid4().hex[:8]}"
    db = tmp_path / "runrecord.db"
    procs: list[Proc] = []

    def runner(*args: str, extra: dict | None = None, provider_url: str) -> Proc:
        env = {"RUNRECORD_DB": str(db), "MEMORY_DB": str(tmp_path / "memory.db"), "PROVIDER_URL": provider_url,
               "PYTHONUNBUFFERED": "1", "RUNRECORD_LEASE_SECONDS": "0.5", **(extra or {})}
        proc = Proc(f"runrecord{len(procs)}", [sys.executable, "-m", "durable_agents.runrecord", *args], env=env)
        procs.append(proc)
        return proc

    try:
        provider = start_provider(tmp_path / "provider.db")
        url = provider.url
        procs.append(provider.proc)
        first = runner("start", run_id, TASK, "--email", EMAIL, extra=PACE, provider_url=url)
        await poll_until(lambda: email_applied(url, run_id), timeout=60, interval=0.05,
                         what="the provider to apply the email")
        mid_run = idempotency_key(run_id, "record_outcome") not in effects_by_key(url, run_id)
        for proc in (first, provider.proc):
            proc.kill()
        assert mid_run, "the ticket was created before the kill: it did not land mid-run"

        provider.restart()
        procs.append(provider.proc)
        assert provider.url == url

        await wait_lease_expired(db, run_id, timeout=30)
        second = runner("resume", run_id, provider_url=url)
        assert wait_exit(second, timeout=120) == 0, second.output()
        with RunRecord(db) as record:
            status = record_status(record, run_id)
        assert_resumed_mid_run(status, second, url, run_id)
    finally:
        for proc in procs:
            proc.kill()
