"""Each step's request, built one way for every engine: pure functions from the
run's inputs and the results of the steps before it.

A request is built only from ``RunInputs`` (what the run was started with,
fixed for its life) and the *recorded* results of earlier steps, never from
anything else held in memory, so a resumed or replayed run sends exactly what
the first attempt would have sent: the same idempotency key (``durable_agents.steps.keys``),
the same body, the same start id metadata (``durable_agents.steps.adoption``) and the same
memory cut-off.

``results`` maps a step name to its result, either as the step returned it
(``DraftResult``, ``EmailSent``: the Temporal workflow, the in-memory
"before") or as recorded JSON (a dict: the run record, DBOS). Both read the
same.

Pure and deterministic (no clock, no randomness, no I/O): the Temporal
workflow calls these in workflow code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.models import DraftRequest, RecordRequest, RememberRequest, SendRequest, sent_reply
from durable_agents.steps.params import ParamValue


@dataclass(frozen=True)
class RunInputs:
    """What a run was started with.

    ``start_id`` names this start of the run id (Temporal: the original
    execution run id; run record and DBOS: a token drawn at start); empty:
    the requests carry no start metadata.
    ``created_at`` is the memory cut-off (Unix seconds; None: no cut-off).
    ``params``: the values a step needs beyond these (a refund's amount),
    recorded with the run (``durable_agents.steps.params``); empty for runs without any.
    """

    run_id: str
    task: str
    email: str
    conversation_id: str
    start_id: str = ""
    created_at: float | None = None
    params: Mapping[str, ParamValue] = field(default_factory=dict)


RequestBuilder = Callable[[RunInputs, Mapping[str, Any]], Any]


def _field(result: Any, name: str) -> Any:
    """A field of a step's result, recorded (a dict) or as returned (a dataclass)."""
    return result[name] if isinstance(result, Mapping) else getattr(result, name)


def draft_request(inputs: RunInputs, results: Mapping[str, Any]) -> DraftRequest:
    return DraftRequest(run_id=inputs.run_id, task=inputs.task, conversation_id=inputs.conversation_id,
                        memory_as_of=inputs.created_at)


def send_request(inputs: RunInputs, results: Mapping[str, Any]) -> SendRequest:
    drafted = results["draft"]
    return SendRequest(
        run_id=inputs.run_id,
        to=inputs.email,
        subject=_field(drafted, "subject"),
        body=_field(drafted, "body"),
        idempotency_key=idempotency_key(inputs.run_id, "send_confirmation"),
        start_id=inputs.start_id,
    )


def remember_request(inputs: RunInputs, results: Mapping[str, Any]) -> RememberRequest:
    """The exchange memory keeps: the task, and the reply that was really sent
    (the adopted email's body if the send step adopted one, ``sent_reply``)."""
    drafted = results.get("draft") or {}
    body = drafted.get("body", "") if isinstance(drafted, Mapping) else drafted.body
    return RememberRequest(run_id=inputs.run_id, conversation_id=inputs.conversation_id, task=inputs.task,
                           reply=sent_reply(body, results.get("send_confirmation") or {}))


def record_request(inputs: RunInputs, results: Mapping[str, Any], *, remember: bool = False) -> RecordRequest:
    """``remember``: the step also appends the exchange to memory once the
    ticket is recorded (the Temporal workflow's choice, saving a round trip;
    the other engines remember after the run)."""
    return RecordRequest(
        run_id=inputs.run_id,
        summary=_field(results["draft"], "summary"),
        email_message_id=_field(results["send_confirmation"], "message_id"),
        idempotency_key=idempotency_key(inputs.run_id, "record_outcome"),
        remember=remember_request(inputs, results) if remember else None,
        start_id=inputs.start_id,
    )
