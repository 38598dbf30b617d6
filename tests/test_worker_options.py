"""What ``python worker.py`` runs with, shown by the worker process itself:
at most its activity slots at once, the client of an OpenAI-compatible model
imported before it polls (and never by a worker that does not need it), the
shutdown grace it is given; and the operational variables refused with a
message that names them (docs/operations.md)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType

from durable_agents.flowclient.runs import execution_timeout, parking_window, start_run, workflow_task_timeout
from durable_agents.flowclient.worker_options import (
    CACHED_STICKY_TIMEOUT,
    GRACEFUL_SHUTDOWN,
    MAX_CONCURRENT_ACTIVITIES,
    graceful_shutdown_timeout,
    worker_options,
)
from lab.processes import REPO
from tests.fake_openai_server import FakeOpenAIServer
from tests.support import executions, poll_until, wait_closed, wait_exit

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"
STEP_LINE = re.compile(r"step (\w+) (started|completed|failed): run (\S+) attempt (\d+)")


def test_the_options_default_to_the_lab_values_and_take_the_environment():
    assert worker_options(env={})["max_concurrent_activities"] == MAX_CONCURRENT_ACTIVITIES
    assert worker_options(env={})["sticky_queue_schedule_to_start_timeout"] == CACHED_STICKY_TIMEOUT
    assert graceful_shutdown_timeout({}) == GRACEFUL_SHUTDOWN
    assert workflow_task_timeout({}) == timedelta(seconds=2)
    assert parking_window({}) == timedelta(hours=24)

    env = {"LAB_MAX_CONCURRENT_ACTIVITIES": "7", "LAB_STICKY_TIMEOUT_SECONDS": "5",
           "LAB_GRACEFUL_SHUTDOWN_SECONDS": "65", "LAB_WORKFLOW_TASK_TIMEOUT_SECONDS": "10",
           "LAB_PARKING_WINDOW_SECONDS": "604800"}
    options = worker_options(env=env)
    assert options["max_concurrent_activities"] == 7
    assert options["sticky_queue_schedule_to_start_timeout"] == timedelta(seconds=5)
    assert "sticky_queue_schedule_to_start_timeout" not in worker_options(cache=0, env=env)  # no cache, no sticky queue
    assert graceful_shutdown_timeout(env) == timedelta(seconds=65)
    assert graceful_shutdown_timeout({"LAB_GRACEFUL_SHUTDOWN_SECONDS": "0"}) == timedelta(0)
    assert workflow_task_timeout(env) == timedelta(seconds=10)
    # The parking window is what the execution timeout adds to the budgets.
    assert execution_timeout(env=env) - execution_timeout(env={}) == timedelta(days=7) - timedelta(hours=24)


@pytest.mark.parametrize(("name", "value", "says"), [
    ("LAB_MAX_CONCURRENT_ACTIVITIES", "0", "a whole number from 1 to 1000; unset, it is"),
    ("LAB_MAX_CONCURRENT_ACTIVITIES", "2.5", "a whole number from 1 to 1000"),
    ("LAB_STICKY_TIMEOUT_SECONDS", "0", "more than 0 and at most 600; unset, it is 0.1"),
    ("LAB_STICKY_TIMEOUT_SECONDS", "nan", "more than 0 and at most 600"),
    ("LAB_GRACEFUL_SHUTDOWN_SECONDS", "-1", "from 0 to 3600; unset, it is 5"),
    ("LAB_WORKFLOW_TASK_TIMEOUT_SECONDS", "121", "more than 0 and at most 120; unset, it is 2"),
    ("LAB_PARKING_WINDOW_SECONDS", "1 day", "from 0 to 2592000; unset, it is 86400"),
])
def test_a_bad_value_is_refused_naming_the_variable(name, value, says):
    def read() -> object:
        env = {name: value}
        return (worker_options(env=env), graceful_shutdown_timeout(env), workflow_task_timeout(env),
                parking_window(env))

    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r} must be ") + ".*" + re.escape(says)):
        read()


@pytest.mark.process
def test_a_bad_setting_stops_the_worker_before_it_connects():
    # Nothing listens on port 9: had the worker got as far as connecting, it would say so instead.
    env = {**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:9", "LAB_MAX_CONCURRENT_ACTIVITIES": "lots"}
    done = subprocess.run([sys.executable, "worker.py"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: LAB_MAX_CONCURRENT_ACTIVITIES='lots' must be a whole number" in done.stderr, done.stderr


def most_at_once(output: str) -> int:
    """The most attempts a worker ran at the same time, from its step lines in the order it printed them."""
    running: set[tuple[str, str, str]] = set()
    most = 0
    for line in output.splitlines():
        found = STEP_LINE.search(line)
        if not found:
            continue
        step, what, run, attempt = found.groups()
        if what == "started":
            running.add((run, step, attempt))
            most = max(most, len(running))
        else:
            running.discard((run, step, attempt))
    return most


async def test_the_worker_runs_no_more_attempts_at_once_than_its_activity_slots(client, workers, task_queue, run_id):
    """Four runs at once, every step paced to 0.5 s, two slots: never more than two
    attempts run in the worker at one time (and two do: the slots are used)."""
    worker = workers(extra_env={"LAB_MAX_CONCURRENT_ACTIVITIES": "2", "LAB_STEP_SECONDS": "0.5"})
    assert "activity slots 2," in worker.output()
    runs = [f"{run_id}-{i}" for i in range(4)]
    for i, run in enumerate(runs):
        await start_run(client, run, f"Confirm the refund for order {i}", EMAIL, queue=task_queue)
    for run in runs:
        status = await wait_closed(client, run, timeout=120)
        assert status["status"] == "completed", status
    assert executions(worker, "record_outcome") == 4
    assert most_at_once(worker.output()) == 2, worker.output()


def test_most_at_once_reads_overlapping_attempts():
    """The reading the slot test relies on, on lines as the worker prints them."""
    lines = ["step draft started: run a attempt 1", "step draft started: run b attempt 1",
             "step draft completed: run a attempt 1 in 0.5 s", "step draft started: run c attempt 1",
             "step draft failed: run b attempt 1 after 0.5 s: X", "step draft completed: run c attempt 1 in 0.5 s"]
    assert most_at_once("\n".join(lines)) == 2
    assert most_at_once("\n".join(lines[:2])) == 2


def imports_before_ready(log: str) -> tuple[list[str], bool]:
    """From a worker's output under ``-X importtime``: the top-level packages it imported
    before "worker ready", and whether it printed that line."""
    before, _, _ = log.partition("worker ready")
    names = [m.group(1).split(".")[0] for m in re.finditer(r"^import time:.*\|\s*(\S+)\s*$", before, re.M)]
    return names, "worker ready" in log


def ready_imports(log) -> list[str] | None:
    """The packages imported before "worker ready", once the log has that line."""
    names, ready = imports_before_ready(log.read_text())
    return names if ready else None


def start_importtime_worker(dev_server, provider, task_queue, tmp_path, name: str, extra: dict) -> tuple:
    """worker.py under PYTHONPROFILEIMPORTTIME, its output (importtime's lines go to stderr)
    in a file: a worker prints more import lines than a Proc keeps."""
    log = tmp_path / f"{name}.log"
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TEMPORAL_NAMESPACE": "default",
           "TASK_QUEUE": task_queue, "PROVIDER_URL": provider.url, "PYTHONUNBUFFERED": "1",
           "MEMORY_DB": str(tmp_path / "memory.db"), "PYTHONPROFILEIMPORTTIME": "1", **extra}
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "worker.py"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out.close()
    return proc, log


async def test_a_worker_with_a_model_imports_its_client_before_polling_and_one_without_never(
        dev_server, provider, task_queue, tmp_path):
    """A worker configured with an OpenAI-compatible model has imported ``openai`` when it
    prints "worker ready" (it polls only after), so no draft pays the import on the loop
    that heartbeats; a worker with the offline model never imports it. (A process that
    only builds the model does not either: tests/test_drafting.py.)"""
    procs = []
    try:
        with FakeOpenAIServer() as model:
            for name, extra in (("offline", {}), ("openai", {"LLM_BASE_URL": model.base_url, "LLM_MODEL": "m"})):
                procs.append((name, *start_importtime_worker(dev_server, provider, task_queue, tmp_path, name,
                                                             extra)))
            seen = {}
            for name, proc, log in procs:
                seen[name] = await poll_until(lambda log=log: ready_imports(log), timeout=60,
                                              what=f"the {name} worker to be ready")
                assert proc.poll() is None, log.read_text()[-3000:]
            assert model.request_count == 0  # loaded, not asked
    finally:
        for _, proc, _ in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert "openai" in seen["openai"]
    assert "openai" not in seen["offline"]


async def test_a_stopping_worker_lets_a_running_attempt_finish_within_its_grace(
        client, workers, dev_server, provider, task_queue, run_id):
    """SIGTERM while a 6 s draft runs, grace 30 s: the attempt completes on the stopping
    worker (with the lab's 5 s grace it would be cut as WorkerShutdown and run again), the
    worker exits, and a second worker finishes the run without drafting again."""
    stopping = workers(extra_env={"LAB_STEP_SECONDS": "6", "LAB_GRACEFUL_SHUTDOWN_SECONDS": "30"})
    assert "shutdown grace 30 s" in stopping.output()
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    await poll_until(lambda: "step draft started" in stopping.output(), timeout=30, what="the draft to start")
    stopping.popen.send_signal(signal.SIGTERM)
    assert wait_exit(stopping, 30) == 0, stopping.output()
    assert "worker stopping (finishing in-flight activities, up to 30 s)" in stopping.output()
    assert "step draft completed" in stopping.output(), stopping.output()
    finisher = workers()
    status = await wait_closed(client, run_id, timeout=60)
    assert status["status"] == "completed", status
    assert executions(finisher, "draft") == 0
    history = await client.get_workflow_handle(run_id).fetch_history()
    failed = [e for e in history.events if e.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
                                                            EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT)]
    assert failed == [], failed
