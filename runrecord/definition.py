"""The flow as the run record drives it: the SAME step functions as the
Temporal path (``steps.flow``), each with the request it is given and the
retry policy it runs under.

A request is built only from the run's inputs and the *recorded* results of
earlier steps, never from anything held in memory, so a resumed process sends
exactly what the crashed one would have sent (same idempotency key, same
body). The retry policies mirror ``workflows/agent_flow.py``: draft 4
attempts from 0.2 s doubling to at most 10 s; the two effect steps 6 attempts
from 0.2 s doubling to at most 3 s. A ``retry_after`` from the other side
replaces the computed backoff for that retry (like Temporal's
``next_retry_delay``), capped at ``MAX_RETRY_AFTER``.

The flow is a plain tuple, injectable into ``runrecord.runner.Runner``, so a
test can hand it a changed one and see the change caught on resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from steps import flow as step_functions
from steps.keys import idempotency_key
from steps.models import STEP_NAMES, DraftRequest, RecordRequest, SendRequest

MAX_RETRY_AFTER = 60.0


@dataclass(frozen=True)
class RunInputs:
    run_id: str
    task: str
    email: str
    conversation_id: str


@dataclass(frozen=True)
class RetryPolicy:
    maximum_attempts: int
    initial_interval: float
    backoff_coefficient: float = 2.0
    maximum_interval: float = 10.0

    def delay(self, failed_attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after attempt ``failed_attempt`` (1-based) failed."""
        if retry_after is not None and retry_after > 0:
            return min(float(retry_after), MAX_RETRY_AFTER)
        return min(self.initial_interval * self.backoff_coefficient ** (failed_attempt - 1), self.maximum_interval)


DRAFT_POLICY = RetryPolicy(maximum_attempts=4, initial_interval=0.2, maximum_interval=10.0)
EFFECT_POLICY = RetryPolicy(maximum_attempts=6, initial_interval=0.2, maximum_interval=3.0)

RequestBuilder = Callable[[RunInputs, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class FlowStep:
    """One step: its name (recorded per position), function, request and policy.

    ``effect``: the step sends a keyed request to the provider, so each attempt
    records an intent (key and request) before it can be sent.
    """

    name: str
    run: Callable[[Any, Any], Awaitable[Any]]
    request: RequestBuilder
    policy: RetryPolicy
    effect: bool


def _draft_request(inputs: RunInputs, results: Mapping[str, Any]) -> DraftRequest:
    return DraftRequest(run_id=inputs.run_id, task=inputs.task, conversation_id=inputs.conversation_id)


def _send_request(inputs: RunInputs, results: Mapping[str, Any]) -> SendRequest:
    drafted = results["draft"]
    return SendRequest(
        run_id=inputs.run_id,
        to=inputs.email,
        subject=drafted["subject"],
        body=drafted["body"],
        idempotency_key=idempotency_key(inputs.run_id, "send_confirmation"),
    )


def _record_request(inputs: RunInputs, results: Mapping[str, Any]) -> RecordRequest:
    return RecordRequest(
        run_id=inputs.run_id,
        summary=results["draft"]["summary"],
        email_message_id=results["send_confirmation"]["message_id"],
        idempotency_key=idempotency_key(inputs.run_id, "record_outcome"),
    )


DEFAULT_FLOW: tuple[FlowStep, ...] = (
    FlowStep("draft", step_functions.draft, _draft_request, DRAFT_POLICY, effect=False),
    FlowStep("send_confirmation", step_functions.send_confirmation, _send_request, EFFECT_POLICY, effect=True),
    FlowStep("record_outcome", step_functions.record_outcome, _record_request, EFFECT_POLICY, effect=True),
)
assert tuple(s.name for s in DEFAULT_FLOW) == STEP_NAMES, "the run record must drive the same flow as Temporal"
