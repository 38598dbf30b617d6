"""The restart that is a deploy. An incompatible change to the workflow code
(here: a timer inserted before the email, where the recorded history has the
email's activity) is deployed as a real checkout of its own while runs wait
between steps. Those runs are parked, not failed: ``starter.py status`` says
which task fails, the error and since when (exit 3). Rolling back lets them
complete, with no effect applied twice. The same incompatible code fails the
Replayer within seconds, on the worker's own runner."""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from durable_agents.flowclient.runs import start_run
from durable_agents.flowclient.status import run_status
from durable_agents.flowclient.worker_options import worker_options
from durable_agents.providerclient import fetch_effects
from lab.processes import REPO, Proc
from tests.support import EMAIL, TASK, executions, poll_until, wait_exit

# What the incompatible deploy changes: a new timer before the email, where
# every run already past the draft has the email's activity in its history.
ORIGINAL = "        sent = await self._attempts("
INCOMPATIBLE = "        await workflow.sleep(0.01)  # the incompatible change\n" + ORIGINAL
PACKAGES = ("durable_agents", "provider")


def incompatible_checkout(root: Path) -> Path:
    """A copy of the code a worker runs, with the incompatible change: a deploy."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "worker.py", root / "worker.py")
    flow = root / "durable_agents" / "workflows" / "agent_flow.py"
    source = flow.read_text()
    assert source.count(ORIGINAL) == 1, "the test's patch no longer matches durable_agents/workflows/agent_flow.py"
    flow.write_text(source.replace(ORIGINAL, INCOMPATIBLE))
    return root


def worker_from(root: Path, dev_server, provider, queue: str, name: str, env: dict | None = None) -> Proc:
    full = {"TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": queue, "PROVIDER_URL": provider.url,
            "MEMORY_DB": str(provider.db.parent / "memory.db"), "PYTHONUNBUFFERED": "1",
            # Only the checkout's own code: nothing from the repository leaks in.
            "PYTHONPATH": str(root), **(env or {})}
    proc = Proc(name, [sys.executable, str(root / "worker.py")], env=full, cwd=root)
    proc.wait_for_line("worker ready", timeout=60)
    return proc


async def test_an_incompatible_deploy_parks_runs_and_a_rollback_completes_them(
        client, dev_server, provider, task_queue, tmp_path):
    deployed = incompatible_checkout(tmp_path / "deploy")
    procs: list[Proc] = []
    try:
        # The old code runs steps 1 and 2 of two runs (so their histories hold the email's
        # activity right after the draft) and dies: during step 3's activity (the next
        # workflow task then goes to whichever worker polls), and during the workflow task
        # after step 2 (that task times out, and is retried).
        crash_points = ("record_outcome:before", "temporal:send_confirmation:after_record")
        run_ids = [f"deploy-{n}-{uuid.uuid4().hex[:6]}" for n in range(2)]
        # A queue per run: a worker started for one run must not pick up the other's tasks.
        queues = [f"{task_queue}-{n}" for n in range(2)]
        for run_id, crash_at, queue in zip(run_ids, crash_points, queues, strict=True):
            old = worker_from(REPO, dev_server, provider, queue, "old", {"CRASH_AT": crash_at})
            procs.append(old)
            await start_run(client, run_id, TASK, EMAIL, queue=queue)
            assert wait_exit(old, 60) == -9, old.output()

        # The new, incompatible code is deployed.
        news = [worker_from(deployed, dev_server, provider, queue, "new") for queue in queues]
        procs.extend(news)

        async def all_parked():
            statuses = [await run_status(client, r) for r in run_ids]
            return statuses if all(s["status"] == "parked" for s in statuses) else None

        statuses = await poll_until(all_parked, timeout=60, what="both runs to be parked")
        for status in statuses:
            assert "the workflow task has failed since" in status["detail"], status
            assert [s["status"] for s in status["steps"]][:2] == ["completed", "completed"], status
        # The task the new worker failed first is reported, with its cause; the one a worker died in
        # is retried and times out (workers do not report a second failure), and status says so.
        assert "NON_DETERMINISTIC_ERROR" in statuses[0]["detail"], statuses[0]["detail"]
        # Without a workflow cache the retry's failure went unreported ("every attempt timed out"); with
        # worker.py's cache (the default since issue 13) the new worker reports it, naming the cause.
        assert ("every attempt timed out" in statuses[1]["detail"]
                or "NON_DETERMINISTIC_ERROR" in statuses[1]["detail"]), statuses[1]["detail"]
        shown = subprocess.run([sys.executable, "starter.py", "status", run_ids[0]], cwd=REPO, capture_output=True,
                               text=True, timeout=60, env={**os.environ, "TEMPORAL_ADDRESS": dev_server.address})
        assert shown.returncode == 3 and "parked" in shown.stdout, shown
        assert all(executions(new, "record_outcome") == 0 for new in news)  # parked: no step ran

        # Roll back: the old code again. The parked tasks are retried and succeed.
        for new in news:
            new.kill()
        procs.extend(worker_from(REPO, dev_server, provider, queue, "rolled-back") for queue in queues)

        async def all_completed():
            statuses = [await run_status(client, r) for r in run_ids]
            return statuses if all(s["status"] == "completed" for s in statuses) else None

        await poll_until(all_completed, timeout=120, interval=0.5, what="both runs to complete after the rollback")
        for run_id in run_ids:
            effects = fetch_effects(provider.url, run_id=run_id)
            assert len(effects) == 2 and all(e.effects_applied == 1 and e.requests == 1 for e in effects), effects
    finally:
        for proc in procs:
            proc.kill()


async def test_the_replayer_fails_fast_on_an_incompatible_history(client, workers, provider, run_id, task_queue,
                                                                    tmp_path):
    workers()
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    await client.get_workflow_handle(run_id).result()
    history = await client.get_workflow_handle(run_id).fetch_history()
    await Replayer(workflows=[importlib.import_module("durable_agents.workflows.agent_flow").AgentFlow],
                   workflow_runner=worker_options()["workflow_runner"]).replay_workflow(history)

    module = tmp_path / "incompatible_flow.py"
    source = (REPO / "durable_agents" / "workflows" / "agent_flow.py").read_text()
    module.write_text(source.replace(ORIGINAL, INCOMPATIBLE))
    sys.path.insert(0, str(tmp_path))
    try:
        from incompatible_flow import AgentFlow as IncompatibleFlow

        replayer = Replayer(workflows=[IncompatibleFlow], workflow_runner=worker_options()["workflow_runner"])
        with pytest.raises(NondeterminismError):
            await asyncio.wait_for(replayer.replay_workflow(WorkflowHistory.from_json(
                run_id, history.to_json_dict())), timeout=20)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("incompatible_flow", None)
