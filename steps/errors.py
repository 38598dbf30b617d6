"""The error vocabulary shared by the step functions, the LLM clients and the
provider client, and understood by both engines.

Only two kinds matter to a durable engine:

- ``TransientError``: the same request may succeed later (a 503, a timeout, a
  rate limit). The engine retries it, a bounded number of times, after at least
  ``retry_after`` seconds when the other side said how long to wait.
- ``PermanentError``: retrying the same request cannot help (a malformed email
  address, an idempotency conflict, output the model cannot produce). The
  engine stops the run in its terminal FAILED state, naming the step and this
  message.

Messages are written for a person: they say what went wrong and what to do.
"""

from __future__ import annotations


class StepError(Exception):
    """Base class: a step failed in a way the engine should know how to treat."""

    retryable: bool = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class TransientError(StepError):
    """Worth retrying; ``retry_after`` (seconds) is a lower bound when known."""

    retryable = True


class PermanentError(StepError):
    """Not worth retrying: the run must end FAILED with this message."""

    retryable = False
