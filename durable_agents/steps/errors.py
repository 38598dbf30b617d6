"""The error vocabulary shared by the step functions, the LLM clients and the
provider client, and understood by every engine.

Only two kinds matter to a durable engine:

- ``TransientError``: the same request may succeed later (a 503, a timeout, a
  rate limit). The engine retries it within the step's error budget
  (``durable_agents.steps.retry``), after at least ``retry_after`` seconds when the other side
  said how long to wait. ``in_doubt`` says the request may have been applied
  although no answer said so (a timeout or a broken connection after it was
  sent, a 5xx): if the run ends before a retry settles it, the step is shown
  *in doubt*, not as "nothing happened". ``outage`` says the other side was
  not reached or did not answer this request (unreachable, a timeout, 408,
  429, 502-504): what clears by itself, unlike an error it answered to the
  request (``durable_agents.steps.retry.StepLedger``'s ``same_error_limit`` counts only those).
- ``PermanentError``: retrying the same request cannot help (a malformed email
  address, an idempotency conflict, output the model cannot produce). The
  engine stops the run in its terminal FAILED state, naming the step and this
  message.

Messages are written for a person: they say what went wrong and what to do.

``WORKER_SHUTDOWN_TYPE`` names a failure that is neither kind, because it is
not the step's: on Temporal, an attempt cut short because its worker is
shutting down (``activities`` raises it; the workflow and ``durable_agents.flowclient.status``
read it from history; ``durable_agents.steps.retry`` says how it counts). A plain string
here, so that a reader of a history need not import the activities. Histories
record it: its value never changes.

This module imports nothing: every engine and reader can import it cheaply.
"""

from __future__ import annotations

WORKER_SHUTDOWN_TYPE = "WorkerShutdown"
"""The ApplicationError type of an attempt cut short by its worker shutting down."""


class StepError(Exception):
    """Base class: a step failed in a way the engine should know how to treat."""

    def __init__(self, message: str, *, retry_after: float | None = None, in_doubt: bool = False,
                 outage: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.in_doubt = in_doubt
        self.outage = outage


class TransientError(StepError):
    """Worth retrying; ``retry_after`` (seconds) is a lower bound when known."""


class PermanentError(StepError):
    """Not worth retrying: the run must end FAILED with this message."""


class IdempotencyConflict(PermanentError):
    """The receiver holds a *different* request under this idempotency key.

    Never retried: the same request would get the same answer. The step that
    gets it asks the receiver what was applied under the key and adopts it
    when it belongs to the same run (``durable_agents.steps.adoption``); otherwise the run
    fails with this message."""


class Refused(PermanentError):
    """The receiver refused the request as invalid, and applied nothing (an unknown order, a refund over
    the order's total, a field it does not accept). ``code`` is the receiver's error code, e.g.
    ``refund_exceeds_total``. A flow step fails on it like on any ``PermanentError``; the agent loop's tools
    (``durable_agents.steps.loop``) hand it back to the model as the tool's result instead, since the model chose the
    arguments and may choose better."""

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.code = code
