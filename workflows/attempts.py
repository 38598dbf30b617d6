"""How one attempt of a step ended, as the retry rules (``steps.retry``) see
it: read from the ActivityError the workflow gets. Pure functions, no
workflow state: imported by ``workflows.agent_flow`` through the sandbox
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
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError, TimeoutType

from activities import WORKER_SHUTDOWN_TYPE

# Patch ids: histories record them, so their values never change.
#
# Runs whose history carries this patch marker retry in workflow code by
# steps.retry, send their start id and adopt; runs recorded before it do not.
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
    """How the attempt that raised ``err`` ended, under a rule of ``version`` (``steps.retry``)."""
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
