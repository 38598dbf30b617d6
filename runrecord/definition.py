"""The flow as the run record drives it: the SAME step functions as the
Temporal path (``steps.flow``), each with the request it is given and the
retry policy it runs under.

A request is built only from the run's inputs and the *recorded* results of
earlier steps, never from anything held in memory, so a resumed process sends
exactly what the crashed one would have sent (same idempotency key, same
body). The run's inputs include its start id (sent as request metadata, for
``steps.adoption``) and its creation time (the memory cut-off). Retries follow
``steps.retry``, the same rule and numbers as the Temporal workflow; the rule
a run runs under is recorded with it.

The flow is a plain tuple, injectable into ``runrecord.runner.Runner``, so a
test can hand it a changed one and see the change caught on resume.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from steps import flow as step_functions
from steps.keys import idempotency_key
from steps.models import STEP_NAMES, DraftRequest, RecordRequest, SendRequest


@dataclass(frozen=True)
class RunInputs:
    run_id: str
    task: str
    email: str
    conversation_id: str
    start_id: str = ""  # drawn at start; empty for runs recorded before it existed
    created_at: float | None = None  # the memory cut-off


RequestBuilder = Callable[[RunInputs, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class FlowStep:
    """One step: its name (recorded per position), function and request.

    ``effect``: the step sends a keyed request to the provider, so each attempt
    records an intent (key and request) before it can be sent.
    """

    name: str
    run: Callable[[Any, Any], Awaitable[Any]]
    request: RequestBuilder
    effect: bool


def _draft_request(inputs: RunInputs, results: Mapping[str, Any]) -> DraftRequest:
    return DraftRequest(run_id=inputs.run_id, task=inputs.task, conversation_id=inputs.conversation_id,
                        memory_as_of=inputs.created_at)


def _send_request(inputs: RunInputs, results: Mapping[str, Any]) -> SendRequest:
    drafted = results["draft"]
    return SendRequest(
        run_id=inputs.run_id,
        to=inputs.email,
        subject=drafted["subject"],
        body=drafted["body"],
        idempotency_key=idempotency_key(inputs.run_id, "send_confirmation"),
        start_id=inputs.start_id,
    )


def _record_request(inputs: RunInputs, results: Mapping[str, Any]) -> RecordRequest:
    return RecordRequest(
        run_id=inputs.run_id,
        summary=results["draft"]["summary"],
        email_message_id=results["send_confirmation"]["message_id"],
        idempotency_key=idempotency_key(inputs.run_id, "record_outcome"),
        start_id=inputs.start_id,
    )


DEFAULT_FLOW: tuple[FlowStep, ...] = (
    FlowStep("draft", step_functions.draft, _draft_request, effect=False),
    FlowStep("send_confirmation", step_functions.send_confirmation, _send_request, effect=True),
    FlowStep("record_outcome", step_functions.record_outcome, _record_request, effect=True),
)
assert tuple(s.name for s in DEFAULT_FLOW) == STEP_NAMES, "the run record must drive the same flow as Temporal"
