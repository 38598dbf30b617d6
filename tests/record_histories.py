"""Record replay fixtures: real histories of the agent flow and the agent loop,
made by the code checked out now, for the replay test to run under every later
version.

    .venv/bin/python -m tests.record_histories [--out tests/data/histories/<commit>] [--only flow|loop]
        [--scenario loop-NAME]

Without ``--only`` it records every scenario of both workflows; ``--only loop``
records the agent loop's alone (``loop-...``, the table below), ``--only flow``
the flow's alone, as the recorder did before the loop existed. ``--scenario``
records one of the loop's scenarios alone (a new one, into a new directory).

Run it on main *before* a change to workflow code, activity names or inputs,
or the codec, and commit what it writes: those histories are what runs in
flight look like to the new code. Never regenerate a directory that is
already committed; record a new one instead (the replay test reads them all).
With the change already in the working tree, record from a worktree of HEAD
(the workers run the code of the directory the recorder runs in; it prints
that directory and its commit first)::

    git worktree add /tmp/before HEAD && cp tests/record_histories.py /tmp/before/tests/
    out=$PWD/tests/data/histories/$(git rev-parse --short=12 HEAD) venv=$PWD/.venv
    cd /tmp/before && $venv/bin/python -m tests.record_histories --out $out
    cd - && git worktree remove /tmp/before

Each scenario is checked against the events that prove it *for the code it
runs* (``prove``), and a history that does not hold them is not written. That
code is main from 90625e8 on (issue 35: a reset found by the SDK's random-seed
callback, a cancel that ends the run wherever it lands, version 2 retry rules).
This recorder no longer records f4a12a0's code, whose second retry parks a run
and whose cancel during an attempt is ignored: its histories are committed in
tests/data/histories/f4a12a0a4eb1/, recorded by this file as it was at 720c576
(``git show 720c576:tests/record_histories.py``), and, like every committed
directory, never recorded again.

It starts its own dev server (in memory), provider and worker processes, and
records, each as ``<scenario>.json`` (the format of ``temporal workflow show
--output json``, readable by ``WorkflowHistory.from_json``):

=====================  =========================================================
completed              a run that completed, no faults
completed-encrypted    the same with the payload codec on (key in ``FIXTURE_KEY``)
in-flight              a worker killed before step 3; history read while open
in-flight-encrypted    the same, encrypted
retried                step 2 answered 503 twice by the provider, then completed
failed-rejected        step 2 refused for good (the .invalid domain): FAILED
failed-exhausted       step 3 answered 503 until its 3 s budget ran out: FAILED
heartbeat-timeout      a worker SIGKILLed inside step 2 (``CRASH_AT``, after the
                       email was applied); a second worker finishes the run:
                       ActivityTaskTimedOut (HEARTBEAT), then COMPLETED
start-to-close         step 2's first request held 6 s by the provider on a live
                       worker, past the run's 2 s ``attempt_timeout``:
                       ActivityTaskTimedOut (START_TO_CLOSE), then COMPLETED
worker-shutdown        SIGTERM to a worker (steps paced to 10 s) while step 2 runs:
                       ActivityTaskFailed of type WorkerShutdown after its 5 s
                       grace; a second worker finishes the run: COMPLETED
reset                  step 2 refused once (422), then ``starter.py retry``
                       (``restart_failed_run``): the reset run, COMPLETED
reset-twice-second     step 2 refused once (422); retry; in that run step 2's
                       response lost three times (503), then replayed, and
                       step 3 refused (422): the second run, FAILED, with no
                       ``counted-...`` patch marker (the code before 90625e8
                       wrote one per failure of a reset run)
reset-twice-third      the same run retried again: the third run, COMPLETED,
                       each effect applied once at the provider (the code
                       before 90625e8 parked it)
cancel-mid-attempt     cancelled while step 2's request is held by the provider:
                       the email's attempt is waited for (ActivityTaskCanceled,
                       or completed if its answer came first), step 3 is never
                       scheduled, and the run is CANCELED
cancel-in-backoff      cancelled while step 2 waits out a 10 s Retry-After after
                       a 503: CANCELED
terminated-mid-effect  terminated while step 2's request is held: TERMINATED
=====================  =========================================================

The agent loop's (``AgentLoop``, started as ``durable_agents.flowclient.loop.start_loop`` does),
each on the model stand-in (``durable_agents.testing.standin``: the scripted model, its tool
call ids deterministic) and an order of its own seeded at the provider, the task
naming that one order: lookup; refund and email in one turn; ticket; answer.

====================  ==========================================================
loop-completed        the four turns and their four calls, COMPLETED; each
                      effect applied once at the provider
loop-in-flight        a worker killed in workflow code between the refund and
                      the email of turn 2 (``CRASH_AT=temporal:loop:between_calls``);
                      history read while the run is open: the refund recorded,
                      the email not scheduled (a second worker then finishes it)
loop-continued-<i>    ``history_bound`` 10, the smallest allowed: the run
                      continues as new after every turn; each run of the chain,
                      oldest first: -1 ContinuedAsNew, the middle ones started
                      from a carried state and ContinuedAsNew, the last COMPLETED
loop-retried          the refund answered 503 twice by the provider, then applied:
                      two ActivityTaskFailed, each followed by its backoff timer,
                      then the call completes and the run COMPLETED
loop-turn-limit       ``max_turns`` 2: turn 2 still asks for tools, so the turn is
                      refused (no call runs): FAILED, naming the limit
loop-reset-second     ``loop-completed``'s shape, then ``temporal workflow reset`` to
                      the workflow task that scheduled turn 2: the reset run
                      (WorkflowTaskFailed RESET_WORKFLOW), whose turns 2 to 4 are
                      read back from the base and reused, the model asked each
                      turn once in all (``LOOP_RESET_PATCH``); COMPLETED, each
                      effect applied once
loop-parked           a bad deploy: the worker that was running the run died
                      between the refund and the email of turn 2, and the
                      worker that took over cannot run the loop (its workflow
                      task fails every time: WorkflowTaskFailed, cause
                      WORKFLOW_WORKER_UNHANDLED_FAILURE; ``status`` says
                      parked); then a worker of this code mends it: the email,
                      the ticket, COMPLETED, each effect applied once
====================  ==========================================================

Histories of a run that was reset are fetched by their own Temporal run id;
their workflow id is the file's stem without ``-second`` / ``-third`` (the
replay test reads it from the history's first event).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType, PendingActivityState, TimeoutType, WorkflowTaskFailedCause
from temporalio.client import WorkflowExecutionStatus
from temporalio.worker import Worker

from durable_agents.activities.loop import MODEL_TURN, TOOL_CALL
from durable_agents.flowclient.connect import connect
from durable_agents.flowclient.loop import loop_status, read_chain, start_loop
from durable_agents.flowclient.runs import restart_failed_run, start_run
from durable_agents.flowclient.status import run_status
from durable_agents.providerclient import ProviderClient, seed_orders
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.retry import RetryRule
from durable_agents.testing.standin import start_model_standin, turns_asked
from durable_agents.workflows import agent_flow
from durable_agents.workflows.agent_loop import LOOP_WORKFLOW_NAME
from durable_agents.workflows.loop_state import MIN_HISTORY_BOUND, LoopInput
from lab.processes import LAB_SERVER_CONFIG, REPO, DevServer, start_worker, temporal_cli, wait_until
from lab.provider_process import start_provider

# Not a secret: it exists so the encrypted fixtures can be decoded by the tests.
FIXTURE_KEY = base64.b64encode(bytes(range(200, 232))).decode()
FIXTURE_KEY_ID = "fixture-key"
TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, text=True,
                          capture_output=True, check=True).stdout.strip()


async def _closed(client, run_id: str, timeout: float = 120.0) -> dict:
    async def check():
        status = await run_status(client, run_id)
        return status if status["status"] != "running" else None

    return await wait_until(check, timeout, f"run {run_id} to close", interval=0.2)


_ABSOLUTE_FILE = re.compile(r'File \\?"(/[^"\\]*)')


def without_machine_paths(text: str) -> str:
    """``text`` with the recording machine's paths cut from the stack traces of
    failures: a file of the project relative to its root, an installed one from
    ``site-packages/``, anything else by its name. Replay never reads a stack
    trace, so the fixture replays the same; the repository holds no machine path."""
    def cut(match: re.Match[str]) -> str:
        path = match.group(1)
        if "/site-packages/" in path:
            short = "site-packages/" + path.split("/site-packages/", 1)[1]
        elif path.startswith(f"{REPO}/"):
            short = path[len(f"{REPO}/"):]
        else:
            short = path.rsplit("/", 1)[-1]
        return match.group(0)[: match.start(1) - match.start(0)] + short

    return _ABSOLUTE_FILE.sub(cut, text)


def fixture_workflow_id(path: Path, recorded: dict) -> str:
    """The workflow id of the run a fixture holds (``recorded``: the file's JSON): the
    one its first event names, else the file's stem (a file is named after its run's
    id, but several runs of one id, a reset's, need a suffix: reset-twice-second.json
    and reset-twice-third.json are runs of reset-twice). Replay needs the real one:
    the workflow checks its input's run id against it."""
    events = recorded.get("events") or [{}]
    return events[0].get("workflowExecutionStartedEventAttributes", {}).get("workflowId") or path.stem


def _save(history, path: Path) -> None:
    # Ids and times are kept as recorded; the task queue is the recording's own.
    path.write_text(without_machine_paths(json.dumps(history.to_json_dict(), indent=2)) + "\n")


async def _write(client, run_id: str, path: Path, temporal_run_id: str | None = None):
    """Write the history of ``run_id`` (its newest run, or ``temporal_run_id``) to ``path``; return it."""
    history = await client.get_workflow_handle(run_id, run_id=temporal_run_id).fetch_history()
    _save(history, path)
    return history


ONLY = ("flow", "loop")
"""What ``--only`` selects: the agent flow's scenarios, or the agent loop's."""


async def record(out: Path, only: tuple[str, ...] = ONLY, scenario: str | None = None) -> list[str]:
    """Record the scenarios of the workflows in ``only`` (both unless told; with ``scenario``, that one of the
    loop's alone) into ``out``; their names."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        provider_proc = start_provider(tmp_path / "provider.db")
        provider_url = provider_proc.url
        procs: list = []
        try:
            if "flow" in only:
                written += await _record_flow(server, provider_url, tmp_path, out, procs)
            if "loop" in only:
                written += await _record_loop(server, provider_url, tmp_path, out, procs, scenario)
        finally:
            for proc in procs:
                proc.kill()
            provider_proc.stop()
            server.stop()
    return written


async def _record_flow(server: DevServer, provider_url: str, tmp_path: Path, out: Path, procs: list) -> list[str]:
    """The agent flow's scenarios (the first table of the module docstring)."""
    written: list[str] = []
    for encrypted in (False, True):
        env = {"MEMORY_DB": str(tmp_path / "memory.db")}
        if encrypted:
            env.update(LAB_CODEC_KEY=FIXTURE_KEY, LAB_CODEC_KEY_ID=FIXTURE_KEY_ID)
        client = await connect({"TEMPORAL_ADDRESS": server.address, **env})
        suffix = "-encrypted" if encrypted else ""
        queue = f"fixtures-{uuid.uuid4().hex[:8]}"

        # In flight: killed before step 3, read while no worker runs it.
        dying = start_worker(server.address, provider_url, queue,
                             {**env, "CRASH_AT": "record_outcome:before"}, name="dying")
        procs.append(dying)
        run_id = f"in-flight{suffix}"
        await start_run(client, run_id, TASK, EMAIL, queue=queue)
        await wait_until(lambda dying=dying: not dying.alive(), 60,
                         "the worker to die at record_outcome:before")
        await _write(client, run_id, out / f"{run_id}.json")
        written.append(run_id)

        worker = start_worker(server.address, provider_url, queue, env)
        procs.append(worker)
        await _closed(client, run_id)
        run_id = f"completed{suffix}"
        await start_run(client, run_id, TASK, EMAIL, queue=queue)
        await _closed(client, run_id)
        await _write(client, run_id, out / f"{run_id}.json")
        written.append(run_id)
        if encrypted:
            continue

        async with ProviderClient(provider_url) as provider:
            await provider.set_faults(fail_next=2, status=503, kinds=["email"])
            await start_run(client, "retried", TASK, EMAIL, queue=queue)
            await _closed(client, "retried")
            await _write(client, "retried", out / "retried.json")
            written.append("retried")

            await start_run(client, "failed-rejected", TASK, "nobody@mailbox.invalid", queue=queue)
            await _closed(client, "failed-rejected")
            await _write(client, "failed-rejected", out / "failed-rejected.json")
            written.append("failed-rejected")

            await provider.set_faults(fail_next=1000, status=503, kinds=["ticket"])
            # A 3 s budget (the default's 900 s would outlast _closed's wait).
            await start_run(client, "failed-exhausted", TASK, EMAIL, queue=queue,
                            rule=RetryRule(budget_seconds=3))
            await _closed(client, "failed-exhausted")
            await provider.clear_faults()
            await _write(client, "failed-exhausted", out / "failed-exhausted.json")
            written.append("failed-exhausted")

    plain = {"MEMORY_DB": str(tmp_path / "memory.db")}
    return written + await _play_all(Scenarios, server, provider_url, plain, out, procs)


async def _record_loop(server: DevServer, provider_url: str, tmp_path: Path, out: Path, procs: list,
                       scenario: str | None = None) -> list[str]:
    """The agent loop's scenarios (the second table of the module docstring), on the model stand-in."""
    standin, standin_url = start_model_standin()
    procs.append(standin)
    env = {"MEMORY_DB": str(tmp_path / "memory.db"), "LLM_BASE_URL": standin_url, "LLM_MODEL": "scripted"}
    return await _play_all(LoopScenarios, server, provider_url, env, out, procs, scenario)


async def _play_all(kind: type[Scenarios], server: DevServer, provider_url: str, env: dict[str, str], out: Path,
                    procs: list, only: str | None = None) -> list[str]:
    """Every scenario of ``kind`` in turn (or the one named ``only``), each from no provider fault, with a
    client whose environment is ``env`` (the workers' too); the names they wrote."""
    written: list[str] = []
    client = await connect({"TEMPORAL_ADDRESS": server.address, **env})
    async with ProviderClient(provider_url) as provider:
        scenarios = kind(client, server.address, provider, provider_url, env, out, procs)
        for scenario in scenarios.all():
            if only is not None and scenario.__name__.replace("_", "-") != only:
                continue
            await provider.clear_faults()
            written.extend(await scenario())
    return written


def _name(event_type: int) -> str:
    """``EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT`` -> ``ActivityTaskTimedOut``."""
    words = EventType.Name(event_type).removeprefix("EVENT_TYPE_").split("_")
    return "".join(w.capitalize() for w in words)


def _activity_failure(event):
    """The failure of an ActivityTaskFailed / TimedOut event (the timeout's own, under a retry's wrapper)."""
    for attrs in ("activity_task_failed_event_attributes", "activity_task_timed_out_event_attributes"):
        if event.HasField(attrs):
            failure = getattr(event, attrs).failure
            while not (failure.HasField("timeout_failure_info") or failure.HasField("application_failure_info")) \
                    and failure.HasField("cause"):
                failure = failure.cause
            return failure
    return None


# A check takes an event and ``step_of`` (the step an activity event belongs to, from
# the ActivityTaskScheduled it names; None for any other event) and says whether the
# event is the one wanted.
Check = Callable[[Any, Callable[[Any], "str | None"]], bool]


def _timeout(kind: int):
    def check(event, step_of) -> bool:
        failure = _activity_failure(event)
        return (event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT and failure is not None
                and failure.timeout_failure_info.timeout_type == kind)
    return check


def _failed_of_type(kind: str):
    def check(event, step_of) -> bool:
        failure = _activity_failure(event)
        return (event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED and failure is not None
                and failure.application_failure_info.type == kind)
    return check


def _of(*event_types: int, step: str | None = None):
    """An event of one of ``event_types``; of an activity of ``step``, when given."""
    return lambda event, step_of: event.event_type in event_types and (step is None or step_of(event) == step)


def _task_failed(cause: int):
    def check(event, step_of) -> bool:
        return (event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
                and event.workflow_task_failed_event_attributes.cause == cause)
    return check


def patch_ids(event) -> list[str]:
    """The patch ids a MarkerRecorded event carries (none for another event)."""
    if event.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
        return []
    details = event.marker_recorded_event_attributes.details  # core's patch marker: {"id": ..., "deprecated": ...}
    return [json.loads(p.data)["id"] for p in details["patch-data"].payloads] if "patch-data" in details else []


def _counted(event, step_of) -> bool:
    """A marker of the retired ``counted-<run>-<step>-<attempt>`` patch (durable_agents.workflows.attempts)."""
    return any(p.startswith("counted-") for p in patch_ids(event))


def _step_name(scheduled) -> str:
    """The step an ActivityTaskScheduled's attributes schedule: the flow's activity type (``send_confirmation``);
    for the loop's two activity types, the loop step its activity id names (``turn-2``: ``turn-<n>/<attempt>``)
    and, for a tool call, the tool its input asks for (``turn-2/call-0 issue_refund``)."""
    kind = scheduled.activity_type.name
    if kind not in (MODEL_TURN, TOOL_CALL):
        return kind
    step = scheduled.activity_id.rpartition("/")[0]
    if kind == TOOL_CALL and scheduled.input.payloads:
        try:  # the recorder's loop runs are not encrypted: the ToolRequest is plain JSON
            step += f" {json.loads(scheduled.input.payloads[0].data)['call']['name']}"
        except (ValueError, KeyError, TypeError):
            pass
    return step


def _steps_of(events) -> dict[int, str]:
    """The step (``_step_name``) by the event id of its ActivityTaskScheduled."""
    return {e.event_id: _step_name(e.activity_task_scheduled_event_attributes) for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}


def _step_of(steps: dict[int, str]):
    def step_of(event) -> str | None:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            return steps.get(event.event_id)
        for field in event.ListFields():
            scheduled = getattr(field[1], "scheduled_event_id", None)
            if field[0].name.startswith("activity_task_") and scheduled is not None:
                return steps.get(scheduled)
        return None
    return step_of


def prove(name: str, history, *wanted: tuple[str, Check], absent: tuple[tuple[str, Check], ...] = ()) -> str:
    """One line naming the events that make ``history`` the scenario ``name``, in order,
    and the events it must not hold (``absent``); ``RuntimeError`` saying what was seen
    when one is missing or one is there: a fixture that does not hold what its name
    says is not written silently."""
    events = list(history.events)
    step_of = _step_of(_steps_of(events))

    def seen() -> str:
        return ", ".join(f"{e.event_id} {_name(e.event_type)}" + (f" ({step_of(e)})" if step_of(e) else "")
                         for e in events)

    found: list[str] = []
    after = 0
    for label, check in wanted:
        hit = next((e for e in events if e.event_id > after and check(e, step_of)), None)
        if hit is None:
            raise RuntimeError(f"{name}: no {label} after event {after}; the history holds: {seen()}")
        found.append(f"{label} at event {hit.event_id}")
        after = hit.event_id
    for label, check in absent:
        hit = next((e for e in events if check(e, step_of)), None)
        if hit is not None:
            raise RuntimeError(f"{name}: {label} at event {hit.event_id}, which the code recorded must not "
                               f"write; the history holds: {seen()}")
    return (f"{name}: {len(events)} events; " + ", ".join(found)
            + "".join(f"; no {label}" for label, _ in absent))


async def _pending_started(client, run_id: str, step: str, timeout: float = 60.0) -> None:
    """Until an attempt of ``step`` has been taken by a worker (describe's pending activity)."""
    async def check():
        raw = (await client.get_workflow_handle(run_id).describe()).raw_description
        return [p.activity_id for p in raw.pending_activities if p.activity_type.name == step
                and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED]
    await wait_until(check, timeout, f"an attempt of {step} of run {run_id} to be running", interval=0.1)


async def _run_closed(client, run_id: str, temporal_run_id: str, timeout: float = 120.0):
    """Until that very run (a reset makes a new one under the same id) is closed; its description."""
    async def check():
        description = await client.get_workflow_handle(run_id, run_id=temporal_run_id).describe()
        return description if description.status != WorkflowExecutionStatus.RUNNING else None
    return await wait_until(check, timeout, f"run {run_id} ({temporal_run_id}) to close", interval=0.2)


def _expect(status: dict, state: str, words: str = "") -> dict:
    if status["status"] != state or words not in (status.get("error") or ""):
        raise RuntimeError(f"run {status.get('run_id')} should be {state}" + (f" ({words})" if words else "")
                           + f"; it is: {status}")
    return status


class Scenarios:
    """The scenarios beyond a plain run: crashes, timeouts, shutdowns, resets, cancels.

    Each returns the names it wrote and prints what proves it (``prove``). Each
    uses a task queue of its own when it needs its own workers, and leaves no
    provider fault set."""

    def __init__(self, client, address: str, provider: ProviderClient, provider_url: str,
                 env: dict[str, str], out: Path, procs: list) -> None:
        self.client, self.address, self.provider, self.provider_url = client, address, provider, provider_url
        self.env, self.out, self.procs = env, out, procs
        self._steady: tuple[str, object] | None = None

    def all(self):
        return [self.heartbeat_timeout, self.start_to_close, self.worker_shutdown, self.reset,
                self.reset_twice, self.cancel_mid_attempt, self.cancel_in_backoff, self.terminated_mid_effect]

    def _worker(self, queue: str, name: str, **extra: str):
        proc = start_worker(self.address, self.provider_url, queue, {**self.env, **extra}, name=name)
        self.procs.append(proc)
        return proc

    def steady(self) -> str:
        """A task queue with one plain worker, started on first use."""
        if self._steady is None:
            queue = f"fixtures-{uuid.uuid4().hex[:8]}"
            self._steady = (queue, self._worker(queue, "steady"))
        return self._steady[0]

    async def _done(self, run_id: str, *proof: tuple[str, Check], temporal_run_id: str | None = None,
                    name: str | None = None, absent: tuple[tuple[str, Check], ...] = ()) -> list[str]:
        """Write the history of ``run_id`` as ``<name>.json`` once ``prove`` finds it holds ``proof``."""
        name = name or run_id
        history = await self.client.get_workflow_handle(run_id, run_id=temporal_run_id).fetch_history()
        print(prove(name, history, *proof, absent=absent), flush=True)
        _save(history, self.out / f"{name}.json")
        return [name]

    async def _applied_once(self, run_id: str) -> None:
        """Each effect of ``run_id`` applied once at the provider, under its step's key:
        the provider is the judge, whatever the history says."""
        applied = {e.key: e.effects_applied for e in await self.provider.effects(run_id)}
        wanted = {idempotency_key(run_id, step): 1 for step in ("send_confirmation", "record_outcome")}
        if applied != wanted:
            raise RuntimeError(f"run {run_id} should have each effect applied once ({wanted}); "
                               f"the provider has applied: {applied}")

    async def heartbeat_timeout(self) -> list[str]:
        run_id = "heartbeat-timeout"
        queue = f"fixtures-{uuid.uuid4().hex[:8]}"
        dying = self._worker(queue, "dying", CRASH_AT="send_confirmation:after_effect")
        await start_run(self.client, run_id, TASK, EMAIL, queue=queue)
        await wait_until(lambda: not dying.alive(), 60, "the worker to die at send_confirmation:after_effect")
        finisher = self._worker(queue, "finisher")
        _expect(await _closed(self.client, run_id), "completed")
        finisher.kill()
        return await self._done(
            run_id,
            ("ActivityTaskTimedOut HEARTBEAT", _timeout(TimeoutType.TIMEOUT_TYPE_HEARTBEAT)),
            ("ActivityTaskCompleted", _of(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)),
            ("WorkflowExecutionCompleted", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)),
        )

    async def start_to_close(self) -> list[str]:
        run_id = "start-to-close"
        # Held 6 s, three times the attempt's 2 s, and the provider client waits 5 s: the
        # server's start-to-close timeout is what ends the attempt, on a worker that lives.
        await self.provider.set_faults(hang_next=1, hang_seconds=6, kinds=["email"])
        await start_run(self.client, run_id, TASK, EMAIL, queue=self.steady(),
                        rule=RetryRule(attempt_timeout=2.0))
        _expect(await _closed(self.client, run_id), "completed")
        return await self._done(
            run_id,
            ("ActivityTaskTimedOut START_TO_CLOSE", _timeout(TimeoutType.TIMEOUT_TYPE_START_TO_CLOSE)),
            ("TimerStarted (backoff)", _of(EventType.EVENT_TYPE_TIMER_STARTED)),
            ("ActivityTaskCompleted", _of(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)),
            ("WorkflowExecutionCompleted", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)),
        )

    async def worker_shutdown(self) -> list[str]:
        run_id = "worker-shutdown"
        queue = f"fixtures-{uuid.uuid4().hex[:8]}"
        # Paced, not held by the provider: worker.py gives running attempts 5 s to finish
        # after SIGTERM, and the provider client gives up after 5 s too, so a held request
        # would end in the client's timeout instead. A 10 s pace outlasts the grace.
        stopping = self._worker(queue, "stopping", LAB_STEP_SECONDS="10")
        await start_run(self.client, run_id, TASK, EMAIL, queue=queue)
        await _pending_started(self.client, run_id, "send_confirmation", timeout=90)
        stopping.popen.send_signal(signal.SIGTERM)
        await wait_until(lambda: not stopping.alive(), 30, "the worker to stop after SIGTERM")
        if "worker stopping" not in stopping.output():
            raise RuntimeError(f"the worker did not stop gracefully:\\n{stopping.output()}")
        finisher = self._worker(queue, "finisher")
        _expect(await _closed(self.client, run_id), "completed")
        finisher.kill()
        return await self._done(
            run_id,
            ("ActivityTaskFailed WorkerShutdown", _failed_of_type("WorkerShutdown")),
            ("ActivityTaskCompleted", _of(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)),
            ("WorkflowExecutionCompleted", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)),
        )

    async def _fail_then_retry(self, run_id: str, *faults: dict) -> str:
        """Start ``run_id`` with its email refused once (422: permanent), wait for FAILED,
        set ``faults`` for the run to come and retry it as ``starter.py retry`` does;
        returns the reset run's Temporal run id."""
        await self.provider.set_faults(fail_next=1, status=422, kinds=["email"])
        await start_run(self.client, run_id, TASK, EMAIL, queue=self.steady())
        _expect(await _closed(self.client, run_id), "failed", "step send_confirmation failed")
        await self.provider.clear_faults()
        for fault in faults:
            await self.provider.set_faults(**fault)
        _, _, new_run = await restart_failed_run(self.client, run_id)
        return new_run

    async def reset(self) -> list[str]:
        run_id = "reset"
        new_run = await self._fail_then_retry(run_id)
        await _run_closed(self.client, run_id, new_run)
        _expect(await run_status(self.client, run_id), "completed")
        await self._applied_once(run_id)
        return await self._done(
            run_id,
            ("WorkflowTaskFailed RESET_WORKFLOW",
             _task_failed(WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW)),
            ("ActivityTaskCompleted", _of(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)),
            ("WorkflowExecutionCompleted", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)),
            temporal_run_id=new_run,
        )

    async def reset_twice(self) -> list[str]:
        run_id = "reset-twice"
        # In the second run: three answers lost (503 after applying), so the email's first
        # three attempts fail transiently and the fourth is replayed; then the ticket is
        # refused (422). Two countdowns of their own kinds, so no race between them.
        second = await self._fail_then_retry(run_id, {"lose_response_next": 3, "kinds": ["email"]},
                                             {"fail_next": 1, "status": 422, "kinds": ["ticket"]})
        await _run_closed(self.client, run_id, second)
        _expect(await run_status(self.client, run_id), "failed", "step record_outcome failed")
        # The retired markers (a marker per failure of a reset run, its run id in the id) are
        # what parked the third run before 90625e8: this code must not write them.
        no_markers = (("MarkerRecorded counted-<run>-...", _counted),)
        written = await self._done(
            run_id,
            ("WorkflowTaskFailed RESET_WORKFLOW",
             _task_failed(WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW)),
            ("ActivityTaskFailed (send_confirmation, response lost)",
             _of(EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, step="send_confirmation")),
            ("ActivityTaskCompleted (send_confirmation)",
             _of(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, step="send_confirmation")),
            ("ActivityTaskFailed (record_outcome, 422)",
             _of(EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, step="record_outcome")),
            ("WorkflowExecutionFailed", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED)),
            temporal_run_id=second, name="reset-twice-second", absent=no_markers,
        )
        await self.provider.clear_faults()
        _, _, third = await restart_failed_run(self.client, run_id)
        await _run_closed(self.client, run_id, third)
        _expect(await run_status(self.client, run_id), "completed")
        await self._applied_once(run_id)
        written += await self._done(
            run_id,
            ("WorkflowTaskFailed RESET_WORKFLOW (first retry)",
             _task_failed(WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW)),
            ("ActivityTaskCompleted (send_confirmation)",
             _of(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, step="send_confirmation")),
            ("WorkflowTaskFailed RESET_WORKFLOW (second retry)",
             _task_failed(WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW)),
            ("ActivityTaskCompleted (record_outcome)",
             _of(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, step="record_outcome")),
            ("WorkflowExecutionCompleted", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)),
            temporal_run_id=third, name="reset-twice-third",
            absent=(*no_markers, ("WorkflowTaskFailed NON_DETERMINISTIC_ERROR", _task_failed(
                WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR))),
        )
        return written

    async def _held(self, run_id: str) -> None:
        """Start ``run_id`` with its email request held 6 s by the provider; return once it is held."""
        await self.provider.set_faults(hang_next=1, hang_seconds=6, kinds=["email"])
        await start_run(self.client, run_id, TASK, EMAIL, queue=self.steady())
        await _pending_started(self.client, run_id, "send_confirmation")

        async def held():
            return (await self.provider.faults())["hang"]["remaining"] == 0
        await wait_until(held, 30, "the provider to hold the email request")

    async def cancel_mid_attempt(self) -> list[str]:
        run_id = "cancel-mid-attempt"
        await self._held(run_id)
        await self.client.get_workflow_handle(run_id).cancel()
        _expect(await _closed(self.client, run_id), "failed", "cancel")
        # The email's attempt is waited for (WAIT_CANCELLATION_COMPLETED): it ends canceled,
        # or completed if its answer beat the cancel; either way before the run closes.
        return await self._done(
            run_id,
            ("WorkflowExecutionCancelRequested", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)),
            ("ActivityTaskCancelRequested (send_confirmation)",
             _of(EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED, step="send_confirmation")),
            ("ActivityTaskCanceled or Completed (send_confirmation)",
             _of(EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
                 step="send_confirmation")),
            ("WorkflowExecutionCanceled", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED)),
            absent=(("ActivityTaskScheduled (record_outcome)",
                     _of(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, step="record_outcome")),),
        )

    async def cancel_in_backoff(self) -> list[str]:
        run_id = "cancel-in-backoff"
        await self.provider.set_faults(fail_next=1, status=503, retry_after=10, kinds=["email"])
        await start_run(self.client, run_id, TASK, EMAIL, queue=self.steady())

        async def backing_off():
            step = (await run_status(self.client, run_id))["steps"][1]
            return step if step["status"] == "retrying" and step.get("next_try_at") else None
        await wait_until(backing_off, 60, f"run {run_id} to wait on its backoff timer")
        await self.client.get_workflow_handle(run_id).cancel()
        _expect(await _closed(self.client, run_id), "failed", "canceled")
        return await self._done(
            run_id,
            ("ActivityTaskFailed (send_confirmation, 503)",
             _of(EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, step="send_confirmation")),
            ("TimerStarted", _of(EventType.EVENT_TYPE_TIMER_STARTED)),
            ("WorkflowExecutionCancelRequested", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED)),
            ("WorkflowExecutionCanceled", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED)),
        )

    async def terminated_mid_effect(self) -> list[str]:
        run_id = "terminated-mid-effect"
        await self._held(run_id)
        await self.client.get_workflow_handle(run_id).terminate("record_histories: terminated mid-effect")
        _expect(await _closed(self.client, run_id), "failed", "terminated")
        return await self._done(
            run_id,
            ("ActivityTaskScheduled (send_confirmation)",
             _of(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, step="send_confirmation")),
            ("WorkflowExecutionTerminated", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED)),
        )


LOOP_TOTAL = 2500
"""Cents: each loop scenario's order, seeded at the provider with this total; the script refunds all of it."""


def loop_task(order_id: str) -> str:
    """A loop scenario's task: one order with something to refund (the scripted model's four turns)."""
    return f"Order {order_id} arrived broken: please refund it."


def _recorded(*steps: str) -> list[tuple[str, Check]]:
    """Proof that each of ``steps`` (``turn-1``, ``turn-2/call-0 issue_refund``) was recorded, in order."""
    return [(f"ActivityTaskCompleted ({step})", _of(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, step=step))
            for step in steps]


ONE_ORDER = ("turn-1", "turn-1/call-0 lookup_order", "turn-2", "turn-2/call-0 issue_refund",
             "turn-2/call-1 send_email", "turn-3", "turn-3/call-0 create_ticket", "turn-4")
"""The steps of a loop run whose task names one order, in the order they are recorded."""


def _started(*, carried: bool) -> Check:
    """The run's first event: started fresh, or (``carried``) continued from an earlier run of its chain."""
    def check(event, step_of) -> bool:
        attrs = event.workflow_execution_started_event_attributes
        return (event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
                and bool(attrs.continued_execution_run_id) == carried)
    return check


def _activity_failed_saying(step: str, words: str) -> Check:
    def check(event, step_of) -> bool:
        failure = _activity_failure(event)
        return (event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED and step_of(event) == step
                and failure is not None and words in failure.message)
    return check


def _run_failed_saying(*words: str) -> Check:
    def check(event, step_of) -> bool:
        message = event.workflow_execution_failed_event_attributes.failure.message
        return (event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED
                and all(w in message for w in words))
    return check


def _calls_of(turn: int) -> Check:
    """Any ActivityTaskScheduled of a call of ``turn``."""
    return lambda event, step_of: (event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                                   and (step_of(event) or "").startswith(f"turn-{turn}/call-"))


_CLOSED = tuple((f"{_name(t)}", _of(t)) for t in (
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW))


class LoopScenarios(Scenarios):
    """The agent loop's scenarios (``durable_agents.workflows.agent_loop``), each on an order of its own (the provider
    refunds an order's total once in all, across runs) and the model stand-in (``env`` names it). Each returns the
    names it wrote and prints what proves it (``prove``); the provider, the judge of effects, is asked too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._orders = 0

    def all(self):
        return [self.loop_completed, self.loop_in_flight, self.loop_continued, self.loop_retried,
                self.loop_turn_limit, self.loop_reset, self.loop_parked]

    def _order(self) -> str:
        """A new order, seeded at the provider: its id."""
        self._orders += 1
        order_id = f"L-{1000 + self._orders}"
        seed_orders(self.provider_url, {order_id: LOOP_TOTAL})
        return order_id

    async def _start(self, run_id: str, queue: str | None = None, **start: Any) -> None:
        # The rule given, not the recorder's environment's: the numbers a fixture's run records are these.
        created, existing = await start_loop(self.client, run_id, loop_task(self._order()), EMAIL,
                                             task_queue=queue or self.steady(), rule=RetryRule(), **start)
        if not created:
            raise RuntimeError(f"loop run {run_id} exists already (fresh server expected): {existing}")

    async def _loop_closed(self, run_id: str, timeout: float = 120.0) -> dict:
        """Until the newest run of ``run_id``'s chain is closed (not continued as new); the chain's status."""
        async def check():
            description = await self.client.get_workflow_handle(run_id).describe()
            return description if description.status not in (
                WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW) else None
        await wait_until(check, timeout, f"loop run {run_id} to close", interval=0.2)
        return await loop_status(self.client, run_id)

    async def _effects(self, run_id: str, wanted: dict[str, int]) -> None:
        """The provider applied ``wanted`` (effects by kind) for ``run_id``, each once: whatever the history says."""
        effects = await self.provider.effects(run_id)
        by_kind: dict[str, int] = {}
        for effect in effects:
            by_kind[effect.kind] = by_kind.get(effect.kind, 0) + effect.effects_applied
        if by_kind != wanted or any(e.effects_applied != 1 for e in effects):
            raise RuntimeError(f"loop run {run_id} should have applied {wanted}, each once; the provider has: "
                               f"{[(e.kind, e.key, e.effects_applied) for e in effects]}")

    async def loop_completed(self) -> list[str]:
        run_id = "loop-completed"
        await self._start(run_id)
        _expect(await self._loop_closed(run_id), "completed")
        await self._effects(run_id, {"refund": 1, "email": 1, "ticket": 1})
        return await self._done(
            run_id, ("WorkflowExecutionStarted", _started(carried=False)), *_recorded(*ONE_ORDER),
            ("WorkflowExecutionCompleted", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)),
        )

    async def _killed_between_calls(self, run_id: str) -> str:
        """``run_id`` started on a task queue of its own, whose one worker died in workflow code between the
        refund and the email of turn 2 (``CRASH_AT=temporal:loop:between_calls``): the queue."""
        point = "temporal:loop:between_calls"
        queue = f"fixtures-{uuid.uuid4().hex[:8]}"
        dying = self._worker(queue, "dying", CRASH_AT=point)
        await self._start(run_id, queue=queue)
        await wait_until(lambda: not dying.alive(), 90, f"the worker to die at {point}")
        if f"CRASH_AT={point}" not in dying.output():
            raise RuntimeError(f"the worker died, but not at {point}:\n{dying.output()}")
        return queue

    async def loop_in_flight(self) -> list[str]:
        run_id = "loop-in-flight"
        queue = await self._killed_between_calls(run_id)
        description = await self.client.get_workflow_handle(run_id).describe()
        if description.status != WorkflowExecutionStatus.RUNNING:
            raise RuntimeError(f"loop run {run_id} should be open after the kill; it is {description.status}")
        # Read while no worker serves the queue: the refund is recorded, the email of its turn not scheduled.
        written = await self._done(
            run_id, ("WorkflowExecutionStarted", _started(carried=False)), *_recorded(*ONE_ORDER[:4]),
            absent=(("ActivityTaskScheduled (turn-2/call-1 send_email)",
                     _of(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, step="turn-2/call-1 send_email")),
                    *_CLOSED),
        )
        finisher = self._worker(queue, "finisher")
        _expect(await self._loop_closed(run_id), "completed")
        finisher.kill()
        await self._effects(run_id, {"refund": 1, "email": 1, "ticket": 1})
        again = finisher.output().count(f"step turn-2/call-0 started: run {run_id} attempt")
        if again:
            raise RuntimeError(f"the recorded refund of {run_id} ran again on the finishing worker:\n"
                               f"{finisher.output()}")
        return written

    async def loop_continued(self) -> list[str]:
        run_id = "loop-continued"
        await self._start(run_id, history_bound=MIN_HISTORY_BOUND)
        _expect(await self._loop_closed(run_id), "completed")
        await self._effects(run_id, {"refund": 1, "email": 1, "ticket": 1})
        chain = await read_chain(self.client, run_id)
        if len(chain.runs) < 3:
            raise RuntimeError(f"loop run {run_id} should continue as new at least twice under a history bound of "
                               f"{MIN_HISTORY_BOUND}; its chain has {len(chain.runs)} run(s)")
        written: list[str] = []
        for place, run in enumerate(chain.runs, 1):
            last = place == len(chain.runs)
            # Past the bound after every turn: run n of the chain records turn n and its calls.
            steps = [s for s in ONE_ORDER if s.split("/")[0].split(" ")[0] == f"turn-{place}"]
            end = (EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED if last
                   else EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW)
            written += await self._done(
                run_id, ("WorkflowExecutionStarted" + (" (carried)" if place > 1 else ""),
                         _started(carried=place > 1)),
                *_recorded(*steps), (_name(end), _of(end)),
                temporal_run_id=run.temporal_run_id, name=f"{run_id}-{place}",
            )
        return written

    async def loop_retried(self) -> list[str]:
        run_id = "loop-retried"
        await self.provider.set_faults(fail_next=2, status=503, kinds=["refund"])
        await self._start(run_id)
        _expect(await self._loop_closed(run_id), "completed")
        await self.provider.clear_faults()
        await self._effects(run_id, {"refund": 1, "email": 1, "ticket": 1})
        refund = "turn-2/call-0 issue_refund"
        failed = (f"ActivityTaskFailed ({refund}, 503)", _activity_failed_saying(refund, "503"))
        backoff = ("TimerStarted (backoff)", _of(EventType.EVENT_TYPE_TIMER_STARTED))
        fired = ("TimerFired", _of(EventType.EVENT_TYPE_TIMER_FIRED))
        return await self._done(
            run_id, *_recorded(*ONE_ORDER[:3]), failed, backoff, fired, failed, backoff, fired,
            *_recorded(*ONE_ORDER[3:]),
            ("WorkflowExecutionCompleted", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)),
        )

    async def loop_reset(self) -> list[str]:
        run_id = "loop-reset"
        await self._start(run_id)
        _expect(await self._loop_closed(run_id), "completed")
        handle = self.client.get_workflow_handle(run_id)
        base = (await handle.describe()).run_id
        point = next(e.activity_task_scheduled_event_attributes.workflow_task_completed_event_id
                     for e in (await handle.fetch_history()).events
                     if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                     and e.activity_task_scheduled_event_attributes.activity_id.startswith("turn-2/"))
        subprocess.run([temporal_cli(), "workflow", "reset", "--address", self.address, "--workflow-id", run_id,
                        "--run-id", base, "--event-id", str(point), "--reason", "fixtures: loop-reset"],
                       check=True, capture_output=True, timeout=60)
        reset_run = (await handle.describe()).run_id
        await _run_closed(self.client, run_id, reset_run)
        _expect(await loop_status(self.client, run_id), "completed")
        await self._effects(run_id, {"refund": 1, "email": 1, "ticket": 1})
        asked = turns_asked(self.env["LLM_BASE_URL"], run_id)
        if asked != {"1": 1, "2": 1, "3": 1, "4": 1}:
            raise RuntimeError(f"loop run {run_id}'s reset run should reuse turns 2 to 4; the model was asked {asked}")
        return await self._done(
            run_id, ("WorkflowTaskFailed RESET_WORKFLOW",
                     _task_failed(WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW)),
            *_recorded(*ONE_ORDER[2:]),
            ("WorkflowExecutionCompleted", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)),
            temporal_run_id=reset_run, name=f"{run_id}-second",
        )

    async def loop_parked(self) -> list[str]:
        run_id = "loop-parked"
        queue = await self._killed_between_calls(run_id)
        # The deploy that took over: a worker (in this process) whose loop fails every workflow task.
        async with Worker(self.client, task_queue=queue, workflows=[_CannotRunTheLoop]):
            async def parked():
                status = await loop_status(self.client, run_id)
                return status if status["status"] == "parked" else None
            status = await wait_until(parked, 60, f"loop run {run_id} to be reported parked", interval=0.2)
            if _CANNOT_RUN not in (status.get("detail") or ""):
                raise RuntimeError(f"loop run {run_id} should be parked by the bad deploy; its status: {status}")
        finisher = self._worker(queue, "finisher")
        _expect(await self._loop_closed(run_id), "completed")
        finisher.kill()
        await self._effects(run_id, {"refund": 1, "email": 1, "ticket": 1})
        return await self._done(
            run_id, ("WorkflowExecutionStarted", _started(carried=False)), *_recorded(*ONE_ORDER[:4]),
            ("WorkflowTaskFailed WORKFLOW_WORKER_UNHANDLED_FAILURE",
             _task_failed(WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_WORKFLOW_WORKER_UNHANDLED_FAILURE)),
            *_recorded(*ONE_ORDER[4:]),
            ("WorkflowExecutionCompleted", _of(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)),
        )

    async def loop_turn_limit(self) -> list[str]:
        run_id = "loop-turn-limit"
        await self._start(run_id, max_turns=2)
        _expect(await self._loop_closed(run_id), "failed", "turn limit of 2 reached")
        await self._effects(run_id, {})
        return await self._done(
            run_id, *_recorded(*ONE_ORDER[:2]),
            ("ActivityTaskFailed (turn-2, the limit)", _activity_failed_saying("turn-2", "turn limit of 2 reached")),
            ("WorkflowExecutionFailed (step turn-2, the limit)",
             _run_failed_saying("step turn-2 failed", "turn limit of 2 reached")),
            absent=(("ActivityTaskScheduled (a call of turn 2)", _calls_of(2)),),
        )


_CANNOT_RUN = "this deploy cannot run the agent loop"


@workflow.defn(name=LOOP_WORKFLOW_NAME, sandboxed=False)
class _CannotRunTheLoop:
    """A deploy whose loop cannot run a run (a bug; non-determinism and a payload over the limit fail a
    workflow task the same way, as Temporal sees it): ``loop-parked``."""

    @workflow.run
    async def run(self, inp: LoopInput) -> None:
        raise RuntimeError(_CANNOT_RUN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="default: tests/data/histories/<commit of HEAD>")
    parser.add_argument("--only", choices=ONLY, default=None,
                        help="record only the agent flow's scenarios, or only the agent loop's (default: both)")
    parser.add_argument("--scenario", default=None, metavar="loop-NAME",
                        help="with --only loop: record that scenario alone (e.g. loop-parked)")
    args = parser.parse_args(argv)
    if args.scenario is not None and args.only != "loop":
        parser.error("--scenario names one of the loop's scenarios: give --only loop too")
    known = sorted(m.replace("_", "-") for m in vars(LoopScenarios) if m.startswith("loop_"))
    if args.scenario is not None and args.scenario not in known:
        parser.error(f"no loop scenario {args.scenario!r}: choose from {', '.join(known)}")
    out = args.out or REPO / "tests" / "data" / "histories" / _commit()
    if out.exists() and any(out.iterdir()):
        print(f"{out} exists: fixtures are never regenerated; record into a new directory", file=sys.stderr)
        return 2
    # The workers run the code of REPO (lab.processes starts worker.py there): say which.
    # (This file excepted: the docstring's recipe copies it into the worktree.)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(exclude)tests/record_histories.py"], cwd=REPO, text=True,
                           capture_output=True).stdout.strip()
    print(f"recording the code of {REPO} at commit {_commit()}"
          + (" with uncommitted changes (record from a clean worktree: see the docstring)" if dirty else "")
          + f"; workflow code from {Path(agent_flow.__file__).parent}", flush=True)
    began = time.monotonic()
    written = asyncio.run(record(out, (args.only,) if args.only else ONLY, args.scenario))
    print(f"recording took {time.monotonic() - began:.0f} s", flush=True)
    print(f"recorded {len(written)} histories in {out}: {', '.join(written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
