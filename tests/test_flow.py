"""The Temporal path, end to end, against real processes: the dev server,
the provider (which counts effects), and worker processes killed with SIGKILL.

Crash points (durable_agents/steps/crashpoints.py) make a worker kill itself at an exact
place; a second worker, started without them, must finish the run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from temporalio.api.enums.v1 import TimeoutType

from durable_agents.flowclient.runs import start_run
from durable_agents.flowclient.status import TemporalRunNotFound, run_status
from durable_agents.providerclient import ProviderClient, fetch_effects
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.retry import RetryRule
from durable_agents.steps.settle import settle
from lab.processes import REPO
from tests.support import BAD_INPUT_CASES, EMAIL, TASK, effects_by_key, executions, poll_until, wait_closed, wait_exit

pytestmark = pytest.mark.process


async def start(client, run_id, task_queue, email=EMAIL, task=TASK, rule=None):
    created, _ = await start_run(client, run_id, task, email, queue=task_queue, rule=rule)
    assert created


async def test_happy_path_completes_with_one_effect_each(client, workers, provider, run_id, task_queue):
    worker = workers()
    await start(client, run_id, task_queue)
    status = await wait_closed(client, run_id)
    assert status["status"] == "completed", status
    assert status["current_step"] is None and status["error"] is None
    assert [s["status"] for s in status["steps"]] == ["completed"] * 3
    assert [s["attempts"] for s in status["steps"]] == [1, 1, 1]
    email = status["steps"][1]["result"]
    ticket = status["steps"][2]["result"]
    assert email["message_id"].startswith("msg_") and email["to"] == EMAIL
    assert ticket["ticket_id"].startswith("tkt_")
    effects = effects_by_key(provider.url, run_id)
    assert set(effects) == {idempotency_key(run_id, "send_confirmation"), idempotency_key(run_id, "record_outcome")}
    assert all(e.effects_applied == 1 and e.requests == 1 for e in effects.values())
    # The workflow's own view (query, answered by the live worker) agrees with history.
    live = await client.get_workflow_handle(run_id).query("progress")
    assert live == status
    # And the result returned on completion carries every step.
    result = await client.get_workflow_handle(run_id).result()
    assert result["steps"] == status["steps"]
    assert all(executions(worker, s) == 1 for s in ("draft", "send_confirmation", "record_outcome"))


async def test_kill_between_step_2_and_3_resumes_at_step_3(client, workers, provider, run_id, task_queue):
    first = workers(crash_at="record_outcome:before")
    await start(client, run_id, task_queue)
    assert wait_exit(first) == -9, first.output()
    assert executions(first, "draft") == 1 and executions(first, "send_confirmation") == 1

    stopped = await run_status(client, run_id)
    assert stopped["status"] == "running"
    assert stopped["current_step"] == "record_outcome"
    assert [s["status"] for s in stopped["steps"][:2]] == ["completed", "completed"]
    assert effects_by_key(provider.url, run_id).get(idempotency_key(run_id, "record_outcome")) is None

    second = workers()
    status = await wait_closed(client, run_id)
    assert status["status"] == "completed", status
    # Resumed at step 3: the new worker never executed steps 1 and 2.
    assert executions(second, "draft") == 0
    assert executions(second, "send_confirmation") == 0
    assert executions(second, "record_outcome") == 1
    # The recorded results of steps 1 and 2 are the ones from before the kill.
    assert status["steps"][1]["result"] == stopped["steps"][1]["result"]
    effects = effects_by_key(provider.url, run_id)
    assert len(effects) == 2
    for effect in effects.values():
        assert effect.effects_applied == 1, effect
        assert effect.requests == 1, effect


async def test_with_a_workflow_cache_a_killed_run_resumes_once_after_the_sticky_timeout(
    client, workers, provider, run_id, task_queue
):
    """worker.py --cache N: the run is cached by the worker that dies, so its next
    workflow task is put on that worker's sticky queue; after the 1 s sticky
    timeout the server moves it to the shared queue and the replacement, with an
    empty cache, replays the history and finishes: nothing runs twice."""
    first = workers(crash_at="send_confirmation:after_effect", args=["--cache", "100"])
    assert "workflow cache 100" in first.output()
    await start(client, run_id, task_queue)
    assert wait_exit(first) == -9, first.output()
    second = workers(args=["--cache", "100"])
    status = await wait_closed(client, run_id)
    assert status["status"] == "completed", status
    assert executions(second, "draft") == 0
    assert executions(second, "send_confirmation") == 1  # the retry of the killed attempt: a replay
    assert executions(second, "record_outcome") == 1
    for effect in effects_by_key(provider.url, run_id).values():
        assert effect.effects_applied == 1, effect
    # The sticky path was taken: a workflow task timed out waiting on the dead worker's queue.
    history = await client.get_workflow_handle(run_id).fetch_history()
    sticky_timeouts = [e for e in history.events if e.HasField("workflow_task_timed_out_event_attributes")
                       and (e.workflow_task_timed_out_event_attributes.timeout_type
                            == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START)]
    assert sticky_timeouts, "no workflow task waited on a sticky queue: was the cache on?"


def test_worker_refuses_a_negative_cache():
    done = subprocess.run([sys.executable, "worker.py", "--cache", "-1"], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PROVIDER_URL": "http://127.0.0.1:9"})
    assert done.returncode == 2 and "--cache must be 0 or more" in done.stderr, done


async def test_external_sigkill_after_step_2_resumes_at_step_3(client, workers, provider, run_id, task_queue):
    """The demo's story: the test itself SIGKILLs a slowed-down worker once step 2 is recorded."""
    first = workers(extra_env={"LAB_STEP_SECONDS": "0.6"})
    await start(client, run_id, task_queue)

    async def step2_done():
        s = await run_status(client, run_id)
        return s if s["steps"][1]["status"] == "completed" else None

    await poll_until(step2_done, timeout=30, interval=0.05, what="step 2 to be recorded")
    first.kill()
    second = workers()
    status = await wait_closed(client, run_id)
    assert status["status"] == "completed"
    assert executions(second, "draft") == 0 and executions(second, "send_confirmation") == 0
    assert all(e.effects_applied == 1 for e in effects_by_key(provider.url, run_id).values())
    assert len(effects_by_key(provider.url, run_id)) == 2


async def test_kill_after_email_accepted_before_step_recorded(client, workers, provider, run_id, task_queue):
    first = workers(crash_at="send_confirmation:after_effect")
    await start(client, run_id, task_queue)
    assert wait_exit(first) == -9, first.output()
    key = idempotency_key(run_id, "send_confirmation")
    before = effects_by_key(provider.url, run_id)[key]
    assert (before.requests, before.effects_applied) == (1, 1)

    second = workers()
    status = await wait_closed(client, run_id)
    assert status["status"] == "completed", status
    after = effects_by_key(provider.url, run_id)
    # The step ran again (at-least-once), the provider recognised the key (exactly-once effect).
    assert (after[key].requests, after[key].effects_applied) == (2, 1)
    assert status["steps"][1]["result"]["replayed"] is True
    assert status["steps"][1]["attempts"] == 2
    assert executions(second, "draft") == 0
    ticket = after[idempotency_key(run_id, "record_outcome")]
    assert (ticket.requests, ticket.effects_applied) == (1, 1)


async def test_rejected_email_fails_the_run_at_step_2(client, workers, provider, run_id, task_queue):
    workers()
    # The provider refuses mail to the reserved .invalid top-level domain (RFC 2606), like a hard bounce.
    await start(client, run_id, task_queue, email="nobody@mailbox.invalid")
    status = await wait_closed(client, run_id)
    assert status["status"] == "failed"
    assert status["current_step"] == "send_confirmation"
    assert [s["status"] for s in status["steps"]] == ["completed", "failed", "pending"]
    assert status["steps"][1]["attempts"] == 1  # non-retryable: no second attempt
    assert "send_confirmation" in status["error"] and "invalid" in status["error"]
    effects = effects_by_key(provider.url, run_id)
    assert idempotency_key(run_id, "record_outcome") not in effects
    assert all(e.effects_applied == 0 for e in effects.values())


async def test_provider_503s_are_retried_then_the_run_completes(client, workers, provider, run_id, task_queue):
    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(fail_next=3, status=503, kinds=["email"])
    workers()
    await start(client, run_id, task_queue)
    status = await wait_closed(client, run_id)
    assert status["status"] == "completed", status
    assert status["steps"][1]["attempts"] == 4
    effect = effects_by_key(provider.url, run_id)[idempotency_key(run_id, "send_confirmation")]
    assert (effect.requests, effect.effects_applied) == (4, 1)


async def test_provider_down_for_good_ends_failed_when_the_budget_is_spent(client, workers, provider, run_id,
                                                                           task_queue):
    """A 2 s retry budget (the default is 900 s): the step retries with backoff
    until the budget is spent, then the run ends FAILED naming the step, the
    budget and the last error. 503s do not say whether the ticket was created,
    so the step ends in doubt, and settle asks the provider: not applied."""
    async with ProviderClient(provider.url) as pc:
        await pc.set_faults(fail_next=1000, status=503, kinds=["ticket"])
    workers()
    await start(client, run_id, task_queue, rule=RetryRule(budget_seconds=2))
    status = await wait_closed(client, run_id, timeout=90)
    assert status["status"] == "failed"
    assert status["current_step"] == "record_outcome"
    step = status["steps"][2]
    assert step["status"] == "in_doubt", step
    assert "retry budget of 2 s spent" in status["error"] and "503 injected_fault" in status["error"]
    ticket = effects_by_key(provider.url, run_id)[idempotency_key(run_id, "record_outcome")]
    assert ticket.requests == step["attempts"] >= 3 and ticket.effects_applied == 0
    async with ProviderClient(provider.url) as pc:
        report = {e["step"]: e for e in await settle(pc, run_id)}
    assert report["record_outcome"]["state"] == "not applied"
    assert report["send_confirmation"]["state"] == "applied"


async def test_same_run_id_twice_is_one_run(client, workers, provider, run_id, task_queue):
    workers()
    results = await asyncio.gather(
        *(start_run(client, run_id, TASK, EMAIL, queue=task_queue) for _ in range(3))
    )
    assert sum(created for created, _ in results) == 1
    await wait_closed(client, run_id)
    # After completion, starting again attaches and says so.
    created, existing = await start_run(client, run_id, "another task", EMAIL, queue=task_queue)
    assert not created and existing["status"] == "completed"
    runs = [w async for w in client.list_workflows(f'WorkflowId = "{run_id}"')]
    assert len(runs) == 1
    effects = effects_by_key(provider.url, run_id)
    assert all(e.effects_applied == 1 and e.requests == 1 for e in effects.values())


async def test_workflow_boundary_refuses_bad_input(client, workers, provider, run_id, task_queue):
    """Input that bypasses the starter still cannot start a step."""
    from durable_agents.workflows.agent_flow import WORKFLOW_NAME, FlowInput

    workers()
    await client.start_workflow(
        WORKFLOW_NAME, FlowInput(run_id=run_id, task=" ", email=EMAIL), id=run_id, task_queue=task_queue
    )
    status = await wait_closed(client, run_id)
    assert status["status"] == "failed"
    assert "task is empty" in status["error"]
    assert [s["status"] for s in status["steps"]] == ["pending"] * 3
    assert fetch_effects(provider.url, run_id=run_id) == []


def _starter(dev_server, *args, task_queue="unused"):
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue}
    return subprocess.run(
        [sys.executable, "starter.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_cli_start_wait_and_status_json(dev_server, workers, provider, run_id, task_queue):
    workers()
    done = _starter(dev_server, "start", run_id, TASK, "--email", EMAIL, "--wait", task_queue=task_queue)
    assert done.returncode == 0, done.stderr
    assert "send_confirmation: completed" in done.stdout
    shown = _starter(dev_server, "status", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert set(status) == {"run_id", "status", "current_step", "steps", "error", "detail"}
    assert all(set(s) == {"name", "status", "attempts", "result", "crashes", "last_error", "next_try_at", "note"}
               for s in status["steps"])
    assert status["status"] == "completed"
    again = _starter(dev_server, "start", run_id, TASK, "--email", EMAIL, task_queue=task_queue)
    assert again.returncode == 0 and "already exists (completed)" in again.stderr


def test_cli_bad_input_is_refused_before_anything_starts(dev_server):
    for argv, expected in BAD_INPUT_CASES:
        done = _starter(dev_server, *argv)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert expected in done.stderr, (argv, done.stderr)


async def test_status_of_unknown_run_raises(client):
    with pytest.raises(TemporalRunNotFound, match="starter.py start"):
        await run_status(client, "never-started-run")
