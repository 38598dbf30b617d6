"""How one attempt of a step ended, as the retry rules (``durable_agents.steps.retry``) see
it: read from the ActivityError the workflow gets. Pure functions, no
workflow state: imported by ``durable_agents.workflows.agent_flow`` through the sandbox
(passed through, so it is not compiled and executed again each time a
worker builds the run afresh).

=======================================  ===========  =====================
the attempt ended with                   kind         in doubt
=======================================  ===========  =====================
heartbeat timeout (the worker died)      crash        (for an effect, yes)
``WorkerShutdown`` (worker stopping)     shutdown     (for an effect, yes)
                                         (a crash under a version 1 rule)
start-to-close timeout (live worker)     transient    yes
non-retryable ApplicationError           permanent    as its details say
any other ApplicationError               transient    as its details say
cancelled (the run's cancel)             cancelled    (for an effect, yes)
=======================================  ===========  =====================

The activity wrapper puts ``seconds`` (how long the attempt took),
``retry_after`` and ``in_doubt`` in a failure's details (``activities``).

``StepAttempts`` is the attempt loop both workflows run a step with (the
flow's steps, the loop's turns and calls): one activity per attempt, the
ledger's decision after each failure, a durable timer for a backoff. What
differs between them is passed in as hooks, never as a branch on the
workflow: the commands it writes, in order, are those the replay fixtures
of both workflows hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, NoReturn, Protocol, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError, TimeoutType
from temporalio.workflow import ActivityCancellationType

from durable_agents.activities import WORKER_SHUTDOWN_TYPE
from durable_agents.steps.retry import StepLedger
from durable_agents.steps.runstate import StepStateName, iso

# Patch ids: histories record them, so their values never change.
#
# Runs whose history carries this patch marker retry in workflow code by
# durable_agents.steps.retry, send their start id and adopt; runs recorded before it do not.
LIVE_PATCH = "live-and-honest"
# Retired, but still in histories: until this change a run made by a reset
# recorded a marker per failure it decided on itself, with this id (its own
# Temporal run id in it). A marker whose id holds data strands the runs that
# carry it once they are reset again (the new run's replay cannot name the
# marker: issue 35); a reset is now found where Temporal reseeds the run's
# randomness (``AgentFlow._on_reset``). Replays still answer the old markers
# (``old_counted_markers``), so runs that carry them keep replaying.
# (The frozen path's marker is ``before_live.MEMORY_IN_RECORD_PATCH``.)
COUNTED_PATCH = "counted-{run_id}-{step}-{attempt}"

# One attempt per scheduled activity: the workflow decides about the next one.
ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)


def old_counted_markers(step: str, attempt: int) -> list[str]:
    """The retired ``COUNTED_PATCH`` markers, of any run id, that the history
    being replayed holds for this step and attempt.

    A run reset twice under the retired rule holds the markers the run between
    the two resets wrote, with that run's id, which this run cannot know. The
    SDK is told of the markers in the history it replays before the code runs
    (core's "notify has patch"), and ``workflow.patched`` answers from that
    set; the set has no public accessor, so it is read here from the running
    workflow instance, by name. Only ids of the retired pattern for this step
    and attempt are taken; tests/test_replay_fixtures.py replays a history
    that needs this (``reset-twice-third``), so an SDK that renames the set
    fails there, not in production."""
    runtime = asyncio.get_running_loop()  # in workflow code, the loop is the workflow instance
    notified = getattr(runtime, "_patches_notified", None)
    if not isinstance(notified, (set, frozenset)):
        return []
    suffix = f"-{step}-{attempt}"
    return sorted(i for i in notified if isinstance(i, str) and i.startswith("counted-") and i.endswith(suffix))


class Ending:
    """How one attempt ended: ``kind`` is crash, shutdown, transient, permanent or cancelled."""

    __slots__ = ("kind", "message", "seconds", "retry_after", "in_doubt", "outage")

    def __init__(self, kind: str, message: str, seconds: float | None = None, retry_after: float | None = None,
                 in_doubt: bool = False, outage: bool = False) -> None:
        self.kind, self.message, self.seconds = kind, message, seconds
        self.retry_after, self.in_doubt, self.outage = retry_after, in_doubt, outage


def _details(cause: ApplicationError) -> dict[str, Any]:
    if cause.details and isinstance(cause.details[0], dict):
        return cause.details[0]
    return {}


def ending_of(err: ActivityError, attempt_timeout: timedelta, *, version: int = 2) -> Ending:
    """How the attempt that raised ``err`` ended, under a rule of ``version`` (``durable_agents.steps.retry``)."""
    cause = err.cause
    if isinstance(cause, TimeoutError):
        if cause.type == TimeoutType.HEARTBEAT:
            return Ending("crash", "the worker running it stopped heartbeating (it died, or hung)")
        seconds = attempt_timeout.total_seconds()
        return Ending("transient", f"timed out after {seconds:g} s on a live worker (start-to-close)",
                      seconds=seconds, in_doubt=True, outage=True)
    if isinstance(cause, ApplicationError):
        details = _details(cause)
        in_doubt = bool(details.get("in_doubt"))
        if cause.type == WORKER_SHUTDOWN_TYPE:
            return Ending("crash" if version < 2 else "shutdown", "the worker running it shut down mid-attempt")
        if cause.non_retryable:
            return Ending("permanent", cause.message, in_doubt=in_doubt)
        took = details.get("seconds")
        retry_after = details.get("retry_after")
        return Ending(
            "transient", cause.message,
            seconds=float(took) if isinstance(took, (int, float)) else None,
            retry_after=float(retry_after) if isinstance(retry_after, (int, float)) else None,
            in_doubt=in_doubt, outage=details.get("outage") is True,  # a Retry-After too: StepLedger.after_error
        )
    if isinstance(cause, CancelledError):
        # Version 1 took it for an error and tried again (a run's cancel was ignored).
        return Ending("transient" if version < 2 else "cancelled", "the attempt was cancelled")
    return Ending("transient", str(cause or err))


class ShownStep(Protocol):
    """What a workflow shows of a step while it runs (``durable_agents.workflows.state.StepState``, the loop's
    ``TurnState`` and ``CallState``): the attempts loop keeps these fields."""

    attempts: int
    status: StepStateName
    next_try_at: str | None
    last_error: str | None
    crashes: int
    note: str | None


StateT = TypeVar("StateT", bound=ShownStep)


def _nothing(_what: str) -> None:
    return None


def _as_is(message: str) -> str | None:
    return message


@dataclass
class StepAttempts(Generic[StateT]):
    """The attempts of one step until it succeeds or its ledger gives up (``durable_agents.steps.retry``).

    ``show`` puts the step's state where the Temporal UI reads it; ``seen`` hears of every outcome
    the workflow gets (an attempt's end, a backoff's), as the flow logs what it replayed;
    ``error_text`` is how an error is kept in the shown state; ``deciding`` runs after a failed
    attempt before the ledger decides (the flow answers its retired patch markers there)."""

    name: str
    ledger: StepLedger
    state: StateT
    attempt_timeout: timedelta
    heartbeat_timeout: timedelta | None
    show: Callable[[], None]
    seen: Callable[[str], None] = _nothing
    error_text: Callable[[str], str | None] = _as_is
    deciding: Callable[[Ending], None] | None = None

    @property
    def cancellation(self) -> ActivityCancellationType:
        """An effect's attempt is waited for when the run is cancelled, so that the run learns whether
        the request went out (rule version 2 on; version 1 did not wait)."""
        if self.ledger.effect and self.ledger.rule.version >= 2:
            return ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
        return ActivityCancellationType.TRY_CANCEL

    async def run(self, activity: Callable[..., Any], request: Any, *, completed: Callable[[Any], None],
                  cancelled: Callable[[Ending | None], NoReturn], failed: Callable[[ActivityError], NoReturn],
                  retrying: Callable[[], None] | None = None) -> Any:
        """Attempt ``activity`` with ``request`` until it completes (``completed`` sees its output, which is
        returned) or the ledger gives up (``failed``); a cancel of the run ends it at the attempt
        (``cancelled``, with how the attempt ended, or None if it completed all the same). ``retrying``
        runs once a backoff is over, before the next attempt."""
        ledger, state = self.ledger, self.state
        while True:
            ledger.attempts += 1
            state.attempts, state.status, state.next_try_at = ledger.attempts, "running", None
            self.show()
            began = workflow.now()
            try:
                output = await workflow.execute_activity_method(
                    activity,
                    request,
                    activity_id=f"{self.name}/{ledger.attempts}",
                    summary=f"{self.name}, attempt {ledger.attempts}",
                    start_to_close_timeout=self.attempt_timeout,
                    heartbeat_timeout=self.heartbeat_timeout,
                    retry_policy=ONE_ATTEMPT,
                    cancellation_type=self.cancellation,
                )
            except ActivityError as err:
                self.seen(f"{self.name} attempt {ledger.attempts} (failed)")
                ending = ending_of(err, self.attempt_timeout, version=ledger.rule.version)
                if self._cancel_heard():
                    cancelled(ending)
                if await self._try_again(ending, began):
                    if retrying is not None:
                        retrying()
                    continue
                failed(err)
            self.seen(f"{self.name} attempt {ledger.attempts}")
            completed(output)
            if self._cancel_heard():
                # Cancelled while this attempt ran, and it completed all the same (an effect's attempt is
                # waited for): the result stands, and the run stops here.
                cancelled(None)
            return output

    def _cancel_heard(self) -> bool:
        return self.ledger.rule.version >= 2 and workflow.cancellation_reason() is not None

    async def _try_again(self, ending: Ending, began: datetime) -> bool:
        """After a failed attempt: True once the step may be tried again (any backoff waited out on a
        durable timer); False when the rules give up, and then ``ledger.failure`` says why."""
        ledger, state = self.ledger, self.state
        state.last_error = self.error_text(ending.message)
        if self.deciding is not None:
            self.deciding(ending)
        if ending.kind in ("crash", "shutdown"):
            again = (ledger.after_crash if ending.kind == "crash" else ledger.after_shutdown)(ending.message)
            state.crashes = ledger.crashes
            return again
        if ending.kind == "permanent":
            ledger.after_permanent(ending.message, in_doubt=ending.in_doubt)
            return False
        if ending.seconds is not None:
            seconds = ending.seconds
        elif ledger.rule.version >= 2:
            # No duration of its own: the time since it was scheduled includes waiting for a worker,
            # which no budget is charged for (durable_agents.steps.retry). Its backoff is charged.
            seconds = 0.0
        else:
            seconds = (workflow.now() - began).total_seconds()
        delay = ledger.after_error(ending.message, seconds, retry_after=ending.retry_after,
                                   in_doubt=ending.in_doubt, u=workflow.random().random(), outage=ending.outage)
        if delay is None:
            return False
        state.status = "retrying"
        state.next_try_at = iso(workflow.now().timestamp() + delay)
        self.show()
        await workflow.sleep(delay, summary=f"retry {self.name} (attempt {ledger.attempts + 1})")
        self.seen(f"{self.name} backoff timer")
        return True

    def stopped(self, ending: Ending | None, in_doubt_note: str) -> str:
        """The cancel's words for this step, the step's state marked: ``ending`` is how the attempt the
        cancel interrupted ended (None: it completed). An effect's attempt that did not complete may
        have applied its effect: the step is then in doubt, with ``in_doubt_note``."""
        ledger, state = self.ledger, self.state
        if ending is not None:
            stopped = ending.kind in ("cancelled", "crash", "shutdown") or ending.in_doubt
            ledger.in_doubt = ledger.in_doubt or (ledger.effect and stopped)
            state.status = "in_doubt" if ledger.in_doubt else "failed"
            state.last_error = ending.message
            if ledger.in_doubt:
                state.note = in_doubt_note
        where = (f"during step {self.name}, attempt {ledger.attempts}" if ending is not None
                 else f"after step {self.name} completed")
        return f"canceled {where}: {workflow.cancellation_reason() or 'no reason given'}"

    def given_up(self, in_doubt_note: str) -> str:
        """Why the run ends at this step once the ledger gave up, the step's state marked failed, or in
        doubt with ``in_doubt_note``."""
        self.state.status = "in_doubt" if self.ledger.in_doubt else "failed"
        if self.ledger.in_doubt:
            self.state.note = in_doubt_note
        return self.ledger.failure or f"step {self.ledger.name} failed"  # the ledger says why when it gives up
