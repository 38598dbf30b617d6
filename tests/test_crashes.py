"""Crashes are not errors, on both engines, with real processes killed by
SIGKILL: a step survives ten deaths of the process running it (they spend no
error budget); a poison pill (a step that kills its process every time)
still ends FAILED, naming the deaths; and an attempt that hangs on a live
process until its timeout is an error, not a crash."""

from __future__ import annotations

import json
import sys

from durable_agents.flowclient.runs import start_run
from durable_agents.providerclient import fetch_effects
from durable_agents.steps.retry import RetryRule
from lab.processes import Proc
from tests.support import EMAIL, TASK, executions, wait_closed, wait_exit


async def test_temporal_step_survives_ten_worker_deaths(client, workers, provider, run_id, task_queue):
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    for n in range(10):
        dying = workers(crash_at="draft:before")
        assert wait_exit(dying, 60) == -9, (n, dying.output())
    workers()
    status = await wait_closed(client, run_id, timeout=90)
    assert status["status"] == "completed", status
    draft = status["steps"][0]
    assert (draft["attempts"], draft["crashes"]) == (11, 10), draft
    assert all(e.effects_applied == 1 and e.requests == 1 for e in fetch_effects(provider.url, run_id=run_id))


async def test_temporal_poison_pill_ends_failed_naming_the_deaths(client, workers, provider, run_id, task_queue):
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue, rule=RetryRule(max_worker_deaths=2))
    for n in range(3):
        dying = workers(crash_at="send_confirmation:before")
        assert wait_exit(dying, 60) == -9, (n, dying.output())
    # A healthy worker runs the workflow task that reads the third death, and decides.
    healthy = workers()
    status = await wait_closed(client, run_id, timeout=60)
    assert "step send_confirmation started" not in healthy.output()
    assert status["status"] == "failed", status
    assert "worker died 3 times during send_confirmation" in status["error"], status["error"]
    step = status["steps"][1]
    assert step["crashes"] == 3 and step["attempts"] == 3
    # Killed mid-effect: whether the email went out is unknown, and said so.
    assert step["status"] == "in_doubt", step


async def test_temporal_hang_on_a_live_worker_is_an_error_not_a_crash(client, workers, provider, run_id, task_queue):
    worker = workers(extra_env={"LAB_STEP_SECONDS": "3"})
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue,
                    rule=RetryRule(attempt_timeout=1.5, budget_seconds=4))
    status = await wait_closed(client, run_id, timeout=60)
    assert status["status"] == "failed", status
    draft = status["steps"][0]
    assert draft["crashes"] == 0 and draft["attempts"] >= 2, draft
    assert "retry budget of 4 s spent" in status["error"]
    assert "timed out after 1.5 s on a live worker (start-to-close)" in status["error"], status["error"]
    assert worker.alive()


def _runner(provider, tmp_path, *args, crash_at=None, env=None) -> Proc:
    full = {"RUNRECORD_DB": str(tmp_path / "runrecord.db"), "MEMORY_DB": str(tmp_path / "memory.db"),
            "PROVIDER_URL": provider.url, "PYTHONUNBUFFERED": "1", **(env or {})}
    if crash_at:
        full["CRASH_AT"] = crash_at
    return Proc("runrecord", [sys.executable, "-m", "durable_agents.runrecord", *args], env=full)


def _status(provider, tmp_path, run_id) -> dict:
    proc = _runner(provider, tmp_path, "status", run_id, "--json")
    wait_exit(proc)
    return json.loads(proc.output())


def test_record_step_survives_ten_process_deaths(provider, tmp_path, run_id):
    procs = [_runner(provider, tmp_path, "start", run_id, TASK, "--email", EMAIL, crash_at="draft:before")]
    try:
        assert wait_exit(procs[-1], 60) == -9
        for n in range(9):
            procs.append(_runner(provider, tmp_path, "resume", run_id, crash_at="draft:before"))
            assert wait_exit(procs[-1], 60) == -9, (n, procs[-1].output())
        procs.append(_runner(provider, tmp_path, "resume", run_id))
        assert wait_exit(procs[-1], 60) == 0, procs[-1].output()
    finally:
        for proc in procs:
            proc.kill()
    draft = _status(provider, tmp_path, run_id)["steps"][0]
    assert (draft["status"], draft["attempts"], draft["crashes"]) == ("completed", 11, 10), draft


def test_record_poison_pill_ends_failed_naming_the_deaths(provider, tmp_path, run_id):
    env = {"LAB_MAX_WORKER_DEATHS": "2"}
    procs = [_runner(provider, tmp_path, "start", run_id, TASK, "--email", EMAIL, crash_at="draft:before", env=env)]
    try:
        assert wait_exit(procs[-1], 60) == -9
        for _ in range(2):
            procs.append(_runner(provider, tmp_path, "resume", run_id, crash_at="draft:before"))
            assert wait_exit(procs[-1], 60) == -9, procs[-1].output()
        procs.append(_runner(provider, tmp_path, "resume", run_id))
        assert wait_exit(procs[-1], 60) == 1, procs[-1].output()
        assert "worker died 3 times during draft" in procs[-1].output()
        assert executions(procs[-1], "draft") == 0
    finally:
        for proc in procs:
            proc.kill()
    status = _status(provider, tmp_path, run_id)
    assert status["status"] == "failed" and status["steps"][0]["crashes"] == 3


def test_record_hang_is_an_error_not_a_crash(provider, tmp_path, run_id):
    env = {"LAB_STEP_SECONDS": "2", "LAB_ATTEMPT_TIMEOUT_SECONDS": "1", "LAB_RETRY_BUDGET_SECONDS": "3"}
    proc = _runner(provider, tmp_path, "start", run_id, TASK, "--email", EMAIL, env=env)
    try:
        assert wait_exit(proc, 60) == 1, proc.output()
    finally:
        proc.kill()
    status = _status(provider, tmp_path, run_id)
    draft = status["steps"][0]
    assert draft["crashes"] == 0 and draft["attempts"] >= 2, draft
    assert "retry budget of 3 s spent" in status["error"] and "timed out after 1 s" in status["error"]
