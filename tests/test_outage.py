"""Ride out an outage, on both engines, with the provider process really
stopped: a 30 s outage is ridden out (the budget is time, not a count); one
longer than a (shortened) budget ends FAILED naming the step, the budget and
the last error; ``retry`` once the provider is back completes the run, each
effect applied once, nothing completed run again."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from durable_agents.flowclient.runs import start_run
from durable_agents.flowclient.status import run_status
from durable_agents.providerclient import fetch_effects
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.retry import RetryRule
from lab.processes import REPO, Proc, start_worker
from tests.support import EMAIL, TASK, executions, poll_until, wait_exit


@pytest.fixture
def api(provider):
    """The test's provider (conftest), which the test kills and starts again on the same port and database."""
    return provider


@pytest.fixture
def processes():
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


def record_cli(api, tmp_path, *args, env=None) -> Proc:
    full = {"RUNRECORD_DB": str(tmp_path / "runrecord.db"), "MEMORY_DB": str(tmp_path / "memory.db"),
            "PROVIDER_URL": api.url, "PYTHONUNBUFFERED": "1", **(env or {})}
    return Proc("runrecord", [sys.executable, "-m", "durable_agents.runrecord", *args], env=full)


def record_status(api, tmp_path, run_id) -> dict | None:
    """The record's status JSON, or None while the run does not exist yet."""
    proc = record_cli(api, tmp_path, "status", run_id, "--json")
    if wait_exit(proc) == 2 and "no run with id" in proc.output():
        return None
    return json.loads(proc.output())


def applied(api, run_id: str) -> dict[str, tuple[int, int]]:
    return {e.key.rsplit("/", 1)[-1]: (e.requests, e.effects_applied) for e in fetch_effects(api.url, run_id=run_id)}


async def test_a_30_second_outage_is_ridden_out_on_both_engines(client, dev_server, api, processes, tmp_path):
    queue = f"outage-{uuid.uuid4().hex[:8]}"
    processes.append(start_worker(dev_server.address, api.url, queue, {"MEMORY_DB": str(tmp_path / "memory.db")}))
    temporal_id, record_id = f"outage-t-{uuid.uuid4().hex[:6]}", f"outage-r-{uuid.uuid4().hex[:6]}"
    api.kill()
    down = time.monotonic()
    await start_run(client, temporal_id, TASK, EMAIL, queue=queue)
    record = record_cli(api, tmp_path, "start", record_id, TASK, "--email", EMAIL)
    processes.append(record)

    async def both_retrying():
        t = (await run_status(client, temporal_id))["steps"][1]
        r = (record_status(api, tmp_path, record_id) or {"steps": [{}, {"status": None}]})["steps"][1]
        # Retrying with its next try due: between a failed attempt and the timer the workflow starts for the
        # next one, Temporal's status honestly says retrying with no due time yet (durable_agents.flowclient.status).
        due = all(s["status"] == "retrying" and s.get("next_try_at") for s in (t, r))
        return (t, r) if due else None

    t, r = await poll_until(both_retrying, timeout=20, what="both engines to be retrying send_confirmation")
    for step in (t, r):
        assert "unreachable" in step["last_error"] and step["next_try_at"], step
    await asyncio.sleep(max(0.0, 30 - (time.monotonic() - down)))  # the outage itself, not a wait for state
    api.restart()

    async def temporal_closed():
        status = await run_status(client, temporal_id)
        return status if status["status"] != "running" else None

    status = await poll_until(temporal_closed, timeout=90, what="the Temporal run to finish after the outage")
    assert status["status"] == "completed", status
    assert wait_exit(record, 90) == 0, record.output()
    assert record_status(api, tmp_path, record_id)["status"] == "completed"
    for run_id in (temporal_id, record_id):
        effects = applied(api, run_id)
        assert effects["send_confirmation"][1] == 1 and effects["record_outcome"] == (1, 1), (run_id, effects)
    # The budget is time: several attempts were refused, none counted as the step's end.
    assert status["steps"][1]["attempts"] >= 5


async def test_outage_past_the_budget_fails_and_retry_completes_on_both_engines(
        client, dev_server, api, processes, tmp_path):
    queue = f"outage-{uuid.uuid4().hex[:8]}"
    worker = start_worker(dev_server.address, api.url, queue, {"MEMORY_DB": str(tmp_path / "memory.db")})
    processes.append(worker)
    temporal_id, record_id = f"budget-t-{uuid.uuid4().hex[:6]}", f"budget-r-{uuid.uuid4().hex[:6]}"
    api.kill()
    await start_run(client, temporal_id, TASK, EMAIL, queue=queue, rule=RetryRule(budget_seconds=3))
    record = record_cli(api, tmp_path, "start", record_id, TASK, "--email", EMAIL,
                        env={"LAB_RETRY_BUDGET_SECONDS": "3"})
    processes.append(record)

    async def temporal_closed():
        status = await run_status(client, temporal_id)
        return status if status["status"] != "running" else None

    failed = await poll_until(temporal_closed, timeout=60, what="the Temporal run to fail")
    assert wait_exit(record, 60) == 1, record.output()
    record_failed = record_status(api, tmp_path, record_id)
    for status in (failed, record_failed):
        assert status["status"] == "failed" and status["current_step"] == "send_confirmation", status
        # Connection refused: the request never left, so nothing is in doubt.
        assert status["steps"][1]["status"] == "failed", status
        assert "step send_confirmation failed after" in status["error"]
        assert "retry budget of 3 s spent" in status["error"] and "unreachable" in status["error"], status["error"]

    api.restart()
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "PROVIDER_URL": api.url}
    retried = subprocess.run([sys.executable, "starter.py", "retry", temporal_id, "--wait"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "retrying run" in retried.stdout and "at step send_confirmation" in retried.stdout
    again = record_cli(api, tmp_path, "retry", record_id)
    processes.append(again)
    assert wait_exit(again, 60) == 0, again.output()
    assert executions(again, "draft") == 0

    done = await run_status(client, temporal_id)
    assert done["status"] == "completed" and done["steps"][0] == failed["steps"][0]  # draft not run again
    assert executions(worker, "draft") == 1
    for run_id in (temporal_id, record_id):
        effects = applied(api, run_id)
        assert effects["send_confirmation"] == (1, 1) and effects["record_outcome"] == (1, 1), (run_id, effects)
        assert idempotency_key(run_id, "send_confirmation").endswith(f"{run_id}/send_confirmation")

    # A completed run cannot be retried, on either engine.
    twice = subprocess.run([sys.executable, "starter.py", "retry", temporal_id], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60)
    assert twice.returncode == 2 and "a completed run cannot be retried" in twice.stderr, twice
    twice = record_cli(api, tmp_path, "retry", record_id)
    processes.append(twice)
    assert wait_exit(twice) == 2 and "a completed run cannot be retried" in twice.output()


async def test_a_timed_out_run_names_its_step_and_retry_finishes_it(client, dev_server, workers, provider, run_id,
                                                                    task_queue):
    """The execution timeout is the backstop (the starter sets it above the step
    budgets; here it is forced short): a run that reaches it says at which step,
    and `starter.py retry` restarts it there."""
    from datetime import timedelta

    from durable_agents.workflows.agent_flow import WORKFLOW_NAME, FlowInput

    slow = workers(extra_env={"LAB_STEP_SECONDS": "4"})
    await client.start_workflow(WORKFLOW_NAME, FlowInput(run_id=run_id, task=TASK, email=EMAIL), id=run_id,
                                task_queue=task_queue, execution_timeout=timedelta(seconds=2),
                                task_timeout=timedelta(seconds=2))

    async def closed():
        status = await run_status(client, run_id)
        return status if status["status"] != "running" else None

    status = await poll_until(closed, timeout=30, what="the run to time out")
    assert status["status"] == "failed" and "the run timed out at step draft" in status["error"], status
    slow.kill()
    workers()
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address}
    retried = subprocess.run([sys.executable, "starter.py", "retry", run_id, "--wait"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=120)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert (await run_status(client, run_id))["status"] == "completed"
    assert all(e.effects_applied == 1 for e in fetch_effects(provider.url, run_id=run_id))
