"""Inputs and results of the three steps: plain dataclasses that every engine
serialises (Temporal through its JSON data converter, the run record as JSON
rows, DBOS as plain JSON values in its step outputs). Fields may be added later
with defaults; never renamed. The steps themselves, in order, are
``durable_agents.steps.plan``'s."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from durable_agents.steps.runstate import JsonValue


@dataclass(frozen=True)
class DraftRequest:
    run_id: str
    task: str
    conversation_id: str
    # The memory cut-off: only messages appended at or before this time (Unix
    # seconds) feed the prompt, so a draft re-run inside the same run (a retry,
    # a reset) sees the context the first one saw. Fixed at the run's start.
    memory_as_of: float | None = None


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
    # Names this start of the run id (kept by resets and retries; new if the id
    # is ever started again): sent as request metadata, it is how a step tells
    # its own run's earlier effect from another run's (``durable_agents.steps.adoption``).
    start_id: str = ""


@dataclass(frozen=True)
class EmailSent:
    message_id: str
    to: str
    idempotency_key: str
    replayed: bool = False
    # Set when the provider held a different email of this run under the key and
    # the step adopted it: the reason, both request digests, and the subject
    # and body that were really sent (later steps and memory use these).
    adopted: dict[str, Any] | None = None


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
    start_id: str = ""


@dataclass(frozen=True)
class OutcomeRecorded:
    ticket_id: str
    idempotency_key: str
    replayed: bool = False
    adopted: dict[str, Any] | None = None  # as EmailSent.adopted, with the summary that was recorded


def sent_reply(drafted_body: str, sent: Any) -> str:
    """The reply the customer really got: the adopted email's body when the step
    adopted an earlier one, else the draft's. Memory remembers this one."""
    adopted = sent.get("adopted") if isinstance(sent, dict) else getattr(sent, "adopted", None)
    if isinstance(adopted, dict) and isinstance(adopted.get("body"), str):
        return adopted["body"]
    return drafted_body


def to_jsonable(value: Any) -> JsonValue:
    """A step result as plain JSON (what the status command prints): a dataclass as its dict of fields, any
    other value as it is (a recorded result is JSON already)."""
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return value
