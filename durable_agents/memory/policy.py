"""The limits a store enforces, as one validated value."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from durable_agents.memory.errors import PolicyError
from durable_agents.memory.tokens import TokenCounter, approx_tokens

__all__ = ["MemoryPolicy", "OversizeRule"]


class OversizeRule(enum.StrEnum):
    """What happens to one message larger than the whole room left by the pinned messages."""

    TRUNCATE = "truncate"
    """Cut the content to fit and end it with a visible marker (see ``durable_agents.memory.TRUNCATION_MARKER``)."""

    REJECT = "reject"
    """Raise :class:`durable_agents.memory.OversizeMessageError`; nothing is stored."""


@dataclass(frozen=True)
class MemoryPolicy:
    """Bounds for one conversation's window, enforced after every append.

    - ``max_tokens``: the window (pinned messages included) never counts more.
    - ``max_messages``: the window (pinned messages included) never holds more.
    - ``oversize``: the rule for a single message that cannot fit at all.
    - ``token_counter``: ``Callable[[Message], int]``; see :mod:`durable_agents.memory.tokens`.
    - ``remember_evicted``: how many evicted message ids each conversation
      remembers, so that appending one of them again (an activity retried long
      after its first attempt) is still recognised as a duplicate. Bounded so
      that the store stays bounded; messages in the window are always recognised.
    """

    max_tokens: int = 8000
    max_messages: int = 200
    oversize: OversizeRule = OversizeRule.TRUNCATE
    token_counter: TokenCounter = approx_tokens
    remember_evicted: int = 10_000

    def __post_init__(self) -> None:
        for name, low in (("max_tokens", 1), ("max_messages", 2), ("remember_evicted", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise PolicyError(f"MemoryPolicy.{name} must be an int, got {type(value).__name__}")
            if value < low:
                raise PolicyError(f"MemoryPolicy.{name} must be at least {low}, got {value}")
        if not isinstance(self.oversize, OversizeRule):
            try:
                object.__setattr__(self, "oversize", OversizeRule(self.oversize))
            except ValueError:
                raise PolicyError(
                    f"MemoryPolicy.oversize must be 'truncate' or 'reject', got {self.oversize!r}"
                ) from None
        if not callable(self.token_counter):
            raise PolicyError("MemoryPolicy.token_counter must be a callable taking a Message and returning an int")
