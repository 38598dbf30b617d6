"""A window derived from a conversation's messages, in this process only.

For a caller that holds the messages elsewhere (a run's record, a workflow's
history) and wants the prompt memory's rule gives them: append them in order
to a :class:`DerivedWindow` under a policy, read ``prompt()``. The same
messages under the same policy always give the same window, in any process
(no clock, no randomness, no store), so a window can be derived again after a
crash, or carried and checked against a derivation.

The first message given with ``pin=True`` (the system instructions) is
pinned; everything else follows the package's eviction rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from durable_agents.memory.messages import Message, stable_digest
from durable_agents.memory.policy import MemoryPolicy
from durable_agents.memory.tokens import TokenCounter, approx_tokens
from durable_agents.memory.window import Conversation, MemoryStats

__all__ = ["DerivedWindow", "chat_tokens", "derive_window"]


class DerivedWindow:
    """The window of messages appended to it, under ``policy`` (see the module docstring)."""

    def __init__(self, policy: MemoryPolicy) -> None:
        self._conversation = Conversation("derived", policy)

    def add(self, message_id: str, chat: Mapping[str, Any], *, pin: bool = False) -> None:
        """Append one chat-format message under ``message_id`` (``MemoryInputError`` if it is not one)."""
        message = Message.from_chat(chat, id=message_id, pinned=pin)
        if message_id in self._conversation.index:
            return  # appended already: memory's appends are idempotent by id
        if pin:
            self._conversation.pin(message, stable_digest(message))
        else:
            self._conversation.append(message, stable_digest(message))

    def prompt(self) -> list[dict[str, Any]]:
        """The window in chat format: pinned messages, then the rest, without an unfinished tool round."""
        return [m.to_chat() for m in self._conversation.window()]

    def ids(self) -> list[str]:
        return [m.id for m in self._conversation.window()]

    def stats(self) -> MemoryStats:
        return self._conversation.stats()


def derive_window(policy: MemoryPolicy, messages: Iterable[tuple[str, Mapping[str, Any]]],
                  pinned: int = 1) -> list[dict[str, Any]]:
    """The prompt of ``messages`` (``(id, chat)`` in order; the first ``pinned`` of them pinned) under ``policy``."""
    window = DerivedWindow(policy)
    for i, (message_id, chat) in enumerate(messages):
        window.add(message_id, chat, pin=i < pinned)
    return window.prompt()


def chat_tokens(chat: Mapping[str, Any], counter: TokenCounter = approx_tokens) -> int:
    """What ``counter`` counts for one chat-format message: what it costs a window it joins."""
    return counter(Message.from_chat(chat, id="counted"))
