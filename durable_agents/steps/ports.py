"""What the steps need from the outside world, as interfaces the steps own.

The step functions (``durable_agents.steps.flow``) call three things they do not build:

- a **model** (``LanguageModel``): chat-format messages in, a ``DraftReply``
  (subject, body, one-line summary) out. ``drafting`` implements it;
- the **email, ticket and refund API** (``EffectApi``): ``send_email``,
  ``create_ticket`` and ``issue_refund``, each under an idempotency key the
  engine gives, and
  ``lookup`` (what was applied under a key: how a 409 is adopted,
  ``durable_agents.steps.adoption``, and how a step left in doubt is settled,
  ``durable_agents.steps.settle``). ``durable_agents.providerclient.ProviderClient`` implements it;
- **conversation memory** (``MemoryContext``, ``MemoryWriter``): earlier
  messages of a conversation for the prompt, and the run's exchange appended
  after it. ``memory`` backs them (see the wiring).

The engines receive these in a ``durable_agents.steps.flow.StepDeps``; which implementation
goes in is decided at the edge (``wiring``: from the environment), never in
this package, so ``steps`` imports nothing of the project outside itself.

Contracts every implementation keeps:

- a model and the API raise ``durable_agents.steps.errors.TransientError`` when the same
  call may succeed later and ``PermanentError`` when it cannot (the API: an
  ``IdempotencyConflict`` for a key used by another request). Neither retries
  on its own: retries belong to the durable engine;
- memory never raises for store problems and is never read to decide what has
  been done: it informs prompts. Both memory calls block (SQLite); the steps
  run them in a thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

Remembered = tuple[str, Literal["user", "assistant"], str]
"""One message for ``MemoryWriter``: (message id, role, content)."""


class DraftReply(Protocol):
    """A model's checked answer (``durable_agents.drafting.Draft`` is one)."""

    @property
    def subject(self) -> str: ...

    @property
    def body(self) -> str: ...

    @property
    def summary(self) -> str: ...


@runtime_checkable
class LanguageModel(Protocol):
    """What the draft step needs from a model.

    ``name`` identifies the model in logs and run records, e.g. ``"offline"``
    or ``"openai-compatible:llama3.1"``. ``draft`` takes OpenAI chat-format
    messages: one system message, the earlier turns of the conversation, the
    task as the last user message.
    """

    name: str

    async def draft(self, messages: list[dict]) -> DraftReply: ...


class EmailReceipt(Protocol):
    @property
    def message_id(self) -> str: ...

    @property
    def replayed(self) -> bool: ...  # the API answered from its store: the email went out earlier


class TicketReceipt(Protocol):
    @property
    def ticket_id(self) -> str: ...

    @property
    def replayed(self) -> bool: ...


class RefundReceipt(Protocol):
    @property
    def refund_id(self) -> str: ...

    @property
    def replayed(self) -> bool: ...


class OrderInfo(Protocol):
    """An order as the provider keeps it (``EffectApi.lookup_order``): its total and what was refunded of it,
    in the currency's minor units."""

    @property
    def order_id(self) -> str: ...

    @property
    def total(self) -> int: ...

    @property
    def refunded(self) -> int: ...

    @property
    def currency(self) -> str: ...


class AppliedRequest(Protocol):
    """What the API holds under one idempotency key (``EffectApi.lookup``)."""

    @property
    def requests(self) -> int: ...  # every request that carried the key

    @property
    def applied(self) -> bool: ...

    @property
    def endpoint(self) -> str | None: ...  # e.g. "POST /v1/emails", once applied

    @property
    def applied_at(self) -> str | None: ...

    @property
    def request(self) -> dict[str, Any] | None: ...  # the applied body, metadata included

    @property
    def request_sha256(self) -> str | None: ...

    @property
    def response(self) -> dict[str, Any] | None: ...  # the stored answer: message_id, ticket_id, ...


class EffectApi(Protocol):
    """The email, ticket and refund API the effect steps call (a refund's ``amount``: in the currency's
    minor units). ``metadata`` (the run's start id, ``durable_agents.steps.adoption``) is sent only when given.
    ``aclose`` releases connections: the engine that built the deps calls it when it stops."""

    async def send_email(self, *, idempotency_key: str, run_id: str, to: str, subject: str, body: str,
                         metadata: dict[str, str] | None = None) -> EmailReceipt: ...

    async def create_ticket(self, *, idempotency_key: str, run_id: str, summary: str, email_message_id: str,
                            metadata: dict[str, str] | None = None) -> TicketReceipt: ...

    async def issue_refund(self, *, idempotency_key: str, run_id: str, order_id: str, amount: int,
                           metadata: dict[str, str] | None = None) -> RefundReceipt: ...

    async def lookup(self, idempotency_key: str) -> AppliedRequest | None: ...

    async def lookup_order(self, order_id: str, *, run_id: str | None = None) -> OrderInfo | None: ...

    async def aclose(self) -> None: ...


class AskedCallShape(Protocol):
    """One tool call in a model's answer, as the model gave it: its ``id`` (untrusted), the tool's ``name``,
    and its ``arguments`` as the JSON text the model wrote (not parsed: it may not be JSON)."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def arguments(self) -> str: ...


class ModelAnswerShape(Protocol):
    """A model's answer to one turn of the agent loop: its text, and the tool calls it asks for, in its
    order (none: the answer is final). ``durable_agents.steps.loop.ModelAnswer`` is one."""

    @property
    def content(self) -> str: ...

    @property
    def tool_calls(self) -> Sequence[AskedCallShape]: ...


@runtime_checkable
class ToolModel(Protocol):
    """What the agent loop's turn needs from a model (``durable_agents.steps.loop``): chat-format ``messages`` (the
    window, system first) and the ``tools`` it may call (chat-completions ``tools``: function specs) in; its answer
    out. ``labels`` name the run and the turn (``{"run": ..., "turn": ...}``): an implementation may send
    them along (the lab's stand-in counts requests by them); a real server ignores them.

    The same errors as ``LanguageModel``: ``TransientError`` when asking again may work, ``PermanentError``
    when it cannot. An answer whose tool calls cannot be read is the implementation's to ask again or refuse."""

    name: str

    async def turn(self, messages: list[dict], tools: list[dict], *,
                   labels: Mapping[str, str] | None = None) -> ModelAnswerShape: ...


class MemoryContext(Protocol):
    """Earlier messages of ``conversation_id`` (chat format), appended at or
    before ``as_of`` (Unix seconds; None: all). Empty when memory is off or
    unavailable."""

    def __call__(self, conversation_id: str, as_of: float | None = None) -> list[dict[str, Any]]: ...


class MemoryWriter(Protocol):
    """Append messages to ``conversation_id``, idempotently by message id; how
    many were new (0 on a repeat, or when memory is off or unavailable)."""

    def __call__(self, conversation_id: str, messages: list[Remembered]) -> int: ...
