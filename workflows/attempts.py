"""How one attempt of a step ended, as the retry rules (``steps.retry``) see
it: read from the ActivityError the workflow gets. Pure functions, no
workflow state: imported by ``workflows.agent_flow`` through the sandbox
(passed through, so it is not compiled and executed again each time a
worker builds the run afresh).

=======================================  ===========  =====================
the attempt ended with                   kind         in doubt
=======================================  ===========  =====================
heartbeat timeout (the worker died)      crash        (for an effect, yes)
``WorkerShutdown`` (worker stopping)     crash        (for an effect, yes)
start-to-close timeout (live worker)     transient    yes
non-retryable ApplicationError           permanent    as its details say
any other ApplicationError               transient    as its details say
=======================================  ===========  =====================

The activity wrapper puts ``seconds`` (how long the attempt took),
``retry_after`` and ``in_doubt`` in a failure's details (``activities``).
"""

from __future__ import annotations

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
# A run made by a reset marks each failure it decides on itself, so that a
# replay tells those from the failures kept from before the reset
# (``AgentFlow._counts``). One id per run, step and attempt: ``workflow.patched``
# answers once per id for a run's whole life, so one constant id would mark
# only the first. (The frozen path's marker is ``before_live.MEMORY_IN_RECORD_PATCH``.)
COUNTED_PATCH = "counted-{run_id}-{step}-{attempt}"

# A killed worker's attempt is noticed within about a second: the activity
# wrapper heartbeats every 0.3 s, and the SDK sends at most one heartbeat per
# 0.8 x this timeout (0.8 s). Start-to-close bounds one attempt on a live
# worker: the rule's (steps.retry.ATTEMPT_TIMEOUT_SECONDS).
HEARTBEAT_TIMEOUT = timedelta(seconds=1)
# One attempt per scheduled activity: the workflow decides about the next one.
ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)


class Ending:
    """How one attempt ended: ``kind`` is crash, transient or permanent."""

    __slots__ = ("kind", "message", "seconds", "retry_after", "in_doubt")

    def __init__(self, kind: str, message: str, seconds: float | None = None, retry_after: float | None = None,
                 in_doubt: bool = False) -> None:
        self.kind, self.message, self.seconds = kind, message, seconds
        self.retry_after, self.in_doubt = retry_after, in_doubt


def _details(cause: ApplicationError) -> dict[str, Any]:
    if cause.details and isinstance(cause.details[0], dict):
        return cause.details[0]
    return {}


def ending_of(err: ActivityError, attempt_timeout: timedelta) -> Ending:
    cause = err.cause
    if isinstance(cause, TimeoutError):
        if cause.type == TimeoutType.HEARTBEAT:
            return Ending("crash", "the worker running it stopped heartbeating (it died, or hung)")
        seconds = attempt_timeout.total_seconds()
        return Ending("transient", f"timed out after {seconds:g} s on a live worker (start-to-close)",
                      seconds=seconds, in_doubt=True)
    if isinstance(cause, ApplicationError):
        details = _details(cause)
        in_doubt = bool(details.get("in_doubt"))
        if cause.type == WORKER_SHUTDOWN_TYPE:
            return Ending("crash", "the worker running it shut down mid-attempt")
        if cause.non_retryable:
            return Ending("permanent", cause.message, in_doubt=in_doubt)
        took = details.get("seconds")
        retry_after = details.get("retry_after")
        return Ending(
            "transient", cause.message,
            seconds=float(took) if isinstance(took, (int, float)) else None,
            retry_after=float(retry_after) if isinstance(retry_after, (int, float)) else None,
            in_doubt=in_doubt,
        )
    if isinstance(cause, CancelledError):
        return Ending("transient", "the attempt was cancelled")
    return Ending("transient", str(cause or err))
