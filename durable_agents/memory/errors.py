"""Errors raised by the conversation memory.

Two families, because callers treat them differently:

- :class:`MemoryInputError` (a ``ValueError``): the caller handed over something
  the memory refuses (a tool result for a call nobody made, a message too large
  under the ``reject`` rule, a pinned set larger than the budget, a bad policy).
  Retrying the same call cannot help; the message says what to change.
- :class:`MemoryStoreError` (a ``RuntimeError``): the store itself could not be
  read or written (missing directory, corrupt file, disk full, locked too long).
  Readers never see it: :func:`durable_agents.memory.read_window` turns it into an empty
  context and a warning, because memory informs prompts and must never stop a run.
"""

from __future__ import annotations

__all__ = [
    "MemoryInputError",
    "MemoryStoreError",
    "OversizeMessageError",
    "PinnedTooLargeError",
    "PolicyError",
    "UnknownToolCallError",
]


class MemoryInputError(ValueError):
    """The memory refused a message or a setting; the message says what to do."""


class PolicyError(MemoryInputError):
    """A :class:`durable_agents.memory.MemoryPolicy` field is out of range."""


class UnknownToolCallError(MemoryInputError):
    """A tool result answers a tool call that no stored assistant message is awaiting."""


class OversizeMessageError(MemoryInputError):
    """A single message cannot fit the token budget (``reject`` rule, or not even truncated)."""


class PinnedTooLargeError(MemoryInputError):
    """The pinned messages would leave no room in the budget or the message cap."""


class MemoryStoreError(RuntimeError):
    """The store could not be opened, read or written."""
