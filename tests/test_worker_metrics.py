"""The worker's Prometheus metrics (durable_agents/flowclient/metrics.py, LAB_METRICS_ADDRESS):
a real worker process serves the SDK's metrics; after one run, a scrape finds
its workflow-task and activity metrics; bad settings stop the worker clearly."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import httpx
import pytest

from durable_agents.flowclient.metrics import metrics_address
from durable_agents.flowclient.runs import start_run
from lab.processes import REPO, free_port
from tests.support import EMAIL, TASK, is_loopback, listening_addresses, poll_until, wait_closed


def _series(text: str, name: str, **labels: str) -> list[str]:
    """Sample lines of metric ``name`` whose labels include ``labels``."""
    found = []
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            found.append(line)
    return found


def _count(text: str, name: str, **labels: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in _series(text, f"{name}_count", **labels)
               or _series(text, name, **labels))


async def test_a_worker_serves_its_task_metrics_to_prometheus(client, workers, provider, run_id, task_queue):
    port = free_port()
    worker = workers(extra_env={"LAB_METRICS_ADDRESS": f"127.0.0.1:{port}"})
    url = f"http://127.0.0.1:{port}/metrics"
    assert f"worker metrics: {url}" in worker.output()
    seen = listening_addresses(worker.pid)
    assert ("127.0.0.1", port) in seen and all(is_loopback(a) for a, _ in seen), seen

    await start_run(client, run_id, "Confirm the refund for order 1234", EMAIL, queue=task_queue)
    assert (await wait_closed(client, run_id))["status"] == "completed"

    def scraped():
        text = httpx.get(url, timeout=5).text
        done = _count(text, "temporal_workflow_completed", task_queue=task_queue)
        return text if done >= 1 else None

    text = await poll_until(scraped, timeout=30, what=f"temporal_workflow_completed for {task_queue} at {url}")
    for step in ("draft", "send_confirmation", "record_outcome"):
        assert _count(text, "temporal_activity_execution_latency", task_queue=task_queue, activity_type=step) == 1, \
            _series(text, "temporal_activity_execution_latency_count")
    # Every workflow task of the run (no cache: each replays), at least one per step and the start.
    assert _count(text, "temporal_workflow_task_execution_latency", task_queue=task_queue) >= 4, \
        _series(text, "temporal_workflow_task_execution_latency_count")
    assert _series(text, "temporal_activity_schedule_to_start_latency_bucket", task_queue=task_queue)
    assert EMAIL not in text and TASK not in text  # labels are names, never payloads


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0.0.0.0:9464", "not a loopback address"),
        ("localhost:9464", "is not an IP address"),
        ("127.0.0.1", "has no port"),
        ("127.0.0.1:0", "the port must be 1 to 65535"),
        ("127.0.0.1:http", "the port must be 1 to 65535"),
    ],
)
def test_bad_addresses_are_refused_with_what_to_give(value, words):
    with pytest.raises(ValueError, match=words) as err:
        metrics_address({"LAB_METRICS_ADDRESS": value})
    assert "LAB_METRICS_ADDRESS" in str(err.value)


def test_addresses_accepted():
    assert metrics_address({}) is None and metrics_address({"LAB_METRICS_ADDRESS": " "}) is None
    assert metrics_address({"LAB_METRICS_ADDRESS": "127.0.0.1:9464"}) == "127.0.0.1:9464"
    assert metrics_address({"LAB_METRICS_ADDRESS": "[::1]:9464"}) == "[::1]:9464"
    assert metrics_address({"LAB_METRICS_ADDRESS": "0.0.0.0:9464", "LAB_METRICS_ALLOW_REMOTE": "1"}) == "0.0.0.0:9464"


def test_the_worker_stops_before_connecting_on_a_bad_or_busy_address(dev_server):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        for value, words in ((f"0.0.0.0:{taken}", "LAB_METRICS_ALLOW_REMOTE=1"),
                             (f"127.0.0.1:{taken}", "in use")):
            env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "LAB_METRICS_ADDRESS": value,
                   "MEMORY_DB": "off"}
            done = subprocess.run([sys.executable, "worker.py"], cwd=REPO, env=env, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 2, (value, done.stdout, done.stderr)
            assert re.search(rf"error: LAB_METRICS_ADDRESS.*{words}", done.stderr), done.stderr
            assert "worker ready" not in done.stdout
