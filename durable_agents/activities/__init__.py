"""Temporal activity wrappers around the engine-agnostic steps (``durable_agents.steps.flow``).

One activity per step of ``durable_agents.steps.plan``, one typed dataclass input each,
registered under the step's name, which is also its method's name: the
workflow finds a step in the plan by it. A wrapper adds what only Temporal
needs:

- heartbeats while the step runs, so that a worker killed mid-step is noticed
  after the activity's heartbeat timeout (about a second) instead of its
  start-to-close timeout. The wrapper calls ``heartbeat()`` every 0.3 s; the
  SDK sends at most one per 0.8 x the heartbeat timeout (0.8 s for the 1 s
  timeout), so that is the real cadence. The steps never block this event
  loop: memory's SQLite calls run in a thread (``durable_agents.steps.flow``);
- the step's attempt number in the output and the log lines. The workflow
  schedules each attempt as its own activity with id ``<step>/<attempt>``
  (``durable_agents.workflows.agent_flow``); runs recorded before that use Temporal's attempt;
- the error mapping, for the workflow's retry rules (``durable_agents.steps.retry``):
  ``TransientError`` becomes a retryable ApplicationError whose details say how
  long the attempt took, the other side's Retry-After and whether the effect is
  in doubt; ``PermanentError`` (an idempotency conflict included) and
  ``InputError`` become non-retryable ones, which end the run FAILED at once;
  anything unexpected is retryable, with the same details, and in doubt for a
  step with an effect (``durable_agents.steps.plan.EFFECT_STEPS``): the exception may have
  come after the request reached the provider, so nothing says it was not
  applied. An attempt cut short because this worker is shutting down raises
  ``WorkerShutdown`` (``durable_agents.steps.errors.WORKER_SHUTDOWN_TYPE``): not the step's
  error.

Idempotency keys are not made here: the workflow derives them (``durable_agents.steps.keys``)
and passes them in the input, so they are in the history and identical on
every attempt.

The wrapper is ``run_heartbeating``, one function every activity class
shares: ``FlowActivities`` here, and the agent loop's ``model_turn`` and
``tool_call`` (``durable_agents.activities.loop``), whose steps are named by the loop
(``turn-3``, ``turn-3/call-1``) and whose effect is the tool's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from durable_agents.steps import flow
from durable_agents.steps.errors import (
    WORKER_SHUTDOWN_TYPE as WORKER_SHUTDOWN_TYPE,  # re-exported: durable_agents.workflows.attempts reads it here
)
from durable_agents.steps.errors import PermanentError, TransientError
from durable_agents.steps.limits import InputError
from durable_agents.steps.models import (
    DraftRequest,
    DraftResult,
    EmailSent,
    OutcomeRecorded,
    RecordRequest,
    RememberRequest,
    SendRequest,
)
from durable_agents.steps.plan import EFFECT_STEPS
from durable_agents.steps.startedline import STARTED

T = TypeVar("T")
ResultT = TypeVar("ResultT", covariant=True)

log = logging.getLogger("activities")



def step_attempt() -> int:
    """This attempt's number within its step: from the activity id ``<step>/<n>``
    the workflow gives each attempt, else (runs recorded before) Temporal's."""
    info = activity.info()
    _, sep, number = info.activity_id.rpartition("/")
    return int(number) if sep and number.isdigit() else info.attempt


class StepOutput(Protocol[ResultT]):
    """What every step activity returns: the step's result and this attempt's number."""

    @property
    def result(self) -> ResultT: ...

    @property
    def attempt(self) -> int: ...


@dataclass(frozen=True)
class DraftOutput:
    result: DraftResult
    attempt: int


@dataclass(frozen=True)
class SendOutput:
    result: EmailSent
    attempt: int


@dataclass(frozen=True)
class RecordOutput:
    result: OutcomeRecorded
    attempt: int


async def run_heartbeating(step: Awaitable[T], *, name: str, effect: bool, heartbeat_every: float = 0.3) -> T:
    """Run one attempt of a step inside the activity that called this: its started line (``STARTED``,
    under ``name``), heartbeats every ``heartbeat_every`` s while it runs, and the error mapping of the
    module docstring. ``effect``: the step sends a keyed request, so an unexpected error leaves it in
    doubt. Shared by every activity class (``FlowActivities``; ``durable_agents.activities.loop.LoopActivities``,
    whose steps are named by the loop, ``turn-3``, ``turn-3/call-1``, not by the activity type)."""
    began = time.monotonic()

    def details(**more) -> dict:
        return {"attempt": step_attempt(), "seconds": round(time.monotonic() - began, 3), **more}

    try:
        return await _run_logged(step, name, began, heartbeat_every)
    except TransientError as err:
        raise ApplicationError(
            err.message,
            details(retry_after=err.retry_after, in_doubt=err.in_doubt, outage=err.outage),
            type="TransientError",
            # Read by server-side retries only (runs recorded before the workflow-side ones).
            next_retry_delay=timedelta(seconds=err.retry_after) if err.retry_after else None,
        ) from err
    except (PermanentError, InputError) as err:
        raise ApplicationError(str(err), details(), type=type(err).__name__, non_retryable=True) from err
    except asyncio.CancelledError:
        if activity.is_worker_shutdown():
            raise ApplicationError(
                "this worker shut down during the attempt", details(), type=WORKER_SHUTDOWN_TYPE
            ) from None
        raise
    except Exception as err:  # a bug or an unexpected failure: retried within the budget
        # Nothing says an effect step's request was not applied: it may have failed after sending.
        raise ApplicationError(
            f"{type(err).__name__}: {err}", details(retry_after=None, in_doubt=effect), type=type(err).__name__
        ) from err


async def _run_logged(step: Awaitable[T], name: str, began: float, heartbeat_every: float) -> T:
    info = activity.info()
    attempt = step_attempt()
    # One line per execution: tests count these to prove a step did not run again.
    # Run id, step and attempt on every line; never payload values (the task,
    # the address) and never configuration secrets.
    log.info(STARTED, name, info.workflow_id, attempt)
    task = asyncio.ensure_future(step)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=heartbeat_every)
            if done:
                break
            activity.heartbeat()
        result = task.result()
        log.info("step %s completed: run %s attempt %d in %.3f s",
                 name, info.workflow_id, attempt, time.monotonic() - began)
        return result
    except BaseException as err:
        log.warning("step %s failed: run %s attempt %d after %.3f s: %s",
                    name, info.workflow_id, attempt, time.monotonic() - began, type(err).__name__)
        raise
    finally:
        if not task.done():
            task.cancel()


class FlowActivities:
    """The activities, bound to the dependencies of one worker process."""

    def __init__(self, deps: flow.StepDeps, *, heartbeat_every: float = 0.3) -> None:
        self.deps = deps
        self.heartbeat_every = heartbeat_every

    async def _run(self, step: Awaitable[T]) -> T:
        # A flow step is named as its activity (durable_agents.steps.plan), and has an effect when the plan says so.
        name = activity.info().activity_type
        return await run_heartbeating(step, name=name, effect=name in EFFECT_STEPS,
                                      heartbeat_every=self.heartbeat_every)

    @activity.defn(name="draft")
    async def draft(self, req: DraftRequest) -> DraftOutput:
        result = await self._run(flow.draft(req, self.deps))
        return DraftOutput(result=result, attempt=step_attempt())

    @activity.defn(name="send_confirmation")
    async def send_confirmation(self, req: SendRequest) -> SendOutput:
        result = await self._run(flow.send_confirmation(req, self.deps))
        return SendOutput(result=result, attempt=step_attempt())

    @activity.defn(name="record_outcome")
    async def record_outcome(self, req: RecordRequest) -> RecordOutput:
        result = await self._run(self._record_then_remember(req))
        return RecordOutput(result=result, attempt=step_attempt())

    async def _record_then_remember(self, req: RecordRequest):
        result = await flow.record_outcome(req, self.deps)
        if req.remember is not None:
            # In this activity rather than a 4th one: a round trip less per run
            # (docs/benchmarks.md). After the effect, so memory never holds an
            # exchange whose outcome was not recorded; a crash in between
            # retries both, and both are idempotent. Inside the heartbeating
            # wrapper: a memory file locked by another process delays the
            # write, never the heartbeats.
            await self._remember_best_effort(req.remember)
        return result

    async def _remember_best_effort(self, req: RememberRequest) -> None:
        # Memory informs later prompts; failing here would retry a step whose
        # effect is already applied, for nothing. Log and carry on.
        try:
            await flow.remember_exchange(req, self.deps)
        except Exception as err:  # noqa: BLE001 - best effort by design
            log.warning("exchange not remembered: run %s: %s", req.run_id, type(err).__name__)

    @activity.defn(name="remember_exchange")
    async def remember_exchange(self, req: RememberRequest) -> int:
        """Not a step: appends the finished run's exchange to conversation memory.

        Scheduled only by runs whose history predates the memory write moving
        into ``record_outcome`` (``MEMORY_IN_RECORD_PATCH`` in
        durable_agents/workflows/before_live.py); registered so that such runs can still finish."""
        return await flow.remember_exchange(req, self.deps)

    def all(self) -> list:
        return [self.draft, self.send_confirmation, self.record_outcome, self.remember_exchange]
