"""The workflow's retry loop, tested fast and in process: ``AgentFlow`` on an
in-process worker with the shipped worker options (the sandboxed runner, no
cache, so every workflow task replays the run's history), against the suite's
dev server (fast timers), with stand-in activities that end each attempt as a
script says. No provider, no worker process: what is under test is the
workflow's decisions (``durable_agents.steps.retry``'s rule as ``durable_agents.workflows.agent_flow``
applies it, ``durable_agents.workflows.attempts`` reading how an attempt ended) and the
status the run reports of them, both live (the ``progress`` query) and from
history (``durable_agents.flowclient.status.run_status``).

How an attempt ends is written the way the real activity wrapper writes it
(``durable_agents.activities.FlowActivities._run``): a transient error is a retryable
ApplicationError whose details carry ``seconds``, ``retry_after`` and
``in_doubt``; a permanent one is non-retryable; a worker's graceful shutdown
is an ApplicationError of type ``WORKER_SHUTDOWN_TYPE``. A worker's death
cannot be staged in process, so a crash is an attempt that stops heartbeating:
it sleeps past the rule's (short) heartbeat timeout, which is how Temporal
notices a dead worker. The end-to-end tests with real worker processes
killed by SIGKILL are tests/test_crashes.py, tests/test_heartbeat.py and
tests/test_operator_actions.py.

Rules here have jitter 0 where the timers' exact durations are asserted, so
each ``TimerStarted`` in history can be compared with the arithmetic of
``durable_agents.steps.retry``'s module docstring worked by hand.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from durable_agents.activities import WORKER_SHUTDOWN_TYPE, DraftOutput, RecordOutput, SendOutput, step_attempt
from durable_agents.flowclient.runs import start_run
from durable_agents.flowclient.status import run_status
from durable_agents.flowclient.worker_options import worker_options
from durable_agents.steps.models import (
    DraftRequest,
    DraftResult,
    EmailSent,
    OutcomeRecorded,
    RecordRequest,
    SendRequest,
)
from durable_agents.steps.retry import RetryRule
from durable_agents.steps.runstate import RUN_STATES, STEP_STATES, unix
from durable_agents.workflows.agent_flow import AgentFlow
from tests.support import EMAIL, TASK, poll_until

HEARTBEAT = 0.5
"""The heartbeat timeout of the rules whose attempts crash: a hung attempt is taken for dead after it."""
HANG = 8.0
"""How long a "crashing" attempt sleeps without heartbeating: far past ``HEARTBEAT``. The worker's
shutdown at the end of the test cancels it, so no test waits it out."""

# ---------------------------------------------------------------- how an attempt ends


Ending = Callable[[str], None]
"""What a stand-in does on one attempt of a step: raise, sleep, or return (the step completes)."""


def transient(message: str = "503 service unavailable (stand-in)", *, seconds: float = 0.01,
              retry_after: float | None = None, in_doubt: bool = False) -> Ending:
    """A transient error, with the details the activity wrapper gives one."""
    def end(step: str) -> None:
        raise ApplicationError(message, {"attempt": step_attempt(), "seconds": seconds,
                                         "retry_after": retry_after, "in_doubt": in_doubt},
                               type="TransientError")
    return end


def permanent(message: str = "422 the request is refused for good (stand-in)", *, in_doubt: bool = False) -> Ending:
    def end(step: str) -> None:
        details = {"attempt": step_attempt(), "seconds": 0.01, **({"in_doubt": True} if in_doubt else {})}
        raise ApplicationError(message, details, type="PermanentError", non_retryable=True)
    return end


def shutdown(step: str) -> None:
    """The worker running the attempt stopped gracefully (what the wrapper raises on ``is_worker_shutdown``)."""
    raise ApplicationError("this worker shut down during the attempt", {"attempt": step_attempt(), "seconds": 0.01},
                           type=WORKER_SHUTDOWN_TYPE)


HUNG = "hung"
"""Not a function: the stand-in sleeps ``HANG`` s without a heartbeat (async, so it is awaited there)."""


def succeed(step: str) -> None:
    return None


class StandIns:
    """The three steps' activities, under their real names and types. ``script[step]`` is the list of
    endings of that step's attempts, in order; past its end, an attempt completes. ``calls`` counts the
    attempts each step began."""

    def __init__(self, **script: list[Ending | str]) -> None:
        self.script = script
        self.calls = {"draft": 0, "send_confirmation": 0, "record_outcome": 0}

    async def _attempt(self, step: str) -> int:
        self.calls[step] += 1
        attempt = step_attempt()  # from the activity id <step>/<n> the workflow gives each attempt
        endings = self.script.get(step, [])
        ending = endings[attempt - 1] if attempt <= len(endings) else succeed
        if ending == HUNG:
            await asyncio.sleep(HANG)  # no heartbeat: Temporal takes the worker for dead
            raise AssertionError("a hung attempt outlived the test")
        assert callable(ending)
        ending(step)
        return attempt

    @activity.defn(name="draft")
    async def draft(self, req: DraftRequest) -> DraftOutput:
        attempt = await self._attempt("draft")
        return DraftOutput(DraftResult(subject="Re: refund", body="Done.", summary="refund", model="stand-in"),
                           attempt)

    @activity.defn(name="send_confirmation")
    async def send_confirmation(self, req: SendRequest) -> SendOutput:
        attempt = await self._attempt("send_confirmation")
        return SendOutput(EmailSent(message_id="msg_1", to=req.to, idempotency_key=req.idempotency_key), attempt)

    @activity.defn(name="record_outcome")
    async def record_outcome(self, req: RecordRequest) -> RecordOutput:
        attempt = await self._attempt("record_outcome")
        return RecordOutput(OutcomeRecorded(ticket_id="tkt_1", idempotency_key=req.idempotency_key), attempt)

    def all(self) -> list:
        return [self.draft, self.send_confirmation, self.record_outcome]


# ---------------------------------------------------------------- running one and reading it


class Run:
    """One run of ``AgentFlow`` on a fresh task queue, with a worker of this process running it."""

    def __init__(self, client: Client, stand_ins: StandIns, rule: RetryRule) -> None:
        self.client, self.stand_ins, self.rule = client, stand_ins, rule
        self.queue = f"logic-{uuid.uuid4().hex[:12]}"
        self.run_id = f"logic-{uuid.uuid4().hex[:12]}"
        self.handle: WorkflowHandle = client.get_workflow_handle(self.run_id)
        self._worker = Worker(client, task_queue=self.queue, workflows=[AgentFlow],
                              activities=stand_ins.all(), **worker_options(cache=0))

    async def __aenter__(self) -> Run:
        await self._worker.__aenter__()
        try:
            created, _ = await start_run(self.client, self.run_id, TASK, EMAIL, queue=self.queue, rule=self.rule)
            assert created, f"run {self.run_id} already existed"
        except BaseException:
            await self._worker.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            # A run still open (a test that failed midway) must not outlive the test.
            if (await self.handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                await self.handle.terminate("the test is over")
        finally:
            # Stopping the worker cancels any attempt still hung (HANG): no test waits one out.
            await self._worker.__aexit__(*exc)

    async def failure(self) -> ApplicationError:
        """The run's error, once it has failed (it must fail)."""
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(self.handle.result(), timeout=60)
        cause = failed.value.cause
        assert isinstance(cause, ApplicationError), repr(cause)
        return cause

    async def completed(self) -> None:
        result = await asyncio.wait_for(self.handle.result(), timeout=60)
        assert result["status"] == "completed", result

    async def progress(self) -> dict[str, Any]:
        """The workflow's own answer (the ``progress`` query), as plain JSON."""
        return await self.handle.query("progress")

    async def history_status(self) -> dict[str, Any]:
        """What ``starter.py status`` reads from history, without asking the workflow."""
        return await run_status(self.client, self.run_id)

    async def both(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return await self.progress(), await self.history_status()

    async def timers(self) -> list[float]:
        """The duration of every timer the run started (its backoffs), in order."""
        history = await self.handle.fetch_history()
        return [ev.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
                for ev in history.events if ev.event_type == EventType.EVENT_TYPE_TIMER_STARTED]

    async def first_timer_task_seconds(self) -> float:
        """How long the workflow task that started the first timer took, from its start (the task's time, what
        ``workflow.now()`` reads) to its completion (the time history gives the timer)."""
        events = (await self.handle.fetch_history()).events
        timer = next(ev for ev in events if ev.event_type == EventType.EVENT_TYPE_TIMER_STARTED)
        completed_id = timer.timer_started_event_attributes.workflow_task_completed_event_id
        completed = next(ev for ev in events if ev.event_id == completed_id)
        started_id = completed.workflow_task_completed_event_attributes.started_event_id
        started = next(ev for ev in events if ev.event_id == started_id)
        return (completed.event_time.ToDatetime() - started.event_time.ToDatetime()).total_seconds()

    async def activity_endings(self) -> list[str]:
        """The event that closed each attempt, in order (``ActivityTaskTimedOut``, ...)."""
        history = await self.handle.fetch_history()
        closing = {EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "completed",
                   EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "failed",
                   EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "timed_out",
                   EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "canceled"}
        return [closing[ev.event_type] for ev in history.events if ev.event_type in closing]


def step(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in status["steps"] if s["name"] == name)


def check_words(*statuses: dict[str, Any]) -> None:
    """Every status word is one of ``durable_agents.steps.runstate``'s."""
    for status in statuses:
        assert status["status"] in RUN_STATES, status
        for s in status["steps"]:
            assert s["status"] in STEP_STATES, s


def rule(**overrides: Any) -> RetryRule:
    """A version 2 rule with small, exact numbers: no jitter, 0.1 s doubling to 0.4 s."""
    return RetryRule(**{"budget_seconds": 5.0, "initial_interval": 0.1, "maximum_interval": 0.4, "jitter": 0.0,
                        "max_worker_deaths": 2, **overrides})


# ---------------------------------------------------------------- transient errors


async def test_transient_errors_are_retried_with_a_growing_backoff_until_the_step_succeeds(client):
    """Three 503s, then the draft completes and so does the run. Each backoff is a durable timer
    within its jittered range (0.1, 0.2, 0.4 s doubling, 20 % jitter: ranges that do not overlap)."""
    stand_ins = StandIns(draft=[transient(), transient(), transient("503 still down (stand-in)")])
    async with Run(client, stand_ins, rule(jitter=0.2, maximum_interval=1.0)) as run:
        await run.completed()
        timers = await run.timers()
        progress, history = await run.both()

    assert stand_ins.calls == {"draft": 4, "send_confirmation": 1, "record_outcome": 1}
    assert len(timers) == 3, timers
    for seconds, base in zip(timers, (0.1, 0.2, 0.4), strict=True):
        assert 0.8 * base - 1e-6 <= seconds <= base + 1e-6, f"backoff {seconds} s outside [{0.8 * base}, {base}]"
    check_words(progress, history)
    for status in (progress, history):
        assert status["status"] == "completed" and status["error"] is None, status
        draft = step(status, "draft")
        assert (draft["status"], draft["attempts"], draft["crashes"]) == ("completed", 4, 0), draft
        assert draft["last_error"] == "503 still down (stand-in)", draft
        assert [s["status"] for s in status["steps"]] == ["completed"] * 3, status


@pytest.mark.parametrize(("failing", "in_doubt", "step_word"), [
    ("draft", False, "failed"),
    ("send_confirmation", True, "in_doubt"),
])
async def test_a_spent_budget_ends_the_run_failed_naming_the_step_the_budget_and_the_last_error(
        client, failing, in_doubt, step_word):
    """Every attempt fails after 0.05 s, with a 1 s budget and backoffs of 0.1 s doubling to 0.4 s.
    Worked by hand: errors spend 0.05 each and the backoffs 0.1, 0.2, 0.4 and then only the 0.1 s
    the budget has left; the 5th error finds none, and the run fails there. An effect step whose
    errors said their outcome was unknown ends in doubt."""
    stand_ins = StandIns(**{failing: [transient(f"503 attempt {n} (stand-in)", seconds=0.05, in_doubt=in_doubt)
                                      for n in range(1, 20)]})
    async with Run(client, stand_ins, rule(budget_seconds=1.0)) as run:
        error = await run.failure()
        timers = await run.timers()
        progress, history = await run.both()

    assert stand_ins.calls[failing] == 5, stand_ins.calls
    assert timers == pytest.approx([0.1, 0.2, 0.4, 0.1], abs=1e-3)
    assert error.type == "StepFailed" and error.non_retryable, error
    assert error.message.startswith(f"step {failing} failed after 5 attempt(s): retry budget of 1 s spent"), error
    assert error.message.endswith("last error: 503 attempt 5 (stand-in)"), error
    assert error.details and error.details[0]["error"] == error.message, error.details
    check_words(progress, history)
    for status in (progress, history):
        assert status["status"] == "failed" and status["current_step"] == failing, status
        assert status["error"] == error.message, status
        failed = step(status, failing)
        assert (failed["status"], failed["attempts"], failed["crashes"]) == (step_word, 5, 0), failed
        assert failed["last_error"] == "503 attempt 5 (stand-in)", failed
        assert (failed["note"] is not None) == in_doubt, failed
        assert step(status, "record_outcome")["status"] == "pending", status


async def test_retry_after_raises_the_delay_never_lowers_it_and_the_budget_caps_it(client):
    """The draft's errors say Retry-After 2 s, then 0.01 s, then 5 s, with a 3 s budget: the first
    backoff is 2 s (not 0.1), the second the rule's own 0.2 s (a short Retry-After does not hurry
    the next try), the third what is left of the budget, 3 - (2.03 + 0.2) = 0.77 s. While the
    first backoff runs, both readers say the step is retrying, and until when."""
    stand_ins = StandIns(draft=[transient(retry_after=2.0), transient(retry_after=0.01),
                                transient("429 slow down (stand-in)", retry_after=5.0)])
    async with Run(client, stand_ins, rule(budget_seconds=3.0)) as run:
        async def retrying():
            progress = await run.progress()
            return progress if step(progress, "draft")["status"] == "retrying" else None

        progress = await poll_until(retrying, timeout=10, interval=0.05, what="the draft to be retrying")
        history = await run.history_status()
        await run.completed()
        timers = await run.timers()
        task_seconds = await run.first_timer_task_seconds()
        final_progress, final_history = await run.both()

    assert timers == pytest.approx([2.0, 0.2, 0.77], abs=1e-3)
    check_words(progress, history, final_progress, final_history)
    for status in (progress, history):
        assert status["status"] == "running" and status["current_step"] == "draft", status
        draft = step(status, "draft")
        assert (draft["status"], draft["attempts"]) == ("retrying", 1), draft
        assert draft["last_error"] == "503 service unavailable (stand-in)", draft
        assert draft["next_try_at"] is not None, draft
        assert status["detail"].startswith("retrying draft: attempt 1 failed (503 service unavailable"), status
    # The live answer (the workflow task's time + the delay) and history (the timer's event time + its
    # duration) agree on when the next try is due, within the time the task took (read from history: on a
    # loaded host a workflow task takes more than half a second).
    due = [unix(step(status, "draft")["next_try_at"]) for status in (progress, history)]
    assert abs(due[0] - due[1]) <= task_seconds + 0.01, (due, task_seconds)
    for status in (final_progress, final_history):
        draft = step(status, "draft")
        assert (status["status"], draft["attempts"], draft["last_error"]) == (
            "completed", 4, "429 slow down (stand-in)"), status


# ---------------------------------------------------------------- permanent errors


@pytest.mark.parametrize(("failing", "in_doubt", "step_word"), [
    ("draft", False, "failed"),
    ("send_confirmation", False, "failed"),
    ("send_confirmation", True, "in_doubt"),
])
async def test_a_permanent_error_ends_the_run_at_once(client, failing, in_doubt, step_word):
    """A non-retryable error: no second attempt, no backoff, however much budget is left. An effect
    step is in doubt only when the error's details say its outcome is unknown."""
    stand_ins = StandIns(**{failing: [permanent(in_doubt=in_doubt)]})
    async with Run(client, stand_ins, rule(budget_seconds=60.0)) as run:
        error = await run.failure()
        timers = await run.timers()
        progress, history = await run.both()

    assert stand_ins.calls[failing] == 1 and stand_ins.calls["record_outcome"] == 0, stand_ins.calls
    assert timers == []
    assert error.type == "StepFailed", error
    assert error.message == f"step {failing} failed after 1 attempt(s): 422 the request is refused for good (stand-in)"
    check_words(progress, history)
    for status in (progress, history):
        assert status["status"] == "failed" and status["current_step"] == failing, status
        assert status["error"] == error.message, status
        failed = step(status, failing)
        assert (failed["status"], failed["attempts"], failed["crashes"]) == (step_word, 1, 0), failed
        assert failed["last_error"] == "422 the request is refused for good (stand-in)", failed


# ---------------------------------------------------------------- crashes and shutdowns


async def test_crashes_spend_no_budget_and_are_retried_at_once(client):
    """Two attempts of the draft hang without a heartbeat (0.5 s heartbeat timeout: the worker is
    taken for dead, about 1-2 s of wall time between them), then an error, then success, with a
    0.3 s budget and a death limit of 2. Had the crashes been charged to the budget, the error
    would have found none left; had they been retried after a backoff, there would be timers before
    the error's. The one timer is the error's backoff."""
    stand_ins = StandIns(draft=[HUNG, HUNG, transient("503 after the crashes (stand-in)")])
    async with Run(client, stand_ins, rule(budget_seconds=0.3, initial_interval=0.05, heartbeat_timeout=HEARTBEAT,
                                           max_worker_deaths=2)) as run:
        await run.completed()
        timers = await run.timers()
        endings = await run.activity_endings()
        progress, history = await run.both()

    assert endings[:4] == ["timed_out", "timed_out", "failed", "completed"], endings
    assert timers == pytest.approx([0.05], abs=1e-3)
    check_words(progress, history)
    for status in (progress, history):
        assert status["status"] == "completed", status
        draft = step(status, "draft")
        assert (draft["status"], draft["attempts"], draft["crashes"]) == ("completed", 4, 2), draft
        assert draft["last_error"] == "503 after the crashes (stand-in)", draft


async def test_the_worker_death_limit_ends_the_run(client):
    """The email step's attempts all hang (a poison pill), with a death limit of 1: the first
    death is retried at once, the second ends the run FAILED, "worker died 2 times", with no
    backoff between them. A crash mid-request leaves an effect in doubt."""
    stand_ins = StandIns(send_confirmation=[HUNG] * 5)
    async with Run(client, stand_ins, rule(budget_seconds=60.0, heartbeat_timeout=HEARTBEAT,
                                           max_worker_deaths=1)) as run:
        error = await run.failure()
        timers = await run.timers()
        progress, history = await run.both()

    assert stand_ins.calls["send_confirmation"] == 2, stand_ins.calls
    assert timers == []
    assert error.type == "StepFailed", error
    assert error.message.startswith("step send_confirmation failed after 2 attempt(s): worker died 2 times during "
                                 "send_confirmation (the limit is 1; LAB_MAX_WORKER_DEATHS)"), error
    check_words(progress, history)
    for status in (progress, history):
        assert status["status"] == "failed" and status["current_step"] == "send_confirmation", status
        assert status["error"] == error.message, status
        sent = step(status, "send_confirmation")
        assert (sent["status"], sent["attempts"], sent["crashes"]) == ("in_doubt", 2, 2), sent
        assert sent["note"] and "settle" in sent["note"], sent
    assert step(progress, "send_confirmation")["last_error"].startswith("the worker running it stopped heartbeating")


async def test_a_worker_shutdown_is_retried_at_once_and_is_no_death_under_a_version_2_rule(client):
    """Two attempts of the draft are cut short by a worker's graceful shutdown, with a death limit
    of 0 and a budget of 0.05 s: neither is a death (the limit would end the run at the first) nor
    spends budget (no backoff timer: retried at once), and the run completes."""
    stand_ins = StandIns(draft=[shutdown, shutdown])
    async with Run(client, stand_ins, rule(budget_seconds=0.05, max_worker_deaths=0)) as run:
        assert run.rule.version == 2
        await run.completed()
        timers = await run.timers()
        progress, history = await run.both()

    assert stand_ins.calls["draft"] == 3, stand_ins.calls
    assert timers == []
    check_words(progress, history)
    for status in (progress, history):
        assert status["status"] == "completed", status
        draft = step(status, "draft")
        assert (draft["status"], draft["attempts"]) == ("completed", 3), draft
    # The workflow says how it read the attempt; history holds the activity's own message.
    assert step(progress, "draft")["last_error"] == "the worker running it shut down mid-attempt", progress
    assert step(history, "draft")["last_error"] == "this worker shut down during the attempt", history
    # The workflow holds no shutdown against the worker: its own count of deaths is 0.
    assert step(progress, "draft")["crashes"] == 0, progress


async def test_both_readers_count_the_same_crashes_after_a_worker_shutdown(client):
    """``durable_agents.steps.runstate``: ``crashes`` counts the attempts whose process died. A graceful shutdown is
    no death under a version 2 rule (``durable_agents.steps.retry``); history and the workflow should say so alike."""
    async with Run(client, StandIns(draft=[shutdown]), rule(max_worker_deaths=0)) as run:
        await run.completed()
        progress, history = await run.both()
    assert step(history, "draft")["crashes"] == step(progress, "draft")["crashes"] == 0, (progress, history)


async def test_a_version_1_rule_counts_a_worker_shutdown_as_a_death(client):
    """A rule recorded before rules had a version (``RetryRule.from_dict`` without one) decides as it
    did then: the same shutdown is a death, and a death limit of 0 ends the run at the first one."""
    v1 = RetryRule.from_dict({"budget_seconds": 60.0, "max_worker_deaths": 0, "initial_interval": 0.1})
    stand_ins = StandIns(draft=[shutdown, shutdown])
    async with Run(client, stand_ins, v1) as run:
        assert run.rule.version == 1
        error = await run.failure()
        timers = await run.timers()
        progress, history = await run.both()

    assert stand_ins.calls["draft"] == 1, stand_ins.calls
    assert timers == []
    assert error.message.startswith("step draft failed after 1 attempt(s): worker died 1 times during draft "
                                 "(the limit is 0;"), error
    check_words(progress, history)
    for status in (progress, history):
        assert status["status"] == "failed" and status["current_step"] == "draft", status
        draft = step(status, "draft")
        assert (draft["status"], draft["attempts"], draft["crashes"]) == ("failed", 1, 1), draft


# ---------------------------------------------------------------- the attempt limit


async def test_the_attempt_limit_ends_a_step_however_long_its_budget(client):
    """A rule of 3 attempts per step and an hour's budget: an error, a shutdown and a crash are three
    failed attempts (every kind counts), and the third ends the run, with nearly all of the budget
    and all of the death limit left."""
    stand_ins = StandIns(draft=[transient(), shutdown, HUNG, transient()])
    async with Run(client, stand_ins, rule(budget_seconds=3600.0, attempts_per_step=3, max_worker_deaths=10,
                                           heartbeat_timeout=HEARTBEAT)) as run:
        error = await run.failure()
        timers = await run.timers()
        progress, history = await run.both()

    assert stand_ins.calls["draft"] == 3, stand_ins.calls
    assert timers == pytest.approx([0.1], abs=1e-3)  # the error's backoff; the others are retried at once
    assert error.type == "StepFailed", error
    assert error.message.startswith("step draft failed after 3 attempt(s): 3 attempts failed, the most a step may "
                                 "have (3, the run's retry rule) however long its budget; last error: the worker "
                                 "running it stopped heartbeating"), error
    check_words(progress, history)
    for status in (progress, history):
        assert status["status"] == "failed" and status["current_step"] == "draft", status
        assert status["error"] == error.message, status
        draft = step(status, "draft")
        assert (draft["status"], draft["attempts"]) == ("failed", 3), draft
    assert step(progress, "draft")["crashes"] == 1, progress
