"""Inputs and results of the three steps: plain dataclasses that both engines
serialise (Temporal through its JSON data converter, the run record as JSON
rows). Fields may be added later with defaults; never renamed."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

STEP_NAMES: tuple[str, ...] = ("draft", "send_confirmation", "record_outcome")
"""The flow, in order. Both engines check a run against this list on resume."""


@dataclass(frozen=True)
class DraftRequest:
    run_id: str
    task: str
    conversation_id: str


@dataclass(frozen=True)
class DraftResult:
    subject: str
    body: str
    summary: str
    model: str
    context_messages: int = 0


@dataclass(frozen=True)
class SendRequest:
    run_id: str
    to: str
    subject: str
    body: str
    idempotency_key: str


@dataclass(frozen=True)
class EmailSent:
    message_id: str
    to: str
    idempotency_key: str
    replayed: bool = False


@dataclass(frozen=True)
class RememberRequest:
    """After a run's last effect: its exchange, to be appended to conversation memory.

    Message ids derive from the run id, so a retried or resumed append adds
    nothing the second time."""

    run_id: str
    conversation_id: str
    task: str
    reply: str


@dataclass(frozen=True)
class RecordRequest:
    run_id: str
    summary: str
    email_message_id: str
    idempotency_key: str
    # Set by the Temporal workflow: the activity appends the exchange to memory
    # once the ticket is recorded (best effort), saving a round trip.
    remember: RememberRequest | None = None


@dataclass(frozen=True)
class OutcomeRecorded:
    ticket_id: str
    idempotency_key: str
    replayed: bool = False


def to_jsonable(value: Any) -> Any:
    """A step result as plain JSON (what the status command prints)."""
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return value
