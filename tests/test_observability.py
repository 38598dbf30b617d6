"""Observability: log lines with run, step, attempt and duration; OpenTelemetry
spans per step (in-memory exporter, and LAB_OTEL=console in a worker process);
the starter's UI link and its live table in a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time

import pytest

from durable_agents.flowclient.runs import start_run
from lab.processes import REPO
from tests.support import EMAIL, TASK, wait_closed


async def test_log_lines_carry_run_step_attempt_and_duration(client, workers, provider, run_id, task_queue):
    from durable_agents.providerclient import ProviderClient

    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(fail_next=1, status=503, kinds=["email"])
    worker = workers()
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    assert (await wait_closed(client, run_id))["status"] == "completed"
    out = worker.output()
    for step in ("draft", "record_outcome"):
        assert f"step {step} started: run {run_id} attempt 1" in out
        assert re.search(rf"step {step} completed: run {re.escape(run_id)} attempt 1 in \d+\.\d{{3}} s", out), out
    assert re.search(rf"step send_confirmation failed: run {re.escape(run_id)} attempt 1 after \d+\.\d{{3}} s: "
                     r"TransientError", out), out
    assert re.search(rf"step send_confirmation completed: run {re.escape(run_id)} attempt 2 in", out), out


async def test_one_span_per_step_with_an_in_memory_exporter(dev_server, provider, task_queue, run_id):
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra: pip install -e '.[dev]'")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from temporalio.worker import Worker

    from durable_agents.activities import FlowActivities
    from durable_agents.flowclient.connect import connect, tracing_interceptors
    from durable_agents.wiring import deps_from_env
    from durable_agents.workflows.agent_flow import AgentFlow

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    interceptors = tracing_interceptors({}, tracer_provider=tracer_provider)
    client = await connect({"TEMPORAL_ADDRESS": dev_server.address}, interceptors=interceptors)
    deps = deps_from_env({"PROVIDER_URL": provider.url, "MEMORY_DB": "off"})
    async with Worker(client, task_queue=task_queue, workflows=[AgentFlow],
                      activities=FlowActivities(deps).all(), max_cached_workflows=0):
        await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
        status = await wait_closed(client, run_id)
    await deps.provider.aclose()
    assert status["status"] == "completed", status
    spans = exporter.get_finished_spans()
    names = [s.name for s in spans]
    for step in ("draft", "send_confirmation", "record_outcome"):
        assert names.count(f"RunActivity:{step}") == 1, names
    [start] = [s for s in spans if s.name == "StartWorkflow:AgentFlow"]
    # One trace: the starter's span is the root of every step's span.
    assert {s.context.trace_id for s in spans if s.name.startswith("RunActivity:")} == {start.context.trace_id}


def test_lab_otel_console_prints_step_spans_from_the_worker_process(dev_server, workers, provider, task_queue, run_id):
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra: pip install -e '.[dev]'")
    worker = workers(extra_env={"LAB_OTEL": "console", "OTEL_SERVICE_NAME": "lab-worker-test"})
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue}
    done = subprocess.run([sys.executable, "starter.py", "start", run_id, TASK, "--email", EMAIL, "--wait"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 30
    while "RunActivity:record_outcome" not in worker.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    out = worker.output()
    for step in ("draft", "send_confirmation", "record_outcome"):
        assert f'"name": "RunActivity:{step}"' in out, out[-3000:]
    assert "lab-worker-test" in out


def test_bad_lab_otel_is_refused(dev_server):
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "LAB_OTEL": "jaeger"}
    done = subprocess.run([sys.executable, "starter.py", "status", "x"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "LAB_OTEL='jaeger'" in done.stderr, done.stderr


def test_starter_prints_the_ui_link_and_keeps_the_json_shape(dev_server, workers, provider, run_id, task_queue):
    workers()
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue}
    env.pop("TEMPORAL_UI_URL", None)
    done = subprocess.run([sys.executable, "starter.py", "start", run_id, TASK, "--email", EMAIL, "--wait"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"http://localhost:8233/namespaces/default/workflows/{run_id}" in done.stdout
    custom = subprocess.run([sys.executable, "starter.py", "status", run_id], cwd=REPO, text=True,
                            env={**env, "TEMPORAL_UI_URL": "http://ui.example:8080/"}, capture_output=True, timeout=60)
    assert f"http://ui.example:8080/namespaces/default/workflows/{run_id}" in custom.stdout
    shown = subprocess.run([sys.executable, "starter.py", "watch", run_id, "--json"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60)
    status = json.loads(shown.stdout)
    assert set(status) == {"run_id", "status", "current_step", "steps", "error", "detail"}
    assert "http" not in shown.stdout  # --json prints the JSON and nothing else


def _run_in_terminal(argv: list[str], env: dict, timeout: float = 120.0) -> tuple[int, str]:
    """Run argv with a pseudo-terminal as stdout; return (exit code, everything it wrote)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, cwd=REPO, env={**env, "COLUMNS": "140", "TERM": "xterm"},
                            stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


def test_start_wait_in_a_terminal_shows_a_live_table(dev_server, workers, provider, run_id, task_queue):
    workers(extra_env={"LAB_STEP_SECONDS": "0.3"})
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue}
    code, out = _run_in_terminal([sys.executable, "starter.py", "start", run_id, TASK, "--email", EMAIL, "--wait"], env)
    assert code == 0, out
    assert "\x1b[" in out, "no terminal control sequences: the live table did not render"
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    assert f"run {run_id}: completed" in plain, plain[-2000:]
    assert "running" in plain  # a step was shown while in progress, then the table moved on
    assert f"/namespaces/default/workflows/{run_id}" in plain


async def test_the_ui_shows_the_current_step_and_no_run_data(client, dev_server, workers, provider, run_id, task_queue):
    """What the Temporal UI shows as a run's current details, read as an operator would
    (``temporal workflow metadata``, the query the UI makes): the step, where it stands and its
    attempt while the run is open, then that it completed; never the task or the address, which
    may be personal data and are encrypted everywhere else when the codec is on."""
    from lab.processes import temporal_cli

    workers(extra_env={"LAB_STEP_SECONDS": "1"})  # each step takes ~1 s, time enough to look
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    seen: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        shown = subprocess.run([temporal_cli(), "workflow", "metadata", "-w", run_id, "--address",
                                dev_server.address], capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0, shown.stderr
        assert TASK not in shown.stdout and EMAIL not in shown.stdout, shown.stdout
        found = re.search(r"step \d of 3, \w+: \w+ \(attempt \d+\)|completed: every step done", shown.stdout)
        if found and found.group() not in seen:
            seen.append(found.group())
        if "completed: every step done" in shown.stdout:
            break
        time.sleep(0.2)
    assert seen[-1:] == ["completed: every step done"], seen
    for expected in ("step 1 of 3, draft: running (attempt 1)",
                     "step 2 of 3, send_confirmation: running (attempt 1)",
                     "step 3 of 3, record_outcome: running (attempt 1)"):
        assert expected in seen, seen
