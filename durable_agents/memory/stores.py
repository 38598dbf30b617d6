"""The store interface, what both stores share, and the in-memory store."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol, runtime_checkable

from durable_agents.memory.errors import MemoryInputError, MemoryStoreError
from durable_agents.memory.messages import Message
from durable_agents.memory.policy import MemoryPolicy
from durable_agents.memory.window import AppendResult, Conversation, EvictionEvent, MemoryStats, Outcome

__all__ = ["EvictionHook", "InMemoryStore", "Store"]

log = logging.getLogger("memory")

_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)

EvictionHook = Callable[[EvictionEvent], None]


@runtime_checkable
class Store(Protocol):
    """Bounded conversation memory keyed by conversation id (see the package docstring)."""

    policy: MemoryPolicy

    def append(self, conversation_id: str, message: Message) -> AppendResult: ...

    def pin(self, conversation_id: str, message: Message) -> AppendResult: ...

    def unpin(self, conversation_id: str, message_id: str) -> bool: ...

    def window(self, conversation_id: str, *, include_pinned: bool = True,
               as_of: float | None = None) -> list[Message]: ...

    def stats(self, conversation_id: str) -> MemoryStats: ...

    def clear(self, conversation_id: str) -> None: ...

    def close(self) -> None: ...


def check_conversation_id(conversation_id: str) -> str:
    if not isinstance(conversation_id, str) or not conversation_id:
        raise MemoryInputError(f"conversation id must be a non-empty string, got {conversation_id!r}")
    return conversation_id


def check_message(message: Message) -> Message:
    if not isinstance(message, Message):
        raise MemoryInputError(
            f"expected a durable_agents.memory.Message, got {type(message).__name__}; "
            "build one with Message(...) or Message.from_chat(...)"
        )
    return message


class StoreBase:
    """Result building, logging and the eviction hook, shared by both stores."""

    policy: MemoryPolicy

    def __init__(self, policy: MemoryPolicy | None, on_evict: EvictionHook | None) -> None:
        if policy is None:
            policy = MemoryPolicy()
        if not isinstance(policy, MemoryPolicy):
            raise MemoryInputError(f"policy must be a durable_agents.memory.MemoryPolicy, got {type(policy).__name__}")
        if on_evict is not None and not callable(on_evict):
            raise MemoryInputError("on_evict must be a callable taking an EvictionEvent")
        self.policy = policy
        self._on_evict = on_evict

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        pass

    def _duplicate(self, conv: Conversation, message: Message, stored_digest: object, digest: object) -> AppendResult:
        conv.duplicates += 1
        conflict = stored_digest != digest
        if conflict:
            conv.conflicts += 1
            log.warning(
                "conversation %r: message id %r was appended again with different content; "
                "kept the stored message and ignored the new one (ids must identify one message)",
                conv.conversation_id,
                message.id,
            )
        return AppendResult(added=False, duplicate=True, conflict=conflict)

    def _finish(self, conversation_id: str, outcome: Outcome) -> AppendResult:
        """Build the result; log and call the hook for whatever left the window."""
        evicted, abandoned, dropped = outcome.evicted, outcome.abandoned, outcome.dropped
        if outcome.truncated:
            # A truncated message is either stored (entry) or dropped on arrival, never neither.
            truncated_id = next(e.message.id for e in (outcome.entry, dropped) if e is not None)
            log.warning(
                "conversation %r: message %r was larger than the budget allows and was truncated to %d tokens",
                conversation_id,
                truncated_id,
                outcome.tokens,
            )
        events: list[EvictionEvent] = []
        if abandoned:
            events.append(_event(conversation_id, "abandoned", abandoned))
            log.warning(
                "conversation %r: evicted an unfinished tool round (%d messages, %d tokens: %s) because a "
                "new message arrived before all its tool results",
                conversation_id,
                events[-1].messages,
                events[-1].tokens,
                ", ".join(events[-1].message_ids),
            )
        if dropped is not None:
            evicted = [*evicted, dropped]
        if evicted:
            events.append(_event(conversation_id, "budget", evicted))
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "conversation %r: evicted %d messages (%d tokens) to stay within max_tokens=%d, "
                    "max_messages=%d%s",
                    conversation_id,
                    events[-1].messages,
                    events[-1].tokens,
                    self.policy.max_tokens,
                    self.policy.max_messages,
                    " (a tool result whose call had already been evicted)" if dropped is not None else "",
                )
        hook = self._on_evict
        if hook is not None:
            for event in events:
                try:
                    hook(event)
                except Exception:  # memory must never stop a run, not even through its hook
                    log.exception("conversation %r: the on_evict hook raised; ignored", conversation_id)
        if len(events) == 1:
            only = events[0]
            ids, messages, tokens = only.message_ids, only.messages, only.tokens
        else:
            ids = tuple(i for event in events for i in event.message_ids)
            messages, tokens = len(ids), sum(event.tokens for event in events)
        return _new_tuple(AppendResult, (True, False, messages, tokens, ids, outcome.truncated, False, outcome.tokens))


def _event(conversation_id: str, reason: str, entries: list) -> EvictionEvent:
    tokens = 0
    for e in entries:
        tokens += e.tokens
    return EvictionEvent(conversation_id, reason, tuple([e.message.id for e in entries]), len(entries), tokens)


class _Slot:
    """A conversation plus the ids it evicted recently (for duplicate detection)."""

    __slots__ = ("conv", "evicted_ids", "appended_at")

    def __init__(self, conv: Conversation) -> None:
        self.conv = conv
        self.evicted_ids: OrderedDict[str, int] = OrderedDict()
        self.appended_at: dict[str, float] = {}  # stored message id -> when (for as_of)


class InMemoryStore(StoreBase):
    """Conversation memory in this process only. Thread-safe.

    ``on_evict`` is called (outside the store's lock) with an
    :class:`EvictionEvent` whenever messages leave a window.
    """

    def __init__(self, policy: MemoryPolicy | None = None, *, on_evict: EvictionHook | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(policy, on_evict)
        self._clock = clock
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _slot(self, conversation_id: str) -> _Slot | None:
        """The conversation's slot, or None if it has none (the id is checked then)."""
        if self._closed:
            raise MemoryStoreError("this InMemoryStore is closed; open a new one")
        slot = self._slots.get(conversation_id)
        if slot is None:
            check_conversation_id(conversation_id)
        return slot

    def _new_slot(self, conversation_id: str) -> _Slot:
        """The conversation's slot, made if it has none."""
        slot = self._slot(conversation_id)
        if slot is None:
            slot = self._slots[conversation_id] = _Slot(Conversation(conversation_id, self.policy))
        return slot

    def append(self, conversation_id: str, message: Message) -> AppendResult:
        """Store ``message`` (pinned if ``message.pinned``) and evict down to the policy's bounds."""
        if message.__class__ is not Message:
            check_message(message)
        # Python's hash is salted per process, which is fine for a store that lives in one process;
        # the SQLite store uses durable_agents.memory.messages.stable_digest instead.
        digest = hash((message.role, message.content, message.tool_calls, message.tool_call_id))
        with self._lock:
            slot = self._slots.get(conversation_id)
            if slot is None:
                slot = self._new_slot(conversation_id)
            conv = slot.conv
            stored = conv.index.get(message.id)
            if stored is not None:
                return self._duplicate(conv, message, stored.digest, digest)
            ledger = slot.evicted_ids
            if ledger:
                old = ledger.get(message.id)
                if old is not None:
                    return self._duplicate(conv, message, old, digest)
            outcome = conv.pin(message, digest) if message.pinned else conv.append(message, digest)
            times = slot.appended_at
            if outcome.entry is not None:
                times[message.id] = self._clock()
            if not (outcome.evicted or outcome.abandoned or outcome.dropped):
                if not outcome.truncated:  # the common case, kept short
                    return _new_tuple(AppendResult, (True, False, 0, 0, (), False, False, outcome.tokens))
            else:
                for group in (outcome.abandoned, outcome.evicted):
                    for e in group:
                        times.pop(e.message.id, None)
                if self.policy.remember_evicted:
                    self._remember(slot, outcome)
        return self._finish(conversation_id, outcome)

    def _remember(self, slot: _Slot, outcome: Outcome) -> None:
        ledger = slot.evicted_ids
        for group in (outcome.abandoned, outcome.evicted):
            for e in group:
                ledger[e.message.id] = e.digest
        if outcome.dropped is not None:
            ledger[outcome.dropped.message.id] = outcome.dropped.digest
        limit = self.policy.remember_evicted
        while len(ledger) > limit:
            ledger.popitem(last=False)

    def pin(self, conversation_id: str, message: Message) -> AppendResult:
        """Store ``message`` as pinned: never evicted, shown first, counted against the budget."""
        check_message(message)
        if not message.pinned:
            message = replace(message, pinned=True)
        return self.append(conversation_id, message)

    def unpin(self, conversation_id: str, message_id: str) -> bool:
        """Remove a pinned message (e.g. replaced instructions). False if it was not pinned."""
        with self._lock:
            slot = self._slot(conversation_id)
            if slot is None or slot.conv.unpin(message_id) is None:
                return False
            slot.appended_at.pop(message_id, None)
            return True

    def window(self, conversation_id: str, *, include_pinned: bool = True, as_of: float | None = None) -> list[Message]:
        """Pinned messages first, then the rest in order; never an unanswered tool call.

        ``as_of`` (seconds, the store's clock): leave out what was appended
        later, by whole blocks (see ``Conversation.window``)."""
        with self._lock:
            slot = self._slot(conversation_id)
            if slot is None:
                return []
            if as_of is None:
                return slot.conv.window(include_pinned)
            hide = {mid for mid, at in slot.appended_at.items() if at > as_of}
            return slot.conv.window(include_pinned, hide)

    def stats(self, conversation_id: str) -> MemoryStats:
        with self._lock:
            slot = self._slot(conversation_id)
            conv = slot.conv if slot is not None else Conversation(conversation_id, self.policy)
            return conv.stats()

    def clear(self, conversation_id: str) -> None:
        """Forget the conversation: window, pinned messages, remembered ids and counters."""
        with self._lock:
            self._slot(conversation_id)
            self._slots.pop(conversation_id, None)

    def conversations(self) -> list[str]:
        with self._lock:
            return list(self._slots)

    def close(self) -> None:
        with self._lock:
            self._slots.clear()
            self._closed = True
