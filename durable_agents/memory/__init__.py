"""Bounded conversation memory that feeds prompts.

Memory *informs* prompts. It is never read to decide what has happened (that is
the run record's job), it knows nothing of runs or Temporal, and reading it
never stops a run: :func:`read_window` turns a missing or damaged store into an
empty context and a warning.

The eviction rule
=================

Bounds. ``MemoryPolicy.max_tokens`` and ``MemoryPolicy.max_messages`` bound the
window, pinned messages included. Both are enforced after every append: when
``append`` returns, the stored window is within both.

Pinned messages (the system instructions, ``pin()``) are never evicted, are
shown first in pin order, and count against both bounds. Pinning that would
leave no room (pinned tokens >= ``max_tokens`` or pinned messages >=
``max_messages``) raises :class:`PinnedTooLargeError` and stores nothing.

Units. Messages are grouped as they arrive. A *block* is what is never split:
one user message; one assistant (or unpinned system) message; or an assistant
message with tool calls together with all the tool results that answer them (a
*tool round*). An *exchange* is a user message and every block after it up to
the next user message (messages before the first user message form an
exchange of their own).

Order of eviction, applied until the window is within both bounds:

1. the oldest whole exchange, while more than one exchange is stored;
2. then, inside the newest exchange, its oldest block, except that the
   exchange's opening user message is kept while any other of its blocks but
   the newest can go;
3. then that user message; last, the newest block itself (possible only for a
   tool round that alone exceeds the room, or a round with more calls than the
   message cap allows).

Whole blocks go, so eviction never leaves a tool result without its call or a
call without its results.

An unfinished tool round (an assistant message whose calls do not all have
results yet) is stored and counted, but ``window()`` leaves it out until its
last result arrives, so a window is always a valid prompt. If the round is
evicted while unfinished (rule 3), its results that arrive later are evicted on
arrival (reported as evicted, never rejected). If a user or assistant message
arrives before the round is finished, the round is *abandoned*: deleted,
reported as evicted with reason ``"abandoned"``, and logged as a warning.

A tool result is accepted only for a call of the unfinished round (or of one
evicted while unfinished); any other ``tool_call_id`` (unknown, already
answered, abandoned) raises :class:`UnknownToolCallError` and stores nothing.

Oversize. A message whose own count exceeds the room (``max_tokens`` minus the
pinned tokens) follows ``MemoryPolicy.oversize``: ``"truncate"`` (the default)
keeps the longest prefix of its content that fits with the visible marker
``TRUNCATION_MARKER`` appended (tool-call arguments are never cut; if they alone
do not fit it raises :class:`OversizeMessageError`); ``"reject"`` raises
:class:`OversizeMessageError`. Either way a warning is logged or an error
raised: never silently.

Idempotence. Appending a message id that is stored, or among the last
``MemoryPolicy.remember_evicted`` ids evicted from the conversation, changes
nothing and returns ``AppendResult(added=False, duplicate=True)``. If the
content differs, the stored message wins, ``conflict=True`` and a warning is
logged (a retried activity that got a different model answer must not stop
the run).

Observability. Every ``AppendResult`` carries the messages and tokens it
evicted (and their ids); ``stats()`` carries cumulative counts; the store's
``on_evict`` hook receives an :class:`EvictionEvent` and the ``memory`` logger
logs a line (INFO for the budget, WARNING for abandoned rounds, truncation and
conflicting duplicates).

Token counting is pluggable (``MemoryPolicy.token_counter``); the default
:func:`approx_tokens` is an estimate whose known error is stated in
:mod:`durable_agents.memory.tokens`. Details, edge cases and measurements: docs/memory.md.
"""

from durable_agents.memory.derived import DerivedWindow, chat_tokens, derive_window
from durable_agents.memory.errors import (
    MemoryInputError,
    MemoryStoreError,
    OversizeMessageError,
    PinnedTooLargeError,
    PolicyError,
    UnknownToolCallError,
)
from durable_agents.memory.messages import Message, Role, ToolCall
from durable_agents.memory.policy import MemoryPolicy, OversizeRule
from durable_agents.memory.reader import append_or_warn, open_store, read_context, read_window
from durable_agents.memory.sqlite_store import SQLiteStore
from durable_agents.memory.stores import EvictionHook, InMemoryStore, Store
from durable_agents.memory.tokens import TokenCounter, approx_tokens, estimate_text_tokens, upper_bound_tokens
from durable_agents.memory.window import TRUNCATION_MARKER, AppendResult, EvictionEvent, MemoryStats

__all__ = [
    "DerivedWindow",
    "TRUNCATION_MARKER",
    "AppendResult",
    "EvictionEvent",
    "EvictionHook",
    "InMemoryStore",
    "MemoryInputError",
    "MemoryPolicy",
    "MemoryStats",
    "MemoryStoreError",
    "Message",
    "OversizeMessageError",
    "OversizeRule",
    "PinnedTooLargeError",
    "PolicyError",
    "Role",
    "SQLiteStore",
    "Store",
    "TokenCounter",
    "ToolCall",
    "UnknownToolCallError",
    "append_or_warn",
    "chat_tokens",
    "derive_window",
    "approx_tokens",
    "estimate_text_tokens",
    "open_store",
    "read_context",
    "read_window",
    "upper_bound_tokens",
]
